"""JupyterHub end to end: a real JupyterHub (from PyPI, with configurable-http-proxy from npm;
scripts/install-jupyterhub.sh) spawns two real Unix users' single-user servers with its
LocalProcessSpawner, and runs the shared engine (`jupyter gpujobs engine` on fake GPUs) as a
hub-managed service. Nothing is set up per user: each server finds the engine's socket and
forwards its gpujobs/api/ routes to it as its Unix user, so the hub's own OAuth to the user's
server is what admits a browser to the panel's API.

Both users run `%%gpujob` cells in kernels of their servers (kernels REST and websocket, through
the hub's proxy); they see one queue, and each sees the other's job only as its queue view. A
GPU kernel of a user's server is that user's job. A Chromium logged in through the hub's login
page as one user sees the panel with both users' jobs (tests/ui/screenshots/jupyterhub-panel.png).
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from servers import free_port, stop_job_processes
from team import USER_PYTHON, USERS, as_user, missing, user_env

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = USER_PYTHON.parent
CHP = VENV_BIN.parent / "chp" / "node_modules" / ".bin" / "configurable-http-proxy"
PASSWORD = "gpujobs-hub-test-password"
ADMIN_TOKEN = uuid.uuid4().hex
U1, U2 = USERS


def _missing() -> str | None:
    why = missing()
    if why:
        return why
    if not (VENV_BIN / "jupyterhub").exists() or not CHP.exists():
        return "no JupyterHub or configurable-http-proxy: run scripts/install-jupyterhub.sh"
    return None


pytestmark = [pytest.mark.skipif(_missing() is not None, reason=str(_missing())), pytest.mark.timeout(600)]


@dataclass
class Hub:
    url: str  # http://127.0.0.1:PORT/ (the proxy, as a browser sees the hub)
    base: Path
    socket: Path
    proc: subprocess.Popen[bytes]
    log_path: Path

    def api(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """A request as the test's admin service (a token-only hub service)."""
        return httpx.request(method, self.url + path, headers={"Authorization": f"token {ADMIN_TOKEN}"},
                             timeout=60, follow_redirects=False, **kw)

    def gpujobs(self, user: str, method: str, path: str, **kw: Any) -> httpx.Response:
        """The gpujobs API of `user`'s server, through the hub's proxy."""
        return self.api(method, f"user/{user}/gpujobs/api/{path}", **kw)

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]


def hub_config(base: Path, port: int, socket: Path) -> str:
    """jupyterhub_config.py of the test: the lines docs/shared-server.md shows, plus ports,
    a throwaway database and login by shared password instead of PAM."""
    engine = [sys.executable, "-m", "jupyter_gpujobs.cli", "engine", f"--socket={socket}",
              f"--state-dir={base / 'engine'}", "--fake-gpus=2xA100", f"--claim-dir={base / 'claims'}",
              "--GPUJobs.tick_interval=0.5", "--GPUJobs.kill_grace=1"]
    return f"""
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = {port}
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {free_port()}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{free_port()}"
c.ConfigurableHTTPProxy.command = [{str(CHP)!r}]
c.ConfigurableHTTPProxy.pid_file = {str(base / 'hub' / 'proxy.pid')!r}
c.JupyterHub.db_url = "sqlite:///{base / 'hub' / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = {str(base / 'hub' / 'cookie_secret')!r}
c.JupyterHub.authenticator_class = "shared-password"
c.SharedPasswordAuthenticator.user_password = {PASSWORD!r}
c.Authenticator.allowed_users = {set(USERS)!r}

# the shared engine, as a hub-managed service (started and stopped with the hub, as root)
c.JupyterHub.services = [
    {{"name": "gpujobs-engine", "command": {engine!r},
      "environment": {{"PYTHONPATH": {str(REPO)!r}}}}},
    {{"name": "test-admin", "api_token": {ADMIN_TOKEN!r}}},
]
c.JupyterHub.load_roles = [
    {{"name": "test-admin", "services": ["test-admin"],
      "scopes": ["admin:users", "admin:servers", "access:servers", "read:users", "tokens"]}},
]
# every user's server: jupyterhub-singleuser with jupyter-gpujobs installed, as the user
c.Spawner.cmd = [{str(VENV_BIN / 'jupyterhub-singleuser')!r}]
c.Spawner.args = ["--GPUJobs.engine_url=unix://{socket}", "--LabApp.expose_app_in_browser=True"]
c.Spawner.notebook_dir = {str(base / '{username}')!r}
c.Spawner.default_url = "/lab"
c.Spawner.environment = {{"JUPYTERLAB_SETTINGS_DIR": {str(base / 'lab-settings')!r}}}
c.Spawner.start_timeout = 180
c.Spawner.http_timeout = 180
"""


@pytest.fixture(scope="module")
def hub() -> Iterator[Hub]:
    base = Path(tempfile.mkdtemp(prefix="gpujobs-hub-", dir="/tmp"))
    base.chmod(0o755)  # users traverse it to their folders and the engine's socket
    (base / "hub").mkdir(mode=0o700)
    for user in USERS:
        pw = pwd.getpwnam(user)
        (base / user).mkdir(mode=0o700)
        os.chown(base / user, pw.pw_uid, pw.pw_gid)
    # no "get notified about Jupyter news?" toast over the panel
    news = base / "lab-settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    news.parent.mkdir(parents=True)
    news.write_text('{"fetchNews": "false"}')
    subprocess.run(["chmod", "-R", "a+rX", str(base / "lab-settings")], check=True)
    socket = base / "run" / "engine.sock"
    port = free_port()
    (base / "hub" / "jupyterhub_config.py").write_text(hub_config(base, port, socket))
    log_path = base / "hub" / "hub.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUJOBS_", "JUPYTER"))}
    env["PATH"] = f"{VENV_BIN}:/usr/sbin:/usr/bin:/sbin:/bin"
    proc = subprocess.Popen([str(VENV_BIN / "jupyterhub"), "-f", str(base / "hub" / "jupyterhub_config.py")],
                            cwd=base / "hub", env=env, stdout=open(log_path, "wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    hub = Hub(f"http://127.0.0.1:{port}/", base, socket, proc, log_path)
    try:
        _wait(lambda: _status(hub.url + "hub/api") == 200 and socket.exists(), 120, "the hub and the engine", hub)
        for user in USERS:
            r = hub.api("POST", f"hub/api/users/{user}/server")
            assert r.status_code in (201, 202), r.text
        for user in USERS:
            _wait(lambda u=user: hub.api("GET", f"hub/api/users/{u}").json()["servers"].get("", {}).get("ready"),
                  180, f"{user}'s server", hub)
        yield hub
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # the hub stops the servers, the proxy and the engine
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        stop_job_processes(base)
        shutil.rmtree(base, ignore_errors=True)


def _status(url: str) -> int:
    try:
        return httpx.get(url, timeout=5, follow_redirects=False).status_code
    except httpx.HTTPError:
        return 0


def _wait(predicate: Any, timeout: float, what: str, hub: Hub) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        if hub.proc.poll() is not None:
            raise AssertionError(f"the hub exited ({hub.proc.returncode}) waiting for {what}:\n{hub.logs()}")
        try:
            value = predicate()
        except (httpx.HTTPError, KeyError, ValueError):
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} in {timeout} s:\n{hub.logs()}")
        time.sleep(0.2)


def wait_state(hub: Hub, user: str, job_id: int, state: str, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        job = hub.gpujobs(user, "GET", f"jobs/{job_id}").json()
        if job["state"] == state:
            return job
        if time.monotonic() > deadline:
            log = hub.gpujobs(user, "GET", f"jobs/{job_id}/log").json().get("data", "")
            raise AssertionError(f"job {job_id} is not {state} in {timeout} s: {job}\n{log[-2000:]}")
        time.sleep(0.3)


# --------------------------------------------------------------- kernels through the hub


class Kernel:
    """A kernel of a user's server, started and driven through the hub's proxy (kernels REST and
    the channels websocket), as JupyterLab does."""

    def __init__(self, hub: Hub, user: str, name: str = "python3") -> None:
        self.hub, self.user = hub, user
        r = hub.api("POST", f"user/{user}/api/kernels", json={"name": name})
        assert r.status_code == 201, r.text
        self.id = r.json()["id"]
        self.session = uuid.uuid4().hex

    def execute(self, code: str, timeout: float = 120) -> tuple[str, list[str]]:
        """Run `code`; its stdout, and its errors (ename: evalue)."""
        # in a thread of its own: the Playwright browser runs an event loop in this one
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, self._execute(code, timeout)).result()

    async def _execute(self, code: str, timeout: float) -> tuple[str, list[str]]:
        from tornado.httpclient import HTTPRequest
        from tornado.websocket import websocket_connect

        url = "ws" + self.hub.url[len("http"):] + f"user/{self.user}/api/kernels/{self.id}/channels"
        ws = await websocket_connect(HTTPRequest(url, headers={"Authorization": f"token {ADMIN_TOKEN}"}))
        msg_id = uuid.uuid4().hex
        ws.write_message(json.dumps({
            "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": self.user,
                       "session": self.session, "date": "", "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell",
            "content": {"code": code, "silent": False, "store_history": False, "user_expressions": {},
                        "allow_stdin": False, "stop_on_error": True},
        }))
        out, errors = [], []
        try:
            deadline = time.monotonic() + timeout
            while True:
                raw = await asyncio.wait_for(ws.read_message(), max(deadline - time.monotonic(), 0.1))
                assert raw is not None, "the kernel's websocket closed"
                msg = json.loads(raw)
                if msg.get("parent_header", {}).get("msg_id") != msg_id or msg["channel"] != "iopub":
                    continue
                kind, content = msg["msg_type"], msg["content"]
                if kind == "stream" and content["name"] == "stdout":
                    out.append(content["text"])
                elif kind == "error":
                    errors.append(f"{content['ename']}: {content['evalue']}")
                elif kind == "status" and content["execution_state"] == "idle":
                    return "".join(out), errors
        finally:
            ws.close()

    def value(self, code: str) -> Any:
        """The JSON value the last line of `code`'s output prints."""
        out, errors = self.execute(code)
        assert not errors, errors
        return json.loads(out.strip().splitlines()[-1])


def job_ids(kernel: Kernel) -> list[int]:
    """The ids of the kernel's user's jobs, newest first, as the client in the kernel lists them."""
    return kernel.value("from jupyter_gpujobs.client import GPUJobsClient; import json, getpass; "
                        "print(json.dumps([j['id'] for j in GPUJobsClient().jobs(user=getpass.getuser())['jobs']]))")


# ------------------------------------------------------------------------------- tests


def test_the_engine_runs_as_a_hub_service_and_each_server_forwards_to_it(hub: Hub) -> None:
    """No per-user setup: each spawned server knows its user from the engine's socket."""
    for user in USERS:
        assert hub.gpujobs(user, "GET", "whoami").json() == {"user": user, "admin": False}
    # a user's browser session or token reaches only their own server: u1's gpujobs API refuses
    # u2's token (the hub's OAuth of u1's server admits only u1 and admins)
    token = hub.api("POST", f"hub/api/users/{U2}/tokens", json={"note": "test"}).json()["token"]
    r = httpx.get(hub.url + f"user/{U1}/gpujobs/api/whoami", headers={"Authorization": f"token {token}"}, timeout=30)
    assert r.status_code == 403
    r = httpx.get(hub.url + f"user/{U2}/gpujobs/api/whoami", headers={"Authorization": f"token {token}"}, timeout=30)
    assert r.json()["user"] == U2
    # without any credential: to the hub's login, never the API
    r = httpx.get(hub.url + f"user/{U1}/gpujobs/api/jobs", timeout=30, follow_redirects=False)
    assert r.status_code in (302, 403), r.status_code
    assert "gpujobs-engine" in hub.log_path.read_text()  # the hub started it


def test_two_users_cells_share_one_queue_and_keep_their_data(hub: Hub, browser: Any) -> None:
    k1, k2 = Kernel(hub, U1), Kernel(hub, U2)
    for k in (k1, k2):
        assert not k.execute("%load_ext jupyter_gpujobs")[1]
    # u1's cell takes both GPUs; u2's waits for one, and so does u1's next one
    out, errors = k1.execute("%%gpujob -g 2 -t 5m --name u1-secret-training --async\nimport time; time.sleep(300)")
    assert not errors, errors
    (j1,) = job_ids(k1)
    wait_state(hub, U1, j1, "RUNNING")
    out, errors = k2.execute("%%gpujob -g 1 -t 5m --name u2-private-eval --async\nprint('eval done')")
    assert not errors, errors
    out, errors = k1.execute("%%gpujob -g 1 -t 5m --name u1-next --async\nprint('next')")
    assert not errors, errors
    (j2,), (j3, _) = job_ids(k2), job_ids(k1)

    # one queue: both users see both waiting jobs, in the same order
    queues = [[row["id"] for row in hub.gpujobs(user, "GET", "queue").json()["jobs"]] for user in USERS]
    assert queues[0] == queues[1] and set(queues[0]) == {j2, j3}, queues
    # each sees the other's jobs only as their queue view
    mine, theirs = hub.gpujobs(U1, "GET", f"jobs/{j1}").json(), hub.gpujobs(U1, "GET", f"jobs/{j2}").json()
    assert mine["user"] == U1 and mine["name"] == "u1-secret-training" and not mine.get("private")
    assert theirs["user"] == U2 and theirs["state"] == "PENDING" and theirs["private"] is True
    assert "u2-private-eval" not in json.dumps(theirs)
    assert hub.gpujobs(U1, "GET", f"jobs/{j2}/log").status_code == 403
    assert hub.gpujobs(U2, "GET", f"jobs/{j1}").json()["private"] is True
    refused = hub.gpujobs(U2, "DELETE", f"jobs/{j1}")
    assert refused.status_code == 403 and f"belongs to {U1}" in refused.json()["message"], refused.text
    assert hub.gpujobs(U1, "GET", f"jobs/{j1}").json()["state"] == "RUNNING"
    # and from inside the kernels, the same (the kernel's client is on the socket, as its user)
    assert k2.value("from jupyter_gpujobs.client import GPUJobsClient; import json; "
                    f"print(json.dumps(GPUJobsClient().job({j1}).get('private')))") is True

    # the browser: u1 logs in through the hub and opens the panel of their own Lab
    panel_shows_the_shared_queue(hub, browser, j1, j2, j3)

    # u1's jobs end: u2's runs on a freed GPU, and a blocking cell streams its output back
    for job_id in (j3, j1):
        assert hub.gpujobs(U1, "DELETE", f"jobs/{job_id}").status_code == 200
    wait_state(hub, U2, j2, "COMPLETED")
    out, errors = k2.execute("%%gpujob -g 1 -t 2m\nimport os; print('on GPU', os.environ['CUDA_VISIBLE_DEVICES'], "
                             "'as uid', os.getuid())")
    assert not errors, errors
    assert f"as uid {pwd.getpwnam(U2).pw_uid}" in out and "on GPU" in out, out


def panel_shows_the_shared_queue(hub: Hub, browser: Any, running: int, *waiting: int) -> None:
    sys.path.insert(0, str(Path(__file__).parent / "ui"))
    from labtools import open_lab, open_panel, screenshot, screenshot_on_failure

    context = browser.new_context(viewport={"width": 1400, "height": 900})
    pg = context.new_page()
    try:
        with screenshot_on_failure(pg, "jupyterhub-panel"):
            pg.goto(hub.url + "hub/login", wait_until="domcontentloaded")
            pg.fill("input[name=username]", U1)
            pg.fill("input[name=password]", PASSWORD)
            pg.click("input[type=submit], button[type=submit]")
            pg.wait_for_url(f"**/user/{U1}/**", timeout=120000)
            open_lab(pg, hub.url + f"user/{U1}/")
            panel = open_panel(pg)
            for job_id in waiting:
                pg.locator(f'#gpujobs-panel .jp-GPUJobs-queue tr[data-job-id="{job_id}"]').wait_for(timeout=30000)
            queue = panel.locator(".jp-GPUJobs-queue").inner_text()
            assert U2 in queue, queue  # the other user's job, in the same queue
            gpus = panel.locator(".jp-GPUJobs-gpu.jp-mod-busy")
            assert gpus.count() == 2 and f"job #{running} · you" in gpus.first.inner_text()
            assert "u2-private-eval" not in panel.inner_text()
            pg.wait_for_timeout(500)
            screenshot(pg, "jupyterhub-panel")
    finally:
        context.close()


def test_a_gpu_kernel_of_a_hub_users_server_is_that_users_job(hub: Hub) -> None:
    pw = pwd.getpwnam(U2)
    home = Path(pw.pw_dir)
    r = subprocess.run(as_user(U2, [str(VENV_BIN / "jupyter-gpujobs"), "kernelspec", "install", "--name",
                                    "gpu-hub-test", "--user", "-g", "1", "-t", "10m"]),
                       capture_output=True, text=True, timeout=120, cwd=home, env=user_env(U2, home))
    assert r.returncode == 0, r.stderr
    # the server's kernelspec list is read fresh: the kernel starts from it as from Lab's launcher
    kernel = Kernel(hub, U2, "gpu-hub-test")
    try:
        job_id, uid = kernel.value("import os, json; print(json.dumps([int(os.environ['GPUJOBS_JOB_ID']), "
                                   "os.getuid()]))")
        assert uid == pw.pw_uid
        job = hub.gpujobs(U2, "GET", f"jobs/{job_id}").json()
        assert job["kind"] == "kernel" and job["user"] == U2 and job["state"] == "RUNNING"
        assert hub.gpujobs(U1, "GET", f"jobs/{job_id}").json()["private"] is True
    finally:
        hub.api("DELETE", f"user/{U2}/api/kernels/{kernel.id}")
        shutil.rmtree(home / ".local/share/jupyter/kernels/gpu-hub-test", ignore_errors=True)


@pytest.fixture(autouse=True)
def jp_asyncio_loop() -> Iterator[None]:
    """pytest-jupyter's autouse loop fixture would close Playwright's running loop; these tests
    talk to servers in other processes and need no loop of their own."""
    yield None


@pytest.fixture(autouse=True)
def jp_server_cleanup() -> Iterator[None]:
    yield None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    sys.path.insert(0, str(Path(__file__).parent / "ui"))
    from labtools import CHROMIUM, CHROMIUM_ARGS

    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing: run scripts/install-browser.sh")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()
