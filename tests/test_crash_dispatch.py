"""Crash-safe dispatch: a server SIGKILLed while it starts jobs. The next server on the same
state finds every run by its run directory: a run that never started goes back to the queue
(and runs once), a run that did start is reattached and recorded. No job is called LOST while
it runs, none runs twice, and no GPU is handed to a second job while the first still runs."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any

import pytest
from crash_harness import check, kill_during_burst, kill_job_processes, read_runs, recording_command

from jupyter_gpujobs.engine.runners import NOT_STARTED_REASON

TESTS = Path(__file__).parent
CRASH_EXTENSION = "--ServerApp.jpserver_extensions=crash_on_start=True"


def _crash_at_first_start(live_server: Any, when: str, runs: Path) -> tuple[Any, dict[str, Any]]:
    """A one-GPU server that SIGKILLs itself as it starts a job (`when`: before or after the
    job's supervisor is spawned), restarted without the crash; returns it and the job."""
    server = live_server(fake_gpus="1xA100", start=False)
    server.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), server.env.get("PYTHONPATH")]))
    server.env["CRASH_ON_START"] = when
    server.args.append(CRASH_EXTENSION)
    server.start()
    job = server.client().submit(recording_command(runs, 1.5), gpus=1, begin=time.time() + 1.0)
    assert server.proc is not None
    assert server.proc.wait(timeout=30) == -9, "the server was to kill itself as it started the job"
    server.args.remove(CRASH_EXTENSION)
    server.start()
    return server, job


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_crash_while_a_job_starts_neither_loses_it_nor_runs_it_twice(live_server: Any, tmp_path: Path,
                                                                        when: str) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    server, job = _crash_at_first_start(live_server, when, runs)
    client = server.client()
    # a second job wants the only GPU: it must wait for the first job's run to end
    second = client.submit(recording_command(runs, 0.2), gpus=1)
    counts = check(client, [job["id"], second["id"]], runs, timeout=60)
    assert counts.failures == 0, counts.details
    first = client.job(job["id"])
    assert first["state"] == "COMPLETED", first
    assert client.job(second["id"])["state"] == "COMPLETED"
    assert len([r for r in read_runs(runs) if r["job"] == job["id"]]) == 1, "ran exactly once"
    reasons = [(e["state"], e["reason"]) for e in client.events(job["id"])]
    if when == "before":  # never started: back to the queue, saying why, then run
        assert ("PENDING", NOT_STARTED_REASON) in reasons, reasons
        assert [s for s, _ in reasons if s in ("RUNNING", "PENDING", "COMPLETED")] == [
            "PENDING", "RUNNING", "PENDING", "RUNNING", "COMPLETED"]
    else:  # it started: the restarted server found it and recorded its end
        assert [s for s, _ in reasons if s in ("RUNNING", "PENDING", "COMPLETED")] in (
            ["PENDING", "RUNNING", "COMPLETED"],
            # it may also have been stopped before its process started, and queued again
            ["PENDING", "RUNNING", "PENDING", "RUNNING", "COMPLETED"])
    assert not any(s == "LOST" for s, _ in reasons)


def test_sigkill_during_a_burst_loses_nothing_and_holds_no_gpu_twice(live_server: Any, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    server = live_server(fake_gpus="32xA100")
    try:
        counts = kill_during_burst(server, runs, cycles=3, tasks=32, seconds=1.0, rng=random.Random(15))
    finally:
        kill_job_processes(runs)
    assert counts.acknowledged == 96
    assert counts.failures == 0, counts.details
