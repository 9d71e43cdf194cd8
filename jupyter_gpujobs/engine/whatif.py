"""What-if before submitting (`POST jobs?dry_run=1`, `submit --test-only`): when a request
would start if it were submitted now, and which nearby choices would change that (fewer GPUs,
a share of one GPU, another GPU model, a shorter time limit). Nothing is stored, nothing is
published, no audit row is written: the request is checked exactly as a submission is
(`Admission.checked`, the same InvalidInput and so the same 400s) and then only answered.

The answer comes from `Timeline`, the GPU time line as the planner books it, rebuilt from the
last plan: the running jobs' time limits, then every waiting job booked from its expected
start (the one the queue shows) for its time limit, in queue order - the first
`policy.reservation_depth` in detail (`Cluster.reserve`: per host, with the holes backfill may
use), the deeper ones on the aggregate line (`placement.AggregateLine`). The request joins it
at the back of the queue, as a new job of no higher priority does, and gets what the planner
would give it there: now on k free GPUs of one host whose holes are long enough for its limit
(it delays no reservation), else its booking on the detailed line, or past the depth on the
aggregate line, never earlier than k GPUs of one host free; and within the limits on what its
user and group run at once (`quotas.Limit`, with their jobs' bookings replayed in queue order).
On random snapshots this is the planner's own expected start for the request once queued
(tests/test_whatif.py). A share
starts now on a card with room beside the shares running there (`scheduler.shares.Card`),
else as a new card. The line is built again for a new estimate, or a new plan once it is a
second old, and an answer only reads it (and copies a few heaps past the depth), so an answer
costs about a submission (benchmarks/bench_whatif.py). What it leaves out, said with every
answer (`basis`): a higher priority (urgent, fair share) that puts the request ahead of
others, the waiting share jobs, and, for a holder of an advance reservation, the time inside
it (the reserved GPUs are kept from everyone else as the planner keeps them).

The right-sizing advice of a request (`WhatIf.advice`, shown with the answer and in a job's
`GET jobs/<id>` to its owner) comes from `advice.py`, with the start of its suggestion from
the same line.

May call: `admission.Admission` (the checks of a submission), `inventory.Inventory` (the GPUs),
`rules.Rules` (the policy in force), `advice` (which reads the user's own finished jobs), the
pure scheduler's placement and shares, and the model. It reads the active jobs and the last
plan's estimates from `state.EngineState`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from heapq import heapify
from typing import Any

from ..model import (
    GPU,
    Job,
    Policy,
    Reservation,
    format_duration,
    gpu_matches_type,
    is_share,
    share_fraction,
    share_memory_bytes,
)
from .admission import Admission
from .advice import advice_text, advise, history
from .inventory import Inventory
from .rules import Rules
from .scheduler.deferral import as_clock, next_offpeak
from .scheduler.placement import INF, AggregateLine, Cluster, View
from .scheduler.quotas import Limit, Quotas
from .scheduler.reservations import AHEAD_S, occurrences
from .scheduler.shares import Shares
from .state import EngineState

#: A nearby choice is shown when it starts at least this much sooner than the request (s).
SOONER_S = 60.0
#: The shares a what-if tries for a request of one whole GPU.
SHARES = (0.5, 0.25)


@dataclass(frozen=True)
class Shape:
    """What a what-if varies: GPUs (or a share of one), model and time limit."""

    gpus: int
    gpu_type: str | None
    time_limit_s: int
    share: float | None = None
    gpu_memory: int | None = None

    def job(self, user: str) -> Job:
        return Job(id=0, user=user, gpus=self.gpus, gpu_type=self.gpu_type, time_limit_s=self.time_limit_s,
                   share=self.share, gpu_memory=self.gpu_memory)

    def as_dict(self) -> dict[str, Any]:
        gpus: float = self.share if self.share is not None else self.gpus
        return {"gpus": gpus, "gpu_type": self.gpu_type, "time_limit_s": self.time_limit_s,
                "gpu_memory": self.gpu_memory}


class Timeline:
    """The GPU time line after the waiting jobs, as the planner books them (see the module
    docstring). Pure: built from plain values, changed by nothing after `__init__` (an answer
    reads the detailed line and works on copies of the aggregate one)."""

    def __init__(self, now: float, gpus: Sequence[GPU], running: Sequence[Job], waiting: Sequence[Job],
                 estimates: Mapping[int, float | None], policy: Policy, reservations: Sequence[Reservation] = ()):
        self.now = now
        dl = policy.default_time_limit_s
        ends = {j.id: (j.started_at if j.started_at is not None else now) + (j.time_limit_s or dl) for j in running}
        self.cluster = cl = Cluster(now, gpus, running, ends)
        # the advance reservations' GPUs, kept from everyone but their holders, as the planner
        # blocks them (`Rules._reserve_ahead`); the line is everyone else's: a holder's request
        # is answered as anyone's (`holder` says it may start sooner)
        kept = occurrences(reservations, gpus, now)
        self.reservations = [o.reservation for o in kept]
        for o in kept:
            p = cl.by_host_index.get((o.host, o.gpus[0]))
            if p is not None:
                for i in o.gpus:
                    cl.block(p, i, o.start, o.end, o.start - now <= AHEAD_S)
        self.cards = Shares(cl, gpus, running, ends)
        self.models = sorted(set(cl.pool_name))
        # the first `reservation_depth` waiting jobs are booked in detail (`Cluster.reserve`: per
        # host, holes that backfill may use), the deeper ones on the aggregate line made from
        # that detailed line, as the planner does
        depth = INF if policy.reservation_depth is None else max(0, policy.reservation_depth)
        booked = 0
        line: AggregateLine | None = None
        for j in waiting:
            start = estimates.get(j.id)
            if start is None or is_share(j) or j.gpus == 0:
                continue
            view = cl.view(j.gpu_type)
            if j.gpus > view.max_size:
                continue
            limit, floor = j.time_limit_s or dl, max(start, now)
            if booked < depth:
                cl.reserve(view, j.gpus, limit, floor)
                booked += 1
                continue
            if line is None:
                line = AggregateLine(cl)
            line.take(cl, view, j.gpus, limit, floor)
        self.deep = booked >= depth  # a new job would be past the reservation depth
        self.heaps = (line or AggregateLine(cl)).heaps
        # the limits on what one user or group runs at once: their jobs' bookings, read when a
        # request of theirs comes (`_limits`)
        self.quotas = Quotas(policy)
        self.running = running
        self.waiting = waiting
        self.estimates = estimates
        self.ends = ends
        self._kept: dict[tuple[str, str | None], list[tuple[Limit, bool]]] = {}

    def start(self, shape: Shape, now: float, floor: float, user: str = "", group: str | None = None) -> float:
        """When a job of this shape of `user` (in `group`), asked for at `now` (at or after the
        line's own time) and waiting from `floor` (>= now) on, would start (INF: never here)."""
        view = self.cluster.view(shape.gpu_type)
        if shape.gpus == 0:
            return floor
        if shape.gpus > view.max_size:
            return INF
        if shape.share is not None or shape.gpu_memory is not None:
            return self._share_start(view, shape, now, floor)
        k = shape.gpus
        # the limits on what the user and their group run at once, as the planner's `_place`
        # reads them: room now lets it start now; else their time lines give it a floor
        limits = self._limits(user, group) if user else []
        blocked = any(lim.now_used + (k if per_gpu else 1) > lim.cap for lim, per_gpu in limits)
        if floor <= now and not blocked and self._now(view, k, shape.time_limit_s, now):
            return now
        for lim, per_gpu in limits:
            floor = max(floor, lim.earliest(k if per_gpu else 1, floor))
        if floor == INF:
            return INF
        return max(floor, self._later(view, k, shape.time_limit_s, floor))

    def _limits(self, user: str, group: str | None) -> list[tuple[Limit, bool]]:
        """Fresh copies of the user's and group's limits (running jobs, GPUs) with what their
        running jobs use and their waiting jobs' bookings, as the planner keeps them when it
        reaches a new job at the back of the queue. The originals are made once per line."""
        key = (user, group)
        kept = self._kept.get(key)
        if kept is None:
            kept = self._kept[key] = []
            for whose, caps, mine in ((f"user {user}", self.quotas.user_caps(user), lambda j: j.user == user),
                                      (f"group {group}", self.quotas.group_caps(group),
                                       lambda j: group is not None and j.group == group)):
                for cap, per_gpu in zip(caps, (False, True)):
                    if cap is None:
                        continue
                    lim = Limit(cap, f"{whose} limit of {cap}")
                    for j in filter(mine, self.running):
                        lim.book(self.now, self.ends[j.id], (len(j.assigned_gpus) or j.gpus) if per_gpu else 1, self.now)
                    dl = self.quotas.policy.default_time_limit_s
                    for j in filter(mine, self.waiting):  # in queue order, each as the planner walked it
                        t = self.estimates.get(j.id)
                        if t is not None and not is_share(j):
                            a = j.gpus if per_gpu else 1
                            lim.earliest(a, self.now)  # (consumes the ends it needed)
                            lim.book(t, t + (j.time_limit_s or dl), a, self.now)
                    kept.append((lim, per_gpu))
        out = []
        for lim, per_gpu in kept:
            copy = Limit(lim.cap, lim.reason)
            copy.now_used, copy.line, copy.line_used = lim.now_used, list(lim.line), lim.line_used
            heapify(copy.line)
            out.append((copy, per_gpu))
        return out

    def _now(self, view: View, k: int, limit: float, now: float) -> bool:
        """k free GPUs of one host whose holes (the first booking on each) are long enough for
        `limit`: the request delays no reservation (`Cluster.start_now`, without taking them)."""
        cl = self.cluster
        need = now + limit
        for p in view.free_pids:
            hole = cl.hole[p]
            if sum(hole.get(i, INF) >= need for i in cl.free[p]) >= k:
                return True
        return False

    def _later(self, view: View, k: int, limit: float, floor: float) -> float:
        """Its start on the detailed line (`Cluster.reserve` would book it there), or past the
        reservation depth on (a copy of) the aggregate line, never earlier than k GPUs of one
        host free on the detailed line."""
        cl = self.cluster
        earliest = cl.earliest(view, k)
        if not self.deep:
            return earliest
        line = AggregateLine.__new__(AggregateLine)
        line.heaps = {name: list(h) for name, h in self.heaps.items()
                      if any(cl.pool_name[p] == name for p in view.pids)}
        for h in line.heaps.values():
            heapify(h)
        line.by_view = {}
        return max(line.take(cl, view, k, limit, floor), earliest)

    def _share_start(self, view: View, shape: Shape, now: float, floor: float) -> float:
        """A share: on a card with room beside its running shares, else as a new card."""
        job = shape.job("")
        best = INF
        for p in view.pids:
            for card in self.cards.cards.get(p, ()):
                frac, mem = share_fraction(job, card.memory), share_memory_bytes(job, card.memory) or 0
                if mem <= card.memory:
                    best = min(best, card.earliest(floor, shape.time_limit_s, frac, mem, INF))
        if best <= floor:
            return best
        return min(best, self.start(Shape(1, shape.gpu_type, shape.time_limit_s), now, floor))


class WhatIf:
    """The engine's part that answers `POST jobs?dry_run=1`."""

    #: A line is kept this long (s) across new plans (see `timeline`).
    REBUILD_S = 1.0

    def __init__(self, state: EngineState, admission: Admission, inventory: Inventory, rules: Rules):
        self.state = state
        self.admission = admission
        self.inventory = inventory
        self.rules = rules
        self._line: tuple[tuple[object, object], tuple[GPU, ...], Timeline] | None = None

    def timeline(self) -> Timeline:
        """The line after the waiting jobs, each booked from its expected start as the views
        show it (the last plan's, else the last estimate's). Built again when a new estimate
        came, or when a new plan came and the line is a second old: at most once a second under
        a stream of submissions, whose cycles each make a plan."""
        s = self.state
        gpus = tuple(self.inventory.inventory)
        cached = self._line
        if cached is not None and cached[1] == gpus and cached[0][1] is s.estimates and (
                cached[0][0] is s.plan or s.clock() < cached[2].now + self.REBUILD_S):
            return cached[2]
        waiting = [j for j in map(s.pending.get, s.plan.order) if j is not None]
        planned = s.plan.expected_start
        estimates = {j.id: planned[j.id] if j.id in planned else s.estimates.get(j.id) for j in waiting}
        line = Timeline(s.clock(), gpus, list(s.running.values()), waiting, estimates, self.rules.current_policy(),
                        self.rules.reservations)
        self._line = ((s.plan, s.estimates), gpus, line)
        return line

    async def answer(self, user: str, body: dict[str, Any]) -> dict[str, Any]:
        """When the request in `body` would start if `user` submitted it now, and the nearby
        choices that would start sooner. Raises InvalidInput exactly as `submit` does."""
        new = await self.admission.checked(user, body)
        spec = new.specs[0]
        s = self.state
        asked = Shape(spec["gpus"], spec["gpu_type"], spec["time_limit_s"] or s.policy.default_time_limit_s,
                      spec["share"], spec["gpu_memory"])
        out: dict[str, Any] = {"dry_run": True, "request": asked.as_dict(), "tasks": len(new.specs),
                               "expected_start": None, "alternatives": [], "now": new.now}
        floor = None if s.mirrored or spec["held"] else self._floor(spec, new.now)
        if s.mirrored:
            out["basis"] = f"the {s.runner.name} runner schedules these jobs itself: ask it (sbatch --test-only)"
        elif spec["held"]:
            out["basis"] = "submitted held, it starts only once released"
        elif floor is None:
            out["basis"] = "it waits for a job whose end has no estimate yet"
        else:
            line = self.timeline()
            now = max(new.now, line.now)
            floor = max(floor, now)
            who = (user, spec["group"])
            start = line.start(asked, now, floor, *who)
            out["expected_start"] = _time(start)
            # a bound from time limits, as the planner books: sooner if the jobs ahead end sooner
            out["expected_start_kind"] = "bound" if now < start < INF else None
            out["alternatives"] = [{**shape.as_dict(), "change": change, "expected_start": _time(t)}
                                   for change, shape in self.nearby(asked, line)
                                   if (t := line.start(shape, now, floor, *who)) < INF and t + SOONER_S <= start]
            out["basis"] = ("the queue as the last plan left it, this request behind every waiting job; not "
                            "counted: a higher priority, waiting shares")
            held = [r.label for r in line.reservations if r.holds(user, spec["group"])]
            if held:
                out["basis"] += f"; you hold {', '.join(held)}: inside it your job may start sooner"
        out["advice"] = self.advice(user, spec["name"], asked, floor=floor)
        return out

    def _floor(self, spec: dict[str, Any], now: float) -> float | None:
        """The earliest the request may start: its begin, the next off-peak window, its
        dependencies' expected ends (None: a dependency with no estimate)."""
        s = self.state
        floor = max(now, spec["begin"] or now)
        policy = self.rules.current_policy()
        if spec["offpeak"] and policy.offpeak_windows:
            floor = next_offpeak(floor, policy.offpeak_windows, as_clock(policy))
        for dep in spec["depends"]:
            job = s.active_job(dep.job_id)
            if job is None:
                continue
            started = job.started_at if job.started_at is not None else s.plan.expected_start.get(
                job.id, s.estimates.get(job.id))
            if started is None:
                return None
            floor = max(floor, started + (job.time_limit_s or policy.default_time_limit_s))
        return floor

    def advice(self, user: str, name: str, asked: Shape, exclude: int | None = None,
               floor: float | None = None) -> dict[str, Any] | None:
        """Right-sizing advice (`advice.advise`) from `user`'s own finished jobs named `name`
        (not `exclude`) for the request `asked`; with `floor`, when its suggestion would start
        if asked for now, waiting from `floor` on."""
        s = self.state
        runs = [r for r in history(s.store, user, name, s.clock()) if r.job_id != exclude]
        cards = [g.memory_total_mb for g in self.inventory.inventory if gpu_matches_type(g.name, asked.gpu_type)]
        out = advise(asked.gpus, asked.share, asked.gpu_memory, asked.time_limit_s, runs, min(cards, default=None))
        suggest = out and out["suggest"]
        if not out or not suggest or floor is None or s.mirrored:
            return out
        shape = Shape(asked.gpus, asked.gpu_type, suggest.get("time_limit_s", asked.time_limit_s),
                      suggest.get("gpus", asked.share), asked.gpu_memory)
        line = self.timeline()
        now = max(s.clock(), line.now)
        t = line.start(shape, now, max(floor, now), user)
        out["expected_start"] = _time(t)
        if t < INF:
            out["text"] = advice_text(out["runs"], out["used"], suggest,
                                      "now" if t <= now else f"in {format_duration(t - now)}")
        return out

    def nearby(self, asked: Shape, line: Timeline) -> list[tuple[str, Shape]]:
        """The nearby choices: fewer GPUs, a share of one GPU, another model, a shorter limit."""
        out: list[tuple[str, Shape]] = []
        whole = asked.share is None and asked.gpu_memory is None
        if whole:
            for k in sorted({asked.gpus // 2, 1} - {0, asked.gpus}, reverse=True):
                out.append(("fewer GPUs", Shape(k, asked.gpu_type, asked.time_limit_s)))
            if asked.gpus == 1 and self.state.shares.watched:
                out.extend(("a share of one GPU", Shape(1, asked.gpu_type, asked.time_limit_s, f)) for f in SHARES)
        if asked.gpu_type:
            for model in line.models:
                if not gpu_matches_type(model, asked.gpu_type):
                    out.append(("another GPU model", Shape(asked.gpus, model, asked.time_limit_s, asked.share,
                                                           asked.gpu_memory)))
        if asked.time_limit_s >= 1200:
            shorter = max(600, asked.time_limit_s // 2 // 60 * 60)
            out.append(("a shorter time limit", Shape(asked.gpus, asked.gpu_type, shorter, asked.share,
                                                      asked.gpu_memory)))
        return out


def _time(t: float) -> float | None:
    return None if t == INF else t
