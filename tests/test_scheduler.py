"""The scheduler on hand-built snapshots: what a user of the queue would notice."""

from __future__ import annotations

from jupyter_gpujobs.engine.scheduler import Usage, decay_and_add, schedule
from jupyter_gpujobs.model import (
    GPU,
    Dependency,
    Job,
    JobState,
    OffpeakWindow,
    Plan,
    Policy,
    Quota,
)

NOW = 1_700_000_000.0  # a Tuesday, 22:13 UTC
PLAIN = Policy(fairshare=False, weight_age=0.0, weight_size=0.0, preemption=False)


def gpus(hosts: int = 1, per_host: int = 4, name: str = "A100") -> list[GPU]:
    return [GPU(i, f"{h}-{i}", name, host=f"h{h}") for h in range(hosts) for i in range(per_host)]


def job(jid: int, user: str = "alice", gpus: int = 1, age: float = 0.0, **kw: object) -> Job:
    return Job(id=jid, user=user, gpus=gpus, submitted_at=NOW - 1000 + jid - age, **kw)  # type: ignore[arg-type]


def run(jid: int, host: str, idx: tuple[int, ...], user: str = "bob", started: float = NOW - 100,
        limit: int = 3600, **kw: object) -> Job:
    return Job(id=jid, user=user, gpus=len(idx), state=JobState.RUNNING, host=host, assigned_gpus=idx,
               started_at=started, time_limit_s=limit, submitted_at=started - 10, **kw)  # type: ignore[arg-type]


def started(plan: Plan) -> list[int]:
    return [s.job_id for s in plan.starts]


def test_fifo_within_a_class_and_higher_classes_first() -> None:
    pending = [job(3), job(1), job(2, priority="low"), job(4, priority="urgent"), job(5, priority="high")]
    plan = schedule(NOW, pending, [], gpus(1, 3), PLAIN)
    assert plan.order == [4, 5, 1, 3, 2]
    assert started(plan) == [4, 5, 1]
    assert plan.reasons[3] == "waiting for 1 free GPU" and 3 not in started(plan)


def test_gpu_type_and_one_host() -> None:
    inv = gpus(2, 2, "A100") + [GPU(0, "t", "Tesla T4", host="t4box")]
    plan = schedule(NOW, [job(1, gpus=1, gpu_type="T4"), job(2, gpus=2, gpu_type="A100")], [], inv, PLAIN)
    by_id = {s.job_id: s for s in plan.starts}
    assert by_id[1].host == "t4box"
    assert by_id[2].host in ("h0", "h1") and len(by_id[2].gpus) == 2
    # 3 GPUs never fit on one 2-GPU host, even with 4 A100 free in total
    plan = schedule(NOW, [job(3, gpus=3, gpu_type="A100")], [], inv, PLAIN)
    assert plan.starts == [] and "one host has at most 2" in plan.reasons[3]
    assert plan.expected_start[3] is None
    plan = schedule(NOW, [job(4, gpu_type="H100")], [], inv, PLAIN)
    assert plan.reasons[4] == "no H100 GPUs on this server"


def test_best_fit_keeps_a_whole_host_free() -> None:
    running = [run(9, "h0", (0, 1, 2))]
    plan = schedule(NOW, [job(1, gpus=1), job(2, gpus=4)], running, gpus(2, 4), PLAIN)
    by_id = {s.job_id: s for s in plan.starts}
    assert by_id[1].host == "h0" and by_id[2].host == "h1"


def test_user_limits_with_reasons() -> None:
    pol = Policy(fairshare=False, preemption=False, user_max_gpus=2)
    plan = schedule(NOW, [job(1, gpus=2), job(2)], [], gpus(2, 4), pol)
    assert started(plan) == [1]
    assert plan.reasons[2] == "user limit of 2 GPUs reached"
    # the held job is expected when alice's first job reaches its limit
    assert plan.expected_start[2] == NOW + pol.default_time_limit_s
    jobs_pol = Policy(fairshare=False, preemption=False, user_max_running_jobs=2)
    plan = schedule(NOW, [job(3, user="bob"), job(4, user="bob"), job(5, user="bob"), job(6)], [], gpus(2, 4), jobs_pol)
    assert started(plan) == [3, 4, 6] and plan.reasons[5] == "user limit of 2 running jobs reached"


def test_backfill_short_job_starts_without_delaying_the_reserved_one() -> None:
    inv = gpus(1, 4)
    running = [run(9, "h0", (0, 1), limit=3600, started=NOW)]  # frees 2 GPUs at NOW+3600
    big = job(1, gpus=4, time_limit_s=7200)
    short = job(2, gpus=2, time_limit_s=1800)
    plan = schedule(NOW, [big, short], running, inv, PLAIN)
    assert started(plan) == [2]
    assert plan.expected_start[1] == NOW + 3600
    long = job(3, gpus=2, time_limit_s=7200)  # would still run when the big job should start
    plan = schedule(NOW, [big, long], running, inv, PLAIN)
    assert started(plan) == []
    assert plan.reasons[3] == "behind job 1 (reserved)"
    assert plan.expected_start[1] == NOW + 3600
    # without backfill the short one waits too
    plan = schedule(NOW, [big, short], running, inv, Policy(backfill=False, fairshare=False, preemption=False))
    assert started(plan) == [] and plan.reasons[2] == "behind job 1 (first in line)"


def test_fairshare_reorders_after_usage() -> None:
    pol = Policy(weight_age=0.0, weight_size=0.0, preemption=False)
    pending = [job(1, user="heavy"), job(2, user="light")]
    plan = schedule(NOW, pending, [], gpus(1, 1), pol)
    assert plan.order == [1, 2]
    usage = decay_and_add(None, [run(7, "h0", (0,), user="heavy")], 36000, pol.fairshare_half_life_s)
    assert usage.users["heavy"] == 36000
    plan = schedule(NOW, pending, [], gpus(1, 1), pol, usage)
    assert plan.order == [2, 1] and started(plan) == [2]
    # usage decays: after many half-lives the order is FIFO again
    old = decay_and_add(usage, [], 100 * pol.fairshare_half_life_s, pol.fairshare_half_life_s)
    assert schedule(NOW, pending, [], gpus(1, 1), pol, old).order == [1, 2]
    assert schedule(NOW, pending, [], gpus(1, 1), pol, {"heavy": 5.0}).order == [2, 1]


def test_guarantee_reclaims_from_a_borrower_least_work_lost() -> None:
    pol = Policy(group_quotas={"vision": Quota(guaranteed_gpus=2)}, fairshare=False)
    running = [run(10, "h0", (0,), user="bob", started=NOW - 5000, borrowed=True),
               run(11, "h0", (1,), user="bob", started=NOW - 100, borrowed=True)]
    mine = job(42, user="carol", group="vision")
    plan = schedule(NOW, [mine], running, gpus(1, 2), pol)
    assert [(p.job_id, p.by_job_id) for p in plan.preemptions] == [(11, 42)]
    assert plan.preemptions[0].reason == "preempted by job 42 (guarantee of group vision)"
    assert plan.starts == [] and plan.reasons[42] == "waiting for preempted job 11 to exit"
    assert plan.expected_start[42] == NOW + pol.preempt_grace_s
    # a start beyond the guarantee is borrowed; one within it is not
    plan = schedule(NOW, [job(1, user="bob"), job(2, user="carol", group="vision")], [], gpus(1, 2), pol)
    assert {s.job_id: s.borrowed for s in plan.starts} == {1: True, 2: False}


def test_non_preemptible_job_is_never_a_victim() -> None:
    pol = Policy(fairshare=False)
    running = [run(10, "h0", (0,), user="bob", priority="low", started=NOW - 10)]  # not preemptible, not borrowed
    plan = schedule(NOW, [job(1, priority="urgent")], running, gpus(1, 1), pol)
    assert plan.preemptions == [] and plan.reasons[1] == "waiting for 1 free GPU"
    running = [run(10, "h0", (0,), user="bob", priority="low", preemptible=True)]
    plan = schedule(NOW, [job(1, priority="urgent")], running, gpus(1, 1), pol)
    assert [p.reason for p in plan.preemptions] == ["preempted by job 1 (urgent)"]
    # the same class is not preempted by a non-urgent job without a guarantee
    running = [run(10, "h0", (0,), user="bob", preemptible=True)]
    assert schedule(NOW, [job(1, priority="high")], running, gpus(1, 1), Policy(fairshare=False)).preemptions == []


def test_urgent_jobs_never_preempt_each_other() -> None:
    """An urgent job that borrowed idle GPUs keeps them against another urgent job (trading
    one urgent job for another only wastes work, and cascades cycle after cycle); a lower
    class on the same host is still taken."""
    pol = Policy(fairshare=False)
    running = [run(10, "h0", (0,), user="bob", priority="urgent", borrowed=True, preemptible=True)]
    plan = schedule(NOW, [job(1, priority="urgent")], running, gpus(1, 1), pol)
    assert plan.preemptions == [] and plan.reasons[1] == "waiting for 1 free GPU"
    running.append(run(11, "h0", (1,), user="bob", priority="high", borrowed=True))
    plan = schedule(NOW, [job(1, priority="urgent")], running, gpus(1, 2), pol)
    assert [(p.job_id, p.by_job_id) for p in plan.preemptions] == [(11, 1)]


def test_urgent_uses_the_reserve_and_nothing_else_may() -> None:
    pol = Policy(urgent_reserve_gpus=2, fairshare=False, preemption=False)
    plan = schedule(NOW, [job(1, gpus=2), job(2), job(3, priority="urgent")], [], gpus(1, 4), pol)
    assert sorted(started(plan)) == [1, 3]
    assert plan.reasons[2] == "the last 2 GPUs are kept for urgent jobs"
    plan = schedule(NOW, [job(4, gpus=3)], [], gpus(1, 4), pol)
    assert plan.starts == []


def test_offpeak_and_begin_wait() -> None:
    # NOW is Tuesday 22:13 UTC; with +2 h it is 00:13 local on Wednesday
    pol = Policy(fairshare=False, offpeak_windows=(OffpeakWindow((0, 1, 2, 3, 4), 1.0, 6.0),), utc_offset_s=7200)
    plan = schedule(NOW, [job(1, offpeak=True), job(2, begin=NOW + 600)], [], gpus(), pol)
    assert plan.starts == []
    assert plan.reasons[1] == "waiting for off-peak hours"
    assert plan.expected_start[1] == NOW - (NOW + 7200) % 86400 + 3600
    assert plan.reasons[2].startswith("begins at ") and plan.expected_start[2] == NOW + 600
    inside = Policy(fairshare=False, offpeak_windows=(OffpeakWindow((1,), 22.0, 26.0),))
    assert started(schedule(NOW, [job(1, offpeak=True)], [], gpus(), inside)) == [1]


def test_dependencies_and_arrays() -> None:
    finished = {12: JobState.FAILED, 13: JobState.COMPLETED, 14: JobState.FAILED}
    pending = [job(1, depends=(Dependency("afterok", 12),)), job(2, depends=(Dependency("afterok", 13),)),
               job(3, depends=(Dependency("after", 14),)), job(4, depends=(Dependency("afterok", 5),)),
               job(5), job(6, depends=(Dependency("afterok", 999),))]
    plan = schedule(NOW, pending, [], gpus(1, 1), PLAIN, finished=finished)
    assert (1, "dependency job 12 ended FAILED") in plan.cancels
    assert (6, "dependency job 999 is unknown") in plan.cancels
    assert started(plan) == [2]
    assert plan.reasons[4] == "waiting for job 5 (afterok)"
    assert plan.expected_start[4] is not None and plan.expected_start[4] >= plan.expected_start[5] + 3600
    tasks = [job(20 + i, array_job_id=20, array_index=i, array_max_running=2) for i in range(4)]
    plan = schedule(NOW, tasks, [], gpus(1, 8), PLAIN)
    assert started(plan) == [20, 21]
    assert plan.reasons[22] == "array limit of 2 running tasks"


def test_zero_gpu_job_starts_and_no_gpus_reason() -> None:
    plan = schedule(NOW, [job(1, gpus=0), job(2)], [], [], PLAIN)
    assert started(plan) == [1]
    assert plan.reasons[2] == "no GPUs on this server" and plan.expected_start[2] is None
    busy = [run(9, "h0", (0,))]
    assert started(schedule(NOW, [job(3, gpus=0)], busy, gpus(1, 1), PLAIN)) == [3]
    sick = [GPU(0, "x", "A100", host="h0", healthy=False), GPU(1, "y", "A100", host="h0", draining=True)]
    assert schedule(NOW, [job(4)], [], sick, PLAIN).reasons[4] == (
        "every GPU here is draining or unhealthy (1 of 2 draining): it waits for one to be undrained or healthy again")


def test_every_pending_job_has_a_reason_and_an_estimate() -> None:
    pending = [job(i, gpus=1 + i % 3, time_limit_s=600 * (1 + i % 5)) for i in range(1, 40)]
    plan = schedule(NOW, pending, [run(99, "h1", (0, 1))], gpus(2, 4), Policy())
    waiting = {j.id for j in pending} - set(started(plan))
    assert waiting and set(plan.reasons) == waiting
    assert all(plan.expected_start[i] is not None for i in waiting)


def test_estimates_are_never_earlier_than_the_plan_allows() -> None:
    """Replay forward with every job running to its limit: nobody starts after its estimate."""
    pol = Policy(weight_age=0.0, oldest_first=False)  # priority must not drift with time in this check
    inv = gpus(2, 4)
    pending = [job(i, user=f"u{i % 3}", gpus=(1, 2, 4, 1, 3)[i % 5], time_limit_s=(600, 1800, 3600, 300)[i % 4])
               for i in range(1, 30)]
    running = [run(100, "h0", (0, 1), limit=1200), run(101, "h1", (3,), limit=400)]
    usage = Usage({"u0": 100.0})
    first = schedule(NOW, pending, running, inv, pol, usage)
    expected = dict(first.expected_start)
    now, queue, active = NOW, {j.id: j for j in pending}, list(running)
    actual: dict[int, float] = {}
    for _ in range(200):
        plan = schedule(now, list(queue.values()), active, inv, pol, usage)
        for s in plan.starts:
            j = queue.pop(s.job_id)
            actual[j.id] = now
            active.append(j.replace(state=JobState.RUNNING, started_at=now, host=s.host, assigned_gpus=s.gpus))
        if not queue:
            break
        now = min(a.started_at + a.time_limit_s for a in active if a.started_at + a.time_limit_s > now)  # type: ignore[operator]
        active = [a for a in active if a.started_at + a.time_limit_s > now]  # type: ignore[operator]
    assert not queue
    late = {i: (actual[i] - NOW, expected[i] - NOW) for i in expected if actual[i] > expected[i] + 1e-6}  # type: ignore[operator]
    assert not late, late
