"""Retries of failed runs (issue 27, item 5), live on fake GPUs: a job with `retries: N` that
fails runs again after its backoff (doubling), at most N more times, each run an event and
counted in the job; one that succeeds on a retry completes; a cancel is never retried; bad
values are refused naming the field. Also the CLI's drain and undrain (item 6)."""

from __future__ import annotations

import sys
from typing import Any

from servers import wait_job

from jupyter_gpujobs.client import GPUJobsClient, GPUJobsError

PY = sys.executable


def _runs(client: GPUJobsClient, job_id: int) -> tuple[list[float], list[dict[str, Any]]]:
    """The start times of a job's runs and its retry events (back to the queue after a failure)."""
    events = client.events(job_id)
    starts = [e["time"] for e in events if e["state"] == "RUNNING"]
    retries = [e for e in events if e["state"] == "PENDING" and e["data"].get("retry")]
    return starts, retries


def test_retries_run_with_the_backoff_and_stop_at_the_count(live_server: Any) -> None:
    server = live_server(fake_gpus="1xA100")
    client = server.client()
    job_id = client.submit([PY, "-c", "import sys; print('try'); sys.exit(3)"], name="flaky", retries=2,
                           retry_backoff="1s")["id"]
    job = wait_job(client, job_id, ("FAILED", "COMPLETED", "CANCELLED"))
    assert (job["state"], job["exit_code"], job["retries"], job["retried"]) == ("FAILED", 3, 2, 2), job
    starts, retries = _runs(client, job_id)
    assert len(starts) == 3, starts  # the first run and two retries, no more
    assert [e["data"]["retry"] for e in retries] == [1, 2]
    assert "run 1 of 3 failed" in retries[0]["reason"] and "retry 1 of 2 after 1s" in retries[0]["reason"]
    assert "retry 2 of 2 after 2s" in retries[1]["reason"]
    # each retry started no sooner than its backoff after the failure (1 s, then 2 s)
    for retry, start in zip(retries, starts[1:]):
        assert start >= retry["data"]["retry_at"] - 0.01, (start, retry)
    out = server.cli("show", str(job_id))
    assert out.returncode == 0 and "retries: 2 of 2 used" in out.stdout and "run 2 of 3 failed" in out.stdout, out


def test_a_retry_that_succeeds_completes_and_a_cancel_is_not_retried(live_server: Any, tmp_path: Any) -> None:
    server = live_server(fake_gpus="1xA100")
    client = server.client()
    marker = tmp_path / "failed-once"
    once = f"import os, sys\nif not os.path.exists({str(marker)!r}):\n    open({str(marker)!r}, 'w').close()\n" \
           "    sys.exit(1)\nprint('second time lucky')"
    job_id = client.submit([PY, "-c", once], retries=3, retry_backoff="1s")["id"]
    job = wait_job(client, job_id, ("COMPLETED", "FAILED"))
    assert (job["state"], job["retried"]) == ("COMPLETED", 1), job
    assert len(_runs(client, job_id)[0]) == 2

    sleeper = client.submit([PY, "-c", "import time; time.sleep(600)"], retries=3, retry_backoff="1s")["id"]
    wait_job(client, sleeper, ("RUNNING",))
    assert client.cancel(sleeper)["state"] in ("CANCELLED", "RUNNING")
    job = wait_job(client, sleeper, ("CANCELLED", "FAILED", "PENDING"))
    assert (job["state"], job["retried"]) == ("CANCELLED", 0), job

    for body, field in (({"retries": -1}, "retries"), ({"retries": "many"}, "retries"), ({"retries": 101}, "retries"),
                        ({"retries": True}, "retries"), ({"retry_backoff": "soon"}, "retry_backoff"),
                        ({"retry_backoff": "2d"}, "retry_backoff"), ({"retry_oom": "yes"}, "retry_oom")):
        try:
            client.submit([PY, "-c", "pass"], **body)
            raise AssertionError(f"{body} was accepted")
        except GPUJobsError as err:
            assert err.status == 400 and err.field == field, (body, err.field, err.message)


def test_drain_and_undrain_from_the_cli(live_server: Any) -> None:
    server = live_server(fake_gpus="1xA100", users={"tok-root": "root", "tok-bob": "bob"},
                         config={"admin_users": ["root"]})
    bob = GPUJobsClient(url=server.url, token="tok-bob")
    out = server.cli("drain", "0", "--reason", "fan noise")
    assert out.returncode == 0 and "GPU 0 draining" in out.stdout, out
    assert [g["draining"] for g in bob.gpus()] == [True]
    out = server.cli("gpus")
    assert out.returncode == 0 and "draining (no new jobs)" in out.stdout, out
    job_id = bob.submit([PY, "-c", "print(1)"])["id"]
    wait_job(bob, job_id, lambda j: j["state"] == "PENDING" and "1 of 1 draining" in j["reason"])
    # only admins drain
    out = server.cli("--token", "tok-bob", "drain", "0")
    assert out.returncode != 0 and "admin" in out.stderr, out
    out = server.cli("undrain", "0")
    assert out.returncode == 0 and "GPU 0 handed out again" in out.stdout, out
    assert wait_job(bob, job_id, ("COMPLETED",))["state"] == "COMPLETED"
    assert [g["draining"] for g in bob.gpus()] == [False]


def test_out_of_memory_is_retried_only_when_asked(live_server: Any) -> None:
    server = live_server(fake_gpus="1xA100")
    client = server.client()
    hog = [PY, "-c", "x = bytearray(512 << 20); x[::4096] = b'1' * len(x[::4096]); print('fit')"]
    plain = client.submit(hog, mem="64M", retries=2, retry_backoff="1s")["id"]
    job = wait_job(client, plain, ("FAILED", "COMPLETED", "CANCELLED"))
    assert job["state"] == "FAILED" and "memory" in job["reason"], job
    assert (job["retried"], len(_runs(client, plain)[0])) == (0, 1)  # out of memory: not retried unless asked
    asked = client.submit(hog, mem="64M", retries=1, retry_backoff="1s", retry_oom=True)["id"]
    job = wait_job(client, asked, ("FAILED", "COMPLETED", "CANCELLED"))
    assert (job["state"], job["retried"], len(_runs(client, asked)[0])) == ("FAILED", 1, 2), job
    assert "memory" in _runs(client, asked)[1][0]["reason"]
