"""GPU-hour budgets in the pure scheduler (engine/scheduler/budgets.py): a used-up budget
holds the jobs it covers with the reason (or walks them at low priority), a job that
depends on a held one waits for it instead of being cancelled, and periods start on Monday
and on the 1st in the policy's local time."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

from jupyter_gpujobs.engine.scheduler import schedule
from jupyter_gpujobs.engine.scheduler.budgets import BudgetState, period_bounds
from jupyter_gpujobs.model import GPU, Dependency, Job, JobState, Policy

NOW = 1_800_000_000.0


def _gpus(n: int) -> list[GPU]:
    return [GPU(index=i, uuid=f"GPU-{i}", name="A100") for i in range(n)]


def _job(jid: int, user: str, group: str | None = None, priority: str = "normal", **kw: object) -> Job:
    return Job(id=jid, user=user, command=["true"], group=group, priority=priority, state=JobState.PENDING,
               submitted_at=NOW - 100 + jid, **kw)  # type: ignore[arg-type]


def test_a_used_up_hold_budget_holds_its_jobs_with_the_reason_and_others_start() -> None:
    jobs = [_job(1, "alice", "vision"), _job(2, "bob"), _job(3, "carol", "vision")]
    used = BudgetState("groups", "vision", gpu_hours=1, used_gpu_hours=1.25, period="month", period_end=NOW + 3600)
    plan = schedule(NOW, jobs, [], _gpus(4), Policy(), budgets=[used])
    assert [s.job_id for s in plan.starts] == [2]
    for jid in (1, 3):
        assert plan.reasons[jid].startswith("group vision's budget of 1 GPU-hours for this month is used up (1.25 used)")
        assert plan.expected_start[jid] == NOW + 3600  # it renews then
    assert plan.order[-2:] == [1, 3]
    # not used up yet: every job starts
    left = BudgetState("groups", "vision", gpu_hours=1, used_gpu_hours=0.9)
    assert {s.job_id for s in schedule(NOW, jobs, [], _gpus(4), Policy(), budgets=[left]).starts} == {1, 2, 3}


def test_a_user_budget_covers_the_users_jobs_in_any_group() -> None:
    jobs = [_job(1, "alice", "vision"), _job(2, "alice"), _job(3, "bob", "vision")]
    used = BudgetState("users", "alice", gpu_hours=2, used_gpu_hours=2, period="dates")
    plan = schedule(NOW, jobs, [], _gpus(4), Policy(), budgets=[used])
    assert [s.job_id for s in plan.starts] == [3]
    assert plan.reasons[1].endswith("waits until an admin raises it")
    assert plan.expected_start[2] is None


def test_a_low_budget_runs_its_jobs_after_the_others() -> None:
    # one GPU: the over-budget job, although older, goes after bob's
    jobs = [_job(1, "alice", "vision"), _job(2, "bob")]
    used = BudgetState("groups", "vision", gpu_hours=1, used_gpu_hours=3, mode="low")
    plan = schedule(NOW, jobs, [], _gpus(1), Policy(), budgets=[used])
    assert [s.job_id for s in plan.starts] == [2]
    assert plan.order == [2, 1]
    alone = schedule(NOW, [jobs[0]], [], _gpus(1), Policy(), budgets=[used])
    assert [s.job_id for s in alone.starts] == [1]  # it still runs when the GPUs are free


def test_a_job_depending_on_a_held_job_waits_for_it() -> None:
    jobs = [_job(1, "alice", "vision"), _job(2, "bob", depends=(Dependency("afterok", 1),))]
    used = BudgetState("groups", "vision", gpu_hours=1, used_gpu_hours=1)
    plan = schedule(NOW, jobs, [], _gpus(2), Policy(), budgets=[used])
    assert plan.cancels == [] and plan.starts == []
    assert plan.reasons[2] == "waiting for job 1 (afterok)"


def test_periods_start_on_monday_and_on_the_first_in_local_time() -> None:
    zone = "America/New_York"
    policy = Policy(time_zone=zone)
    now = datetime(2026, 3, 11, 23, 30, tzinfo=ZoneInfo(zone)).timestamp()  # a Wednesday
    week = period_bounds("week", None, None, now, policy)
    assert week == (datetime(2026, 3, 9, tzinfo=ZoneInfo(zone)).timestamp(),
                    datetime(2026, 3, 16, tzinfo=ZoneInfo(zone)).timestamp())
    month = period_bounds("month", None, None, now, policy)
    assert month == (datetime(2026, 3, 1, tzinfo=ZoneInfo(zone)).timestamp(),  # (summer time begins on the 8th)
                     datetime(2026, 4, 1, tzinfo=ZoneInfo(zone)).timestamp())
    assert period_bounds("dates", 10.0, 20.0, 15.0, policy) == (10.0, 20.0)
    assert period_bounds("dates", 10.0, 20.0, 20.0, policy) is None  # over
    assert period_bounds("dates", 10.0, 20.0, 5.0, policy) is None  # not begun
