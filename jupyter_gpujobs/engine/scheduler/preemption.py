"""Preemption: which running jobs give their GPUs back to a job that has the right to them.

A job within its guarantee (user or group) or an `urgent` job that cannot start may reclaim
GPUs from running jobs that are borrowed (beyond their own guarantee) or that are preemptible
and of a lower class; an urgent job takes them only from lower classes (two urgent jobs never
preempt each other, which would only trade one for the other). A job that is neither preemptible nor borrowed is never a victim. The
victims are chosen on one pool (one host, one model) so as to lose the least work: least
elapsed run time x GPUs first, and the pool that loses the least in total. The planner offers
as candidates only jobs that ran at least `policy.preempt_min_runtime_s` and that are not
already stopping for an earlier preemptor (its `model.Claim`).
"""

from __future__ import annotations

from collections.abc import Sequence

from ...model import PRIORITY_RANK, Job


def may_preempt(victim: Job, preemptor: Job, urgent: bool) -> bool:
    if victim.user == preemptor.user and not urgent:
        return False
    lower = PRIORITY_RANK.get(victim.priority, 1) < PRIORITY_RANK.get(preemptor.priority, 1)
    if urgent:  # urgent work takes GPUs from lower classes only, never from other urgent work
        return lower and (victim.borrowed or victim.preemptible)
    if victim.borrowed:  # a guarantee reclaims borrowed GPUs, except from urgent work
        return victim.priority != "urgent"
    return victim.preemptible and lower


class VictimIndex:
    """Whether any of some running jobs `may_preempt` would allow a preemptor to take, in a
    few set lookups instead of one call per job: most failed attempts fail for want of any."""

    __slots__ = ("users", "borrowed_users", "preemptible_users", "lowest_rank")

    def __init__(self, jobs: Sequence[Job]):
        self.users = {j.user for j in jobs}
        self.borrowed_users: set[str] = set()  # users of borrowed jobs that are not urgent
        self.preemptible_users: dict[int, set[str]] = {}  # class rank -> users of preemptible jobs, not borrowed
        self.lowest_rank = 99  # of the jobs that are borrowed or preemptible
        for j in jobs:
            rank = PRIORITY_RANK.get(j.priority, 1)
            if j.borrowed or j.preemptible:
                self.lowest_rank = min(self.lowest_rank, rank)
            if j.borrowed:
                if j.priority != "urgent":
                    self.borrowed_users.add(j.user)
            elif j.preemptible:
                self.preemptible_users.setdefault(rank, set()).add(j.user)

    def any_for(self, preemptor: Job, urgent: bool) -> bool:
        """Is `may_preempt(job, preemptor, urgent)` true for one of the jobs?"""
        rank = PRIORITY_RANK.get(preemptor.priority, 1)
        if urgent:
            return self.lowest_rank < rank
        me = preemptor.user
        return _someone_else(self.borrowed_users, me) or any(
            _someone_else(users, me) for r, users in self.preemptible_users.items() if r < rank)


def _someone_else(users: set[str], me: str) -> bool:
    return len(users) > 1 or (len(users) == 1 and me not in users)


def choose_victims(now: float, preemptor: Job, k: int, candidates: dict[int, list[Job]],
                   free_usable: dict[int, int], urgent: bool
                   ) -> tuple[int, list[Job]] | None:
    """(pool, victims) freeing k GPUs on one pool with the least lost work, or None.

    `candidates` maps pool -> running jobs on it not yet chosen; `free_usable` pool -> free
    GPUs not held by a reservation.
    """
    best: tuple[float, int, list[Job]] | None = None
    for p, jobs in candidates.items():
        have = free_usable.get(p, 0)
        allowed = sorted((j for j in jobs if may_preempt(j, preemptor, urgent)),
                         key=lambda j: ((now - (now if j.started_at is None else j.started_at)) * len(j.assigned_gpus), j.id))
        chosen: list[Job] = []
        lost = 0.0
        for j in allowed:
            if have >= k:
                break
            chosen.append(j)
            have += len(j.assigned_gpus)
            lost += (now - (now if j.started_at is None else j.started_at)) * len(j.assigned_gpus)
        if have >= k and chosen and (best is None or lost < best[0]):
            best = (lost, p, chosen)
    return None if best is None else (best[1], best[2])


def victims_text(victims: Sequence[Job]) -> str:
    ids = ", ".join(str(v.id) for v in victims)
    return f"waiting for preempted job{'s' if len(victims) > 1 else ''} {ids} to exit"
