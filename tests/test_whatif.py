"""What-if before submitting (`POST jobs?dry_run=1`, `submit --test-only`, `%%gpujob --test-only`)
on real servers with fake GPUs: it is checked exactly as a submission (the same 400s), stores
and publishes nothing, and on a busy cluster says when the request would start - the start the
scheduler then gives it once submitted for real - and which nearby choices start sooner."""

from __future__ import annotations

import json
import random
import sys
import time
from typing import Any

import pytest
from servers import wait_for

from jupyter_gpujobs.engine.scheduler import schedule
from jupyter_gpujobs.engine.store.accounting import list_audit
from jupyter_gpujobs.engine.whatif import Shape, Timeline
from jupyter_gpujobs.model import GPU, Job, JobState, Policy, Reservation

PY = sys.executable
SLEEP = [PY, "-c", "import time; time.sleep(120)"]


@pytest.fixture
def gpujobs_config(gpujobs_config: dict[str, Any]) -> dict[str, Any]:
    return {**gpujobs_config, "fake_gpus": "2xA100,1xT4"}


async def dry(api: Any, body: dict[str, Any]) -> tuple[int, Any]:
    return await api("POST", "jobs", body, params={"dry_run": "1"})


async def running(api: Any, **spec: Any) -> dict[str, Any]:
    status, job = await api("POST", "jobs", {"command": SLEEP, "gpus": 1, **spec})
    assert status == 201, job

    async def started() -> Any:
        _, view = await api("GET", f"jobs/{job['id']}")
        return view if view["state"] == "RUNNING" else None

    return await wait_for(started, timeout=15)


async def test_dry_run_answers_and_stores_nothing(api: Any, engine: Any) -> None:
    seen: list[dict[str, Any]] = []
    engine.subscribe(seen.append)
    status, answer = await dry(api, {"command": ["true"], "gpus": 1, "gpu_type": "A100", "time_limit": "10m",
                                     "name": "probe"})
    assert status == 200, answer
    assert answer["dry_run"] is True and answer["alternatives"] == []
    assert answer["expected_start"] is not None and answer["expected_start"] - answer["now"] < 1, "free GPUs: now"
    assert answer["request"] == {"gpus": 1, "gpu_type": "A100", "time_limit_s": 600, "gpu_memory": None}
    status, listed = await api("GET", "jobs")
    assert status == 200 and listed["jobs"] == []
    status, queue = await api("GET", "queue")
    assert queue["total"] == 0
    assert engine.store.list_jobs()[0] == [] and not engine.active_jobs()
    assert seen == [], "a what-if publishes no event"
    assert list_audit(engine.store, 0, time.time() + 60) == [], "no audit row"


async def test_dry_run_begin_hold_array_and_dependency(api: Any, engine: Any) -> None:
    base = {"command": ["true"], "gpus": 1, "time_limit": "10m"}
    status, later = await dry(api, {**base, "begin": "+2h"})
    assert status == 200 and abs(later["expected_start"] - (later["now"] + 7200)) < 5, later
    status, held = await dry(api, {**base, "hold": True})
    assert held["expected_start"] is None and "held" in held["basis"]
    status, array = await dry(api, {**base, "array": "0-3"})
    assert array["tasks"] == 4 and array["expected_start"] - array["now"] < 1
    first = await running(api, gpu_type="T4", time_limit="30m")
    status, after = await dry(api, {**base, "depends": [f"afterok:{first['id']}"]})
    assert abs(after["expected_start"] - (first["started_at"] + 1800)) < 5, "after its dependency's limit"
    assert [j.id for j in engine.store.list_jobs()[0]] == [first["id"]], "only the real job is stored"
    await api("DELETE", f"jobs/{first['id']}")


@pytest.mark.parametrize("body", [
    {"command": ["true"], "gpus": -1},
    {"command": ["true"], "gpus": 1.5},
    {"command": ["true"], "gpu_type": "H100"},
    {"command": ["true"], "time_limit": "soon"},
    {"command": ["true"], "bogus": 1},
    {"command": ["true"], "cwd": "/no/such/folder"},
    {"command": ["true"], "depends": ["after:99999"]},
    {"gpus": 1},
])
async def test_dry_run_refuses_what_submit_refuses(api: Any, engine: Any, body: dict[str, Any]) -> None:
    real = await api("POST", "jobs", body)
    what_if = await dry(api, body)
    assert real[0] == 400, real
    assert what_if == real


async def test_dry_run_flag_is_checked(api: Any, engine: Any) -> None:
    status, body = await api("POST", "jobs", {"command": ["true"]}, params={"dry_run": "perhaps"})
    assert status == 400 and body["field"] == "dry_run", body
    status, job = await api("POST", "jobs", {"command": ["true"], "gpus": 0}, params={"dry_run": "0"})
    assert status == 201 and job["id"], "dry_run=0 is a real submission"


async def test_busy_cluster_start_and_nearby_choices(api: Any, engine: Any) -> None:
    """A100 0 holds a 0.5 share for 20m, A100 1 a whole job for 30m, and job W (1xA100, 30m)
    waits ahead: a 1xA100 request starts when the second A100 frees (30m, W takes the first at
    20m), as the scheduler then says once it is submitted; a share fits beside the running one
    now, and the T4 is free now."""
    share = await running(api, gpus=0.5, gpu_type="A100", time_limit="20m")
    whole = await running(api, gpu_type="A100", time_limit="30m")
    status, w = await api("POST", "jobs", {"command": SLEEP, "gpus": 1, "gpu_type": "A100", "time_limit": "30m"})
    assert status == 201

    async def estimated() -> Any:
        _, view = await api("GET", f"jobs/{w['id']}")
        return view if view["expected_start"] else None

    w = await wait_for(estimated, timeout=10)
    assert abs(w["expected_start"] - (share["started_at"] + 1200)) < 5, "W waits for the share's card"
    request = {"command": SLEEP, "gpus": 1, "gpu_type": "A100", "time_limit": "40m"}
    status, answer = await dry(api, request)
    assert status == 200, answer
    assert abs(answer["expected_start"] - (whole["started_at"] + 1800)) < 5, answer
    changes = {(a["change"], a["gpus"], a["gpu_type"]): a["expected_start"] - answer["now"]
               for a in answer["alternatives"]}
    assert set(changes) == {("a share of one GPU", 0.5, "A100"), ("a share of one GPU", 0.25, "A100"),
                            ("another GPU model", 1, "T4")}, answer["alternatives"]
    assert all(t < 1 for t in changes.values()), "each starts now"
    assert "behind every waiting job" in answer["basis"] and answer["expected_start_kind"] == "bound"
    # submitted for real, the scheduler gives it the start the what-if said
    status, job = await api("POST", "jobs", request)
    assert status == 201

    async def its_estimate() -> Any:
        _, view = await api("GET", f"jobs/{job['id']}")
        return view if view["expected_start"] else None

    view = await wait_for(its_estimate, timeout=10)
    assert abs(view["expected_start"] - answer["expected_start"]) < 5, (view["expected_start"], answer)
    # a shorter limit helps nobody here (no hole); fewer GPUs neither; a 2xA100 request would
    # wait for both, and 1xA100 (fewer GPUs) would start with the first
    status, two = await dry(api, {**request, "gpus": 2})
    assert status == 200 and two["expected_start"] >= answer["expected_start"]
    assert all(a["change"] != "a shorter time limit" for a in two["alternatives"])
    for job_id in (share["id"], whole["id"], w["id"], job["id"]):
        await api("DELETE", f"jobs/{job_id}")


def test_cli_test_only(live_server: Any) -> None:
    server = live_server(fake_gpus="1xA100,1xT4")
    holder = server.cli("submit", "-g", "1", "--type", "A100", "-t", "30m", "--json", "--", *SLEEP)
    assert holder.returncode == 0, holder.stderr
    holder_id = json.loads(holder.stdout)["id"]
    client = server.client()
    deadline = time.monotonic() + 15
    while client.job(holder_id)["state"] != "RUNNING":
        assert time.monotonic() < deadline, "the holder did not start"
        time.sleep(0.1)
    out = server.cli("submit", "--test-only", "-g", "1", "--type", "A100", "-t", "1h", "--", "python", "train.py")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("would start by ") and lines[0].endswith(" at the latest - nothing was submitted"), out.stdout
    assert lines[1].startswith("1xA100 by ") and lines[1].endswith("; 1xT4 now"), out.stdout
    as_json = server.cli("submit", "--test-only", "--json", "-g", "1", "--", "true")
    assert json.loads(as_json.stdout)["dry_run"] is True
    bad = server.cli("submit", "--test-only", "-g", "1", "--type", "H100", "--", "true")
    assert bad.returncode == 1 and "gpu_type" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    assert [j["id"] for j in client.jobs()["jobs"]] == [holder_id], "--test-only submitted nothing"
    # show gives its owner advice from their earlier runs of the name
    runs = [client.submit(["true"], gpus=1, gpu_type="T4", time_limit="2h", name="quick")["id"] for _ in range(2)]
    for job_id in runs:
        assert client.wait(job_id, timeout=30)["state"] == "COMPLETED"
    show = server.cli("show", str(runs[1]))
    again = server.cli("submit", "-g", "1", "--type", "T4", "-t", "2h", "--name", "quick", "--", "true")
    assert again.returncode == 0 and again.stdout.splitlines()[1].startswith("advice: 2 earlier runs: "), again.stdout
    advice = next(line for line in show.stdout.splitlines() if line.startswith("advice: "))
    assert advice.startswith("advice: 1 earlier run: ") and "ran <= " in advice and advice.endswith("10m would do"), advice
    client.cancel(holder_id)


def test_magic_test_only(live_server: Any, tmp_path: Any) -> None:
    from test_magics import Kernel

    server = live_server(fake_gpus="1xA100")
    kernel = Kernel(server, tmp_path)
    try:
        out = kernel.execute("%%gpujob --test-only -g 1 -t 10m\nprint('never runs')")
        assert out["error"] is None, out["error"]
        assert out["stdout"].startswith("would start now - nothing was submitted"), out["stdout"]
        assert "1xGPU now" in out["stdout"]
        bad = kernel.execute("%%gpujob --test-only -g 3\nprint('never runs')")
        assert bad["stderr"].startswith("UsageError: the engine refused the job: gpus"), bad
        assert server.client().jobs()["jobs"] == [], "nothing was submitted"
    finally:
        kernel.km.shutdown_kernel(now=True)


# ------------------------------------------------------------------ against the planner itself


USERS = ("ann", "ben", "cat")


def random_snapshot(seed: int) -> tuple[Any, ...]:
    """A random cluster (1-3 hosts of 8 GPUs, A100 or T4 by host), running and waiting jobs of
    three users (some asking for a model), limits on what one user runs at once or none, an
    advance reservation of another user or none, and the plan the scheduler made of them once
    it carried out its starts."""
    r = random.Random(seed)
    now = 1_000_000.0
    hosts = r.randint(1, 3)
    gpus = [GPU(h * 8 + i, f"u{h}-{i}", "A100" if h % 2 == 0 else "T4", host=f"h{h}", memory_total_mb=40960)
            for h in range(hosts) for i in range(8)]
    running, jid = [], 1
    for h in range(hosts):
        free = list(range(h * 8, h * 8 + 8))
        r.shuffle(free)
        while free and r.random() < 0.8:
            k = min(len(free), r.choice([1, 1, 2, 4]))
            limit = r.choice([600, 1800, 3600, 7200])
            running.append(Job(jid, r.choice(USERS), gpus=k, time_limit_s=limit, state=JobState.RUNNING, host=f"h{h}",
                               started_at=now - r.uniform(0, limit * 0.9), assigned_gpus=tuple(free.pop() for _ in range(k))))
            jid += 1
    pending = {}
    for n in range(r.randint(0, 40)):
        pending[jid] = Job(jid, r.choice(USERS), gpus=r.choice([1, 1, 2, 4]), gpu_type=r.choice([None, None, "A100", "T4"]),
                           time_limit_s=r.choice([600, 1800, 3600]), submitted_at=now - 1000 + n)
        jid += 1
    held = r.choice([(), (Reservation(1, r.choice([1, 2, 4]), now + r.choice([-600, 1200, 5400]), 3600,
                                      users=("dan",)),)])  # dan has no jobs: all the others are kept off
    policy = Policy(fairshare=False, weight_age=0.0, weight_size=0.0, weight_fairshare=0.0, preemption=False,
                    reservation_depth=r.choice([2, 5, 100]), user_max_gpus=r.choice([None, 4, 8]),
                    user_max_running_jobs=r.choice([None, 3]))
    plan = schedule(now, pending, running, gpus, policy, reservations=held)
    while plan.starts:  # the server carries out the starts, and its next cycle plans again
        for st in plan.starts:
            running.append(pending.pop(st.job_id).replace(state=JobState.RUNNING, started_at=now, host=st.host,
                                                         assigned_gpus=tuple(st.gpus)))
        plan = schedule(now, pending, running, gpus, policy, reservations=held)
    waiting = [pending[i] for i in plan.order]
    return r, now, gpus, running, waiting, plan, policy, jid, held


@pytest.mark.parametrize("seed", range(200))
def test_the_start_is_the_one_the_scheduler_gives(seed: int) -> None:
    """On random snapshots the what-if's start of a request is the expected start the pure
    scheduler gives that request once it is in the queue, behind the waiting jobs (and within
    its user's limits)."""
    r, now, gpus, running, waiting, plan, policy, jid, held = random_snapshot(seed)
    shape = Shape(r.choice([1, 2, 4]), r.choice([None, "A100", "T4"]), r.choice([600, 1800, 3600]))
    line = Timeline(now, gpus, running, waiting, plan.expected_start, policy, held)
    user = r.choice(USERS)
    asked = line.start(shape, now, now, user)
    request = Job(jid, user, gpus=shape.gpus, gpu_type=shape.gpu_type, time_limit_s=shape.time_limit_s,
                  submitted_at=now)
    then = schedule(now, {**{j.id: j for j in waiting}, jid: request}, running, gpus, policy, reservations=held)
    given = now if jid in {st.job_id for st in then.starts} else then.expected_start.get(jid)
    if given is None:  # no GPU here of the model it asks for
        assert shape.gpu_type not in {g.name for g in gpus} and asked == float("inf"), then.reasons.get(jid)
    else:
        assert asked == pytest.approx(given), (shape, asked - now, given - now)
