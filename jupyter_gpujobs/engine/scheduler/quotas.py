"""Quotas and limits: who may run how much.

Layers, each optional: the per-user limits of the policy (`user_max_running_jobs`,
`user_max_gpus`), the user's quota (`user_quotas[user]`, else `default_user_quota`) and the
group's quota (`group_quotas[group]`): guaranteed GPUs, max GPUs, max running jobs, max time
limit, elastic (may borrow idle GPUs beyond the guarantee; if not, the guarantee is also the
cap). `urgent_reserve_gpus` keeps that many GPUs for `urgent` jobs only.

A `Limit` counts one resource (running jobs or GPUs of one user, group or array) both now and
on the time line of reservations, so a job held by a limit gets an honest expected start.
"""

from __future__ import annotations

import heapq

from ...model import Policy, Quota, format_duration


class Limit:
    """A cap on a resource. `now_used` is what runs now (plus this plan's starts); the heap of
    (end, amount) is the time line used for expected starts."""

    __slots__ = ("cap", "now_used", "line", "line_used", "reason")

    def __init__(self, cap: int, reason: str):
        self.cap = cap
        self.now_used = 0
        self.line: list[tuple[float, int]] = []
        self.line_used = 0
        self.reason = reason

    def earliest(self, amount: int, floor: float) -> float:
        """When the time line has room for `amount` (consumes the ends it needs)."""
        if amount > self.cap:
            return float("inf")
        t = floor
        line = self.line
        while self.line_used + amount > self.cap and line:
            end, a = heapq.heappop(line)
            self.line_used -= a
            if end > t:
                t = end
        return t

    def book(self, start: float, end: float, amount: int, now: float) -> None:
        if start <= now:
            self.now_used += amount
        self.line_used += amount
        heapq.heappush(self.line, (end, amount))


def _min(*values: int | None) -> int | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None


class Quotas:
    """Resolves the quota layers of users and groups once per cycle."""

    def __init__(self, policy: Policy):
        self.policy = policy
        self.any_guarantee = (
            any(q.guaranteed_gpus > 0 for q in policy.user_quotas.values())
            or any(q.guaranteed_gpus > 0 for q in policy.group_quotas.values())
            or bool(policy.default_user_quota and policy.default_user_quota.guaranteed_gpus > 0))
        self._user: dict[str, Quota | None] = {}

    def user(self, user: str) -> Quota | None:
        if user in self._user:
            return self._user[user]
        q = self.policy.user_quotas.get(user, self.policy.default_user_quota)
        self._user[user] = q
        return q

    def group(self, group: str | None) -> Quota | None:
        return self.policy.group_quotas.get(group) if group else None

    def user_caps(self, user: str) -> tuple[int | None, int | None]:
        """(max running jobs, max GPUs) of a user over all layers."""
        q = self.user(user)
        p = self.policy
        if q is None:
            return p.user_max_running_jobs, p.user_max_gpus
        gpu_cap = q.max_gpus if q.elastic else _min(q.max_gpus, q.guaranteed_gpus)
        return _min(p.user_max_running_jobs, q.max_running_jobs), _min(p.user_max_gpus, gpu_cap)

    def group_caps(self, group: str | None) -> tuple[int | None, int | None]:
        q = self.group(group)
        if q is None:
            return None, None
        gpu_cap = q.max_gpus if q.elastic else _min(q.max_gpus, q.guaranteed_gpus)
        return q.max_running_jobs, gpu_cap

    def max_time_limit(self, user: str, group: str | None) -> tuple[int | None, str]:
        """The smallest max time limit that applies and whose it is."""
        best: int | None = self.policy.max_time_limit_s
        who = "this server"
        uq, gq = self.user(user), self.group(group)
        if uq and uq.max_time_limit_s is not None and (best is None or uq.max_time_limit_s < best):
            best, who = uq.max_time_limit_s, f"user {user}"
        if gq and gq.max_time_limit_s is not None and (best is None or gq.max_time_limit_s < best):
            best, who = gq.max_time_limit_s, f"group {group}"
        return best, who

    def guarantees(self, user: str, group: str | None) -> tuple[int, int]:
        uq, gq = self.user(user), self.group(group)
        return (uq.guaranteed_gpus if uq else 0), (gq.guaranteed_gpus if gq else 0)

    def outside_reserve(self, total_gpus: int) -> int | None:
        """How many of `total_gpus` jobs that are not urgent may use; None: no urgent reserve."""
        reserve = self.policy.urgent_reserve_gpus
        return max(0, total_gpus - reserve) if reserve > 0 else None

    def never_starts(self, user: str, group: str | None, gpus: int, time_limit_s: int, urgent: bool,
                     total_gpus: int) -> tuple[str, str] | None:
        """(field, why) when a job like this could never start under these limits, whatever
        else runs: a time limit over the maximum of its user or group, more GPUs than a cap
        of theirs, or than the GPUs outside the urgent reserve; None when it could. The
        submit path refuses such a job with it (the scheduler reads the same caps)."""
        most, who = self.max_time_limit(user, group)
        if most is not None and time_limit_s > most:
            return "time_limit", (f"{format_duration(time_limit_s)} is over the maximum of {format_duration(most)} "
                                  f"for {who}")
        for field, whose, (jobs_cap, gpus_cap) in (("gpus", f"user {user}", self.user_caps(user)),
                                                   ("group", f"group {group}", self.group_caps(group))):
            if jobs_cap is not None and jobs_cap < 1:
                return field, f"{whose} may run no jobs"
            if gpus_cap is not None and gpus > gpus_cap:
                return "gpus", (f"asked for {gpus} GPUs but {whose} may use at most {gpus_cap} at a time; "
                                "this job could never start")
        cap = None if urgent else self.outside_reserve(total_gpus)
        if cap is not None and gpus > cap:
            return "gpus", (f"asked for {gpus} GPUs but only {cap} of this server's {total_gpus} may run jobs "
                            "that are not urgent; this job could never start")
        return None
