"""The urgent reserve against a guarantee, live (issue 32): 4 GPUs, 1 kept for urgent work,
alice guaranteed 2, bob borrowing 3. Alice's 2-GPU job preempts two of bob's; the GPUs (and the
room outside the reserve) they free stay hers while the other victim stops, so a victim
requeued meanwhile does not restart on them (or on the reserve's GPU) and get preempted again:
alice starts once both have stopped, and each victim is stopped once."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from servers import wait_job

from jupyter_gpujobs.client import GPUJobsClient

PY = sys.executable

#: Runs until told to stop; on SIGTERM it takes `sys.argv[1]` seconds to save its work, then
#: exits. A second run (after a requeue) finishes at once.
VICTIM = """
import os, signal, sys, time
marker = sys.argv[2]
if os.path.exists(marker):
    print('second run', flush=True)
    time.sleep(600)
open(marker, 'w').write('x')
def term(*_):
    time.sleep(float(sys.argv[1]))
    sys.exit(143)
signal.signal(signal.SIGTERM, term)
print('first run', flush=True)
time.sleep(600)
"""


def test_a_guarantee_beyond_the_full_urgent_reserve_starts_once_its_victims_stop(
        live_server: Any, tmp_path: Path) -> None:
    server = live_server(fake_gpus="4xA100", users={"tok-bob": "bob", "tok-alice": "alice"},
                         config={"user_quotas": json.dumps({"alice": {"guaranteed_gpus": 2}}),
                                 "urgent_reserve_gpus": 1, "preempt_min_runtime": 0, "preempt_grace": 20})
    bob = GPUJobsClient(url=server.url, token="tok-bob")
    alice = GPUJobsClient(url=server.url, token="tok-alice")

    bobs = []
    # the oldest loses the most work (kept); of the other two one stops at once, one in 3 s
    for n, save_s in enumerate((0, 0, 3)):
        job = bob.submit([PY, "-c", VICTIM, str(save_s), str(tmp_path / f"marker{n}")], gpus=1, name=f"b{n}")
        assert wait_job(bob, job["id"], lambda j: j["state"] == "RUNNING")["borrowed"] is True
        wait_job(bob, job["id"], lambda j: "first run" in bob.log(j["id"])["data"])
        bobs.append(job["id"])
    fourth = bob.submit([PY, "-c", "print(1)"], gpus=1, name="b3")
    assert "urgent" in wait_job(bob, fourth["id"], lambda j: "urgent" in j["reason"])["reason"]
    bob.cancel(fourth["id"])

    mine = alice.submit([PY, "-c", "import time; time.sleep(600)"], gpus=2, name="guaranteed")
    got = wait_job(alice, mine["id"], lambda j: j["state"] == "RUNNING", timeout=60)
    assert len(got["assigned_gpus"]) == 2

    # each victim was stopped once, and neither runs again while alice runs
    for job_id in bobs[1:]:
        events = bob.events(job_id)
        assert sum(1 for e in events if e["state"] == "STOPPING") == 1, events
        assert bob.job(job_id)["state"] == "PENDING"
    assert bob.job(bobs[0])["state"] == "RUNNING"
    used = [g for j in (bob.job(bobs[0]), got) for g in j["assigned_gpus"]]
    assert len(set(used)) == 3, used  # the reserve's GPU stays free for urgent work
