"""Preemption on a live server: a borrowed job is reclaimed by a job within its owner's
guarantee, receives SIGTERM, is requeued with its history, and later completes; victims that
ignore SIGTERM are stopped once, and the GPUs they free go to their preemptor."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from servers import wait_job

from jupyter_gpujobs.client import GPUJobsClient

PY = sys.executable

VICTIM = """
import os, signal, sys, time
marker = sys.argv[1]
if os.path.exists(marker):
    print('second run: finishing', flush=True)
    sys.exit(0)
open(marker, 'w').write('x')
def term(*_):
    print('got SIGTERM; grace', os.environ.get('GPUJOBS_PREEMPT_GRACE'), flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, term)
print('first run', flush=True)
time.sleep(60)
"""


def _alice_and_bob(live_server: Any, config: dict[str, Any]) -> tuple[GPUJobsClient, GPUJobsClient]:
    """Clients of alice and bob on a server of 2 GPUs with these settings."""
    server = live_server(fake_gpus="2xA100", config=config, users={"tok-bob": "bob", "tok-alice": "alice"})
    return GPUJobsClient(url=server.url, token="tok-alice"), GPUJobsClient(url=server.url, token="tok-bob")


def test_borrowed_job_is_preempted_and_requeued(live_server: Any, tmp_path: Path) -> None:
    alice, bob = _alice_and_bob(live_server, {"user_quotas": json.dumps({"alice": {"guaranteed_gpus": 2}}),
                                              "preempt_min_runtime": 0})
    assert bob.whoami()["user"] == "bob" and alice.whoami()["user"] == "alice"

    first = bob.submit([PY, "-c", "import time; time.sleep(8)"], gpus=1, name="steady")
    wait_job(bob, first["id"], lambda j: j["state"] == "RUNNING")
    victim = bob.submit([PY, "-c", VICTIM, str(tmp_path / "marker")], gpus=1, name="borrower")
    v = wait_job(bob, victim["id"], lambda j: j["state"] == "RUNNING")
    assert v["borrowed"] is True
    wait_job(bob, victim["id"], lambda j: "first run" in bob.log(j["id"])["data"])  # it runs before it is reclaimed

    mine = alice.submit([PY, "-c", "import time; time.sleep(1)"], gpus=1, name="guaranteed")
    requeued = wait_job(bob, victim["id"], lambda j: j["state"] == "PENDING" or j.get("restarts", 0) > 0)
    assert f"preempted by job {mine['id']}" in requeued["reason"] or requeued["restarts"] == 1

    done = wait_job(bob, victim["id"], lambda j: j["state"] not in ("PENDING", "RUNNING"), timeout=40)
    assert done["state"] == "COMPLETED"
    assert alice.job(mine["id"])["state"] == "COMPLETED"
    assert bob.job(first["id"])["state"] in ("RUNNING", "COMPLETED"), "the older job lost no work"

    log = bob.log(victim["id"])["data"]
    assert "first run" in log and "got SIGTERM; grace 1" in log and "second run: finishing" in log
    events = bob.events(victim["id"])
    states = [e["state"] for e in events if e["state"] in ("PENDING", "RUNNING", "COMPLETED")]
    assert states == ["PENDING", "RUNNING", "PENDING", "RUNNING", "COMPLETED"]
    why = [e for e in events if e["state"] == "PENDING"][1]["reason"]
    assert why.startswith(f"preempted by job {mine['id']}"), why


STUBBORN = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: print('ignoring SIGTERM', flush=True))
marker = sys.argv[1]
first = not os.path.exists(marker)
open(marker, 'a').write('x')
print('run', flush=True)
time.sleep(60 if first else 4)
"""


def test_victims_that_ignore_sigterm_are_stopped_once_and_their_gpus_go_to_the_preemptor(
        live_server: Any, tmp_path: Path) -> None:
    """No ping-pong: bob's borrowed jobs ignore SIGTERM and are older than alice's job, so in
    queue order (by age alone) they come first when requeued. Alice's job must still start
    once their grace is over (not after they restart and are preempted again), and each of
    them restarts once, after her job."""
    grace = 3
    alice, bob = _alice_and_bob(live_server, {
        "user_quotas": json.dumps({"alice": {"guaranteed_gpus": 2}}),
        "fairshare": False, "weight_size": 0, "preempt_grace": grace, "preempt_min_runtime": 0})
    victims = [bob.submit([PY, "-c", STUBBORN, str(tmp_path / f"marker{i}")], gpus=1, name=f"borrower{i}")["id"]
               for i in range(2)]
    for v in victims:
        assert wait_job(bob, v, lambda j: j["state"] == "RUNNING")["borrowed"] is True
        wait_job(bob, v, lambda j: "run" in bob.log(j["id"])["data"])

    mine = alice.submit([PY, "-c", "import time; time.sleep(3)"], gpus=2, name="guaranteed")["id"]
    started = wait_job(alice, mine, lambda j: j["state"] != "PENDING", timeout=60)
    waited = started["started_at"] - started["submitted_at"]
    assert grace - 0.5 <= waited <= grace + 5, f"the preemptor waited {waited:.1f}s for a {grace}s grace"
    assert started["state"] in ("RUNNING", "COMPLETED")

    for v in victims:
        done = wait_job(bob, v, lambda j: j["state"] not in ("PENDING", "RUNNING"), timeout=60)
        assert done["state"] == "COMPLETED" and done["restarts"] == 1, done
        runs = [e for e in bob.events(v) if e["state"] == "RUNNING"]
        assert len(runs) == 2 and runs[1]["time"] >= started["started_at"], "restarted after the preemptor"
    assert alice.job(mine)["state"] == "COMPLETED"
