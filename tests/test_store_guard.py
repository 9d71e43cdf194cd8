"""One store, one engine; a damaged store is refused, never replaced (issue 32, items 7 and 8).

Real Jupyter servers: a second server on the first one's SQLite store starts no engine and
answers 503 naming the first (pid, host, how to stop it); an empty (0 bytes) or unreadable
store file is refused with 503 naming the file and how to restore it, and left as it was;
`jupyter gpujobs doctor` says the same."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import httpx
import pytest
from servers import LiveServer, wait_job


def _on_state_dir(server: LiveServer, state_dir: Path) -> LiveServer:
    server.args = [f"--GPUJobs.state_dir={state_dir}" if a.startswith("--GPUJobs.state_dir=") else a
                   for a in server.args]
    return server


def _refusal(server: LiveServer) -> str:
    r = httpx.get(server.url + "gpujobs/api/jobs", headers={"Authorization": f"token {server.token}"}, timeout=10)
    assert r.status_code == 503, r.text
    return str(r.json()["message"])


def test_a_second_server_on_one_store_starts_no_engine_and_names_the_first(live_server: Any) -> None:
    first = live_server(fake_gpus="1xA100")
    second = _on_state_dir(live_server(fake_gpus="1xA100", start=False), first.state_dir).start(status=503)
    message = _refusal(second)
    assert first.proc is not None
    assert f"pid {first.proc.pid} on host {socket.gethostname()}" in message, message
    assert f"kill {first.proc.pid}" in message and str(first.state_dir / "gpujobs.sqlite") in message
    # submitting to the second is refused too: no job is accepted that nobody would run
    r = httpx.post(second.url + "gpujobs/api/jobs", json={"command": ["true"], "gpus": 0},
                   headers={"Authorization": f"token {second.token}"}, timeout=10)
    assert r.status_code == 503
    # the first goes on as before
    client = first.client()
    job = client.submit(["true"], gpus=0, time_limit="1m")
    assert wait_job(client, job["id"], ("COMPLETED", "FAILED"))["state"] == "COMPLETED"
    # once the first is gone, a server on the store starts its engine and sees the job
    first.stop()
    third = _on_state_dir(live_server(fake_gpus="1xA100", start=False), first.state_dir).start()
    assert third.client().job(job["id"])["state"] == "COMPLETED"


@pytest.mark.parametrize("content", [b"", b"this is not a database\n" * 200], ids=["empty", "garbage"])
def test_a_damaged_store_is_refused_and_left_as_it_was(live_server: Any, tmp_path: Path, content: bytes) -> None:
    state = tmp_path / "damaged"
    state.mkdir(mode=0o700)
    database = state / "gpujobs.sqlite"
    database.write_bytes(content)
    server = _on_state_dir(live_server(fake_gpus="1xA100", start=False), state).start(status=503)
    message = _refusal(server)
    assert str(database) in message and "backup" in message, message
    assert ("empty (0 bytes)" if not content else "damaged") in message
    out = server.cli("doctor")
    assert out.returncode == 1 and str(database) in out.stdout and "backup" in out.stdout, out.stdout
    server.stop()
    assert database.read_bytes() == content  # never a new empty store over it
