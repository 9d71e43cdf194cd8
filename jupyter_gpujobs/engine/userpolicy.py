"""What one user may ask of the engine beyond a submission's own fields: the priority classes
they may use (`c.GPUJobs.priority_tiers`), and how much they may queue (waiting jobs, tasks of
one array: `c.GPUJobs.user_max_pending_jobs`, `user_max_array_tasks`). Admins may use every
class and are not capped.

The rules themselves are pure functions of the domain (`model.priority_refusal`,
`array_cap_refusal`, `pending_cap_refusal`); this module applies them to a user (their Unix
groups, whether they are an admin), raises the engine's refusals for admission, and reports
them for `quota`.

May call: the domain, the engine's errors, `runners.users.in_group`.
"""

from __future__ import annotations

from typing import Any

from ..model import (
    InvalidInput,
    Policy,
    array_cap_refusal,
    pending_cap_refusal,
    priorities_for,
    priority_refusal,
)
from .errors import Conflict, PermissionDenied
from .runners.users import in_group


class PriorityNotAllowed(PermissionDenied):
    """A user asked for a priority class the policy does not open to them (HTTP 403)."""

    field = "priority"


def _member_of(user: str) -> Any:
    return lambda group: in_group(user, group)


def allowed_priorities(policy: Policy, user: str, admin: bool) -> list[str]:
    """The priority classes `user` may submit at, lowest first."""
    if admin:
        return priorities_for({}, user, _member_of(user))
    return priorities_for(policy.priority_tiers, user, _member_of(user))


def check_priority(policy: Policy, priority: str, user: str, admin: bool) -> None:
    """PriorityNotAllowed naming the class when `user` may not submit at `priority`."""
    if admin:
        return
    refusal = priority_refusal(policy.priority_tiers, priority, user, _member_of(user))
    if refusal is not None:
        raise PriorityNotAllowed(refusal)


def check_queue_caps(policy: Policy, admin: bool, pending: int, tasks: int, array: bool) -> None:
    """A submission of `tasks` jobs (an array's tasks when `array`) by a user with `pending`
    jobs waiting: InvalidInput (`array`) past the array cap, Conflict past the cap on waiting
    jobs; admins are not capped."""
    if admin:
        return
    refusal = array_cap_refusal(policy.user_max_array_tasks, tasks) if array else None
    if refusal is not None:
        raise InvalidInput("array", refusal)
    refusal = pending_cap_refusal(policy.user_max_pending_jobs, pending, tasks)
    if refusal is not None:
        raise Conflict("pending_jobs", refusal)


def limits_report(policy: Policy, user: str, admin: bool) -> dict[str, Any]:
    """What `quota` shows of these rules for `user`."""
    return {
        "priorities": allowed_priorities(policy, user, admin),
        "max_pending_jobs": None if admin else policy.user_max_pending_jobs,
        "max_array_tasks": None if admin else policy.user_max_array_tasks,
    }


__all__ = ["PriorityNotAllowed", "allowed_priorities", "check_priority", "check_queue_caps", "limits_report"]
