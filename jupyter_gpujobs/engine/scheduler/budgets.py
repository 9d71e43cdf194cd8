"""GPU-hour budgets in one scheduling cycle (issue 30; as Slurm's GrpTRESMins).

A budget of a user or group gives it so many GPU-hours over a period. The engine measures
what was used (engine/rules.py, from the store) and hands the cycle one `BudgetState` per
budget, as data. This module decides what that means for the pending jobs: once a budget is
used up, the jobs it covers wait with the reason (mode "hold"), or run at low priority
(mode "low"); a job is covered by its user's budget and by its group's.

Pure: no I/O, no clock. May call: the model and deferral.py (local time).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from ...model import Job, Plan, Policy
from .deferral import LocalClock, as_clock

MODES = ("hold", "low")
PERIODS = ("week", "month", "dates")


@dataclass(frozen=True)
class BudgetState:
    """A budget and what was used of it in its current period."""

    scope: str  # "users" | "groups"
    name: str
    gpu_hours: float
    used_gpu_hours: float
    mode: str = "hold"
    period: str = "month"
    period_start: float = 0.0
    period_end: float | None = None  # when it renews (None: it does not: a "dates" budget)

    @property
    def used_up(self) -> bool:
        return self.used_gpu_hours >= self.gpu_hours

    @property
    def left_gpu_hours(self) -> float:
        return max(0.0, self.gpu_hours - self.used_gpu_hours)

    @property
    def whose(self) -> str:
        return f"{'user' if self.scope == 'users' else 'group'} {self.name}"

    def reason(self) -> str:
        """Why a job it covers waits (or runs at low priority)."""
        what = (f"{self.whose}'s budget of {self.gpu_hours:g} GPU-hours "
                f"{'for this ' + self.period if self.period != 'dates' else 'for its dates'} is used up "
                f"({self.used_gpu_hours:.2f} used)")
        if self.mode == "low":
            return what + "; runs at low priority"
        if self.period_end is not None:
            return what + f"; waits until it renews on {time.strftime('%Y-%m-%d %H:%M', time.localtime(self.period_end))}"
        return what + "; waits until an admin raises it"


def period_bounds(period: str, start: float | None, end: float | None, now: float, clock: LocalClock | Policy
                  ) -> tuple[float, float | None] | None:
    """The current period of a budget: ("week") from Monday 00:00 local time to the next,
    ("month") from the 1st 00:00 to the next 1st, ("dates") from `start` to `end`; None when
    a budget for dates is not in force now (not begun, or over)."""
    if period == "dates":
        assert start is not None and end is not None
        return (start, end) if start <= now < end else None
    c = as_clock(clock)
    wall = datetime.fromtimestamp(c.local(now), timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "week":
        first = wall - timedelta(days=wall.weekday())
        after = first + timedelta(days=7)
    else:
        first = wall.replace(day=1)
        after = (first + timedelta(days=32)).replace(day=1)
    return c.utc(first.timestamp()), c.utc(after.timestamp())


def covering(job: Job, used_up: Mapping[tuple[str, str], BudgetState]) -> BudgetState | None:
    """The used-up budget that covers a job (its user's first, then its group's), if any."""
    b = used_up.get(("users", job.user))
    if b is None and job.group:
        b = used_up.get(("groups", job.group))
    return b


def apply(pending: Mapping[int, Job], budgets: Sequence[BudgetState]
          ) -> tuple[Mapping[int, Job], dict[int, BudgetState]]:
    """The jobs the cycle walks (those of a used-up "low" budget at low priority) and the
    jobs held by a used-up "hold" budget (left out of the walk)."""
    used_up = {(b.scope, b.name): b for b in budgets if b.used_up}
    if not used_up:
        return pending, {}
    walk: dict[int, Job] = {}
    held: dict[int, BudgetState] = {}
    for jid, j in pending.items():
        b = covering(j, used_up)
        if b is None:
            walk[jid] = j
        elif b.mode == "low":
            walk[jid] = j if j.priority == "low" else j.replace(priority="low")
        else:
            held[jid] = b
    return walk, held


def mark_held(plan: Plan, held: Mapping[int, BudgetState], estimate: bool) -> None:
    """The held jobs (id -> the budget that holds it) in the plan: at the end of the order,
    with their reason, and (in an estimating cycle) expected to start when their budget renews."""
    for jid in sorted(held):
        b = held[jid]
        plan.order.append(jid)
        plan.reasons[jid] = b.reason()
        if estimate:
            plan.expected_start[jid] = b.period_end


__all__ = ["MODES", "PERIODS", "BudgetState", "apply", "covering", "mark_held", "period_bounds"]
