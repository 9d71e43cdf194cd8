"""A cancel during a preemption's grace wins: the job ends CANCELLED, recorded as cancelled by
its owner, and is never requeued or run again. And a job is told the grace it will really get
when preempted (GPUJOBS_PREEMPT_GRACE), apart from the one at its time limit or a cancel
(GPUJOBS_KILL_GRACE)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from jupyter_gpujobs.client import GPUJobsClient

PY = sys.executable
TESTS = Path(__file__).parent

#: Ignores SIGTERM (so it lives through the whole grace); a second run would say so.
STUBBORN = """
import os, signal, sys, time
marker = sys.argv[1]
if os.path.exists(marker):
    print('second run', flush=True)
    sys.exit(0)
open(marker, 'w').write('x')
def term(*_):
    print('got SIGTERM; preempt grace', os.environ['GPUJOBS_PREEMPT_GRACE'],
          'kill grace', os.environ.get('GPUJOBS_KILL_GRACE'), flush=True)
signal.signal(signal.SIGTERM, term)
print('first run', flush=True)
time.sleep(120)
"""


def _wait(client: GPUJobsClient, job_id: int, pred: Any, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        job = client.job(job_id)
        if pred(job):
            return job
        assert time.monotonic() < deadline, (job["state"], job["reason"], client.log(job_id)["data"])
        time.sleep(0.1)


def test_cancel_during_the_preemption_grace_wins(live_server: Any, tmp_path: Path) -> None:
    users = {"tok-alice": "alice", "tok-bob": "bob"}
    server = live_server(
        fake_gpus="2xA100",
        config={"user_identity": "jupyter", "user_quotas": json.dumps({"alice": {"guaranteed_gpus": 2}}),
                "preempt_min_runtime": 0},
        extra_args=["--ServerApp.identity_provider_class=identity.TokenUsers",
                    f"--TokenUsers.users={json.dumps(users)}"],
        start=False,
    )
    server.args[server.args.index("--GPUJobs.preempt_grace=1")] = "--GPUJobs.preempt_grace=6"
    server.env["PYTHONPATH"] = str(TESTS) + ":" + server.env.get("PYTHONPATH", "")
    server.token = "tok-bob"
    server.start()
    bob = GPUJobsClient(url=server.url, token="tok-bob")
    alice = GPUJobsClient(url=server.url, token="tok-alice")

    first = bob.submit([PY, "-c", "import time; time.sleep(60)"], gpus=1, name="steady")
    _wait(bob, first["id"], lambda j: j["state"] == "RUNNING")
    victim = bob.submit([PY, "-c", STUBBORN, str(tmp_path / "marker")], gpus=1, name="borrower")
    assert _wait(bob, victim["id"], lambda j: j["state"] == "RUNNING")["borrowed"] is True
    _wait(bob, victim["id"], lambda j: "first run" in bob.log(j["id"])["data"])

    alice.submit([PY, "-c", "import time; time.sleep(1)"], gpus=1, name="guaranteed")
    _wait(bob, victim["id"], lambda j: "got SIGTERM" in bob.log(j["id"])["data"])  # the grace runs
    stopping = time.monotonic()
    answer = bob.cancel(victim["id"])
    assert answer["state"] in ("RUNNING", "CANCELLED")

    done = _wait(bob, victim["id"], lambda j: j["state"] not in ("RUNNING", "PENDING"), timeout=30)
    assert done["state"] == "CANCELLED", done
    assert done["reason"] == "cancelled by bob"
    assert time.monotonic() - stopping >= 3, "it had the rest of its preemption grace"
    time.sleep(2)  # nothing brings it back
    again = bob.job(victim["id"])
    assert again["state"] == "CANCELLED" and again["restarts"] == 0
    log = bob.log(victim["id"])["data"]
    assert "second run" not in log
    # the grace it was told is the one it got when preempted (6 s), not the kill grace (1 s)
    assert "got SIGTERM; preempt grace 6 kill grace 1" in log, log
    events = bob.events(victim["id"])
    assert [e["state"] for e in events if e["state"] in ("PENDING", "RUNNING", "CANCELLED")] == [
        "PENDING", "RUNNING", "CANCELLED"]
    assert any(e["state"] == "STOPPING" and e["actor"] == "bob" and "cancelled by bob" in e["reason"]
               for e in events), events
