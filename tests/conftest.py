"""Shared test fixtures: a real Jupyter server with the extension on fake GPUs.

Two ways to get one:
- `jp_fetch` / `jp_serverapp` (pytest-jupyter): the server runs in the test's own event loop.
  Talk to it with `jp_fetch`, `AsyncGPUJobsClient`, or asyncio subprocesses — a blocking call
  (the sync client, `subprocess.run`) from the test would stall the server it waits for.
- `live_server(...)`: a separate `jupyter server` process, for restarts, the CLI, kernels and
  anything that blocks. It is stopped (or SIGKILLed by the test) at the end.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from servers import FAKE_GPUS, LiveServer, live_servers, stop_job_processes

pytest_plugins = ("pytest_jupyter.jupyter_server",)


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
def live_server(tmp_path: Path) -> Iterator[Callable[..., LiveServer]]:
    """Factory: `live_server(fake_gpus="2xA100", config={...})` -> a started LiveServer.

    Call `.start()` again after `.kill()` to restart on the same database and state dir.
    """
    yield from live_servers(tmp_path)
