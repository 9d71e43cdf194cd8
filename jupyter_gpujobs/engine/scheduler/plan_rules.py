"""What holds a job back in one scheduling cycle: its limits, its floor, reservations (policy).

Part of the planner's cycle (planner.py). It owns:
- the limits that apply to a job (user, group, array, the urgent reserve: quotas.py), cached
  per kind of job, and the running jobs' use of them at the start of the cycle;
- a job's floor on the time line: its begin time, the next off-peak window, the expected ends
  of the jobs it depends on (deferral.py);
- advance reservations (reservations.py): their occurrences blocked for others, and the
  holders' jobs started or booked inside the occurrence they hold.

It is a mixin of the planner's `_Cycle` (planner.py): its methods read and write the
cycle's state, which `_Cycle.__init__` sets up in one place, and call the cycle's other
parts through `self`. It imports only the scheduler's pure modules and the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from heapq import heapify

from ...model import Job, Reservation, Start
from .deferral import as_clock, clock_text, next_offpeak
from .placement import INF, View
from .quotas import Limit
from .reservations import AHEAD_S, HolderLine, gpus_text, occurrences, reserved_text
from .shares import Shares, gpu_bytes, running_weight


def _may_fit(k: int, lims: list[tuple[Limit, bool]]) -> bool:
    """No limit is smaller than the job (else it can never start, and gets no estimate)."""
    return all((k if per_gpu else 1) <= lim.cap for lim, per_gpu in lims)


class Rules:
    """What holds a job back: limits, floors, reservations."""

    def _floor(self, j: Job) -> tuple[float, str | None]:
        """When a job may start at the earliest (now, its begin time or the next off-peak
        window), and the reason when that is later than now."""
        now = self.now
        floor = now
        why: str | None = None
        clock = as_clock(self.policy)
        windows = self.policy.offpeak_windows
        if j.begin is not None and j.begin > now:
            floor = j.begin
            why = f"begins at {clock_text(j.begin, now, clock)}"
        if j.offpeak and windows:
            nxt = self.offpeak_now if floor == now else next_offpeak(floor, windows, clock)
            if nxt is not None and nxt > floor:
                floor = nxt
                why = "waiting for off-peak hours"
        return floor, why

    def _dependency_floor(self, j: Job) -> float | None:
        floor = self.now
        dl = self.policy.default_time_limit_s
        for d in j.depends:
            if d.job_id not in self.active:
                continue
            if d.job_id in self.ends:
                t: float | None = self.ends[d.job_id]
            else:
                est = self.expected.get(d.job_id, -1.0)
                if est == -1.0:
                    return None  # not walked yet
                if est is None:
                    return INF
                target_limit = self._limit_s.get(d.job_id, dl)
                t = est + target_limit
            floor = max(floor, t if t is not None else INF)
        return floor

    def _limit(self, key: tuple[str, object], cap: int | None, text: str) -> Limit | None:
        if key in self.limits:
            return self.limits[key]
        lim = Limit(cap, text) if cap is not None else None
        self.limits[key] = lim
        return lim

    def _kind(self, j: Job) -> tuple[list[tuple[Limit, bool]], int | None]:
        """The limits that apply to a job and its maximum time limit (cached per kind of job)."""
        key = (j.user, j.group, j.array_job_id, j.array_max_running, j.priority)
        kind = self.kinds.get(key)
        if kind is None:
            ug = (j.user, j.group)
            mt = self.mtl_cache.get(ug)
            if mt is None:
                mt = self.mtl_cache[ug] = self.quotas.max_time_limit(j.user, j.group)
            kind = self.kinds[key] = (self._limits_of(j), mt[0])
        return kind

    def _limits_of(self, j: Job) -> list[tuple[Limit, bool]]:
        """(limit, counts GPUs?) pairs that apply to a job (cached per kind of job)."""
        key = (j.user, j.group, j.array_job_id, j.array_max_running, j.priority == "urgent")
        out = self.lims_cache.get(key)
        if out is None:
            out = self.lims_cache[key] = self._limits_uncached(j)
        return out

    def _owner_limits(self, kind: str, who: str | None, caps: tuple[int | None, int | None],
                      whose: str) -> list[tuple[Limit, bool]]:
        """The running-jobs and GPU limits of one user ("u") or group ("g") with these caps."""
        jobs_cap, gpus_cap = caps
        out = []
        for key, cap, per_gpu, what in ((kind + "j", jobs_cap, False, "running jobs"),
                                        (kind + "g", gpus_cap, True, "GPUs")):
            lim = self._limit((key, who), cap, f"{whose} limit of {cap} {what} reached")
            if lim:
                out.append((lim, per_gpu))
        return out

    def _limits_uncached(self, j: Job) -> list[tuple[Limit, bool]]:
        ul = self.user_limits.get(j.user)
        if ul is None:
            ul = self.user_limits[j.user] = self._owner_limits("u", j.user, self.quotas.user_caps(j.user), "user")
        gl = self.group_limits.get(j.group)
        if gl is None:
            gl = self.group_limits[j.group] = self._owner_limits("g", j.group, self.quotas.group_caps(j.group),
                                                                 f"group {j.group}")
        out = ul + gl if gl else ul
        if j.array_job_id is not None and j.array_max_running:
            lim = self._limit(("a", j.array_job_id), j.array_max_running,
                              f"array limit of {j.array_max_running} running tasks")
            if lim:
                out = out + [(lim, False)]
        if self.reserve_limit is not None and j.priority != "urgent":
            out = out + [(self.reserve_limit, True)]
        return out

    def _account_running(self, running: Sequence[Job]) -> None:
        """The running jobs' use of the limits, now and on the limits' time lines (each line
        is filled, then made a heap once), and of GPUs per user and group."""
        ends, user_gpus, group_gpus = self.ends, self.user_gpus, self.group_gpus
        card_bytes: dict[tuple[str, int], int] | None = None
        for j in running:
            if j.share is not None or j.gpu_memory is not None:  # its fraction of its card
                if card_bytes is None:
                    card_bytes = gpu_bytes(self.gpus)
                    self.shares = Shares(self.cluster, self.gpus, running, ends)
                n: float = running_weight(j, card_bytes)
            else:
                n = len(j.assigned_gpus) if j.assigned_gpus else j.gpus
            end = ends[j.id]
            for lim, per_gpu in self._limits_of(j):
                a = n if per_gpu else 1
                lim.now_used += a
                lim.line_used += a
                lim.line.append((end, a))
            user_gpus[j.user] = user_gpus.get(j.user, 0) + n
            if j.group:
                group_gpus[j.group] = group_gpus.get(j.group, 0) + n
        for lim in self.limits.values():
            if lim is not None:
                heapify(lim.line)
        if self.reserve_limit is not None:
            heapify(self.reserve_limit.line)

    def _reserve_ahead(self, reservations: Sequence[Reservation]) -> None:
        """Block each reservation's active or next occurrence on the time line for others, and
        give its holders a time line of its GPUs (`HolderLine`)."""
        cl, now = self.cluster, self.now
        one_host = len(set(cl.pool_host)) <= 1
        for o in occurrences(reservations, self.gpus, now):
            p = cl.by_host_index.get((o.host, o.gpus[0]))
            if p is None:
                continue
            line = HolderLine(o, p)
            firm = o.start - now <= AHEAD_S
            for i in o.gpus:
                line.avail[i] = cl.block(p, i, o.start, o.end, firm)
                self.reserved_gpus[(o.host, i)] = max(o.end, self.reserved_gpus.get((o.host, i), o.end))
                if firm:
                    self.blocked_until[(o.host, i)] = self.reserved_gpus[(o.host, i)]
            cl.reserved_text.setdefault(p, []).append(reserved_text(o, now, as_clock(self.policy), one_host))
            self.holder_lines.append(line)
            self.holder_users.update(o.reservation.users)
            self.holder_groups.update(o.reservation.groups)
        self._open_holders()

    def _open_holders(self) -> None:
        users, groups = self.open_holders = (set(), set())
        for line in self.holder_lines:
            if line.occ.active(self.now) and any(t <= self.now for t in line.avail.values()):
                users.update(line.occ.reservation.users)
                groups.update(line.occ.reservation.groups)

    def _holds(self, j: Job) -> bool:
        """Does `j`'s user or group hold a reservation in this cycle?"""
        return j.user in self.holder_users or (j.group is not None and j.group in self.holder_groups)

    def _may_start_reserved(self, j: Job) -> bool:
        """Does `j` hold an occurrence on now with a free GPU (`open_holders`)?"""
        users, groups = self.open_holders
        return j.user in users or (j.group is not None and j.group in groups)

    def _start_reserved(self, j: Job, k: int, limit: float, view: View, lims: list[tuple[Limit, bool]]) -> bool:
        """Start a holder's job now on the free GPUs of an active occurrence it holds."""
        now = self.now
        for line in self.holder_lines:
            if not line.occ.holds(j.user, j.group) or line.pool not in view.pids:
                continue
            idx = line.start_now(now, k, limit)
            if idx is None:
                continue
            self.plan.starts.append(Start(j.id, line.occ.host, idx, False))
            self._book(j, lims, now, now + limit)
            self.user_gpus[j.user] = self.user_gpus.get(j.user, 0) + k
            if j.group:
                self.group_gpus[j.group] = self.group_gpus.get(j.group, 0) + k
            self.last_start = now
            self._cluster_changed()
            self._open_holders()
            return True
        return False

    def _book_reserved(self, j: Job, k: int, limit: float, floor: float, view: View) -> tuple[float, str] | None:
        """Book a holder's job inside the occurrence it holds where it starts soonest, when
        that is no later than the GPUs outside it allow: (start, reason), else None."""
        best: tuple[float, HolderLine] | None = None
        for line in self.holder_lines:
            if line.occ.holds(j.user, j.group) and line.pool in view.pids:
                t = line.earliest(k, floor, limit)
                if t is not None and (best is None or t < best[0]):
                    best = (t, line)
        if best is None or max(self.cluster.earliest(view, k), floor) < best[0]:
            return None
        t, line = best
        line.book(k, t, limit)
        o = line.occ
        when = clock_text(o.start, self.now, self.policy)
        if o.start > self.now:
            return t, f"waiting for reservation {o.reservation.label} ({gpus_text(o.gpus)} from {when})"
        return t, f"waiting for its reserved {gpus_text(o.gpus)} (reservation {o.reservation.label})"
