"""Hold, release and update of jobs (issue 27, item 4), live on fake GPUs: a held job never
starts while GPUs are free (other jobs start and end past it), stays held across a restart,
and starts at release; `PATCH jobs/{id}` changes a pending job's fields within the rules and
extends a running job's time limit, refused with the reason when it would run into a
reservation; owners change their own jobs, admins anyone's; the CLI's hold, release, update."""

from __future__ import annotations

import sys
import time
from typing import Any

from servers import wait_job, wait_until

from jupyter_gpujobs.client import GPUJobsClient, GPUJobsError
from jupyter_gpujobs.engine.scheduler import schedule
from jupyter_gpujobs.model import GPU, Dependency, Job, Policy
from jupyter_gpujobs.notebook.cells import describe

PY = sys.executable
QUICK = [PY, "-c", "print('ran')"]


def _refused(call: Any, status: int, field: str | None = None, words: str = "") -> str:
    try:
        call()
    except GPUJobsError as err:
        assert err.status == status, (err.status, err.message)
        assert field is None or err.field == field, (err.field, err.message)
        assert words in err.message, err.message
        return err.message
    raise AssertionError("not refused")


def test_the_scheduler_places_no_held_job() -> None:
    """Pure: a held job is not eligible (a free GPU stays free, no expected start, it says why);
    a job that depends on it waits for it; one behind it starts."""
    now = 1_000_000.0
    held = Job(1, "bob", held=True, submitted_at=now, time_limit_s=60)
    after = Job(2, "bob", submitted_at=now, time_limit_s=60, depends=(Dependency("afterok", 1),))
    behind = Job(3, "alice", submitted_at=now + 1, time_limit_s=60)
    for estimate in (True, False):
        plan = schedule(now, [held, after, behind], [], [GPU(0, "u0", "A100"), GPU(1, "u1", "A100")], Policy(),
                        estimate=estimate)
        assert [s.job_id for s in plan.starts] == [3]
        assert plan.reasons[1].startswith("held") and plan.expected_start.get(1) is None
        assert plan.reasons[2] == "waiting for job 1 (afterok)"
    plan = schedule(now, [held.replace(held=False), after], [], [GPU(0, "u0", "A100")], Policy())
    assert [s.job_id for s in plan.starts] == [1]


def test_a_held_job_never_starts_while_gpus_are_free_and_starts_at_release(live_server: Any) -> None:
    server = live_server(fake_gpus="1xA100", users={"tok-root": "root", "tok-bob": "bob", "tok-alice": "alice"},
                         config={"admin_users": ["root"]})
    bob = GPUJobsClient(url=server.url, token="tok-bob")
    alice = GPUJobsClient(url=server.url, token="tok-alice")
    held = bob.submit(QUICK, name="held", begin="+1h")["id"]
    assert bob.hold(held)["state"] == "HELD"
    assert bob.hold(held)["state"] == "HELD"  # again: nothing changes
    # its begin comes: it is still held
    assert bob.update(held, begin=None)["begin"] is None
    held_at_submit = bob.submit(QUICK, name="held-too", hold=True)["id"]
    # jobs submitted after them start and end on the free GPU, the held ones stay HELD
    for n in range(2):
        wait_job(bob, bob.submit(QUICK, name=f"after{n}")["id"], ("COMPLETED",))
    for job_id in (held, held_at_submit):
        job = bob.job(job_id)
        assert (job["state"], job["held"], job["started_at"]) == ("HELD", True, None), job
        assert job["reason"].startswith("held"), job
    # everyone sees it HELD (the queue view), only its owner or an admin may release it
    assert alice.job(held)["state"] == "HELD"
    _refused(lambda: alice.release(held), 403, words="belongs to bob")
    page = bob.queue_page()
    assert page["held"] == 2 and {j["id"]: j["state"] for j in page["jobs"]} == {held: "HELD", held_at_submit: "HELD"}
    # the CLI's tables and the notebook's widgets say HELD
    assert describe(bob.job(held)) == f"job {held} HELD: it starts once released (jupyter gpujobs release {held})"
    out = server.cli("list", "--all", "--state", "HELD")
    assert out.returncode == 0 and f"{held}" in out.stdout and "HELD" in out.stdout, out
    assert sorted(j["id"] for j in bob.jobs(state="HELD")["jobs"]) == sorted([held, held_at_submit])
    assert {held, held_at_submit} <= {j["id"] for j in bob.jobs(state="PENDING")["jobs"]}  # still pending, held

    # held across a restart (the store keeps it)
    server.kill()
    server.start()
    wait_job(bob, bob.submit(QUICK, name="after-restart")["id"], ("COMPLETED",))
    assert bob.job(held)["state"] == "HELD"

    out = server.cli("release", str(held), str(held_at_submit))  # root: an admin
    assert out.returncode == 0 and f"job {held} PENDING" in out.stdout, out
    for job_id in (held, held_at_submit):
        assert wait_job(bob, job_id, ("COMPLETED",))["held"] is False
    states = [e["state"] for e in bob.events(held)]
    assert states[:5] == ["PENDING", "HELD", "UPDATED", "RELEASED", "RUNNING"], states
    assert [e["actor"] for e in bob.events(held) if e["state"] in ("HELD", "RELEASED")] == ["bob", "root"]
    # only a pending job may be held
    _refused(lambda: bob.hold(held), 409, "state", "only a pending job")
    out = server.cli("hold", str(held))
    assert out.returncode == 1 and "only a pending job may be held" in out.stderr, out


def test_update_a_pending_job_within_the_rules(live_server: Any) -> None:
    server = live_server(fake_gpus="1xA100", users={"tok-root": "root", "tok-bob": "bob", "tok-alice": "alice"},
                         config={"admin_users": ["root"], "max_time_limit": "2h",
                                 "priority_tiers": {"high": ["alice"], "urgent": []}})
    bob = GPUJobsClient(url=server.url, token="tok-bob")
    alice = GPUJobsClient(url=server.url, token="tok-alice")
    job_id = bob.submit(QUICK, name="a", time_limit="10m", begin="+1h")["id"]
    job = bob.update(job_id, time_limit="1h", name="b", priority="low")
    assert (job["time_limit_s"], job["name"], job["priority"], job["state"]) == (3600, "b", "low", "PENDING")
    updated = [e for e in bob.events(job_id) if e["state"] == "UPDATED"]
    assert len(updated) == 1 and "time limit 10m -> 1h" in updated[0]["reason"], updated

    # bad values: 4xx naming the field
    _refused(lambda: bob.update(job_id, time_limit="3h"), 400, "time_limit", "over the maximum")
    _refused(lambda: bob.update(job_id, time_limit="soon"), 400, "time_limit")
    _refused(lambda: bob.update(job_id, begin="tomorrow"), 400, "begin")
    _refused(lambda: bob.update(job_id, gpus=2), 400, "gpus", "cannot be changed")
    _refused(lambda: bob.update(job_id), 400, "body")
    _refused(lambda: bob.update(job_id, name="x\x1b[2J"), 400, "name")
    # a class bob may not submit with, he may not raise his job to (priority tiers)
    _refused(lambda: bob.update(job_id, priority="high"), 403, "priority", "not open to bob")
    _refused(lambda: bob.update(job_id, priority="urgent"), 403, "priority")
    # another's job: only an admin may change it
    _refused(lambda: alice.update(job_id, name="mine"), 403, words="belongs to bob")
    out = server.cli("update", str(job_id), "--priority", "high", "--begin", "now")
    assert out.returncode == 0 and "priority high" in out.stdout, out
    assert wait_job(bob, job_id, ("COMPLETED",))["priority"] == "high"
    _refused(lambda: bob.update(job_id, name="late"), 409, "state", "ended")
    _refused(lambda: bob.update(999999, name="x"), 404)


def test_extend_a_running_job_unless_it_pushes_back_a_reservation(live_server: Any, tmp_path: Any) -> None:
    server = live_server(fake_gpus="1xA100", users={"tok-root": "root", "tok-bob": "bob", "tok-alice": "alice"},
                         config={"admin_users": ["root"], "kill_grace": 1})
    bob = GPUJobsClient(url=server.url, token="tok-bob")
    admin = server.client()
    # a run that outlives its first limit: it completes only if the limit was extended
    go = tmp_path / "go"
    wait_for_go = f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)\nprint('done')"
    job_id = bob.submit([PY, "-c", wait_for_go], name="long", time_limit="8s")["id"]
    wait_job(bob, job_id, ("RUNNING",))
    job = bob.update(job_id, time_limit="10m")
    assert job["time_limit_s"] == 600 and job["state"] == "RUNNING" and job["ends_at"] == job["started_at"] + 600
    # past the first limit and its kill grace, it still runs
    wait_until(lambda: time.time() > job["started_at"] + 8 + 1 + 1, what="the first limit and its grace passed")
    assert bob.job(job_id)["state"] == "RUNNING"

    # a reservation of the GPU for alice from 20 minutes on: running into it is refused
    admin.reserve(1, "+20m", "1h", users=["alice"], name="alice-demo")
    message = _refused(lambda: bob.update(job_id, time_limit="30m"), 409, "time_limit", "reservation alice-demo")
    assert "reserved for user alice" in message, message
    assert bob.job(job_id)["time_limit_s"] == 600
    # up to its start is fine; shorter too, but not below what it already ran
    assert bob.update(job_id, time_limit="15m")["time_limit_s"] == 900
    _refused(lambda: bob.update(job_id, time_limit="1s"), 409, "time_limit", "has run")
    _refused(lambda: bob.update(job_id, begin="+1h"), 409, "begin", "already running")
    go.write_text("")
    done = wait_job(bob, job_id, ("COMPLETED", "TIMEOUT", "FAILED"))
    assert done["state"] == "COMPLETED", done
    assert bob.log(job_id)["data"].strip().endswith("done")


def test_an_extension_that_pushes_back_a_guaranteed_job_is_refused(live_server: Any, tmp_path: Any) -> None:
    """Alice is guaranteed the GPU but may not preempt (no preemption here): her job waits for
    bob's to end, so bob may not run longer; once she has nothing waiting, he may."""
    server = live_server(fake_gpus="1xA100", users={"tok-root": "root", "tok-bob": "bob", "tok-alice": "alice"},
                         config={"admin_users": ["root"], "preemption": False,
                                 "user_quotas": {"alice": {"guaranteed_gpus": 1}}})
    bob = GPUJobsClient(url=server.url, token="tok-bob")
    alice = GPUJobsClient(url=server.url, token="tok-alice")
    job_id = bob.submit([PY, "-c", "import time; time.sleep(600)"], name="long", time_limit="10m")["id"]
    wait_job(bob, job_id, ("RUNNING",))
    hers = alice.submit(QUICK, name="hers", time_limit="5m")["id"]
    wait_job(alice, hers, lambda j: j["state"] == "PENDING" and j["expected_start"])
    message = _refused(lambda: bob.update(job_id, time_limit="20m"), 409, "time_limit", f"push back job {hers}")
    assert "alice" in message and "guarantee" in message, message
    assert bob.job(job_id)["time_limit_s"] == 600
    alice.cancel(hers)
    assert bob.update(job_id, time_limit="20m")["time_limit_s"] == 1200
    bob.cancel(job_id)
