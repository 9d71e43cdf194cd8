"""File-descriptor exhaustion (issue 32, item 5): a server started at a 1024 soft limit raises
it to the hard one (and says so in GET info and doctor), answers while 1,100 idle connections
are open, and closes idle connections after c.GPUJobs.connection_idle_timeout; a repeated log
line is written once per interval, with a count."""

from __future__ import annotations

import logging
import resource
import socket
from typing import Any

import httpx
import pytest
from servers import wait_until


def test_a_repeated_error_is_logged_once_per_interval_with_a_count() -> None:
    from jupyter_gpujobs.engine.connections import RepeatFilter

    now = [0.0]
    f = RepeatFilter(60.0, clock=lambda: now[0])

    def record(msg: str, *args: Any, level: int = logging.ERROR) -> logging.LogRecord:
        return logging.LogRecord("jupyter_gpujobs", level, __file__, 1, msg, args, None)

    assert f.filter(record("accept failed: fd %d: Too many open files", 1000))
    assert not any(f.filter(record("accept failed: fd %d: Too many open files", 1001 + i)) for i in range(500))
    assert f.filter(record("another error"))  # another shape passes
    assert f.filter(record("an info line", level=logging.INFO)) and f.filter(record("an info line", level=logging.INFO))
    now[0] = 61.0
    summary = record("accept failed: fd %d: Too many open files", 2000)
    assert f.filter(summary)
    assert summary.getMessage() == ("accept failed: fd 2000: Too many open files "
                                    "[500 more like this in the last 61s were not logged]")


def test_a_flood_of_idle_connections_neither_starves_the_server_nor_stays(live_server: Any) -> None:
    """At a 1024 soft limit (raised at start), 1,100 idle and 50 half-sent connections: the server
    answers meanwhile and closes them all after its timeouts, logging that once."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 4096:
        raise AssertionError(f"the test needs a hard open-files limit of 4096 or more (it is {hard})")
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))  # what the server inherits, as under many inits
    try:
        # (jupyter_server raises a soft limit below its min_open_files_limit to 4096: not here)
        server = live_server(fake_gpus="1xA100", config={"connection_idle_timeout": 3, "connection_body_timeout": 3},
                             extra_args=["--ServerApp.min_open_files_limit=0"])
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    info = server.client().info()
    assert info["open_files"]["raised_from"] == 1024 and info["open_files"]["soft"] == hard, info
    out = server.cli("doctor")
    assert f"limit {hard} (raised at start from 1024)" in out.stdout, out.stdout

    idle: list[socket.socket] = []
    try:
        for i in range(1150):
            s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            if i >= 1100:  # half-sent: a body promised that never comes
                s.sendall(b"POST /gpujobs/api/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
            idle.append(s)
        r = httpx.get(server.url + "gpujobs/api/whoami", headers={"Authorization": f"token {server.token}"},
                      timeout=30)
        assert r.status_code == 200
        for s in idle:
            s.settimeout(60)
        # the server closes each idle connection (recv sees its end) once its idle timeout passed
        open_ = set(idle)

        def all_closed() -> bool:
            open_.difference_update([s for s in list(open_) if _closed_by_peer(s)])
            return not open_

        wait_until(all_closed, timeout=120, what="the server closing 1,100 idle and 50 half-sent connections")
        # one log line for the 50 timed-out bodies, not one each
        assert server.server_log().count("Timeout reading body") == 1, server.server_log()[-3000:]
    finally:
        for s in idle:
            s.close()


def _closed_by_peer(s: socket.socket) -> bool:
    """Whether the server closed its end (recv sees the end of the stream)."""
    s.setblocking(False)
    try:
        return s.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def test_the_shared_engine_caps_the_connections_of_one_user() -> None:
    """The shared engine's socket: one Unix user's flood of connections is cut at
    c.GPUJobs.max_connections_per_user; another user still gets through."""
    from team import USERS, Team, missing

    if missing() is not None:
        pytest.skip(str(missing()))
    with Team(fake_gpus="1xA100", users=(), engine_args=["--GPUJobs.max_connections_per_user=20"]) as team:
        held = []
        try:
            for _ in range(20):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect(str(team.socket))
                held.append(s)
            extra = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            extra.connect(str(team.socket))
            held.append(extra)
            wait_until(lambda: _closed_by_peer(extra), timeout=30, what="the engine closing root's 21st connection")
            assert all(not _closed_by_peer(s) for s in held[:20])
            code = (f"import httpx, json; c = httpx.Client(transport=httpx.HTTPTransport(uds={str(team.socket)!r}), "
                    "base_url='http://x/gpujobs/api/'); print(json.dumps(c.get('whoami').status_code))")
            assert team.run_as(USERS[0], code) == 200  # another user is not held back by root's flood
        finally:
            for s in held:
                s.close()
        with team.socket_client() as c:  # root's own connections closed: root gets through again
            assert wait_until(lambda: _answers(c), timeout=30, what="root answered again")
        assert "closed another" in team.engine_log.read_text()


def _answers(c: httpx.Client) -> bool:
    try:
        return c.get("whoami").status_code == 200
    except httpx.HTTPError:
        return False
