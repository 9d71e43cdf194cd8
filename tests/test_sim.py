"""The simulator on a tiny synthetic trace: its metrics agree with each other."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from jupyter_gpujobs.sim import POLICIES, TraceJob, read_trace, simulate, typical_limit


def test_replay_metrics_are_consistent(tmp_path: Path) -> None:
    rows = ["job_id,user,submit_time_s,duration_s,num_gpus,gpu_type,status"]
    # user a floods the cluster with long jobs; user b submits short ones after
    for n in range(6):
        rows.append(f"a{n},a,{n},1000,2,,COMPLETED")
    for n in range(4):
        rows.append(f"b{n},b,{10 + n},50,1,,COMPLETED")
    rows.append("c0,c,20,100,16,,FAILED")  # wider than a host: folded onto one host
    path = tmp_path / "tiny.csv"
    path.write_text("\n".join(rows) + "\n")
    trace = read_trace(path)
    assert len(trace) == 11 and typical_limit(1000) == 3600 and typical_limit(1e6) == 14 * 86400
    results = {name: simulate(trace, pol, hosts=1, gpus_per_host=4, name=name) for name, pol in POLICIES.items()}
    work = 6 * 1000 * 2 + 4 * 50 + 100 * 16
    for res in results.values():
        m = res.metrics()
        assert len(res.wait) == 11 and all(w >= 0 for w in res.wait)
        assert abs(res.busy_gpu_s - work) < 1e-6  # every job ran exactly its duration
        assert m["makespan_lb"] == work / 4 and m["makespan"] >= m["makespan_lb"]
        assert 0 < m["utilization"] <= 1 and abs(m["utilization"] - work / (4 * m["makespan"])) < 1e-9
        assert m["p50_wait"] <= m["p99_wait"] and m["mean_jct"] >= m["mean_wait"]
        assert 0 < m["jain_slowdown"] <= 1 and m["mean_bsld"] >= 1
        assert 0 <= m["predicted_1m"] <= m["predicted_ok"] <= 1 and m["waited_1m"] <= m["waited_ok"]
        assert res.bounds_n + res.predictions_n == res.waited_n > 0
        assert m["waited_ok"] <= m["waited_5m25"] <= 1 and 0 <= m["waited_in_range"] <= 1
    # expected starts from time limits only: every estimate of a job that waited is a bound,
    # and here (no job arrives later to go first) each is kept
    limits = simulate(trace, replace(POLICIES["default"], use_predictions=False), hosts=1, gpus_per_host=4)
    assert limits.bounds_n == limits.waited_n and limits.bounds_kept == limits.bounds_n
    assert limits.wait == results["default"].wait and limits.jct == results["default"].jct  # no start changes
    fifo, fill = results["fifo"].metrics(), results["fifo+backfill"].metrics()
    assert fill["mean_wait"] <= fifo["mean_wait"]
    # under fifo nobody passes anybody: start order is submit order
    assert results["fifo"].user_waits()["b"] > 0


def test_skipping_idle_event_times_changes_nothing(tmp_path: Path) -> None:
    import random

    rnd = random.Random(7)
    rows = ["job_id,user,submit_time_s,duration_s,num_gpus,gpu_type,status"]
    t = 0
    for n in range(150):
        t += rnd.choice((0, 0, 5, 30, 200))
        rows.append(f"j{n},u{rnd.randrange(5)},{t},{rnd.choice((20, 60, 900, 4000))},{rnd.choice((3, 4, 6, 8))},,COMPLETED")
    path = tmp_path / "rand.csv"
    path.write_text("\n".join(rows) + "\n")
    trace = read_trace(path)
    skipped = 0
    for name, pol in POLICIES.items():
        fast = simulate(trace, pol, hosts=2, gpus_per_host=8, name=name)
        slow = simulate(trace, pol, hosts=2, gpus_per_host=8, name=name, skip_idle=False)
        assert slow.skipped == 0 and fast.cycles + fast.skipped == slow.cycles
        skipped += fast.skipped
        a, b = fast.metrics(), slow.metrics()
        del a["cycles"], b["cycles"]
        assert a == b, name
    assert skipped > 0


def test_a_learned_reservation_saves_its_holders_wait() -> None:
    """A busy cluster and group vision's Friday habit (4 GPUs at 09:05 for 2.5 h): the detector
    finds it in the first three weeks; reserved from then on, vision starts at once."""
    from jupyter_gpujobs.engine.monitor.habits import find_habits
    from jupyter_gpujobs.model import Job, JobState, Reservation, validate_reservation
    from jupyter_gpujobs.sim import TraceJob

    monday = 1795996800.0  # 2026-11-30 00:00 UTC
    week = 7 * 86400
    trace: list[TraceJob] = []
    t = monday
    while t < monday + 5 * week:  # a 2-GPU job of 3 h every 45 minutes: the 8 GPUs stay busy
        trace.append(TraceJob(len(trace) + 1, f"bg{len(trace) % 3}", t, 3 * 3600, 2))
        t += 45 * 60
    holders = []
    for w in range(5):
        trace.append(TraceJob(len(trace) + 1, "carol", monday + w * week + 4 * 86400 + 9 * 3600 + 300, 2.5 * 3600, 4,
                              group="vision"))
        holders.append(trace[-1].id)
    trace.sort(key=lambda j: j.submit)
    policy = POLICIES["default"]
    before = simulate(trace, policy, hosts=1, gpus_per_host=8)

    learned_at = monday + 3 * week  # what the engine would have seen by the fourth Monday
    seen = [Job(id=j.id, user=j.user, group=j.group, gpus=j.gpus, submitted_at=j.submit, started_at=j.submit,
                ended_at=j.submit + j.duration, time_limit_s=typical_limit(j.duration), state=JobState.COMPLETED)
            for j in trace if j.submit < learned_at]
    [habit] = [h for h in find_habits(seen, learned_at) if h.name == "vision"]
    assert (habit.weekday, habit.start_hour, habit.end_hour, habit.gpus) == (4, 9, 14, 4)
    fields = validate_reservation(habit.reservation_body(), learned_at)
    reservation = Reservation(id=1, **fields)
    after = simulate(trace, policy, hosts=1, gpus_per_host=8, reservations=[reservation])

    later = holders[3:]  # the Fridays after it was reserved
    assert all(before.job_waits[j] > 600 for j in later)
    assert all(after.job_waits[j] == 0 for j in later)
    assert all(after.job_waits[j] == before.job_waits[j] for j in holders[:3])
    assert len(after.job_waits) == len(trace)  # everyone else still ran


def test_a_job_that_ends_is_charged_to_fair_share_up_to_its_end() -> None:
    """light runs 300 s; then heavy runs 1,000 s alone, with no other event in between; when it
    ends each asks for both GPUs. heavy has used more, so light goes first. (The replay once
    charged usage only after taking the jobs that end out: heavy's 1,000 s were never counted,
    it looked the lighter user, and went first.)"""
    trace = [TraceJob(1, "light", 0.0, 300.0, 1), TraceJob(2, "other", 299.0, 1.0, 1),
             TraceJob(3, "heavy", 300.0, 1000.0, 1),
             TraceJob(4, "heavy", 1300.0, 100.0, 2), TraceJob(5, "light", 1300.0, 100.0, 2)]
    res = simulate(trace, POLICIES["default"], hosts=1, gpus_per_host=2)
    assert res.job_waits[5] == 0 and res.job_waits[4] == 100
