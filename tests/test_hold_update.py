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
    out = server.cli("list", "--all")
    assert out.returncode == 0 and f"{held}" in out.stdout and "HELD" in out.stdout, out

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
