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

from servers import wait_job

from jupyter_gpujobs.client import GPUJobsClient

PY = sys.executable

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


def test_cancel_during_the_preemption_grace_wins(live_server: Any, tmp_path: Path) -> None:
    server = live_server(fake_gpus="2xA100", users={"tok-bob": "bob", "tok-alice": "alice"},
                         config={"user_quotas": json.dumps({"alice": {"guaranteed_gpus": 2}}),
                                 "preempt_min_runtime": 0, "preempt_grace": 6})
    bob = GPUJobsClient(url=server.url, token="tok-bob")
    alice = GPUJobsClient(url=server.url, token="tok-alice")

    first = bob.submit([PY, "-c", "import time; time.sleep(60)"], gpus=1, name="steady")
    wait_job(bob, first["id"], lambda j: j["state"] == "RUNNING")
    victim = bob.submit([PY, "-c", STUBBORN, str(tmp_path / "marker")], gpus=1, name="borrower")
    assert wait_job(bob, victim["id"], lambda j: j["state"] == "RUNNING")["borrowed"] is True
    wait_job(bob, victim["id"], lambda j: "first run" in bob.log(j["id"])["data"])

    alice.submit([PY, "-c", "import time; time.sleep(1)"], gpus=1, name="guaranteed")
    wait_job(bob, victim["id"], lambda j: "got SIGTERM" in bob.log(j["id"])["data"])  # the grace runs
    stopping = time.monotonic()
    answer = bob.cancel(victim["id"])
    assert answer["state"] in ("RUNNING", "CANCELLED")

    done = wait_job(bob, victim["id"], lambda j: j["state"] not in ("RUNNING", "PENDING"), timeout=30)
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


#: Lives through SIGTERM (it saves nothing); says so each second, and how long it has run.
SURVIVOR = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: print('got SIGTERM', flush=True))
print('run', flush=True)
began = time.monotonic()
while True:
    time.sleep(1)
    print(f'alive {time.monotonic() - began:.0f}', flush=True)
"""


def test_a_cancelled_preemptors_victim_is_not_killed(live_server: Any, tmp_path: Path) -> None:
    # issue 32: alice's guaranteed job preempts bob's borrowed one, then alice cancels it in the
    # grace: nothing else needs the GPU, so the preemption is withdrawn and bob's job runs on,
    # neither killed at the end of the grace nor requeued
    server = live_server(fake_gpus="2xA100", users={"tok-bob": "bob", "tok-alice": "alice"},
                         config={"user_quotas": json.dumps({"alice": {"guaranteed_gpus": 2}}),
                                 "preempt_min_runtime": 0, "preempt_grace": 4})
    bob = GPUJobsClient(url=server.url, token="tok-bob")
    alice = GPUJobsClient(url=server.url, token="tok-alice")
    first = bob.submit([PY, "-c", "import time; time.sleep(120)"], gpus=1, name="steady")
    wait_job(bob, first["id"], lambda j: j["state"] == "RUNNING")
    victim = bob.submit([PY, "-c", SURVIVOR], gpus=1, name="borrower")
    assert wait_job(bob, victim["id"], lambda j: j["state"] == "RUNNING")["borrowed"] is True
    wait_job(bob, victim["id"], lambda j: "run" in bob.log(j["id"])["data"])

    mine = alice.submit([PY, "-c", "import time; time.sleep(60)"], gpus=1, name="guaranteed")
    wait_job(bob, victim["id"], lambda j: "got SIGTERM" in bob.log(j["id"])["data"])
    alice.cancel(mine["id"])
    resumed = wait_job(bob, victim["id"], lambda j: any(e["state"] == "RESUMED" for e in bob.events(j["id"])))
    assert resumed["state"] == "RUNNING"
    # well past its 4 s grace it still runs, its first run, and was stopped once
    wait_job(bob, victim["id"], lambda j: "alive 9" in bob.log(j["id"])["data"] or j["state"] != "RUNNING")
    job = bob.job(victim["id"])
    assert job["state"] == "RUNNING" and job["restarts"] == 0, job
    assert bob.log(victim["id"])["data"].count("run\n") == 1
    events = bob.events(victim["id"])
    assert [e["state"] for e in events if e["state"] in ("STOPPING", "RESUMED", "PENDING")] == [
        "PENDING", "STOPPING", "RESUMED"], events
    assert f"job {mine['id']}" in [e for e in events if e["state"] == "RESUMED"][0]["reason"]
    assert alice.job(mine["id"])["state"] == "CANCELLED"
    bob.cancel(victim["id"])
