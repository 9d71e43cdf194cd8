"""No job waits for ever behind fair-share or backfill (issue 33): age that grows without bound,
and every job that has waited its time limit goes first, oldest first (bookings that lighter
users' jobs and backfill cannot push back)."""

from __future__ import annotations

from dataclasses import replace

from jupyter_gpujobs.engine.scheduler import Usage, schedule
from jupyter_gpujobs.engine.scheduler.priority import QueueOrder
from jupyter_gpujobs.model import GPU, Job, JobState, Policy
from jupyter_gpujobs.sim import POLICIES, TraceJob, simulate

NOW = 1_700_000_000.0
#: the default before issue 33: age capped at 1, no job due
CAPPED = Policy(age_max=1.0, oldest_first=False, preemption=False)
HEAVY = Usage({"heavy": 1e7, "light": 1.0})


def gpus(per_host: int = 8) -> list[GPU]:
    return [GPU(i, f"g{i}", "A100", host="h0") for i in range(per_host)]


def pending(jid: int, user: str, n: int, waited: float, limit: int = 3600) -> Job:
    return Job(id=jid, user=user, gpus=n, submitted_at=NOW - waited, time_limit_s=limit)


def running(jid: int, idx: int, ends_in: float) -> Job:
    return Job(id=jid, user="light", gpus=1, state=JobState.RUNNING, host="h0", assigned_gpus=(idx,),
               started_at=NOW - 100, time_limit_s=int(100 + ends_in), submitted_at=NOW - 200)


def test_a_due_wide_job_keeps_its_booking_against_lighter_users() -> None:
    """A heavy user's 8-GPU job that waited past its limit goes first and holds the host: a light
    user's newer job that would run into its booking does not start on the GPU that is free."""
    busy = [running(100 + i, i, 600 + 60 * i) for i in range(7)]  # GPU 7 is free
    wide = pending(1, "heavy", 8, waited=7200)
    narrow = pending(2, "light", 1, waited=60, limit=7200)
    plan = schedule(NOW, [wide, narrow], busy, gpus(), Policy(preemption=False), HEAVY)
    assert plan.order == [1, 2] and plan.starts == []
    assert plan.expected_start[1] == NOW + 600 + 60 * 6  # when the last running job's limit ends
    # before issue 33 fair-share put the light job first, and it took the free GPU
    old = schedule(NOW, [wide, narrow], busy, gpus(), CAPPED, HEAVY)
    assert old.order == [2, 1] and [s.job_id for s in old.starts] == [2]
    # not yet due (waited less than its limit): fair-share orders it as before
    young = replace(wide, submitted_at=NOW - 1800)
    assert schedule(NOW, [young, narrow], busy, gpus(), Policy(preemption=False), HEAVY).order == [2, 1]


def test_age_outgrows_fair_share() -> None:
    """Age has no cap: a heavy user's job that waited 30 days is ahead of a light user's new job
    (fair-share is worth at most weight_fairshare / weight_age x age_saturation_s of waiting)."""
    old = pending(1, "heavy", 1, waited=30 * 86400, limit=10**8)
    new = pending(2, "light", 1, waited=10)
    policy = Policy(oldest_first=False, preemption=False)
    assert schedule(NOW, [old, new], [], gpus(1), policy, HEAVY).order == [1, 2]
    assert schedule(NOW, [old, new], [], gpus(1), CAPPED, HEAVY).order == [2, 1]


def test_every_job_that_waited_its_limit_goes_first_oldest_first() -> None:
    """All of a heavy user's 8-GPU jobs that waited past their limit go ahead of a light user's
    newer ones, oldest first. Before, only the oldest job of each GPU count was due: the rest of
    the heavy user's burst stayed behind every lighter user's job, and formed the tail of a
    synthetic mix (benchmarks/replay.py, p99 wait 1.6x fifo+backfill's)."""
    jobs = [pending(1, "heavy", 8, waited=3 * 3600), pending(2, "heavy", 8, waited=2.5 * 3600),
            pending(3, "heavy", 8, waited=2 * 3600), pending(4, "light", 8, waited=600, limit=4 * 3600),
            pending(5, "light", 1, waited=60)]
    assert QueueOrder.compute(NOW, jobs, Policy(), HEAVY, 8).ids()[:3] == [1, 2, 3]
    # without due jobs, fair-share puts the light user's jobs first
    assert set(QueueOrder.compute(NOW, jobs, Policy(oldest_first=False), HEAVY, 8).ids()[:2]) == {4, 5}


def test_a_kept_order_places_a_requeued_due_job_first() -> None:
    """Whether a job is due depends on it and the time only, so a kept order stays valid when
    jobs leave or arrive, and a requeued job that waited past its limit (it keeps its submit
    time) is placed first."""
    jobs = [pending(1, "light", 1, waited=60), pending(2, "heavy", 8, waited=1800)]
    order = QueueOrder.compute(NOW, jobs, Policy(), HEAVY, 8)
    assert order.ids() == [1, 2]
    assert order.arrange(jobs[1:]) is not None
    arranged = order.arrange(jobs + [pending(9, "heavy", 1, waited=2 * 3600)])
    assert arranged is not None and [j.id for j in arranged[0]] == [9, 1, 2]


def test_a_wide_job_is_not_passed_for_ever_by_a_stream_of_narrow_ones() -> None:
    """Replayed on 2 hosts x 8 GPUs: a heavy user holds 4 GPUs for days and asks for 8 more,
    while 20 light users keep about 11 GPUs busy with 1-GPU jobs. Due once it waited its limit
    (1 h), the 8-GPU job starts within one narrow job's limit (15 min) after; before issue 33 it
    waited until the stream ended, three days later."""
    trace = [TraceJob(1, "heavy", 0.0, 4 * 86400.0, 4), TraceJob(2, "heavy", 3600.0, 1000.0, 8)]
    t = 0.0
    while t < 3 * 86400:
        trace.append(TraceJob(len(trace) + 1, f"light{len(trace) % 20}", t, 690.0, 1))
        t += 63.0
    trace.sort(key=lambda j: (j.submit, j.id))
    trace = [replace(j, id=n + 1) for n, j in enumerate(trace)]
    wide = next(j.id for j in trace if j.gpus == 8)
    default = POLICIES["default"]
    now = simulate(trace, default, 2, 8, "default").job_waits[wide]
    before = simulate(trace, replace(default, age_max=1.0, oldest_first=False), 2, 8, "before").job_waits[wide]
    assert 3600 <= now <= 3600 + 900
    assert before > 2 * 86400
