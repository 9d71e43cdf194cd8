"""Shared test fixtures: a real Jupyter server with the extension on fake GPUs.

Two ways to get one:
- `jp_fetch` / `jp_serverapp` (pytest-jupyter): the server runs in the test's own event loop.
  Talk to it with `jp_fetch`, `AsyncGPUJobsClient`, or asyncio subprocesses — a blocking call
  (the sync client, `subprocess.run`) from the test would stall the server it waits for.
- `live_server(...)`: a separate `jupyter server` process, for restarts, the CLI, kernels and
  anything that blocks. It is stopped (or SIGKILLed by the test) at the end.

The whole session runs on Jupyter dirs of its own (`_isolate_jupyter`): what the user installed
or configured in their home, and a Jupyter server they are running, are not seen by the tests;
`clean_prefix_python` is the test Python without what was installed into its venv's prefix.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from servers import FAKE_GPUS, LiveServer, live_servers, stop_job_processes

pytest_plugins = ("pytest_jupyter.jupyter_server",)


# Set in a kernel, terminal or job of a running server (e.g. the user's Lab): they would point
# the tests' clients and jobs at that server or its fake GPUs.
_SERVER_ENV = ("GPUJOBS_URL", "GPUJOBS_TOKEN", "GPUJOBS_FAKE_GPUS", "GPUJOBS_FAKE_FLEET", "GPUJOBS_JOB_ID",
               "GPUJOBS_CELL_DIR", "GPUJOBS_TIME_LIMIT", "GPUJOBS_ENDS_AT", "GPUJOBS_GPU_UUIDS",
               "GPUJOBS_WARN_AT", "GPUJOBS_USER", "GPUJOBS_ARRAY_INDEX", "GPUJOBS_ARRAY_JOB_ID",
               "JPY_SESSION_NAME", "JUPYTER_SERVER_ROOT", "JUPYTER_SERVER_URL")


@pytest.fixture(scope="session", autouse=True)
def _isolate_jupyter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Jupyter's per-user dirs (config, data with its kernelspecs, runtime with the running
    servers) and IPython's dir are the session's own, and they come before the venv's prefix
    (JUPYTER_PREFER_ENV_PATH=0), so a kernelspec or config the user installed with `--user` or
    `--sys-prefix` does not change what the tests see. Every process a test starts inherits it."""
    home = tmp_path_factory.mktemp("jupyter-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JUPYTER_CONFIG_DIR", str(home / "config"))
        mp.setenv("JUPYTER_DATA_DIR", str(home / "data"))
        mp.setenv("JUPYTER_RUNTIME_DIR", str(home / "runtime"))
        mp.setenv("IPYTHONDIR", str(home / "ipython"))
        mp.setenv("JUPYTER_PREFER_ENV_PATH", "0")
        for name in ("JUPYTER_PATH", "JUPYTER_CONFIG_PATH", "JUPYTER_PLATFORM_DIRS", *_SERVER_ENV):
            mp.delenv(name, raising=False)
        # Fake-GPU processes the tests start without a server (runner-level jobs) carry a fleet
        # of this test process's own: a process with no fleet is on every fake-GPU server's
        # GPUs, and the servers of tests running at the same time (xdist workers) would take
        # it for a process outside their queue and keep that GPU from their jobs. Servers
        # give their own jobs and kernels their own fleet (engine/gpus/fake.py).
        mp.setenv("GPUJOBS_FAKE_FLEET", f"tests-{os.getpid()}")
        yield home


@pytest.fixture(scope="session")
def clean_prefix_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A Python with the test Python's packages but a prefix of its own: Jupyter finds no
    kernelspec, extension or config installed into the venv (`--sys-prefix`) through it."""
    venv = tmp_path_factory.mktemp("clean-prefix")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site_packages = sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)})
    # addsitedir also runs the venv's .pth files (an editable install of the package)
    with open(Path(site_packages) / "_test_python.pth", "w") as f:
        f.write(f"import site; site.addsitedir({sysconfig.get_path('purelib')!r})\n")
    return str(venv / "bin" / "python")


@pytest.fixture(autouse=True)
def _restore_gpujobs_environ() -> Iterator[None]:
    """An in-process server puts GPUJOBS_URL/TOKEN/FAKE_FLEET into os.environ for its kernels;
    take them out again so they do not leak into the next test's processes."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("GPUJOBS_")}
    yield
    for key in [k for k in os.environ if k.startswith("GPUJOBS_")]:
        if key not in saved:
            del os.environ[key]
    os.environ.update(saved)


@pytest.fixture
def gpujobs_config(tmp_path: Path) -> dict[str, Any]:
    """`c.GPUJobs` settings of the in-process test server; override the fixture to change them."""
    return {
        "fake_gpus": FAKE_GPUS,
        "state_dir": str(tmp_path / "gpujobs-state"),
        "kill_grace": 1,
        "preempt_grace": 1,
        "tick_interval": 0.5,
    }


@pytest.fixture
def jp_server_config(gpujobs_config: dict[str, Any]) -> dict[str, Any]:
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_gpujobs": True}},
        "GPUJobs": gpujobs_config,
    }


@pytest.fixture
def engine(jp_serverapp: Any, jp_asyncio_loop: Any) -> Iterator[Any]:
    """The JobService of the in-process server, started (pytest-jupyter does not run the
    extensions' async start hooks) and stopped around the test."""
    service = jp_serverapp.web_app.settings["gpujobs_service"]
    jp_asyncio_loop.run_until_complete(service.start())
    yield service
    jp_asyncio_loop.run_until_complete(service.stop())
    stop_job_processes(service.state_dir / "run")


@pytest.fixture
def monitor(jp_serverapp: Any, engine: Any, jp_asyncio_loop: Any) -> Iterator[Any]:
    """The server's Monitor, started (pytest-jupyter does not run the extension's start hook),
    with fake GPUs 0 and 1 drained: other test runs on this machine use them."""
    m = jp_serverapp.web_app.settings["gpujobs_monitor"]
    jp_asyncio_loop.run_until_complete(m.start())
    for index in (0, 1):
        m.drain("localhost", index, True, "tests", "shared with other test runs")
    yield m
    # stop what a failed test left running through the engine, so whole job trees end
    for job in list(engine.running()):
        jp_asyncio_loop.run_until_complete(engine.cancel(job.id, job.user, wait_s=5))
    jp_asyncio_loop.run_until_complete(m.stop())


@pytest.fixture
def api(jp_fetch: Callable[..., Any], engine: Any) -> Callable[..., Any]:
    """`await api("GET", "jobs", body=...)` -> (status, JSON) without raising on 4xx."""
    from tornado.httpclient import HTTPClientError

    async def call(method: str, path: str, body: Any = None, raw: bytes | None = None,
                   params: dict[str, Any] | None = None) -> tuple[int, Any]:
        kwargs: dict[str, Any] = {"method": method}
        if raw is not None:
            kwargs["body"] = raw
        elif body is not None:
            kwargs["body"] = json.dumps(body)
        elif method in ("POST", "PUT"):
            kwargs["body"] = b""
        if params:
            kwargs["params"] = params
        if method == "DELETE":
            kwargs["allow_nonstandard_methods"] = True
        try:
            r = await jp_fetch("gpujobs", "api", *path.split("/"), **kwargs)
        except HTTPClientError as err:
            assert err.response is not None
            return err.code, json.loads(err.response.body or b"null")
        return r.code, json.loads(r.body or b"null")

    return call


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A folder every test user can enter and write, sticky as /tmp (pytest's tmp_path is
    root's alone), for tests of jobs run as real Unix users."""
    path = Path(f"/tmp/gpujobs-open-{os.getpid()}-{time.monotonic_ns()}")
    path.mkdir(mode=0o1777)
    os.chmod(path, 0o1777)
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=False)


@pytest.fixture
def live_server(tmp_path: Path) -> Iterator[Callable[..., LiveServer]]:
    """Factory: `live_server(fake_gpus="2xA100", config={...})` -> a started LiveServer.

    Call `.start()` again after `.kill()` to restart on the same database and state dir.
    """
    yield from live_servers(tmp_path)


@pytest.fixture
def events_sockets(jp_ws_fetch: Callable[..., Any]) -> Iterator[Callable[..., Any]]:
    """`await events_sockets("tok-bob")` -> the events websocket of that token's user on the
    in-process server (closed after the test)."""
    opened: list[Any] = []

    async def connect(token: str) -> Any:
        ws = await jp_ws_fetch("gpujobs", "api", "events", headers={"Authorization": f"token {token}"})
        opened.append(ws)
        return ws

    yield connect
    for ws in opened:
        ws.close()
