"""Preemption without ping-pong, the urgent reserve against guarantees, and GPUs in use
outside the queue, on hand-built snapshots."""

from __future__ import annotations

from dataclasses import replace

from test_scheduler import NOW, gpus, job, run, started

from jupyter_gpujobs.engine.scheduler import schedule
from jupyter_gpujobs.model import GPU, Claim, Policy, Quota

GUARANTEE = Policy(user_quotas={"alice": Quota(guaranteed_gpus=2)}, fairshare=False, weight_age=1.0)


def test_a_requeued_victim_does_not_take_back_the_gpu_freed_for_its_preemptor() -> None:
    # bob's job 10 was preempted for alice's 42 and has just exited; requeued, it is older
    # than 42 and so ahead of it in the queue, and GPU 0 is free again
    victim = job(10, user="bob", age=5000)
    preemptor = job(42, user="alice")
    for depth in (100, 0):  # the detailed walk and the deep one, by job and by class
        for estimate in (True, False):
            pol = replace(GUARANTEE, reservation_depth=depth)
            plan = schedule(NOW, [victim, preemptor], [], gpus(1, 1), pol, claims=[Claim(42, (), NOW - 1)],
                            estimate=estimate)
            assert started(plan) == [42], (depth, estimate)
            assert plan.reasons[10] == "waiting for 1 free GPU" and 42 not in plan.reasons, (depth, estimate)
    # without the claim the older job would go first: the ping-pong of issue 15
    assert started(schedule(NOW, [victim, preemptor], [], gpus(1, 1), GUARANTEE)) == [10]


def test_a_preemptor_waits_for_its_victims_and_preempts_nobody_else() -> None:
    running = [run(10, "h0", (0,), user="bob", borrowed=True, started=NOW - 500),  # stopping for 42
               run(11, "h0", (1,), user="bob", borrowed=True, started=NOW - 900)]
    claim = Claim(42, (10,), NOW + 20)
    plan = schedule(NOW, [job(42, user="alice")], running, gpus(1, 2), GUARANTEE, claims=[claim])
    assert plan.preemptions == [] and plan.starts == []
    assert plan.reasons[42] == "waiting for preempted job 10 to exit"
    assert plan.expected_start[42] == NOW + 20
    # a victim in its grace is no victim of anyone else: carol's urgent job takes job 11
    pol = replace(GUARANTEE, user_quotas={})
    urgent = job(43, user="carol", priority="urgent")
    plan = schedule(NOW, [urgent], running, gpus(1, 2), pol, claims=[claim])
    assert [(p.job_id, p.by_job_id) for p in plan.preemptions] == [(11, 43)]


def test_gpus_freed_for_a_preemptor_are_kept_while_its_other_victim_stops() -> None:
    # alice's 2-GPU job 42 preempted 10 and 11; 10 exited (GPU 0 free) and is requeued, 11 is
    # in its grace: no job may start on GPU 0, above all not job 10
    running = [run(11, "h0", (1,), user="bob", borrowed=True, started=NOW - 500)]
    pending = [job(10, user="bob", age=5000), job(42, user="alice", gpus=2), job(12, user="dan", age=6000)]
    plan = schedule(NOW, pending, running, gpus(1, 2), GUARANTEE, claims=[Claim(42, (11,), NOW + 25)])
    assert plan.starts == [] and plan.preemptions == []
    assert plan.reasons[42] == "waiting for preempted job 11 to exit" and plan.expected_start[42] == NOW + 25
    # a job short enough to end before then may still use GPU 0 (backfill delays nothing)
    short = job(13, user="dan", time_limit_s=10)
    plan = schedule(NOW, [*pending, short], running, gpus(1, 2), GUARANTEE, claims=[Claim(42, (11,), NOW + 25)])
    assert started(plan) == [13]


def test_a_job_is_no_victim_before_its_minimum_run_time() -> None:
    pol = replace(GUARANTEE, preempt_min_runtime_s=60)
    young = [run(10, "h0", (0,), user="bob", borrowed=True, started=NOW - 30)]
    plan = schedule(NOW, [job(42, user="alice")], young, gpus(1, 1), pol)
    assert plan.preemptions == [] and plan.reasons[42] == "waiting for 1 free GPU"
    old = [run(10, "h0", (0,), user="bob", borrowed=True, started=NOW - 61)]
    plan = schedule(NOW, [job(42, user="alice")], old, gpus(1, 1), pol)
    assert [(p.job_id, p.by_job_id) for p in plan.preemptions] == [(10, 42)]
    plan = schedule(NOW, [job(42, user="alice")], young, gpus(1, 1), replace(pol, preempt_min_runtime_s=0))
    assert [(p.job_id, p.by_job_id) for p in plan.preemptions] == [(10, 42)]
    assert Policy().preempt_min_runtime_s == 60


def test_a_guarantee_preempts_borrowers_when_the_urgent_reserve_is_full() -> None:
    pol = replace(GUARANTEE, urgent_reserve_gpus=1)
    running = [run(10 + i, "h0", (i,), user="bob", borrowed=True, started=NOW - 1000 + i) for i in range(3)]
    for depth in (100, 0):  # the detailed walk and the deep one
        for estimate in (True, False):
            p = replace(pol, reservation_depth=depth)
            plan = schedule(NOW, [job(42, user="alice")], running, gpus(1, 4), p, estimate=estimate)
            assert [(x.job_id, x.by_job_id) for x in plan.preemptions] == [(12, 42)], (depth, estimate)
            assert plan.reasons[42] == "waiting for preempted job 12 to exit"
            # 2 GPUs: two borrowers go; the reserve's GPU 3 stays free for urgent work
            plan = schedule(NOW, [job(43, user="alice", gpus=2)], running, gpus(1, 4), p, estimate=estimate)
            assert sorted(x.job_id for x in plan.preemptions) == [11, 12], (depth, estimate)
    # beyond her guarantee alice waits for the reserve, and preempts nobody
    plan = schedule(NOW, [job(44, user="alice", gpus=3)], running, gpus(1, 4), pol)
    assert plan.preemptions == [] and plan.reasons[44] == "the last 1 GPUs are kept for urgent jobs"


def test_a_victim_requeued_while_the_other_stops_waits_when_the_urgent_reserve_is_full() -> None:
    # issue 32: alice's 2-GPU job 42 preempted bob's 11 and 12 (GPUs 1, 2) past a full reserve;
    # 11 has exited and is requeued, 12 is in its grace. The room outside the reserve is
    # alice's: job 11 must not start on GPU 3 (then alice would find the reserve full again,
    # preempt it again, and so on); it waits, and alice starts once 12 is gone
    pol = replace(GUARANTEE, urgent_reserve_gpus=1)
    kept = run(10, "h0", (0,), user="bob", borrowed=True, started=NOW - 1000)
    stopping = run(12, "h0", (2,), user="bob", borrowed=True, started=NOW - 900)
    pending = [job(11, user="bob", age=5000), job(42, user="alice", gpus=2)]
    for depth in (100, 0):
        for estimate in (True, False):
            p = replace(pol, reservation_depth=depth)
            plan = schedule(NOW, pending, [kept, stopping], gpus(1, 4), p, estimate=estimate,
                            claims=[Claim(42, (12,), NOW + 25)])
            assert plan.starts == [] and plan.preemptions == [], (depth, estimate)
            assert plan.reasons[42] == "waiting for preempted job 12 to exit"
            assert plan.reasons[11] == "the last 1 GPUs are kept for urgent jobs", (depth, estimate)
            plan = schedule(NOW, pending, [kept], gpus(1, 4), p, estimate=estimate, claims=[Claim(42, (), NOW + 25)])
            assert started(plan) == [42] and plan.preemptions == [], (depth, estimate)
            assert plan.reasons[11] == "the last 1 GPUs are kept for urgent jobs"


def test_a_gpu_in_use_outside_the_queue_is_not_handed_out() -> None:
    text = "in use by a process outside the queue (7.6 GB, pid 1234, user bob)"
    inv = [GPU(i, f"u{i}", "A100", foreign=text if i == 1 else None) for i in range(3)]
    plan = schedule(NOW, [job(1), job(2), job(3)], [], inv, Policy(fairshare=False))
    assert sorted(s.gpus[0] for s in plan.starts) == [0, 2]
    assert plan.reasons[3] == f"waiting for 1 free GPU; GPU 1 is {text}"
    assert plan.expected_start[3] is not None  # when the first of the others ends
    # a job that needs it waits, with the reason and no expected start
    plan = schedule(NOW, [job(4, gpus=3)], [], inv, Policy(fairshare=False))
    assert plan.starts == [] and plan.reasons[4] == f"waiting for 3 free GPUs; GPU 1 is {text}"
    assert plan.expected_start[4] is None
