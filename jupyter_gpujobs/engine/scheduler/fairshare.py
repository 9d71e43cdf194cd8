"""Fair-share: decayed GPU-seconds per user and group (`Usage`), the per-cycle update the
service calls (`decay_and_add`), and the fair-share factor in [0, 1] that priority uses.

The factor follows the classic Slurm formula F = 2 ** (-usage_share / share), where
usage_share is this user's part of all decayed usage and share is this user's part of all
shares; a user who used exactly their share gets 0.5, an idle user 1.0. A job with a group
gets the geometric mean of its user's and its group's factor.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ...model import Job
from .shares import running_weight


@dataclass(frozen=True)
class Usage:
    """Decayed GPU-seconds per user and per group (`None`-group jobs count for the user only)."""

    users: Mapping[str, float] = field(default_factory=dict)
    groups: Mapping[str, float] = field(default_factory=dict)


def decay_and_add(usage: Usage | Mapping[str, float] | None, running_jobs: Iterable[Job],
                  dt: float, half_life: float, card_bytes: Mapping[tuple[str, int], int] | None = None) -> Usage:
    """The usage after `dt` more seconds: old usage decays by 0.5 ** (dt / half_life), then every
    running job adds (its GPUs) x dt to its user and its group; a job on a share of one GPU adds
    its fraction of the card x dt (`shares.running_weight`; `card_bytes`, the memory of each card
    by (host, index), gives the fraction of a job that asked for an amount of GPU memory).
    Pure: returns a new `Usage`.

    The service calls it once per cycle before `schedule()`, with `dt` = seconds since the
    previous call and `half_life` = `policy.fairshare_half_life_s`.
    """
    old = as_usage(usage)
    factor = 0.5 ** (dt / half_life) if half_life > 0 and dt > 0 else 1.0
    users = {u: v * factor for u, v in old.users.items() if v * factor > 1e-9}
    groups = {g: v * factor for g, v in old.groups.items() if v * factor > 1e-9}
    if dt > 0:
        for job in running_jobs:
            if job.share is not None or job.gpu_memory is not None:
                used = running_weight(job, card_bytes or {}) * dt
            else:
                used = (len(job.assigned_gpus) or job.gpus) * dt
            if used <= 0:
                continue
            users[job.user] = users.get(job.user, 0.0) + used
            if job.group:
                groups[job.group] = groups.get(job.group, 0.0) + used
    return Usage(users, groups)


def as_usage(usage: Usage | Mapping[str, float] | None) -> Usage:
    """Accept a `Usage`, a plain mapping user -> GPU-seconds, or None (no usage yet)."""
    if usage is None:
        return Usage()
    if isinstance(usage, Usage):
        return usage
    return Usage(dict(usage), {})


def _factors(used: Mapping[str, float], shares: Mapping[str, float], names: Iterable[str],
             default_share: float) -> dict[str, float]:
    names = set(names) | set(used) | set(shares)
    total_used = sum(used.values())
    total_share = sum(shares.get(n, default_share) for n in names) or 1.0
    out: dict[str, float] = {}
    for n in names:
        share = shares.get(n, default_share) / total_share
        part = used.get(n, 0.0) / total_used if total_used > 0 else 0.0
        out[n] = 2.0 ** (-part / share) if share > 0 else 0.0
    return out


def fairshare_factors(usage: Usage, user_shares: Mapping[str, float],
                      group_shares: Mapping[str, float], users: Iterable[str],
                      groups: Iterable[str], default_share: float = 1.0
                      ) -> tuple[dict[str, float], dict[str, float]]:
    """Factor per user and per group, over everyone with usage, a share, or a job now."""
    return (_factors(usage.users, user_shares, users, default_share),
            _factors(usage.groups, group_shares, groups, default_share))
