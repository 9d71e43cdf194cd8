"""A full disk under the store, and a read-only store: submissions are refused with 507 /
503 and a message naming the place ("disk full on <path>"), the log says so once a minute
(not a traceback per request or per poll), a job that ends meanwhile keeps its true outcome
(recorded once space returns, never LOST), and everything works again once it is freed.

The full disk is real: a small tmpfs mounted on the server's state directory (database, run
directories, logs) and filled up; this needs root, as CI runs."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from crash_harness import fill, mount_tmpfs
from servers import wait_job

PY = sys.executable


@pytest.fixture
def small_state_disk(live_server: Any) -> Iterator[Any]:
    """A server whose state directory is a 32 MiB tmpfs of its own."""
    server = live_server(fake_gpus="2xA100", start=False)
    trouble = mount_tmpfs(server.state_dir, "32m")
    if trouble:
        pytest.skip(trouble)
    try:
        yield server.start()
    finally:
        server.stop()
        from servers import stop_job_processes

        stop_job_processes(server.state_dir / "run")
        subprocess.run(["umount", "-l", str(server.state_dir)], check=False)


def _post_job(server: Any, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.url + "gpujobs/api/jobs", json=body, timeout=30,
                      headers={"Authorization": f"token {server.token}"})


def test_a_full_disk_is_said_once_and_loses_no_result(small_state_disk: Any) -> None:
    server = small_state_disk
    client = server.client()
    started = server.root / "started"  # outside the small disk
    ending = client.submit([PY, "-c", f"import time; open({str(started)!r}, 'w').close(); time.sleep(3)"], gpus=1,
                           name="ends while the disk is full")
    wait_job(client, ending["id"], lambda j: j["state"] == "RUNNING" and started.exists())
    log_before = server.server_log().count("\n")

    filler = fill(server.state_dir)
    for _ in range(40):
        r = _post_job(server, {"command": ["true"], "gpus": 1})
        assert r.status_code == 507, r.text
        assert r.json()["message"].startswith(f"disk full on {server.state_dir}"), r.json()
    out = server.cli("submit", "--gpus", "1", "--", "true")
    assert out.returncode != 0 and f"disk full on {server.state_dir}" in out.stderr + out.stdout, out
    assert "Unhandled" not in out.stderr + out.stdout

    time.sleep(5)  # the job ends meanwhile; its result cannot be written yet
    job = client.job(ending["id"])
    assert job["state"] == "RUNNING", job  # not LOST: the result is kept until it can be stored
    logged = server.server_log().splitlines()[log_before:]
    assert len(logged) <= 10, "\n".join(logged)
    assert sum("disk full on" in line for line in logged) == 1, "\n".join(logged)
    assert not any("Traceback" in line for line in logged), "\n".join(logged)

    filler.unlink()  # space returns
    done = wait_job(client, ending["id"], lambda j: j["state"] not in ("RUNNING", "PENDING"))
    assert done["state"] == "COMPLETED", done
    assert done["exit_code"] == 0
    later = client.submit([PY, "-c", "print('after')"], gpus=1)
    assert wait_job(client, later["id"], lambda j: j["state"] not in ("RUNNING", "PENDING"))["state"] == "COMPLETED"
    assert "writable again" in server.server_log()


def test_a_read_only_store_refuses_writes_with_503_and_still_answers_reads(live_server: Any,
                                                                           tmp_path: Path) -> None:
    server = live_server(fake_gpus="1xA100")
    client = server.client()
    job = client.submit([PY, "-c", "pass"], gpus=1)
    wait_job(client, job["id"], lambda j: j["state"] == "COMPLETED")
    server.stop()
    db = server.state_dir / "gpujobs.sqlite"
    # the same database, opened read-only (as on a read-only mount or replica)
    server.args.append(f"--GPUJobs.db_url=sqlite:///file:{db}?mode=ro&uri=true")
    server.start()
    client = server.client()
    assert client.job(job["id"])["state"] == "COMPLETED"
    r = _post_job(server, {"command": ["true"], "gpus": 1})
    assert r.status_code == 503, r.text
    assert "read-only" in r.json()["message"] and str(server.state_dir) in r.json()["message"], r.json()
    assert "Traceback" not in server.server_log().split("\n", 1)[-1]
