"""The planner: one scheduling cycle, `schedule()`, tying the small modules together.

Order the queue (priority.py), then walk it once. Each job either starts now on free GPUs
that no earlier job's reservation needs (placement.py), asks for preemption (preemption.py),
or is booked on the GPU time line, which gives its expected start and keeps later jobs from
delaying it. Deferral (deferral.py) and limits (quotas.py) give a job a floor on that time
line. Jobs waiting for a dependency are walked last, from their targets' expected ends.

This module owns the walk (`_Cycle.run`), a job's placement (`_place`, `_place_share`) and the
cycle's state, all set in `_Cycle.__init__`. The cycle's other parts are mixins of `_Cycle`,
each in its own module; they work on that state through `self`:

- policy: plan_rules.py (limits, floors, advance reservations), plan_preempt.py (who may
  preempt, victims, the preemptor's booking), plan_predict.py (`use_predictions` estimates);
- speed, with the same decisions as the plain walk, each naming the benchmark that justifies
  it: plan_memo.py (memo tables: failed shapes and preemptions, the victim index, reasons),
  plan_deep.py (the walk past the reservation depth by class and by family).

Cost (docs/scheduling.md, "Performance"): only the first `policy.reservation_depth` jobs that
cannot start are booked in detail on the GPU time line (like Slurm's bf_max_job_test); deeper
jobs get an aggregate estimate (`AggregateLine`), clamped to the detailed time line, and still
start now when free GPUs allow without delaying any reservation.

May call: the scheduler's pure modules and the model; nothing of the engine, no I/O, no clock.
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Collection, Container, Mapping, Sequence
from functools import cached_property
from itertools import compress
from operator import attrgetter

from ...model import GPU, Claim, Job, JobState, Plan, Policy, Reservation, Start
from .budgets import BudgetState, mark_held
from .budgets import apply as apply_budgets
from .deferral import as_clock, dependency_status, next_offpeak
from .fairshare import Usage, as_usage
from .placement import INF, AggregateLine, Cluster, View
from .plan_deep import DeepWalk
from .plan_memo import Memos
from .plan_predict import PredictedLine, Predicting
from .plan_preempt import Preempting
from .plan_rules import Rules, _may_fit
from .preemption import VictimIndex
from .priority import QueueOrder
from .quotas import Limit, Quotas
from .reservations import HolderLine
from .shares import Shares


def schedule(now: float, pending: Sequence[Job] | Mapping[int, Job], running: Sequence[Job], gpus: Sequence[GPU],
             policy: Policy, usage: Usage | Mapping[str, float] | None = None,
             finished: Mapping[int, JobState] | None = None, estimate: bool = True,
             order: QueueOrder | None = None, claims: Sequence[Claim] = (),
             reservations: Sequence[Reservation] = (), budgets: Sequence[BudgetState] = ()) -> Plan:
    """Decide one cycle. Pure: reads only its arguments, returns a `Plan`.

    With `estimate=False` the cycle decides the same starts, preemptions, cancels, order and
    reasons, and books the reservations of the first `policy.reservation_depth` blocked jobs,
    but gives the jobs past that depth no expected start (`plan.expected_start` has no entry
    for them): the deep-queue estimate is most of a cycle's cost, and a server refreshes it
    less often than it decides (see `GPUJobs.estimate_interval`).

    `order` is the priority order of an earlier cycle (its `plan.queue_order`): the jobs it
    holds keep their places, new ones take theirs, and the priorities are not recalculated
    (the server recalculates them with the estimates). None: calculate them now.

    `pending` may be a mapping of the jobs by id, as a caller that keeps one (the server, the
    simulator) has them: the cycle then reads it, instead of building its own of a deep queue
    (8 % of a deciding cycle's instructions at 10k jobs). It is not changed, nor kept.

    `claims`: the preemptors whose victims were told to stop in earlier cycles (`Claim`). A
    claimant is placed before every other job; while its victims run out their grace it
    waits for them, booked on their GPUs, and preempts nobody else; they are no victims of
    anyone else.

    `reservations`: the advance reservations (`Reservation`); the active or next occurrence
    of each is kept for its holders (reservations.py): others only backfill jobs that end
    before it starts, and its holders' jobs start inside it.

    `budgets`: the GPU-hour budgets with what was used of them (`budgets.BudgetState`): the
    jobs of a used-up one wait with the reason, at the end of the order, or (its mode "low")
    are walked at low priority."""
    by_id = pending if isinstance(pending, Mapping) else dict(zip(map(_id, pending), pending))
    over_budget: dict[int, BudgetState] = {}
    if budgets:  # used-up GPU-hour budgets: their jobs wait, or walk at low priority (budgets.py)
        by_id, over_budget = apply_budgets(by_id, budgets)
    cycle = _Cycle(now, running, gpus, policy, finished or {}, by_id, reservations)
    cycle.estimate = estimate
    cycle.order = order
    cycle.claims = claims
    if not over_budget:
        return cycle.run(as_usage(usage))
    cycle.over_budget = over_budget  # still active for the jobs that depend on them
    plan = cycle.run(as_usage(usage))
    mark_held(plan, over_budget, estimate)
    return plan


_id = attrgetter("id")
_depends = attrgetter("depends")
_held = attrgetter("held")


class _Active:
    """Is a job id pending or running? (`in`, without a set of every id)"""

    __slots__ = ("pending", "running")

    def __init__(self, pending: Mapping[int, Job], running: Mapping[int, float]):
        self.pending, self.running = pending, running

    def __contains__(self, job_id: object) -> bool:
        return job_id in self.pending or job_id in self.running


class _Without:
    """Ids in `ids` but not in `gone`."""

    __slots__ = ("ids", "gone")

    def __init__(self, ids: Container[int], gone: set[int]):
        self.ids, self.gone = ids, gone

    def __contains__(self, job_id: object) -> bool:
        return job_id not in self.gone and job_id in self.ids


class _Cycle(Rules, Preempting, Predicting, Memos, DeepWalk):
    estimate = True  # book the jobs past the reservation depth for their expected start
    order: QueueOrder | None = None  # a kept priority order, else calculated
    claims: Sequence[Claim] = ()  # preemptors waiting for their victims (placed first)
    over_budget: Mapping[int, object] = {}  # pending jobs held by a used-up budget (not walked)

    def __init__(self, now: float, running: Sequence[Job], gpus: Sequence[GPU], policy: Policy,
                 finished: Mapping[int, JobState], pending: Mapping[int, Job],
                 reservations: Sequence[Reservation] = ()):
        self.now = now
        self.policy = policy
        self.finished = finished
        self.gpus = gpus
        self.running = running
        self.plan = Plan()
        dl = policy.default_time_limit_s
        self.ends = {j.id: (j.started_at if j.started_at is not None else now) + (j.time_limit_s or dl)
                     for j in running}
        self.cluster = Cluster(now, gpus, running, self.ends)
        # advance reservations: their holders' time lines, and the GPUs kept from others
        self.holder_lines: list[HolderLine] = []
        self.holder_users: set[str] = set()
        self.holder_groups: set[str] = set()
        # the holders of an occurrence on now with a free GPU: past the reservation depth only
        # their jobs leave the walk by class (they may start inside it); others only wait
        self.open_holders: tuple[set[str], set[str]] = (set(), set())
        self.reserved_gpus: dict[tuple[str, int], float] = {}  # (host, GPU) -> end of its block
        self.blocked_until: dict[tuple[str, int], float] = {}  # the same, for the blocks on the time line
        if reservations:
            self._reserve_ahead(reservations)
        self.quotas = Quotas(policy)
        self.pending = pending  # by id
        self.limits: dict[tuple[str, object], Limit | None] = {}
        self.user_limits: dict[str, list[tuple[Limit, bool]]] = {}
        self.group_limits: dict[str | None, list[tuple[Limit, bool]]] = {}
        self.user_gpus: dict[str, float] = {}
        self.group_gpus: dict[str, float] = {}
        self.claimed: dict[str, int] = {}
        self.expected: dict[int, float | None] = self.plan.expected_start
        self.reserve_limit: Limit | None = None
        cap = self.quotas.outside_reserve(self.cluster.total)
        if cap is not None:
            self.reserve_limit = Limit(cap, f"the last {policy.urgent_reserve_gpus} GPUs are kept for urgent jobs")
        self.victims: set[int] = set()
        self.first: set[int] = set()  # the claimants, placed before the walk
        self.candidates: dict[int, list[Job]] | None = None
        self.victim_index: dict[str | None, VictimIndex] = {}  # by GPU type, while no job is preempted
        self._limit_s: dict[int, float] = {}
        # cost controls (the reservation depth; the memo tables: plan_memo.py, plan_deep.py)
        depth = policy.reservation_depth
        self.depth: float = INF if depth is None else max(0, depth)
        self.reserved_n = 0
        self.deep: AggregateLine | None = None
        # policy.use_predictions: expected starts from predicted runtimes, and their ranges
        # (estimates only: plan_predict.py)
        self.pred: PredictedLine | None = None
        # whether the line of predicted ends holds a prediction yet (before one, a start on it
        # is the time limits' start with less care for packing: a bound, not a prediction)
        self.any_pred = False
        if policy.use_predictions:
            self._init_predictions(running)
        self.failed_shapes: dict[tuple[int, str | None], float] = {}  # (k, type) -> least failed limit
        # (type, user, group, class) -> fewest GPUs for which preemption failed
        self.failed_preempt: dict[tuple[str | None, str | None, str | None, str], int] = {}
        self.kinds: dict[tuple[str, str | None, int | None, int | None, str],
                         tuple[list[tuple[Limit, bool]], int | None]] = {}
        self.shape_floor: dict[tuple[int, str | None], float] = {}  # (k, type) -> cl.earliest
        self.reason_cache: dict[tuple[int, str | None, int | None, int | None], str] = {}
        # (kind, GPUs, type, jobs named in reasons) -> (reason, not blocked by a limit) of deep
        # jobs that can only wait whatever their time limit (cleared when the GPUs change)
        self.waits: dict[tuple[object, ...], tuple[str, bool]] = {}
        self.lims_cache: dict[tuple[str, str | None, int | None, int | None, bool], list[tuple[Limit, bool]]] = {}
        self.mtl_cache: dict[tuple[str, str | None], tuple[int | None, str]] = {}
        self.default_limit = float(policy.default_time_limit_s)
        self.gen = 0  # counts changes of the free GPUs (starts, preemptions)
        self.shares: Shares | None = None  # the cards with shares, made at the first share
        self._account_running(running)

    @cached_property
    def active(self) -> _Active:
        """Ids of the active jobs (for dependencies only)."""
        return _Active(ChainMap(self.pending, self.over_budget) if self.over_budget else self.pending, self.ends)

    def run(self, usage: Usage) -> Plan:
        plan, now, policy = self.plan, self.now, self.policy
        by_id: Mapping[int, Job] = self.pending
        pending = by_id.values()
        queue: Collection[Job] = pending
        waiting_dep: dict[int, int] = {}
        cancelled: set[int] = set()
        with_deps = list(compress(pending, map(_depends, pending)))  # the few jobs with dependencies
        for j in with_deps:
            status, what = dependency_status(j, self.finished, self.active)
            if status == "cancel":
                plan.cancels.append((j.id, str(what)))
                cancelled.add(j.id)
            elif status == "wait":
                waiting_dep[j.id] = int(what)  # type: ignore[arg-type]
        if cancelled:
            self._cancel_dependents(with_deps, cancelled, waiting_dep)
        held = list(compress(pending, map(_held, pending)))  # held jobs are not eligible
        for j in held:
            plan.reasons[j.id] = "held: it starts only once released (jupyter gpujobs release)"
            if self.estimate:
                self.expected[j.id] = None
        if cancelled or held:
            out = cancelled | {j.id for j in held}
            queue = [j for j in pending if j.id not in out]
            by_id = {i: j for i, j in by_id.items() if i not in out}
        arranged = self.order.arrange(queue, by_id) if self.order is not None else None
        if arranged is None:  # no kept order, or one that cannot place a new user's job
            arranged = QueueOrder.compute(now, queue, policy, usage, self.cluster.largest_host).arrange(queue, by_id)
            assert arranged is not None
        ordered, classes, plan.queue_order = arranged
        plan.order = plan.queue_order.ids()  # the ids of `ordered`
        windows = policy.offpeak_windows
        offpeak_now = next_offpeak(now, windows, as_clock(policy)) if windows else None  # an instant
        later: list[Job] = []
        self.top_reserved: int | None = None
        self.fifo_blocked: int | None = None
        self.last_start = now
        self.pred_last = now
        reasons = plan.reasons
        self.offpeak_now = offpeak_now
        # preemptors first: the GPUs freed for them are theirs (a victim requeued meanwhile
        # must not take them back), and they preempt nobody else while their victims stop
        first = self.first
        for c in self.claims:
            j = by_id.get(c.job_id)
            if j is None or j.id in waiting_dep or j.id in first:
                continue
            first.add(j.id)
            if not self._hold_claim(j, c):
                self._place_now(j)
        for n, j in enumerate(ordered):
            if self.reserved_n >= self.depth:
                self._walk_deep(ordered, classes, n, waiting_dep, later)
                break
            if j.id in waiting_dep:
                later.append(j)
                continue
            if first and j.id in first:
                continue
            self._place_now(j)
        # dependency waiters, from their targets' expected ends
        for _ in range(len(later) + 1):
            rest: list[Job] = []
            for j in later:
                floor = self._dependency_floor(j)
                if floor is None:
                    rest.append(j)
                    continue
                dep = next(d for d in j.depends if d.job_id in self.active)
                self._place(j, max(floor, now), f"waiting for job {dep.job_id} ({dep.kind})", deferred=True)
            if len(rest) == len(later):
                break
            later = rest
        for j in later:
            dep = next(d for d in j.depends if d.job_id in self.active)
            reasons[j.id] = f"waiting for job {dep.job_id} ({dep.kind})"
            if self.estimate:  # else its target may just not be estimated in this cycle
                self.expected[j.id] = None
        if first:  # a claimant that started waits for nothing (the walk by class gave it its class's)
            for jid in first & {s.job_id for s in plan.starts}:
                reasons.pop(jid, None)
        return plan

    def _cancel_dependents(self, with_deps: list[Job], cancelled: set[int], waiting_dep: dict[int, int]) -> None:
        """The jobs that a cancel of this cycle leaves without their dependency are cancelled
        in this cycle too, all down a chain (not one link per cycle)."""
        dependents: dict[int, list[Job]] = {}
        for j in with_deps:
            for d in j.depends:
                dependents.setdefault(d.job_id, []).append(j)
        finished = dict(self.finished)
        active = _Without(self.active, cancelled)
        todo = list(cancelled)
        while todo:
            gone = todo.pop()
            finished[gone] = JobState.CANCELLED
            for j in dependents.get(gone, ()):
                if j.id in cancelled:
                    continue
                status, what = dependency_status(j, finished, active)
                if status == "cancel":
                    self.plan.cancels.append((j.id, str(what)))
                    cancelled.add(j.id)
                    waiting_dep.pop(j.id, None)
                    todo.append(j.id)

    def _place_now(self, j: Job) -> None:
        """`_place` from now, or from its begin time or the next off-peak window."""
        self._place(j, *self._floor(j))

    def _limits_to_place(self, j: Job, floor: float, why: str | None) -> tuple[float, list[tuple[Limit, bool]]] | None:
        """The time limit and the limits of a job to place, or None when it cannot be placed
        (no floor on the time line, or a time limit over its maximum): its reason is set and
        it gets no expected start."""
        jid = j.id
        limit = float(j.time_limit_s or self.default_limit)
        self._limit_s[jid] = limit
        if floor == INF:
            self.plan.reasons[jid] = why or "cannot be predicted"
            self.expected[jid] = None
            return None
        lims, mtl = self._kind(j)
        if mtl is not None and limit > mtl:
            self.plan.reasons[jid] = (f"time limit of {int(limit)} s is over the maximum of {mtl} s for "
                                      f"{self.mtl_cache[(j.user, j.group)][1]}")
            self.expected[jid] = None
            return None
        return limit, lims

    def _view_to_place(self, j: Job) -> View | None:
        """The GPUs of the job's type, or None when this server has none (its reason is set
        and it gets no expected start)."""
        cl = self.cluster
        if not cl.pool_host:
            draining = [g for g in self.gpus if g.draining]  # (the others are unhealthy)
            self.plan.reasons[j.id] = ("no GPUs on this server" if not self.gpus else
                                       f"every GPU here is draining or unhealthy ({len(draining)} of {len(self.gpus)} "
                                       "draining): it waits for one to be undrained or healthy again")
        else:
            view = cl.views.get(j.gpu_type) or cl.view(j.gpu_type)
            if view.pids:
                return view
            self.plan.reasons[j.id] = f"no {j.gpu_type} GPUs on this server"
        self.expected[j.id] = None
        return None

    def _place(self, j: Job, floor: float, why: str | None, deferred: bool = False) -> None:
        if j.share is not None or j.gpu_memory is not None:
            self._place_share(j, floor, why, deferred)
            return
        plan, now, policy, cl = self.plan, self.now, self.policy, self.cluster
        reasons, expected = plan.reasons, self.expected
        k = j.gpus
        jid = j.id
        checked = self._limits_to_place(j, floor, why)
        if checked is None:
            return
        limit, lims = checked
        blocked: Limit | None = None
        for lim, per_gpu in lims:
            if lim.now_used + (k if per_gpu else 1) > lim.cap:
                blocked = lim
                break
        view: View | None = None
        if k > 0:
            view = self._view_to_place(j)
            if view is None:
                return
            if k > view.max_size:
                reasons[jid] = f"asks for {k} {view.label} but one host has at most {view.max_size}"
                expected[jid] = None
                return
        holder = bool(self.holder_lines) and k > 0 and self._holds(j)
        if holder and floor <= now and blocked is None and self._start_reserved(j, k, limit, view, lims):  # type: ignore[arg-type]
            return
        if floor <= now and blocked is None:
            if k == 0:
                host = cl.pool_host[0] if cl.pool_host else (self.gpus[0].host if self.gpus else "localhost")
                plan.starts.append(Start(jid, host, (), False))
                self._book(j, lims, now, now + limit)
                self._cluster_changed()
                return
            assert view is not None
            if self.fifo_blocked is None or policy.backfill:
                placed = None
                if view.free_pids:
                    shape = (k, j.gpu_type)
                    if limit < self.failed_shapes.get(shape, INF):
                        placed = cl.start_now(view, k, limit)
                        if placed is None:
                            self._shape_failed(view, k, j.gpu_type, limit)
                if placed is not None:
                    p, idx = placed
                    borrowed = self.quotas.any_guarantee and not self._within_guarantee(j, k)
                    plan.starts.append(Start(jid, cl.pool_host[p], idx, borrowed))
                    self._book(j, lims, now, now + limit)
                    self.user_gpus[j.user] = self.user_gpus.get(j.user, 0) + k
                    if j.group:
                        self.group_gpus[j.group] = self.group_gpus.get(j.group, 0) + k
                    self.last_start = now
                    self._cluster_changed()
                    if self.deep is not None:
                        hole = cl.hole[p]
                        self.deep.started_now(cl.pool_name[p], sum(1 for i in idx if i not in hole), now, now + limit)
                    if self.pred is not None:
                        self._pred_started(j, p, k, limit)
                    return
            if policy.preemption and self._try_preempt(j, k, limit, view):
                return
            why = self._waiting_reason(view, k, j.gpu_type)
        else:
            if (blocked is not None and blocked is self.reserve_limit and floor <= now and view is not None
                    and policy.preemption and self._try_preempt(j, k, limit, view, blocked.cap - blocked.now_used)):
                return  # the reserve is full: a guarantee is honoured by borrowers' GPUs, not the reserve's
            if why is None:
                why = blocked.reason if blocked is not None else "waiting"
        if not self.estimate and self.reserved_n >= self.depth:
            reasons[jid] = why  # past the depth, estimates are left to an estimating cycle
            if k > 0:  # the jobs named in later reasons, as an estimating cycle names them
                if self.fifo_blocked is None and floor <= now and blocked is None and not deferred:
                    self.fifo_blocked = jid
                if self.top_reserved is None and _may_fit(k, lims):
                    self.top_reserved = jid
            return
        # book it on the time line: the expected start
        t = floor
        for lim, per_gpu in lims:
            e = lim.earliest(k if per_gpu else 1, floor)
            if e > t:
                t = e
        if not policy.backfill and k > 0 and not deferred and t < self.last_start:
            t = self.last_start
        if t == INF:
            reasons[jid] = why
            expected[jid] = None
            return
        # past the depth a booking is an estimate: it holds nothing, so it does not count as
        # running now against the limits (a reservation starting now does)
        estimate_only = self.reserved_n >= self.depth
        if k > 0:
            assert view is not None
            inside = self._book_reserved(j, k, limit, t, view) if holder else None
            if inside is not None:
                start = inside[0]
                if floor <= now and blocked is None:
                    why = inside[1]
            elif self.reserved_n < self.depth:
                start = cl.reserve(view, k, limit, t)
                self.reserved_n += 1
            else:
                start = self._deep_estimate(view, k, j.gpu_type, limit, t)
            if start == INF:
                reasons[jid] = why
                expected[jid] = None
                return
            if self.top_reserved is None and start > now:
                self.top_reserved = jid
            if self.fifo_blocked is None and not deferred and blocked is None and floor <= now:
                self.fifo_blocked = jid
            if not policy.backfill and not deferred:
                self.last_start = start
        else:
            start = t
        if start < now:
            start = now
        self._book(j, lims, start, start + limit, counts_now=not estimate_only)
        reasons[jid] = why
        expected[jid] = start if self.pred is None or k == 0 else self._predicted_start(j, view, t, limit, start)  # type: ignore[arg-type]

    def _place_share(self, j: Job, floor: float, why: str | None, deferred: bool) -> None:
        """`_place` for a job that asks for part of one GPU (shares.py packs it): it starts now
        on a card with room, else waits for the earliest card with room (its expected start,
        booked on that card). Its limits count its fraction of a GPU. It preempts nobody."""
        plan, now, policy, cl = self.plan, self.now, self.policy, self.cluster
        reasons, expected = plan.reasons, self.expected
        jid = j.id
        checked = self._limits_to_place(j, floor, why)
        if checked is None:
            return
        limit, lims = checked
        view = self._view_to_place(j)
        if view is None:
            return
        if self.shares is None:
            self.shares = Shares(cl, self.gpus, self.running, self.ends)
        shares = self.shares
        never = shares.impossible(j, view)
        if never is not None:
            reasons[jid] = never
            expected[jid] = None
            return
        weight = shares.weight(j, view)
        blocked: Limit | None = None
        for lim, per_gpu in lims:
            if lim.now_used + (weight if per_gpu else 1) > lim.cap:
                blocked = lim
                break
        if floor <= now and blocked is None:
            if self.fifo_blocked is None or policy.backfill:
                placed = shares.start_now(j, view, limit)
                if placed is not None:
                    p, index, frac, opened = placed
                    borrowed = self.quotas.any_guarantee and not self._within_guarantee(j, frac)
                    plan.starts.append(Start(jid, cl.pool_host[p], (index,), borrowed, frac))
                    self._book(j, lims, now, now + limit, amount=frac)
                    self.user_gpus[j.user] = self.user_gpus.get(j.user, 0) + frac
                    if j.group:
                        self.group_gpus[j.group] = self.group_gpus.get(j.group, 0) + frac
                    self.last_start = now
                    self._cluster_changed()
                    if opened and self.deep is not None:  # a free card is busy now
                        self.deep.started_now(cl.pool_name[p], 1, now, now + limit)
                    if opened and self.pred is not None:
                        self._pred_started(j, p, 1, limit)
                    return
            if self.fifo_blocked is not None and not policy.backfill:
                why = f"behind job {self.fifo_blocked} (first in line)"
            else:
                why = shares.waiting_reason(j, view)
        elif why is None:
            why = blocked.reason if blocked is not None else "waiting"
        reasons[jid] = why
        if not self.estimate and self.reserved_n >= self.depth:
            return
        t = floor
        for lim, per_gpu in lims:
            e = lim.earliest(weight if per_gpu else 1, floor)
            if e > t:
                t = e
        if not policy.backfill and not deferred and t < self.last_start:
            t = self.last_start
        start = shares.book_estimate(j, view, t, limit) if t < INF else INF
        if start == INF:
            expected[jid] = None
            return
        if start < now:
            start = now
        if not policy.backfill and not deferred:
            self.last_start = start
        if self.fifo_blocked is None and not deferred and blocked is None and floor <= now:
            self.fifo_blocked = jid
        self._book(j, lims, start, start + limit, counts_now=False, amount=weight)
        expected[jid] = start

    def _book(self, j: Job, lims: list[tuple[Limit, bool]], start: float, end: float,
              counts_now: bool = True, amount: float | None = None, held: bool = False) -> None:
        """Book a job on its limits' time lines; `amount`: the GPUs it counts (a share's
        fraction); `held`: it counts as running now though it starts later (a preemptor's
        GPUs are its own while its victims stop)."""
        gpus = j.gpus if amount is None else amount
        at = INF if held else self.now if counts_now else -INF
        for lim, per_gpu in lims:
            lim.book(start, end, gpus if per_gpu else 1, at)

