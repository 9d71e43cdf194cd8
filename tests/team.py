"""A team on one GPU machine, for tests and benchmarks: a real shared engine running as root
(`jupyter gpujobs engine` on fake GPUs and its own socket) and a real Jupyter server per Unix
user, each running as that user (setpriv) and forwarding to the engine.

The users, their group and their Python environment come from scripts/install-multiuser.sh.
`Team` is a context manager: leaving it stops the servers and the engine and ends any job
process left behind.
"""

from __future__ import annotations

import json
import os
import pwd
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from servers import free_port, kernel_ready, stop_job_processes

REPO = Path(__file__).resolve().parent.parent
USER_PYTHON = Path(os.environ.get("GPUJOBS_TEST_VENV", "/opt/gpujobs-test")) / "bin" / "python"
USERS = ("gpujobs-u1", "gpujobs-u2")
ADMIN = "gpujobs-admin1"
ADMIN_GROUP = "gpujobs-test-admins"


def missing() -> str | None:
    """Why the multi-user tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root (real Unix users and a root engine)"
    for user in (*USERS, ADMIN):
        try:
            pwd.getpwnam(user)
        except KeyError:
            return f"no user {user}: run scripts/install-multiuser.sh"
    if not USER_PYTHON.exists():
        return f"no {USER_PYTHON}: run scripts/install-multiuser.sh"
    return None


def as_user(user: str, argv: list[str]) -> list[str]:
    """`argv` run as `user`: their uid, primary gid and groups."""
    pw = pwd.getpwnam(user)
    return ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--init-groups", *argv]


def user_env(user: str, home: Path, **extra: str) -> dict[str, str]:
    env = {
        "HOME": str(home), "USER": user, "LOGNAME": user, "PATH": f"{USER_PYTHON.parent}:/usr/bin:/bin",
        "LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1",
        "JUPYTER_CONFIG_DIR": str(home / ".jupyter"), "JUPYTER_DATA_DIR": str(home / ".local/share/jupyter"),
        "JUPYTER_RUNTIME_DIR": str(home / ".local/share/jupyter/runtime"), "IPYTHONDIR": str(home / ".ipython"),
    }
    env.update(extra)
    return env


@dataclass
class UserServer:
    user: str
    home: Path
    port: int
    token: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def api(self, method: str, path: str, token: str | None = None, **kw: Any) -> httpx.Response:
        """A request to this server's gpujobs/api/ (with its token unless `token` says otherwise)."""
        tok = self.token if token is None else token
        headers = {**({"Authorization": f"token {tok}"} if tok else {}), **kw.pop("headers", {})}
        return httpx.request(method, self.url + "gpujobs/api/" + path, headers=headers, timeout=30, **kw)

    def shutdown_kernel(self, kc: Any) -> None:
        kc.stop_channels()
        httpx.delete(self.url + f"api/kernels/{kc.kernel_id}", headers={"Authorization": f"token {self.token}"},
                     timeout=60)

    def start_kernel(self, name: str = "python3") -> Any:
        """A kernel started by this server (so running as its user), and a client to it: root
        reads the connection file the server wrote."""
        from jupyter_client import BlockingKernelClient

        r = httpx.post(self.url + "api/kernels", json={"name": name},
                       headers={"Authorization": f"token {self.token}"}, timeout=60)
        r.raise_for_status()
        kid = r.json()["id"]
        conn = self.home / ".local/share/jupyter/runtime" / f"kernel-{kid}.json"
        deadline = time.monotonic() + 30
        while not conn.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        kc = BlockingKernelClient()
        kc.kernel_id = kid  # type: ignore[attr-defined]
        kc.load_connection_file(str(conn))
        kc.start_channels()
        kernel_ready(kc, 60)
        return kc


def evaluate(kc: Any, code: str, timeout: float = 60) -> Any:
    """Run code that prints one JSON value in a kernel; return the value."""
    msg_id = kc.execute(code)
    out = ""
    deadline = time.monotonic() + timeout
    idle = False
    while True:
        try:
            msg = kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            if idle:
                raise AssertionError(f"the kernel printed nothing for {code!r}") from None
            raise
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            out += msg["content"]["text"]
        elif msg["msg_type"] == "error":
            raise AssertionError("\n".join(msg["content"]["traceback"]))
        elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            idle = True
        if idle and out.strip():
            return json.loads(out.strip().splitlines()[-1])
        if idle:  # the output can trail the idle status (ipykernel flushes stdout from a thread)
            deadline = min(deadline, time.monotonic() + 5)


@dataclass
class Team:
    """`with Team(fake_gpus="4xA100") as team:` a shared engine and one server per user."""

    fake_gpus: str = "4xA100"
    engine_args: list[str] = field(default_factory=list)
    users: tuple[str, ...] = USERS
    base: Path = field(init=False)
    socket: Path = field(init=False)
    engine_log: Path = field(init=False)
    engine: subprocess.Popen[bytes] | None = field(init=False, default=None)
    servers: dict[str, UserServer] = field(init=False, default_factory=dict)

    def __enter__(self) -> Team:
        self.base = Path(tempfile.mkdtemp(prefix="gpujobs-team-", dir="/tmp"))
        self.base.chmod(0o755)  # users traverse it to their own folders and the socket
        self.socket = self.base / "run" / "engine.sock"
        try:
            self.start_engine()
            for user in self.users:
                self.servers[user] = self.start_server(user)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def start_engine(self) -> None:
        self.engine_log = self.base / "engine.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUJOBS_")}
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        cmd = [sys.executable, "-m", "jupyter_gpujobs.cli", "engine", f"--socket={self.socket}",
               f"--state-dir={self.base / 'engine'}", f"--fake-gpus={self.fake_gpus}",
               f"--claim-dir={self.base / 'claims'}", f"--admin-group={ADMIN_GROUP}",
               "--GPUJobs.tick_interval=0.5", "--GPUJobs.kill_grace=1", *self.engine_args]
        self.engine = subprocess.Popen(cmd, env=env, stdout=open(self.engine_log, "wb"), stderr=subprocess.STDOUT,
                                       start_new_session=True)
        deadline = time.monotonic() + 60
        while not self.socket.exists():
            if self.engine.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the shared engine did not start:\n{self.engine_log.read_text()[-3000:]}")
            time.sleep(0.05)

    def start_server(self, user: str) -> UserServer:
        pw = pwd.getpwnam(user)
        home = self.base / user
        home.mkdir(mode=0o700)
        os.chown(home, pw.pw_uid, pw.pw_gid)
        port, token = free_port(), f"token-of-{user}"
        log_path = self.base / f"server-{user}.log"
        argv = [str(USER_PYTHON), "-m", "jupyter_server", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
                "--port-retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={home}",
                "--ServerApp.jpserver_extensions=jupyter_gpujobs=True", f"--GPUJobs.engine_url=unix://{self.socket}"]
        proc = subprocess.Popen(as_user(user, argv), env=user_env(user, home), cwd=home,
                                stdout=open(log_path, "wb"), stderr=subprocess.STDOUT, start_new_session=True)
        server = UserServer(user, home, port, token, proc, log_path)
        deadline = time.monotonic() + 180  # a loaded 2-core machine has taken over a minute
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                state = f"exited with {proc.returncode}" if proc.poll() is not None else "no answer in 180 s"
                raise RuntimeError(f"{user}'s Jupyter server did not start ({state}):\n{log_path.read_text()[-3000:]}")
            try:
                if server.api("GET", "whoami").status_code == 200:
                    return server
            except httpx.HTTPError:
                pass
            time.sleep(0.2)

    # ---------------------------------------------------------------- talking to the engine

    def socket_client(self) -> httpx.Client:
        """A client on the engine's socket as this (root) process."""
        return httpx.Client(transport=httpx.HTTPTransport(uds=str(self.socket)),
                            base_url="http://engine/gpujobs/api/", timeout=30)

    def wait_state(self, job_id: int, states: tuple[str, ...], timeout: float = 60) -> dict[str, Any]:
        """Job `job_id` once it is in one of `states`, asked on the engine's socket as root; a
        timeout's message has its state and the engine's and servers' logs."""
        with self.socket_client() as c:
            deadline = time.monotonic() + timeout
            while True:
                job = c.get(f"jobs/{job_id}").json()
                if job["state"] in states:
                    return job
                if time.monotonic() > deadline:
                    raise AssertionError(f"job {job_id} is {job['state']}, not {states}\n{self.logs()}")
                time.sleep(0.1)

    def run_as(self, user: str, code: str, timeout: float = 60, **env: str) -> Any:
        """Run Python `code` as `user` with the users' Python (cwd: their folder); it prints one
        JSON value, which is returned."""
        home = self.base / user if (self.base / user).exists() else Path(pwd.getpwnam(user).pw_dir)
        r = subprocess.run(as_user(user, [str(USER_PYTHON), "-c", code]), capture_output=True, text=True,
                           timeout=timeout, cwd=home,
                           env=user_env(user, home, GPUJOBS_SOCKET=str(self.socket), **env))
        if r.returncode != 0:
            raise AssertionError(f"as {user}: exit {r.returncode}\n{r.stdout}\n{r.stderr}")
        return json.loads(r.stdout.strip().splitlines()[-1])

    def cli(self, user: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """`jupyter gpujobs ARGS` as `user`, finding the engine as a user's shell does (GPUJOBS_SOCKET)."""
        home = self.base / user
        return subprocess.run(as_user(user, [str(USER_PYTHON), "-m", "jupyter_gpujobs.cli", *args]),
                              capture_output=True, text=True, timeout=timeout, cwd=home,
                              env=user_env(user, home, GPUJOBS_SOCKET=str(self.socket)))

    def logs(self) -> str:
        parts = [self.engine_log.read_text(errors="replace")]
        parts += [s.log_path.read_text(errors="replace") for s in self.servers.values()]
        return "\n".join(parts)[-6000:]

    def __exit__(self, *exc: object) -> None:
        for server in self.servers.values():
            _stop(server.proc)
        if self.engine is not None:
            _stop(self.engine)
        stop_job_processes(self.base)
        shutil.rmtree(self.base, ignore_errors=True)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
