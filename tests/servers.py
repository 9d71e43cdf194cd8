"""Real Jupyter servers with the extension for tests and benchmarks.

`live_servers(tmp_path)` is a generator: its first value is a factory
`make(fake_gpus="2xA100", config={...})` -> a started `LiveServer` (a `jupyter server`
subprocess with fake GPUs and its own Jupyter dirs); resuming it stops them all and kills any
job process left behind. The `live_server` fixture in conftest.py wraps it.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

FAKE_GPUS = "2xA100"


async def wait_for(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.05) -> Any:
    """Await until `predicate()` (sync or async) returns something truthy; return it."""
    import asyncio
    import inspect

    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(interval)


def wait_until(predicate: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    """Poll `predicate()` every 0.1 s until it returns something truthy; return that. After
    `timeout` s, an AssertionError says that `what` did not happen."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} not met within {timeout}s"
        time.sleep(0.1)


def wait_job(client: Any, job_id: int, until: Callable[[dict[str, Any]], Any] | tuple[str, ...],
             timeout: float = 30.0) -> dict[str, Any]:
    """Poll job `job_id` through `client` until `until(job)` holds, or, given states, until it
    is in one of them; return the job. A timeout's message shows its state, reason and log."""
    holds = until if callable(until) else (lambda job: job["state"] in until)
    deadline = time.monotonic() + timeout
    while True:
        job = client.job(job_id)
        if holds(job):
            return job
        if time.monotonic() >= deadline:
            try:
                log = client.log(job_id)["data"][-2000:]
            except Exception as err:  # the message is about the job; its log is a bonus
                log = f"(no log: {err})"
            raise AssertionError(f"job {job_id} stayed {job['state']} ({job['reason']}) for {timeout}s; log:\n{log}")
        time.sleep(0.1)



def kernel_ready(kc: Any, timeout: float = 60.0) -> None:
    """Until the kernel answers kernel_info on shell *and* its IOPub reaches `kc`: a SUB socket
    subscribes some time after it connects, and on a busy machine a kernel_info reply can come
    before that, so the first cell's output would be lost (ZeroMQ's "slow joiner"). As
    jupyter_client's wait_for_ready, but without its heartbeat check, which misfires on a busy
    machine for a client made from a connection file."""
    from queue import Empty

    deadline = time.monotonic() + timeout
    while True:
        msg_id = kc.kernel_info()
        try:
            while kc.get_shell_msg(timeout=1)["parent_header"].get("msg_id") != msg_id:
                pass
            # the kernel publishes its busy/idle status for every request: IOPub is connected
            # once one of this request's arrives
            while kc.get_iopub_msg(timeout=0.5)["parent_header"].get("msg_id") != msg_id:
                pass
            break
        except Empty:
            assert time.monotonic() < deadline, f"the kernel did not answer in {timeout:.0f}s"
    while True:  # the rest of this request's status messages
        try:
            kc.get_iopub_msg(timeout=0.2)
        except Empty:
            return

def stop_job_processes(run_dir: Path, grace: float = 3.0) -> None:
    """End every job a test left running under `run_dir`: SIGTERM its supervisors, which stop
    their whole process trees (SIGKILLing them would orphan the jobs), then SIGKILL stragglers.
    A supervisor is found by its working directory, a job's folder in `run_dir` (one started
    in standby names no job on its command line), or by a command line that names `run_dir`."""
    supervisors = supervisors_under(run_dir)
    for p in supervisors:
        _signal(p, signal.SIGTERM)
    _, alive = psutil.wait_procs(supervisors, timeout=grace)
    for p in alive:
        _signal(p, signal.SIGKILL)


def supervisors_under(run_dir: Path) -> list[psutil.Process]:
    """The job supervisors of a runner whose runs live in `run_dir` (see stop_job_processes)."""
    root = str(run_dir)
    found = []
    for p in psutil.process_iter():
        try:
            cwd = p.cwd()
            if cwd.startswith(root + os.sep) or cwd == root or any(root in arg for arg in p.cmdline()):
                found.append(p)
        except psutil.Error:
            continue
    return found


def _signal(p: psutil.Process, sig: int) -> None:
    try:
        p.send_signal(sig)
    except psutil.Error:
        pass


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now. Under pytest-xdist each worker draws from its own slice
    of 20000-31999, below Linux's ephemeral ports (where kernels and clients bind), so parallel
    workers do not race for a port; LiveServer.start still takes another if one was taken."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and worker[2:].isdigit():
        count = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
        size = 12000 // count
        low = 20000 + int(worker[2:]) % count * size
        for _ in range(100):
            port = random.randrange(low, low + size)
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LiveServer:
    root: Path
    state_dir: Path
    port: int
    token: str
    base_url: str
    env: dict[str, str]
    args: list[str]
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    _logs: list[Path] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.base_url}"

    def client(self) -> Any:
        from jupyter_gpujobs.client import GPUJobsClient

        return GPUJobsClient(url=self.url, token=self.token)

    def start(self, timeout: float = 60.0, port_tries: int = 3, status: int = 200) -> LiveServer:
        """Start the server; a port taken meanwhile (free_port() found it free, but another
        test, kernel or job bound it before the server did) is replaced by another free one.
        `status`: what `GET whoami` answers once it is up (503: the extension did not start)."""
        self.log_path = self.state_dir.parent / f"{self.state_dir.name}-server-{len(self._logs)}.log"
        self._logs.append(self.log_path)
        out = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter_server", *self.args], cwd=self.root, env=self.env,
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log = self.log_path.read_text()
                if port_tries > 1 and f"port {self.port} is not available" in log:
                    self.port = free_port()
                    self.args = [f"--port={self.port}" if a.startswith("--port=") else a for a in self.args]
                    return self.start(timeout, port_tries - 1, status)
                raise RuntimeError(f"jupyter server exited early:\n{log[-4000:]}")
            try:
                r = httpx.get(self.url + "gpujobs/api/whoami", headers={"Authorization": f"token {self.token}"},
                              timeout=1.0)
                if r.status_code == status:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"jupyter server did not answer within {timeout}s:\n{self.log_path.read_text()[-4000:]}")

    def kill(self) -> None:
        """SIGKILL the server process only (jobs' supervisors live in their own sessions)."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            # SIGTERM, as systemd and JupyterHub stop a server: its extensions shut down (with no
            # terminal, SIGINT ends the process without stopping the engine)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def cli(self, *args: str, check: bool = False, timeout: float = 60, **kw: Any) -> subprocess.CompletedProcess[str]:
        """Run `jupyter gpujobs ARGS` against this server."""
        cmd = [sys.executable, "-m", "jupyter_gpujobs.cli", "--url", self.url, "--token", self.token, *args]
        return subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=timeout, env=self.env,
                              cwd=kw.pop("cwd", self.root), **kw)

    def rogue(self, gpu: int, seconds: float = 120, **env: str) -> subprocess.Popen[bytes]:
        """A process that holds fake GPU `gpu` of this server outside the queue (a "rogue", as a
        person who ran `python train.py` by hand would be). It is marked with this server's fake
        fleet, so other servers of the same test run do not see it on their GPUs."""
        fleet = self.client().api("GET", "info")["fake_fleet"]
        assert fleet, "rogue() needs a server on fake GPUs"
        proc_env = {k: v for k, v in os.environ.items() if k != "GPUJOBS_JOB_ID"}
        proc_env.update({"GPUJOBS_FAKE_FLEET": fleet, "GPUJOBS_FAKE_GPU_USE": str(gpu), **env})
        return subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"], env=proc_env)

    def server_log(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in self._logs if p.exists())


def live_servers(tmp_path: Path) -> Iterator[Callable[..., LiveServer]]:
    """Factory: `live_server(fake_gpus="2xA100", config={...})` -> a started LiveServer.

    Call `.start()` again after `.kill()` to restart on the same database and state dir.
    """
    servers: list[LiveServer] = []

    def make(fake_gpus: str = FAKE_GPUS, config: dict[str, Any] | None = None, base_url: str = "/",
             start: bool = True, extra_args: list[str] | None = None,
             users: dict[str, str] | None = None) -> LiveServer:
        """`config`: c.GPUJobs settings (over the short test graces and tick). `users`: token ->
        user name, each token a named user (tests/identity.py, as under JupyterHub); the
        server's own token is the first."""
        n = len(servers)
        root = tmp_path / f"root{n}"
        root.mkdir()
        state = tmp_path / f"state{n}"
        home = tmp_path / f"home{n}"
        for d in (state, home):
            d.mkdir()
        token = f"test-token-{n}"
        port = free_port()
        env = {
            **os.environ,
            "JUPYTER_CONFIG_DIR": str(home / "config"),
            "JUPYTER_DATA_DIR": str(home / "data"),
            "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
            "GPUJOBS_FAKE_GPUS": fake_gpus,
            "PYTHONUNBUFFERED": "1",
        }
        env.pop("GPUJOBS_URL", None)
        env.pop("GPUJOBS_TOKEN", None)
        args = [
            "--no-browser", "--ip=127.0.0.1", f"--port={port}", "--port-retries=0",
            f"--IdentityProvider.token={token}", f"--ServerApp.base_url={base_url}",
            f"--ServerApp.root_dir={root}", "--ServerApp.jpserver_extensions=jupyter_gpujobs=True",
            f"--GPUJobs.state_dir={state}", "--allow-root",
        ]
        settings = {"kill_grace": 1, "preempt_grace": 1, "tick_interval": 0.5, **(config or {})}
        if users:
            settings = {"user_identity": "jupyter", **settings}
            args += ["--ServerApp.identity_provider_class=identity.TokenUsers",
                     f"--TokenUsers.users={json.dumps(users)}"]
            env["PYTHONPATH"] = str(Path(__file__).parent) + os.pathsep + env.get("PYTHONPATH", "")
            token = next(iter(users))
        for key, value in settings.items():
            args.append(f"--GPUJobs.{key}={value}")
        args += extra_args or []
        server = LiveServer(root=root, state_dir=state, port=port, token=token, base_url=base_url, env=env,
                            args=args)
        servers.append(server)
        return server.start() if start else server

    yield make
    for s in servers:
        s.stop()
    # no job process may outlive its test
    for s in servers:
        run_dir = s.state_dir / "run"
        if run_dir.exists():
            stop_job_processes(run_dir)
