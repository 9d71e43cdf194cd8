"""Priority: the order of the pending queue.

Multifactor score = weight_age * age + weight_fairshare * fair-share + weight_class * class
+ weight_size * size, each factor in [0, 1]: age = waited / age_saturation_s (capped at 1),
fair-share from `fairshare.py`, class = rank / 3 (low 0 .. urgent 1), size = GPUs / GPUs of
the largest host. With `policy.strict_classes` (default) the class is also a strict tier: a
higher class is always ahead. Ties go to the older job, then the lower id (FIFO).
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter

from ..model import PRIORITY_RANK, Job, Policy
from .fairshare import Usage, fairshare_factors

_submitted = attrgetter("submitted_at")
_id = attrgetter("id")


def order_pending(now: float, jobs: Sequence[Job], policy: Policy, usage: Usage,
                  largest_host: int) -> list[Job]:
    """Pending jobs, first to be considered first."""
    return order_and_classify(now, jobs, policy, usage, largest_host)[0]


#: What the planner decides a waiting job by, its id and submit time aside: two jobs of one
#: class that wait in the same cycle state wait for the same reason.
job_class = attrgetter("priority", "user", "group", "gpus", "gpu_type", "time_limit_s", "array_job_id",
                       "array_max_running", "offpeak", "begin")


def order_and_classify(now: float, jobs: Sequence[Job], policy: Policy, usage: Usage,
                       largest_host: int) -> tuple[list[Job], list[int]]:
    """The ordered jobs, and for each its class number (equal for jobs of equal `job_class`).

    One pass classifies the jobs; everything in the score but age is a constant of the class,
    so the per-job work is one clamp and one product (this runs over the whole queue every
    cycle, see docs/scheduling.md, "Performance")."""
    rank = PRIORITY_RANK
    w_age, w_fs, w_cls, w_size = policy.weight_age, policy.weight_fairshare, policy.weight_class, policy.weight_size
    classes: dict[tuple[object, ...], int] = {}
    cids = [classes.setdefault(job_class(j), len(classes)) for j in jobs]
    use_fs = policy.fairshare and w_fs != 0
    fs_user: dict[str, float] = {}
    fs_group: dict[str, float] = {}
    if use_fs:
        users = {c[1] for c in classes}
        groups = {c[2] for c in classes if c[2]}
        fs_user, fs_group = fairshare_factors(usage, policy.user_shares, policy.group_shares, users,
                                              groups, policy.fairshare_default_share)  # type: ignore[arg-type]
    # a strict class tier outweighs any score: scores lie within +-(sum of |weights|)
    tier = 2.0 * (abs(w_age) + abs(w_fs) + abs(w_cls) + abs(w_size)) + 1.0 if policy.strict_classes else 0.0
    size_k = w_size / max(1, largest_host)
    # per class: everything in -(sort key) but age; the class and fair-share part per
    # (class, user, group), the size part per GPU count
    base: dict[tuple[object, ...], float] = {}
    sizes = [size_k * k for k in range(largest_host + 1)]
    const: list[float] = []
    for c in classes:
        b = base.get(c[:3])
        if b is None:
            priority, user, group = c[:3]
            r = rank.get(priority, 1)  # type: ignore[call-overload]
            b = tier * r + w_cls / 3.0 * r
            if use_fs:
                fu = fs_user.get(user, 1.0)  # type: ignore[call-overload]
                b += w_fs * ((fu * fs_group.get(group, 1.0)) ** 0.5 if group else fu)  # type: ignore[call-overload]
            base[c[:3]] = b
        k: int = c[3]  # type: ignore[assignment]
        const.append(b + sizes[k if 0 <= k <= largest_host else (largest_host if k > 0 else 0)])
    sat = policy.age_saturation_s
    age_k = w_age / sat if sat > 0 else 0.0
    lo = now - sat if sat > 0 else now
    # age part = age_k * (clamped submit - now) negated: older (up to saturation) sorts first
    # (key, submit time, id, position): ids are unique, so the position is never compared
    keys = [(age_k * ((lo if s < lo else (now if s > now else s)) - now) - const[c], s, i, n)
            for n, (s, i, c) in enumerate(zip(map(_submitted, jobs), map(_id, jobs), cids))]
    keys.sort()
    return [jobs[k[3]] for k in keys], [cids[k[3]] for k in keys]


def multifactor_score(now: float, job: Job, policy: Policy, fairshare: float, largest_host: int) -> float:
    """The score of one job (for docs and the API); `order_and_classify` sorts by the same sum."""
    age = max(0.0, now - job.submitted_at)
    age_f = min(1.0, age / policy.age_saturation_s) if policy.age_saturation_s > 0 else 0.0
    return (policy.weight_age * age_f
            + (policy.weight_fairshare * fairshare if policy.fairshare else 0.0)
            + policy.weight_class * PRIORITY_RANK.get(job.priority, 1) / 3.0
            + policy.weight_size * min(job.gpus, largest_host) / max(1, largest_host))
