"""What a user sees of their quota: their layered limits next to what they use now, and, for
a quota an admin set through the API or CLI, who set it and when (with its recent changes)."""

from __future__ import annotations

from typing import Any

from ..config import quota_to_dict
from ..model import JobState, Quota, share_fraction
from .scheduler.shares import gpu_bytes, running_weight
from .userpolicy import limits_report


def _effective(service: Any, scope: str, name: str) -> Quota | None:
    policy = service.current_policy()
    table = policy.user_quotas if scope == "users" else policy.group_quotas
    quota = table.get(name)
    if quota is None and scope == "users":
        quota = policy.default_user_quota
    return quota


def quota_report(service: Any, user: str) -> dict[str, Any]:
    """The user's quota and usage; groups they have jobs in are reported too."""
    policy = service.current_policy()
    mine = [j for j in service.active_jobs() if j.user == user]
    running = [j for j in mine if j.state is JobState.RUNNING]
    pending = [j for j in mine if j.state is JobState.PENDING]
    quota = _effective(service, "users", user)
    card_bytes = gpu_bytes(service.inventory)
    largest = max(card_bytes.values(), default=0)

    def gpus(jobs: list[Any]) -> float:
        """GPUs in use or asked for, a share counted as its part of one GPU."""
        total = sum(running_weight(j, card_bytes) if j.state is JobState.RUNNING else share_fraction(j, largest)
                    for j in jobs)
        return int(total) if float(total).is_integer() else round(total, 4)

    groups: dict[str, Any] = {}
    for name in sorted({j.group for j in mine if j.group} | set(policy.group_quotas)):
        members = [j for j in service.active_jobs() if j.group == name and j.state is JobState.RUNNING]
        groups[name] = {
            "quota": quota_to_dict(policy.group_quotas.get(name)),
            "running_gpus": gpus(members),
            "running_jobs": len(members),
            "set": _set(service, "groups", name),
        }
    max_gpus = quota.max_gpus if quota and quota.max_gpus is not None else policy.user_max_gpus
    max_jobs = (quota.max_running_jobs if quota and quota.max_running_jobs is not None
                else policy.user_max_running_jobs)
    return {
        "user": user,
        "running_gpus": gpus(running),
        "running_jobs": len(running),
        "pending_jobs": len(pending),
        "pending_gpus": gpus(pending),
        "borrowed_gpus": gpus([j for j in running if j.borrowed]),
        "guaranteed_gpus": quota.guaranteed_gpus if quota else 0,
        "elastic": quota.elastic if quota else True,
        "max_gpus": max_gpus,
        "max_running_jobs": max_jobs,
        "max_time_limit_s": (quota.max_time_limit_s if quota and quota.max_time_limit_s is not None
                             else policy.max_time_limit_s),
        "total_gpus": len(service.inventory),
        "urgent_reserve_gpus": policy.urgent_reserve_gpus,
        # the priority classes they may use, and how much they may queue (userpolicy.py)
        **limits_report(policy, user, service.is_admin(user)),
        "groups": groups,
        "set": _set(service, "users", user),
        # GPU-hour budgets of the user and their groups: what is used and left (engine/rules.py)
        "budgets": service.rules.budget_views(user),
        "changes": service.store.quota_changes([("users", user), *(("groups", g) for g in groups)], limit=10),
    }


def _set(service: Any, scope: str, name: str) -> dict[str, Any] | None:
    """A stored quota (set through the API or CLI): {"quota", "by", "at"}; None for a configured one."""
    return service.quotas_set.get((scope, name))
