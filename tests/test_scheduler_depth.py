"""The scheduler's cost controls: reservation depth, the aggregate estimate of the deep queue,
and the start-now and preemption memos. Each shortcut must keep the rules of the full walk."""

from __future__ import annotations

from dataclasses import replace

from jupyter_gpujobs.model import GPU, Job, JobState, Plan, Policy

NOW = 1_700_000_000.0
PLAIN = Policy(fairshare=False, weight_age=0.0, weight_size=0.0, preemption=False)


def gpus(hosts: int = 1, per_host: int = 8) -> list[GPU]:
    return [GPU(i, f"{h}-{i}", "A100", host=f"h{h}") for h in range(hosts) for i in range(per_host)]


def job(jid: int, gpus: int = 1, limit: int = 3600, user: str = "alice", **kw: object) -> Job:
    return Job(id=jid, user=user, gpus=gpus, time_limit_s=limit, submitted_at=NOW - 1000 + jid, **kw)  # type: ignore[arg-type]


def run(jid: int, host: str, idx: tuple[int, ...], ends_in: float, user: str = "bob") -> Job:
    return Job(id=jid, user=user, gpus=len(idx), state=JobState.RUNNING, host=host, assigned_gpus=idx,
               started_at=NOW - 100, time_limit_s=int(ends_in + 100), submitted_at=NOW - 200)


def started(plan: Plan) -> list[int]:
    return [s.job_id for s in plan.starts]


def schedule(*args: object, **kw: object) -> Plan:
    from jupyter_gpujobs.engine.scheduler import schedule as real

    return real(*args, **kw)  # type: ignore[arg-type]


def _kth_after(avail: list[float], bookings: list[tuple[int, float]]) -> list[float]:
    """The time line of one host after list-scheduling `bookings` (k, limit), as the planner does."""
    av = sorted(avail)
    for k, limit in bookings:
        start = max(av[k - 1], NOW)
        av = sorted(av[k:] + [start + limit] * k)
    return av


def test_deep_estimates_are_never_earlier_than_the_detailed_time_line() -> None:
    # one full 8-GPU host: nothing starts now, every job is booked or estimated
    ends = [600, 900, 1200, 1800, 2400, 3000, 3600, 5400]
    running = [run(100 + i, "h0", (i,), e) for i, e in enumerate(ends)]
    sizes = (1, 2, 4, 1, 3, 8, 1, 2)
    pending = [job(i, gpus=sizes[i % 8], limit=(600, 1800, 3600)[i % 3]) for i in range(1, 40)]
    depth = 3
    plan = schedule(NOW, pending, running, gpus(), replace(PLAIN, reservation_depth=depth))
    assert plan.starts == []
    by_id = {j.id: j for j in pending}
    detailed = plan.order[:depth]
    av = _kth_after([NOW + e for e in ends], [(by_id[i].gpus, float(by_id[i].time_limit_s or 0)) for i in detailed])
    full = schedule(NOW, pending, running, gpus(), replace(PLAIN, reservation_depth=None))
    for n, jid in enumerate(plan.order):
        est = plan.expected_start[jid]
        assert est is not None and plan.reasons[jid]
        if n < depth:  # the detailed part is exactly the full plan
            assert est == full.expected_start[jid]
        else:  # the deep part never before the detailed time line has k GPUs on one host
            assert est >= av[by_id[jid].gpus - 1], (jid, est - NOW, av[by_id[jid].gpus - 1] - NOW)


def test_deep_estimates_use_the_limits_time_line_and_fifo_order() -> None:
    pol = replace(PLAIN, reservation_depth=0, user_max_running_jobs=1)
    running = [run(100, "h0", (0, 1, 2, 3), 1000)]
    pending = [job(1, limit=600), job(2, limit=600)]
    plan = schedule(NOW, pending, running, gpus(1, 8), pol)
    assert started(plan) == [1]  # the deep walk still starts jobs that fit now
    assert plan.reasons[2] == "user limit of 1 running jobs reached"
    assert plan.expected_start[2] == NOW + 600  # when job 1 reaches its limit
    fifo = replace(PLAIN, reservation_depth=2, backfill=False)
    full = [run(100 + i, "h0", (i,), 100.0 * (i + 1)) for i in range(8)]
    pending = [job(i, gpus=(4, 1, 2)[i % 3], limit=(900, 60)[i % 2]) for i in range(1, 30)]
    plan = schedule(NOW, pending, full, gpus(1, 8), fifo)
    starts = [plan.expected_start[i] for i in plan.order]
    assert all(s is not None for s in starts)
    assert starts == sorted(starts)  # type: ignore[type-var]  # without backfill nobody passes anybody
    assert all(plan.reasons[i] == f"behind job {plan.order[0]} (first in line)" for i in plan.order[1:])


def test_shape_memo_does_not_block_a_job_that_could_backfill() -> None:
    # 4 GPUs, 2 busy for an hour; a 4-GPU job is reserved at +1 h
    running = [run(100, "h0", (0, 1), 3600)]
    pending = [job(1, gpus=4, limit=7200),
               job(2, gpus=2, limit=7200),  # would delay job 1: fails, memo (2 GPUs, >= 7200 s)
               job(3, gpus=1, limit=7200),  # fewer GPUs, but as long: fails too
               job(4, gpus=2, limit=9000),  # memo: not even tried
               job(5, gpus=1, limit=1800),  # short: fits before job 1's reservation
               job(6, gpus=1, limit=1800)]
    for depth in (None, 1):
        plan = schedule(NOW, pending, running, gpus(1, 4), replace(PLAIN, reservation_depth=depth))
        assert started(plan) == [5, 6], depth
        assert plan.reasons[2] == "behind job 1 (reserved)" == plan.reasons[4]
        assert plan.expected_start[1] == NOW + 3600
    # past the depth a job holds no reservation, so the next job that fits starts (EASY-like)
    plan = schedule(NOW, pending, running, gpus(1, 4), replace(PLAIN, reservation_depth=0))
    assert started(plan) == [2] and plan.expected_start[1] is not None


def test_default_depth_changes_nothing_on_a_short_queue() -> None:
    pending = [job(i, gpus=1 + i % 3, limit=600 * (1 + i % 5), user=f"u{i % 4}") for i in range(1, 60)]
    running = [run(99, "h1", (0, 1), 1200)]
    a = schedule(NOW, pending, running, gpus(2, 4), Policy())
    b = schedule(NOW, pending, running, gpus(2, 4), Policy(reservation_depth=None))
    assert a == b


def test_preemption_memo_still_lets_an_urgent_job_preempt() -> None:
    pol = replace(Policy(fairshare=False), reservation_depth=0)
    running = [Job(id=100, user="bob", gpus=1, state=JobState.RUNNING, host="h0", assigned_gpus=(0,),
                   started_at=NOW - 100, time_limit_s=3600, priority="low", preemptible=True),
               Job(id=101, user="bob", gpus=1, state=JobState.RUNNING, host="h0", assigned_gpus=(1,),
                   started_at=NOW - 100, time_limit_s=3600, priority="low")]
    # carol's 2-GPU urgent job cannot preempt (job 101 is not preemptible); her 1-GPU one can
    pending = [job(1, gpus=2, user="carol", priority="urgent"), job(2, gpus=1, user="carol", priority="urgent")]
    plan = schedule(NOW, pending, running, gpus(1, 2), pol)
    assert [(p.job_id, p.by_job_id) for p in plan.preemptions] == [(100, 2)]
    assert plan.reasons[2] == "waiting for preempted job 100 to exit"


def test_predictions_change_estimates_only() -> None:
    running = [Job(id=100 + i, user="bob", gpus=1, state=JobState.RUNNING, host="h0", assigned_gpus=(i,),
                   started_at=NOW - 100, time_limit_s=3600, predicted_runtime_s=200.0 * (i + 1)) for i in range(4)]
    pending = [job(i, gpus=1 + i % 2, limit=3600, predicted_runtime_s=300.0) for i in range(1, 12)]
    for depth in (None, 2):
        plain = schedule(NOW, pending, running, gpus(1, 4), replace(PLAIN, reservation_depth=depth, use_predictions=False))
        pred = schedule(NOW, pending, running, gpus(1, 4), replace(PLAIN, reservation_depth=depth, use_predictions=True))
        assert pred.starts == plain.starts and pred.order == plain.order and pred.reasons == plain.reasons
        for jid, est in pred.expected_start.items():
            assert est is not None and NOW <= est <= plain.expected_start[jid]  # type: ignore[operator]
        # job 1 (2 GPUs) is expected when the second running job is predicted to end
        assert pred.order[0] == 1 and pred.expected_start[1] == NOW + 300
        assert plain.expected_start[plain.order[0]] == NOW + 3500
        # what is earlier than the time limits' start is a prediction; the rest are bounds
        assert plain.predicted == set()
        assert 1 in pred.predicted
        assert all((pred.expected_start[j] < plain.expected_start[j]) == (j in pred.predicted)  # type: ignore[operator]
                   for j in pred.expected_start)


def test_without_any_prediction_every_estimate_is_a_bound() -> None:
    # the line of predicted ends packs no hosts: with no prediction on it, its earlier start
    # for the 8-GPU job is no prediction, and the estimate stays the time limits' bound
    running = [run(100, "h0", (0, 1, 2, 3), 600), run(101, "h1", (0, 1, 2, 3), 1200)]
    pending = [job(1, gpus=8, limit=3600)]
    pol = replace(PLAIN, use_predictions=True)
    for depth in (None, 0):
        plan = schedule(NOW, pending, running, gpus(2, 8), replace(pol, reservation_depth=depth))
        assert plan.predicted == set() and plan.expected_start[1] == NOW + 600
        # a prediction for a running job makes the estimates that depend on it predictions
        early = [replace(running[0], predicted_runtime_s=300.0), running[1]]
        plan = schedule(NOW, pending, early, gpus(2, 8), replace(pol, reservation_depth=depth))
        assert plan.predicted == {1} and plan.expected_start[1] == NOW + 200


def test_deep_walk_follows_the_limits_like_the_detailed_walk() -> None:
    # GPUs never bind (8 hosts x 8 free); only alice's limits do: both walks agree exactly
    pol = replace(PLAIN, user_max_running_jobs=2, user_max_gpus=3)
    pending = [job(i, gpus=1 + i % 2, limit=(600, 1800, 900)[i % 3]) for i in range(1, 25)]
    full = schedule(NOW, pending, [], gpus(8, 8), replace(pol, reservation_depth=None))
    deep = schedule(NOW, pending, [], gpus(8, 8), replace(pol, reservation_depth=0))
    assert started(full) == started(deep) and len(started(full)) == 2
    assert full.expected_start == deep.expected_start and full.reasons == deep.reasons


def _random_snapshot(seed: int, hosts: int, n: int) -> tuple[list[Job], list[Job], list[GPU]]:
    import random

    rnd = random.Random(seed)
    inv = [GPU(i, f"{h}-{i}", "A100" if h % 3 else "H100", host=f"h{h}") for h in range(hosts) for i in range(8)]
    running: list[Job] = []
    jid = 1000
    for h in range(hosts):
        for i in rnd.sample(range(8), rnd.randint(2, 7)):
            running.append(Job(id=jid, user=f"u{rnd.randrange(6)}", gpus=1, state=JobState.RUNNING, host=f"h{h}",
                               assigned_gpus=(i,), started_at=NOW - rnd.uniform(0, 3000),
                               time_limit_s=rnd.choice((900, 3600, 14400)), submitted_at=NOW - 5000,
                               preemptible=rnd.random() < 0.3))
            jid += 1
    pending = [Job(id=i, user=f"u{rnd.randrange(6)}", group=f"g{rnd.randrange(2)}",
                   gpus=rnd.choice((1, 1, 1, 2, 4, 8)), gpu_type=rnd.choice((None, None, "H100")),
                   time_limit_s=rnd.choice((600, 900, 3600, 14400)), submitted_at=NOW - rnd.uniform(0, 9000),
                   priority=rnd.choice(("normal",) * 8 + ("high", "urgent")),
                   begin=NOW + 600 if rnd.random() < 0.03 else None) for i in range(1, n + 1)]
    return pending, running, inv


def test_random_snapshots_keep_the_rules_at_every_depth() -> None:
    from jupyter_gpujobs.model import Quota

    policies = [PLAIN, replace(PLAIN, backfill=False),
                Policy(user_max_running_jobs=6, user_max_gpus=10, urgent_reserve_gpus=4,
                       group_quotas={"g0": Quota(guaranteed_gpus=8, max_running_jobs=30)})]
    for seed in range(4):
        pending, running, inv = _random_snapshot(seed, 6, 200)
        busy = {(r.host, i) for r in running for i in r.assigned_gpus}
        for pol in policies:
            full = schedule(NOW, pending, running, inv, replace(pol, reservation_depth=None))
            for depth in (0, 7, 40):
                plan = schedule(NOW, pending, running, inv, replace(pol, reservation_depth=depth))
                used: set[tuple[str, int]] = set()
                for s in plan.starts:  # never a busy GPU, never one GPU twice
                    for i in s.gpus:
                        assert (s.host, i) not in busy and (s.host, i) not in used
                        used.add((s.host, i))
                waiting = [i for i in plan.order if i not in {s.job_id for s in plan.starts}]
                assert all(plan.reasons[i] for i in waiting)
                assert all(plan.expected_start[i] is None or plan.expected_start[i] >= NOW for i in waiting)  # type: ignore[operator]
                if plan.preemptions == full.preemptions:
                    # the first `depth` booked jobs are booked exactly as in the full walk
                    booked = [i for i in waiting if plan.expected_start[i] is not None][:depth]
                    assert all(plan.expected_start[i] == full.expected_start[i] for i in booked), (seed, depth)


def test_a_cycle_without_estimates_decides_exactly_the_same() -> None:
    """`estimate=False` (what the server runs between estimating cycles) must start, preempt,
    cancel, order and explain exactly as a full cycle; only the jobs past the reservation
    depth lose their expected start, and the reservations keep theirs."""
    from jupyter_gpujobs.model import Dependency, OffpeakWindow, Quota

    policies = [PLAIN, replace(PLAIN, backfill=False),
                Policy(user_max_running_jobs=6, user_max_gpus=10, urgent_reserve_gpus=4,
                       group_quotas={"g0": Quota(guaranteed_gpus=8, max_running_jobs=30)},
                       offpeak_windows=(OffpeakWindow((0, 1, 2, 3, 4, 5, 6), 2, 6),))]
    for seed in range(5):
        pending, running, inv = _random_snapshot(seed, 6, 300)
        # a few of every kind the deep walk sends to the full placement
        pending[50] = replace(pending[50], gpus=0)
        pending[120] = replace(pending[120], offpeak=True)
        pending[200] = replace(pending[200], depends=(Dependency("afterok", pending[190].id),))
        pending[260] = replace(pending[260], depends=(Dependency("afterok", 999_999),))
        for pol in policies:
            for depth in (0, 5, 40):
                p = replace(pol, reservation_depth=depth)
                full = schedule(NOW, pending, running, inv, p)
                quick = schedule(NOW, pending, running, inv, p, estimate=False)
                assert quick.starts == full.starts and quick.preemptions == full.preemptions, (seed, depth)
                assert quick.order == full.order and quick.cancels == full.cancels
                assert quick.reasons == full.reasons, (seed, depth)
                assert set(quick.expected_start) <= set(full.expected_start)
                assert all(full.expected_start[i] == t for i, t in quick.expected_start.items())
                if depth and len(full.order) > 2 * depth + len(full.starts):
                    assert len(quick.expected_start) < len(full.expected_start)  # the deep ones


def test_a_deciding_cycle_on_a_full_cluster_keeps_each_class_to_its_maximum_time_limit() -> None:
    """On a full cluster the deciding cycle decides the deep queue class by class. Classes
    that differ only in their time limit must still be told apart where it matters: one over
    its user's maximum time limit is told so, as the job-by-job walk tells it; and with a GPU
    free, where the time limit decides whether a job fits before a reservation, the decisions
    are those of the full cycle."""
    from jupyter_gpujobs.model import Quota

    pol = Policy(user_max_running_jobs=40, default_user_quota=Quota(max_time_limit_s=3600),
                 user_quotas={"u1": Quota(max_time_limit_s=900)},
                 group_quotas={"g0": Quota(guaranteed_gpus=8)})
    for seed in range(6):
        pending, running, inv = _random_snapshot(seed, 6, 400)
        busy = {(r.host, r.assigned_gpus[0]) for r in running}
        jid = 50_000
        for g in inv:  # every GPU busy, but one GPU in the second half of the seeds
            if (g.host, g.index) not in busy and not (seed >= 3 and (g.host, g.index) == ("h1", 0)):
                running.append(Job(id=jid, user="bob", gpus=1, state=JobState.RUNNING, host=g.host,
                                   assigned_gpus=(g.index,), started_at=NOW - 50, time_limit_s=7200,
                                   submitted_at=NOW - 60))
                jid += 1
        for depth in (0, 5, 40):
            p = replace(pol, reservation_depth=depth)
            full = schedule(NOW, pending, running, inv, p)
            quick = schedule(NOW, pending, running, inv, p, estimate=False)
            assert quick.starts == full.starts and quick.preemptions == full.preemptions, (seed, depth)
            assert quick.reasons == full.reasons, (seed, depth)
        def most(user: str) -> int:
            return 900 if user == "u1" else 3600

        over = [j for j in pending if (j.time_limit_s or 0) > most(j.user)]
        assert over
        for j in over:
            assert quick.reasons[j.id] == (f"time limit of {j.time_limit_s} s is over the maximum of "
                                           f"{most(j.user)} s for user {j.user}"), (seed, j)


def test_a_short_job_backfills_where_a_long_one_of_the_same_request_waits() -> None:
    """With a GPU free until a reservation, a long job waits and a short one of the same user
    and request starts in the hole, in the deciding cycle as in the full one (the deep queue
    is decided by class, and the two differ only in their time limit)."""
    inv = gpus()
    running = [run(900 + i, "h0", (i,), ends_in=7200) for i in range(7)]  # GPU 7 free
    pending = [job(1, gpus=8, limit=3600),  # reserved at +2h, on all eight
               job(2, limit=14400, user="vic"),  # cannot fit before it: reserved after it
               job(3, limit=1800, user="carol"),  # deep: fits in the hole
               job(4, limit=14400, user="carol")]  # deep, same request (its class decided first): waits
    p = replace(PLAIN, reservation_depth=2)
    full, quick = schedule(NOW, pending, running, inv, p), schedule(NOW, pending, running, inv, p, estimate=False)
    assert started(full) == started(quick) == [3], quick.reasons
    assert quick.reasons == full.reasons and quick.reasons[4] == "waiting for 1 free GPU"


def test_a_kept_priority_order_places_new_jobs_as_its_calculation_would() -> None:
    """Between priority calculations the server passes the last order: jobs that left drop
    out, new and requeued ones go exactly where a calculation at the same time would put
    them, and the cycle decides as one that calculated the order itself."""
    from jupyter_gpujobs.engine.scheduler import Usage
    from jupyter_gpujobs.engine.scheduler.priority import QueueOrder
    from jupyter_gpujobs.model import Quota

    pol = Policy(user_max_running_jobs=6, user_max_gpus=10, urgent_reserve_gpus=4,
                 group_quotas={"g0": Quota(guaranteed_gpus=8, max_running_jobs=30)})
    usage = Usage({"u0": 5e5, "u1": 1e5, "u3": 2e4}, {"g0": 3e5})
    for seed in range(4):
        pending, running, inv = _random_snapshot(seed, 6, 300)
        first = schedule(NOW, pending[:200], running, inv, pol, usage)
        # later: 50 of them started or ended, 100 new ones arrived, one came back requeued
        later = pending[50:] + [pending[10]]
        kept = schedule(NOW, later, running, inv, pol, usage, order=first.queue_order)
        fresh = schedule(NOW, later, running, inv, pol, usage)
        assert kept.order == fresh.order and kept.starts == fresh.starts
        assert kept.reasons == fresh.reasons and kept.expected_start == fresh.expected_start
        # an hour on, the kept order is still the one of its calculation (ages not refreshed)
        calc = QueueOrder.compute(NOW, later, pol, usage, 8)
        hour = schedule(NOW + 3600, later, running, inv, pol, usage, order=first.queue_order)
        assert hour.order == [j.id for j in calc.arrange(later)[0]]
        # and its own kept order moves on with it
        again = schedule(NOW + 3600, later[5:], running, inv, pol, usage, order=hour.queue_order)
        assert again.order == [i for i in hour.order if i not in {j.id for j in later[:5]}]
        # a user the calculation did not know (no fair-share factor yet) makes a new one
        heavy = Usage({**usage.users, "zoe": 5e6}, usage.groups)
        zoe = [replace(pending[0], id=5000, user="zoe", submitted_at=NOW - 9000)]
        kept = schedule(NOW, later + zoe, running, inv, pol, heavy, order=first.queue_order)
        assert kept.order == schedule(NOW, later + zoe, running, inv, pol, heavy).order
        assert kept.order.index(5000) > 0  # her usage counts, not a newcomer's full factor


def test_the_victim_index_finds_a_victim_exactly_when_may_preempt_does() -> None:
    """A failed preemption is decided from the index of the running jobs' kinds, without asking
    `may_preempt` of each job: it must agree with asking each one, for every kind of preemptor."""
    import random

    from jupyter_gpujobs.engine.scheduler.preemption import VictimIndex, may_preempt

    rnd = random.Random(7)
    classes = ["low", "normal", "high", "urgent"]
    users = ["ann", "bob", "cy"]
    for _ in range(3000):
        running = [Job(id=i, user=rnd.choice(users), priority=rnd.choice(classes), state=JobState.RUNNING,
                       borrowed=rnd.random() < 0.3, preemptible=rnd.random() < 0.4)
                   for i in range(rnd.randint(0, 4))]
        running = [r for r in running if r.borrowed or r.preemptible]  # the planner's candidates
        preemptor = Job(id=99, user=rnd.choice(users), priority=rnd.choice(classes))
        index = VictimIndex(running)
        for urgent in (False, True):
            expected = any(may_preempt(r, preemptor, urgent) for r in running)
            assert index.any_for(preemptor, urgent) == expected, (running, preemptor, urgent)


def test_on_a_full_cluster_the_deciding_cycle_matches_the_detailed_walk_of_every_job() -> None:
    """The deep walk decides by class and family, asks the victim index instead of each
    running job, and writes reasons in bulk. On a full cluster nothing may start but by
    preemption, so its starts, preemptions and reasons must be those of the detailed walk
    with no depth (every job placed one by one): an oracle that shares none of those shortcuts."""
    import random

    from jupyter_gpujobs.model import Quota

    guarantees = Policy(urgent_reserve_gpus=4, group_quotas={"g0": Quota(guaranteed_gpus=8), "g1": Quota(guaranteed_gpus=4)})
    policies = [replace(guarantees, user_max_running_jobs=6, user_max_gpus=10), guarantees,
                replace(guarantees, preemption=False)]
    preempted = 0
    reasons: set[str] = set()
    for seed in range(8):
        pending, running, inv = _random_snapshot(seed, 6, 300)
        rnd = random.Random(seed)
        busy = {(r.host, i) for r in running for i in r.assigned_gpus}
        running += [Job(id=5000 + n, user=f"u{rnd.randrange(6)}", gpus=1, state=JobState.RUNNING, host=g.host,
                        assigned_gpus=(g.index,), started_at=NOW - rnd.uniform(0, 3000), time_limit_s=3600,
                        submitted_at=NOW - 5000, preemptible=rnd.random() < 0.3, borrowed=rnd.random() < 0.2)
                    for n, g in enumerate(inv) if (g.host, g.index) not in busy]
        for pol in policies:
            detailed = schedule(NOW, pending, running, inv, replace(pol, reservation_depth=None))
            for depth in (0, 3, 20):
                quick = schedule(NOW, pending, running, inv, replace(pol, reservation_depth=depth), estimate=False)
                assert quick.starts == detailed.starts and quick.preemptions == detailed.preemptions, (seed, depth)
                assert quick.reasons == detailed.reasons, (seed, depth)
            preempted += len(detailed.preemptions)
            reasons |= {r.split(" job")[0] for r in detailed.reasons.values()}
    assert preempted > 20  # the snapshots do exercise preemption
    # and every kind of wait: a limit, the urgent reserve, a begin time, free GPUs, victims
    assert {"user limit of 6 running", "the last 4 GPUs are kept for urgent", "begins at 22:23",
            "waiting for 1 free GPU", "waiting for 8 free H100", "waiting for preempted"} <= reasons, reasons


def test_a_queue_of_deferred_jobs_is_decided_in_bulk_as_one_by_one() -> None:
    """Jobs that begin later only wait for their begin time, each in its own class. With
    backfill the deciding cycle decides them in bulk even when no job is blocked, and must
    give the reasons of the detailed walk of every job."""
    import random

    from jupyter_gpujobs.model import Quota

    rnd = random.Random(3)
    inv = gpus(hosts=2)
    pending = [job(i, gpus=rnd.choice((1, 1, 2, 4)), user=f"u{rnd.randrange(4)}", limit=rnd.choice((600, 3600)),
                   begin=NOW + rnd.uniform(60, 3 * 86400)) for i in range(1, 301)]
    pending += [job(400, gpus=2), job(401, gpus=1, begin=NOW - 60),  # these two start now
                job(402, gpus=9),  # more than a host has
                job(403, limit=7 * 86400, begin=NOW + 600)]  # over its user's maximum time limit
    for pol in (Policy(default_user_quota=Quota(max_time_limit_s=86400)),
                Policy(default_user_quota=Quota(max_time_limit_s=86400), backfill=False)):
        detailed = schedule(NOW, pending, [], inv, replace(pol, reservation_depth=None))
        assert sorted(started(detailed)) == [400, 401]
        for depth in (0, 5):
            quick = schedule(NOW, pending, [], inv, replace(pol, reservation_depth=depth), estimate=False)
            assert started(quick) == started(detailed)  # (on other GPUs: no reservations to keep clear)
            assert quick.reasons == detailed.reasons, (pol.backfill, depth)
    assert detailed.reasons[7].startswith("begins at ") and "maximum" in detailed.reasons[403]
    assert "one host has at most 8" in detailed.reasons[402]


def test_reasons_given_by_class_read_as_a_dictionary_of_each_job() -> None:
    """The deep walk gives reasons one per class; a reader sees one per job, and a reason the
    walk set for the job itself wins over its class's."""
    from jupyter_gpujobs.model import Reasons

    reasons = Reasons({1: "waiting for job 9 (afterok)"})
    reasons.add_by_class([1, 2, 3, 4], [0, 1, 0, 2], {0: "waiting for 1 free GPU", 2: "behind job 7 (reserved)"})
    reasons[3] = "user limit of 4 GPUs reached"
    expected = {1: "waiting for job 9 (afterok)", 3: "user limit of 4 GPUs reached", 4: "behind job 7 (reserved)"}
    assert reasons == expected and expected == reasons
    assert 2 not in reasons and reasons.get(2) is None and len(reasons) == 3  # its class has no reason
    del reasons[4]
    reasons[5] = "waiting"
    assert dict(reasons) == {1: "waiting for job 9 (afterok)", 3: "user limit of 4 GPUs reached", 5: "waiting"}


def test_pending_jobs_given_by_id_are_scheduled_as_a_list_of_them() -> None:
    """The server hands its dictionary of pending jobs to `schedule()` as it is: the plans are
    those of the same jobs in a list, estimating, deciding or with a kept order, and the
    dictionary is left as it was (the server keeps using it)."""
    from jupyter_gpujobs.model import Dependency, Quota

    pol = Policy(user_max_running_jobs=6, user_max_gpus=10, urgent_reserve_gpus=4, reservation_depth=20,
                 group_quotas={"g0": Quota(guaranteed_gpus=8, max_running_jobs=30)})
    for seed in range(3):
        pending, running, inv = _random_snapshot(seed, 6, 300)
        pending[200] = replace(pending[200], depends=(Dependency("afterok", pending[190].id),))
        pending[260] = replace(pending[260], depends=(Dependency("afterok", 999_999),))  # cancelled
        kept = schedule(NOW - 5, pending[:-10], running, inv, pol).queue_order
        by_id = {j.id: j for j in reversed(pending)}  # another order than the list's
        before = dict(by_id)
        for kw in ({}, {"estimate": False}, {"estimate": False, "order": kept}):
            listed = schedule(NOW, pending, running, inv, pol, **kw)
            mapped = schedule(NOW, by_id, running, inv, pol, **kw)
            assert mapped.starts == listed.starts and mapped.preemptions == listed.preemptions, (seed, kw)
            assert mapped.order == listed.order and mapped.cancels == listed.cancels
            assert mapped.cancels == [(pending[260].id, "dependency job 999999 is unknown")]
            assert dict(mapped.reasons) == dict(listed.reasons)
            assert mapped.expected_start == listed.expected_start
        assert by_id == before and list(by_id) == list(before)
