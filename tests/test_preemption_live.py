"""Preemption on a live server: a borrowed job is reclaimed by a job within its owner's
guarantee, receives SIGTERM, is requeued with its history, and later completes."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from jupyter_gpujobs.client import GPUJobsClient

PY = sys.executable
TESTS = Path(__file__).parent

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


def _wait(client: GPUJobsClient, job_id: int, pred: Any, timeout: float = 20) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        job = client.job(job_id)
        if pred(job):
            return job
        assert time.monotonic() < deadline, (job["state"], job["reason"], client.log(job_id)["data"])
        time.sleep(0.1)


def test_borrowed_job_is_preempted_and_requeued(live_server: Any, tmp_path: Path) -> None:
    users = {"tok-alice": "alice", "tok-bob": "bob"}
    server = live_server(
        fake_gpus="2xA100",
        config={"user_identity": "jupyter", "user_quotas": json.dumps({"alice": {"guaranteed_gpus": 2}})},
        extra_args=["--ServerApp.identity_provider_class=identity.TokenUsers",
                    f"--TokenUsers.users={json.dumps(users)}"],
        start=False,
    )
    server.env["PYTHONPATH"] = str(TESTS) + ":" + server.env.get("PYTHONPATH", "")
    server.token = "tok-bob"
    server.start()
    bob = GPUJobsClient(url=server.url, token="tok-bob")
    alice = GPUJobsClient(url=server.url, token="tok-alice")
    assert bob.whoami()["user"] == "bob" and alice.whoami()["user"] == "alice"

    first = bob.submit([PY, "-c", "import time; time.sleep(8)"], gpus=1, name="steady")
    _wait(bob, first["id"], lambda j: j["state"] == "RUNNING")
    victim = bob.submit([PY, "-c", VICTIM, str(tmp_path / "marker")], gpus=1, name="borrower")
    v = _wait(bob, victim["id"], lambda j: j["state"] == "RUNNING")
    assert v["borrowed"] is True
    deadline = time.monotonic() + 20
    while "first run" not in bob.log(victim["id"])["data"]:  # it really runs before it is reclaimed
        assert time.monotonic() < deadline
        time.sleep(0.1)

    mine = alice.submit([PY, "-c", "import time; time.sleep(1)"], gpus=1, name="guaranteed")
    requeued = _wait(bob, victim["id"], lambda j: j["state"] == "PENDING" or j.get("restarts", 0) > 0)
    assert f"preempted by job {mine['id']}" in requeued["reason"] or requeued["restarts"] == 1

    done = _wait(bob, victim["id"], lambda j: j["state"] not in ("PENDING", "RUNNING"), timeout=40)
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
