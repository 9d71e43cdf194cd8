"""Expected starts that say what they are, on a real server with the monitor and fake GPUs.

With no history an expected start is a bound from the time limits of the jobs ahead ("by
14:05 at the latest"); once the monitor has seen jobs like the one running, it is a
prediction from their runtimes ("about 13:40"), and the API says which (`expected_start_kind`).
Every waiting job with history behind the jobs ahead has a range (`expected_start_range`, from
the spread of those runtimes) and, when its start moved, a note saying why
(`expected_start_note`). The pure parts first: the planner's ranges, the notes."""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from typing import Any

import pytest
from servers import wait_for

from jupyter_gpujobs.engine.scheduler import schedule
from jupyter_gpujobs.engine.scheduler.estimates import moved_notes, overdue_jobs
from jupyter_gpujobs.model import GPU, Job, JobState, Policy

PY = sys.executable
NOW = 1_800_000_000.0


def _running(jid: int, host: str, index: int, started: float, predicted: float,
             spread: tuple[float, float] | None = None) -> Job:
    return Job(id=jid, user="u", gpus=1, state=JobState.RUNNING, host=host, assigned_gpus=(index,),
               started_at=started, submitted_at=started, time_limit_s=3600, predicted_runtime_s=predicted,
               predicted_runtime_range=spread)


def test_a_waiting_jobs_range_comes_from_the_spread_of_the_runtimes_ahead() -> None:
    # one GPU; the running job and each waiting one run 60 s as a rule, 30 to 120 s (10th-90th)
    gpus = [GPU(0, "g0", "A100")]
    running = [_running(1, "localhost", 0, NOW - 10, 60, (30, 120))]
    waiting = [Job(id=i, user="u", gpus=1, submitted_at=NOW - 5 + i, time_limit_s=3600, predicted_runtime_s=60,
                   predicted_runtime_range=(30, 120)) for i in (2, 3)]
    plan = schedule(NOW, waiting, running, gpus, Policy())
    assert plan.expected_start == {2: NOW + 50, 3: NOW + 110} and plan.predicted == {2, 3}
    assert plan.expected_range == {2: (NOW + 20, NOW + 110), 3: (NOW + 50, NOW + 230)}
    # past its 90th percentile a running job is bounded by its time limit only; the range
    # still holds the expected start ("as long again")
    late = [_running(1, "localhost", 0, NOW - 200, 60, (30, 120))]
    plan = schedule(NOW, waiting[:1], late, gpus, Policy())
    assert plan.expected_start == {2: NOW + 60} and plan.expected_range == {2: (NOW, NOW - 200 + 3600)}


def test_a_job_running_past_its_prediction_ends_with_the_owners_longer_runs() -> None:
    # the owner's runs of it took 5, 10 or 15 min or about 3 h (median 10 min); it has run 1 h:
    # it is one of the 3-h ones, so the job behind it starts at its start + the median of
    # those (3 h 10 min), not 10 min from now. Past every run: as long again as its prediction
    gpus = [GPU(0, "g0", "A100")]
    runs = (300.0, 600.0, 900.0, 10800.0, 12000.0)
    waiting = [Job(id=2, user="u", gpus=1, submitted_at=NOW - 5, time_limit_s=3600, predicted_runtime_s=60)]

    def running(ran: float) -> list[Job]:
        return [Job(id=1, user="u", gpus=1, state=JobState.RUNNING, host="localhost", assigned_gpus=(0,),
                    started_at=NOW - ran, submitted_at=NOW - ran, time_limit_s=4 * 3600,
                    predicted_runtime_s=600, predicted_runtimes=runs)]

    plan = schedule(NOW, waiting, running(3600), gpus, Policy())
    assert plan.expected_start == {2: NOW - 3600 + 11400} and plan.predicted == {2}
    plan = schedule(NOW, waiting, running(200), gpus, Policy())  # not past it: its prediction
    assert plan.expected_start == {2: NOW - 200 + 600}
    plan = schedule(NOW, waiting, running(13000), gpus, Policy())
    assert plan.expected_start == {2: NOW + 600}
    # on the late line of ranges it ends no earlier than that, even when its owner's 90th
    # percentile is earlier (2.5 h): the job behind the next one may start as late as 3 h 10 min
    # + that one's limit
    spread = [replace(running(3600)[0], predicted_runtime_range=(400.0, 9000.0))]
    third = Job(id=3, user="u", gpus=1, submitted_at=NOW - 4, time_limit_s=3600, predicted_runtime_s=60)
    plan = schedule(NOW, [*waiting, third], spread, gpus, Policy())
    assert plan.expected_start == {2: NOW + 7800, 3: NOW + 7860}
    assert plan.expected_range == {2: (NOW, NOW + 7800), 3: (NOW + 60, NOW + 7800 + 3600)}


def test_a_job_whose_owners_runs_spread_is_predicted_and_ends_with_the_longer_ones() -> None:
    # the owner's runs of it took about a minute or 1-2 h: their median lies between, but the
    # prediction is as sure as a steady history's, so a job of it that has run 30 min ends with
    # the long runs (the median of those longer than 30 min), not at its time limit (4 h). When
    # the spread made the prediction unconfident, the job behind it was told 4 h
    from jupyter_gpujobs.engine.monitor.predict import RuntimePredictor
    from jupyter_gpujobs.sim import predicted_job

    predictor = RuntimePredictor()
    for runtime in (50.0, 60.0, 70.0, 3600.0, 4800.0, 6000.0, 7200.0):
        predictor.add(("u", "train", ""), runtime)
    p = predictor.predict(("u", "train", ""))
    assert p.seconds == 3600.0 and p.confidence >= 0.6
    base = Job(id=1, user="u", gpus=1, state=JobState.RUNNING, host="localhost", assigned_gpus=(0,),
               started_at=NOW - 1800, submitted_at=NOW - 1800, time_limit_s=4 * 3600)
    running = predicted_job(base, p, min_confidence=0.6)
    assert running.predicted_runtime_s == 3600.0 and running.predicted_runtimes == p.runs_s
    waiting = [Job(id=2, user="v", gpus=1, submitted_at=NOW - 5, time_limit_s=3600)]
    plan = schedule(NOW, waiting, [running], [GPU(0, "g0", "A100")], Policy())
    assert plan.expected_start == {2: NOW - 1800 + 3600} and plan.predicted == {2}
    plan = schedule(NOW, waiting, [replace(running, started_at=NOW - 4000)], [GPU(0, "g0", "A100")], Policy())
    assert plan.expected_start == {2: NOW - 4000 + 6000}  # past its prediction: the median of 4800-7200 s


def test_a_replays_drawn_time_limits_do_not_tell_the_runtime() -> None:
    # `typical_limit` of a 20-min job is always 1 h; drawn limits (over 8x at most) range from
    # 1 h to 4 h for it, the same draws for the same job, and never under the runtime
    from jupyter_gpujobs.sim import drawn_limit, simulate, typical_limit

    limits = [drawn_limit(1200, jid) for jid in range(200)]
    assert set(limits) == {3600, 4 * 3600} and typical_limit(1200) == 3600
    assert limits == [drawn_limit(1200, jid) for jid in range(200)]
    assert all(drawn_limit(d, 7) >= d for d in (1, 899, 901, 86400, 10**6))
    with pytest.raises(ValueError, match="limits must be 'rounded' or 'drawn'"):
        simulate([], Policy(), 1, 1, limits="exact")


def test_a_wide_job_ahead_keeps_only_the_gpus_it_starts_on_from_the_jobs_behind() -> None:
    # host a frees one GPU in 10 s, its other in 100 s; host b both in 20 and 30 s. The 2-GPU
    # job first in line starts in 30 s (on b); the 1-GPU job behind it is not held until then:
    # the GPU free in 10 s is left to it, as backfill gives it
    gpus = [GPU(i, f"{h}{i}", "A100", host=h) for h in "ab" for i in (0, 1)]
    running = [_running(1, "a", 0, NOW, 10), _running(2, "a", 1, NOW, 100),
               _running(3, "b", 0, NOW, 20), _running(4, "b", 1, NOW, 30)]
    wide = Job(id=5, user="v", gpus=2, submitted_at=NOW - 20, time_limit_s=3600, predicted_runtime_s=600)
    one = Job(id=6, user="w", gpus=1, submitted_at=NOW - 10, time_limit_s=3600, predicted_runtime_s=600)
    plan = schedule(NOW, [wide, one], running, gpus, Policy(fairshare=False, weight_size=0.0))
    assert plan.order == [5, 6]
    assert plan.expected_start == {5: NOW + 30, 6: NOW + 10}


def test_a_short_job_behind_a_wide_one_is_predicted_in_the_hole_it_leaves() -> None:
    # one host: a GPU free in 10 s, the other in 100 s; the 2-GPU job first in line starts in
    # 100 s, and its GPU free in 10 s idles until then: a 30-s job behind it fits there (as
    # backfill starts it), a 200-s one does not and starts after the wide job
    gpus = [GPU(i, f"g{i}", "A100") for i in (0, 1)]
    running = [_running(1, "localhost", 0, NOW, 10), _running(2, "localhost", 1, NOW, 100)]
    wide = Job(id=5, user="v", gpus=2, submitted_at=NOW - 30, time_limit_s=3600, predicted_runtime_s=600)
    short = Job(id=6, user="w", gpus=1, submitted_at=NOW - 20, time_limit_s=3600, predicted_runtime_s=30)
    long = Job(id=7, user="x", gpus=1, submitted_at=NOW - 10, time_limit_s=3600, predicted_runtime_s=200)
    plan = schedule(NOW, [wide, short, long], running, gpus, Policy(fairshare=False, weight_size=0.0))
    assert plan.order == [5, 6, 7]
    assert plan.expected_start == {5: NOW + 100, 6: NOW + 10, 7: NOW + 700}


def test_an_overdue_start_moves_and_the_note_names_the_job_running_past_its_prediction() -> None:
    over = _running(7, "localhost", 0, NOW - 300, 60)
    assert overdue_jobs([over, _running(8, "localhost", 1, NOW - 10, 60)], NOW) == [7]
    # told NOW - 30, still waiting: it moved (overdue), whatever the size of the step
    refs, notes = moved_notes({2: NOW - 30, 3: NOW + 600}, {}, {2: NOW + 20, 3: NOW + 630}, NOW, [7])
    assert notes == {2: "passed 30s ago while it waited: moved later by 50s: job 7 is running past its predicted end"}
    assert refs == {2: NOW + 20, 3: NOW + 600}  # (3 moved by less than max(60 s, 10 %): told nothing new)
    # small steps add up against the start last told, and a note stays until the next move
    refs, notes = moved_notes(refs, notes, {2: NOW + 25, 3: NOW + 700}, NOW, [])
    assert refs == {2: NOW + 20, 3: NOW + 700} and notes[2].startswith("passed 30s ago")
    assert notes[3] == ("moved later by 1m40s: jobs ahead ran longer than predicted, or jobs of a higher "
                        "priority came")
    refs, notes = moved_notes(refs, notes, {3: NOW + 100}, NOW, [])
    assert notes == {3: "moved earlier by 10m: jobs ahead ended sooner than predicted"}


@pytest.fixture
def gpujobs_config(gpujobs_config: dict[str, Any]) -> dict[str, Any]:
    # the monitor fixture drains GPUs 0 and 1 (other test runs use them): GPU 2 is the one left;
    # a prediction from three runs of 2, 4 and 6 s is confident enough to count (0.375)
    return {**gpujobs_config, "fake_gpus": "3xA100", "estimate_interval": 0.5, "predict_min_confidence": 0.3}


async def submit(api: Any, seconds: float, **spec: Any) -> dict[str, Any]:
    body = {"command": [PY, "-c", f"import time; time.sleep({seconds})"], "gpus": 1, "time_limit": "10m", **spec}
    status, job = await api("POST", "jobs", body)
    assert status == 201, job
    return job


async def view(api: Any, job_id: int) -> dict[str, Any]:
    status, job = await api("GET", f"jobs/{job_id}")
    assert status == 200, job
    return job


async def test_an_expected_start_is_a_bound_until_history_makes_it_a_prediction(api: Any, engine: Any,
                                                                                 monitor: Any) -> None:
    # no history: the waiting job is expected when the blocker's time limit ends, at the latest
    blocker = await submit(api, 30, name="blocker")

    async def running(job_id: int) -> Any:
        job = await view(api, job_id)
        return job if job["state"] == "RUNNING" else None

    b = await wait_for(lambda: running(blocker["id"]), timeout=20)
    waiting = await submit(api, 1, name="next")

    async def estimated() -> Any:
        job = await view(api, waiting["id"])
        return job if job["expected_start"] is not None else None

    w = await wait_for(estimated, timeout=10)
    assert w["expected_start_kind"] == "bound"
    assert abs(w["expected_start"] - (b["started_at"] + 600)) < 2
    await api("DELETE", f"jobs/{blocker['id']}")
    await api("DELETE", f"jobs/{waiting['id']}")

    # three quick runs of "quick" teach the monitor that it takes about a second
    for _ in range(3):
        job = await submit(api, 0.5, name="quick")

        async def done(job_id: int = job["id"]) -> Any:
            j = await view(api, job_id)
            return j if j["state"] == "COMPLETED" else None

        await wait_for(done, timeout=30)

    # a "quick" one that runs long: the job behind it is predicted to start about when
    # "quick" runs end, long before the bound its time limit gives
    slow = await submit(api, 30, name="quick")
    s = await wait_for(lambda: running(slow["id"]), timeout=20)
    behind = await submit(api, 1, name="next")

    async def predicted() -> Any:
        job = await view(api, behind["id"])
        return job if job["expected_start_kind"] == "prediction" else None

    p = await wait_for(predicted, timeout=10)
    assert p["state"] == "PENDING" and p["expected_start"] < s["started_at"] + 600 - 60
    assert p["expected_start"] < time.time() + 60
    status, queue = await api("GET", "queue")
    assert status == 200
    assert [j["expected_start_kind"] for j in queue["jobs"] if j["id"] == behind["id"]] == ["prediction"]
    for i in (slow["id"], behind["id"]):
        await api("DELETE", f"jobs/{i}")


async def _history(api: Any, monitor: Any, name: str, seconds: list[float]) -> None:
    """Runs of `name` one after the other, until the monitor has seen every one of them."""
    from jupyter_gpujobs.engine.monitor.predict import job_key

    job: dict[str, Any] = {}
    for sec in seconds:
        job = await submit(api, sec, name=name)

        async def done(job_id: int = job["id"]) -> Any:
            j = await view(api, job_id)
            return j if j["state"] == "COMPLETED" else None

        await wait_for(done, timeout=30)
    key = job_key(job["user"], name, job["command"], job["gpu_type"])
    await wait_for(lambda: monitor.predictor.predict(key).runs == len(seconds) or None, timeout=10)


async def test_a_waiting_jobs_range_holds_its_real_start(api: Any, engine: Any, monitor: Any) -> None:
    await _history(api, monitor, "spread", [2, 4, 6])
    blocker = await submit(api, 4, name="spread")
    waiting = await submit(api, 1, name="after-spread")

    async def ranged() -> Any:
        job = await view(api, waiting["id"])
        return job if job["state"] == "PENDING" and job["expected_start_range"] else None

    w = await wait_for(ranged, timeout=20)
    b = await view(api, blocker["id"])
    assert b["state"] == "RUNNING" and w["expected_start_kind"] == "prediction"
    lo, hi = w["expected_start_range"]
    # from the blocker's start: its runs' 10th and 90th percentile (2.4 and 5.6 s, and each
    # run's own start-up), not its time limit (10 min)
    assert b["started_at"] + 2 <= lo < w["expected_start"] < hi < b["started_at"] + 10, (b, w)

    async def started() -> Any:
        job = await view(api, waiting["id"])
        return job if job["started_at"] else None

    s = await wait_for(started, timeout=30)
    assert lo <= s["started_at"] <= hi, (lo, s["started_at"], hi)


async def test_an_overdue_start_moves_and_says_which_job_held_it(api: Any, engine: Any, monitor: Any) -> None:
    await _history(api, monitor, "brief", [0.5, 0.5, 0.5])
    slow = await submit(api, 60, name="brief")  # predicted to take about a second
    behind = await submit(api, 1, name="after-brief")

    async def estimated() -> Any:
        job = await view(api, behind["id"])
        return job if job["expected_start_kind"] == "prediction" else None

    first = (await wait_for(estimated, timeout=20))["expected_start"]
    assert first < time.time() + 10

    async def noted() -> Any:
        job = await view(api, behind["id"])
        return job if job["expected_start_note"] else None

    n = await wait_for(noted, timeout=30)
    assert n["state"] == "PENDING" and n["expected_start"] > first, n
    assert f"job {slow['id']} is running past its predicted end" in n["expected_start_note"], n
    assert n["expected_start_note"].startswith("passed "), n
    for i in (slow["id"], behind["id"]):
        await api("DELETE", f"jobs/{i}")
