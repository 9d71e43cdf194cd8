"""Priority: the order of the pending queue.

Multifactor score = weight_age * age + weight_fairshare * fair-share + weight_class * class
+ weight_size * size, each factor in [0, 1]: age = waited / age_saturation_s (capped at 1),
fair-share from `fairshare.py`, class = rank / 3 (low 0 .. urgent 1), size = GPUs / GPUs of
the largest host. With `policy.strict_classes` (default) the class is also a strict tier: a
higher class is always ahead. Ties go to the older job, then the lower id (FIFO).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..model import PRIORITY_RANK, Job, Policy
from .fairshare import Usage, fairshare_factors


def order_pending(now: float, jobs: Sequence[Job], policy: Policy, usage: Usage,
                  largest_host: int) -> list[Job]:
    """Pending jobs, first to be considered first."""
    rank = PRIORITY_RANK
    w_age, w_fs, w_cls, w_size = policy.weight_age, policy.weight_fairshare, policy.weight_class, policy.weight_size
    strict = policy.strict_classes
    use_fs = policy.fairshare and w_fs != 0
    if not use_fs and w_age == 0 and w_size == 0 and (strict or w_cls == 0):
        # plain class + FIFO: no per-job arithmetic
        return sorted(jobs, key=lambda j: (-rank.get(j.priority, 1), j.submitted_at, j.id))
    fs_user: dict[str, float] = {}
    fs_group: dict[str, float] = {}
    if use_fs:
        fs_user, fs_group = fairshare_factors(
            usage, policy.user_shares, policy.group_shares, {j.user for j in jobs},
            {j.group for j in jobs if j.group}, policy.fairshare_default_share)
    age_k = w_age / policy.age_saturation_s if policy.age_saturation_s > 0 else 0.0
    size_k = w_size / max(1, largest_host)
    cls_k = w_cls / 3.0
    # fair-share is per user (and group): compute each combination once
    fs_cache: dict[tuple[str, str | None], float] = {}

    def key(j: Job) -> tuple[float, float, float, int]:
        r = rank.get(j.priority, 1)
        age = now - j.submitted_at
        score = (w_age if age * age_k >= w_age else age * age_k) if age > 0 else 0.0
        score += cls_k * r + size_k * min(j.gpus, largest_host)
        if use_fs:
            ug = (j.user, j.group)
            f = fs_cache.get(ug)
            if f is None:
                fu = fs_user.get(j.user, 1.0)
                f = (fu * fs_group.get(j.group, 1.0)) ** 0.5 if j.group else fu
                f = fs_cache[ug] = w_fs * f
            score += f
        return (-r if strict else 0, -score, j.submitted_at, j.id)

    return sorted(jobs, key=key)


def multifactor_score(now: float, job: Job, policy: Policy, fairshare: float, largest_host: int) -> float:
    """The score of one job (for docs and the API); `order_pending` inlines the same sum."""
    age = max(0.0, now - job.submitted_at)
    age_f = min(1.0, age / policy.age_saturation_s) if policy.age_saturation_s > 0 else 0.0
    return (policy.weight_age * age_f
            + (policy.weight_fairshare * fairshare if policy.fairshare else 0.0)
            + policy.weight_class * PRIORITY_RANK.get(job.priority, 1) / 3.0
            + policy.weight_size * min(job.gpus, largest_host) / max(1, largest_host))
