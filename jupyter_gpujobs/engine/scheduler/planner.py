"""The planner: one scheduling cycle, `schedule()`, tying the small modules together.

Order the queue (priority.py), then walk it once. Each job either starts now on free GPUs
that no earlier job's reservation needs (placement.py), asks for preemption (preemption.py),
or is booked on the GPU time line, which gives its expected start and keeps later jobs from
delaying it. Deferral (deferral.py) and limits (quotas.py) give a job a floor on that time
line. Jobs waiting for a dependency are walked last, from their targets' expected ends.

Cost (docs/scheduling.md, "Performance"): only the first `policy.reservation_depth` jobs that
cannot start are booked in detail on the GPU time line (like Slurm's bf_max_job_test); deeper
jobs get an aggregate estimate (`AggregateLine`), clamped to the detailed time line, and still
start now when free GPUs allow without delaying any reservation. Start-now attempts are
memoised by shape: once k GPUs of a type cannot start now for time limit T, no later job with
k' >= k GPUs of that type and limit >= T is tried (free GPUs and holes only shrink in a walk);
failed preemption attempts are memoised the same way.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Callable, Collection, Mapping, Sequence
from functools import cached_property
from heapq import heapify, heappop, heappush, heapreplace
from itertools import compress, islice
from operator import attrgetter, itemgetter

from ...model import GPU, Claim, Job, JobState, Plan, Policy, Preemption, Reservation, Start
from .deferral import clock_text, dependency_status, next_window_start
from .fairshare import Usage, as_usage
from .placement import INF, AggregateLine, Cluster, View
from .preemption import VictimIndex, choose_victims, victims_text
from .priority import QueueOrder
from .quotas import Limit, Quotas
from .reservations import AHEAD_S, HolderLine, gpus_text, occurrences, reserved_text
from .shares import Shares, gpu_bytes, running_weight


def schedule(now: float, pending: Sequence[Job] | Mapping[int, Job], running: Sequence[Job], gpus: Sequence[GPU],
             policy: Policy, usage: Usage | Mapping[str, float] | None = None,
             finished: Mapping[int, JobState] | None = None, estimate: bool = True,
             order: QueueOrder | None = None, claims: Sequence[Claim] = (),
             reservations: Sequence[Reservation] = ()) -> Plan:
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
    before it starts, and its holders' jobs start inside it."""
    by_id = pending if isinstance(pending, Mapping) else dict(zip(map(_id, pending), pending))
    cycle = _Cycle(now, running, gpus, policy, finished or {}, by_id, reservations)
    cycle.estimate = estimate
    cycle.order = order
    cycle.claims = claims
    return cycle.run(as_usage(usage))


_id = attrgetter("id")
_depends = attrgetter("depends")


class _Active:
    """Is a job id pending or running? (`in`, without a set of every id)"""

    __slots__ = ("pending", "running")

    def __init__(self, pending: Mapping[int, Job], running: Mapping[int, float]):
        self.pending, self.running = pending, running

    def __contains__(self, job_id: object) -> bool:
        return job_id in self.pending or job_id in self.running


def _may_fit(k: int, lims: list[tuple[Limit, bool]]) -> bool:
    """No limit is smaller than the job (else it can never start, and gets no estimate)."""
    return all((k if per_gpu else 1) <= lim.cap for lim, per_gpu in lims)


def _preempt_memo(j: Job) -> tuple[str | None, str | None, str | None, str]:
    """What a preemption attempt's outcome depends on besides the GPUs asked: an urgent job's
    victims do not depend on who asks (`preemption.may_preempt`), a guarantee's do."""
    if j.priority == "urgent":
        return (j.gpu_type, None, None, "urgent")
    return (j.gpu_type, j.user, j.group, j.priority)


def _tokens(key: Callable[[tuple[object, ...]], tuple[object, ...] | None]) -> Callable[[tuple[object, ...]], object]:
    """For `QueueOrder.per_class`: a token per distinct `key(job_class)`, shared by the classes
    with that key (None where the key is None). A token hashes faster than the key. Classes
    added to an order later (`per_class` makes theirs in each cycle) may get another token for
    the same key: what is decided per token is then decided twice, with the same outcome."""
    tokens: dict[tuple[object, ...], object] = {}

    def token(c: tuple[object, ...]) -> object:
        k = key(c)
        return None if k is None else tokens.setdefault(k, object())

    return token


def _family_key(c: tuple[object, ...]) -> tuple[object, ...] | None:
    """The family of a `job_class` (`_Cycle._bulk_family`): the classes differing only in
    their time limit share it; None for a class decided from its key in each cycle
    (dependencies, off-peak, a begin time, a GPU share)."""
    priority, user, group, k, gt, tl, aid, amr, offpeak, begin, depends, share, gpu_memory = c
    if depends or offpeak or begin is not None or share is not None or gpu_memory is not None:
        return None
    return (priority, user, group, k, gt, aid, amr)


def _kind_key(c: tuple[object, ...]) -> tuple[object, ...]:
    """The kind of a `job_class` (`_Cycle._kind`: who asks, in which array, at which class)."""
    priority, user, group = c[:3]
    aid, amr = c[6:8]
    return (user, group, aid, amr, priority)


_class_limit = itemgetter(5)  # the time limit in a `job_class`


class _Cycle:
    estimate = True  # book the jobs past the reservation depth for their expected start
    order: QueueOrder | None = None  # a kept priority order, else calculated
    claims: Sequence[Claim] = ()  # preemptors waiting for their victims (placed first)

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
        # cost controls (see the module docstring)
        depth = policy.reservation_depth
        self.depth: float = INF if depth is None else max(0, depth)
        self.reserved_n = 0
        self.deep: AggregateLine | None = None
        # policy.use_predictions: expected starts from predicted runtimes (estimates only)
        self.pred: AggregateLine | None = None
        # whether the line of predicted ends holds a prediction yet (before one, a start on it
        # is the time limits' start with less care for packing: a bound, not a prediction)
        self.any_pred = False
        if policy.use_predictions:
            busy: dict[tuple[str, int], float] = {}
            for r in running:
                if r.host is None:
                    continue
                end = self.ends[r.id]
                if r.predicted_runtime_s is not None and r.started_at is not None:
                    self.any_pred = True
                    guess = r.started_at + r.predicted_runtime_s
                    if guess <= now:  # past its prediction: as long again, within its limit
                        guess = now + r.predicted_runtime_s
                    end = min(end, guess)
                for i in r.assigned_gpus:
                    busy[(r.host, i)] = max(end, now)
            for key, end in self.blocked_until.items():
                busy[key] = max(busy.get(key, now), end)
            self.pred = AggregateLine(self.cluster, busy)
            # per pool, when its GPUs free on that line (running jobs only): a k-GPU job's
            # predicted start is no earlier than the first pool with k of them (packing)
            cl = self.cluster
            self.pred_pools = [sorted(busy.get((cl.pool_host[p], i), now) for _, i in av)
                               for p, av in enumerate(cl.avail)]
            self.pred_views: dict[int, tuple[list[float] | None, list[float]]] = {}  # `_pred_view`
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
            cl.reserved_text.setdefault(p, []).append(reserved_text(o, now, self.policy.utc_offset_s, one_host))
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
        when = clock_text(o.start, self.now, self.policy.utc_offset_s)
        if o.start > self.now:
            return t, f"waiting for reservation {o.reservation.label} ({gpus_text(o.gpus)} from {when})"
        return t, f"waiting for its reserved {gpus_text(o.gpus)} (reservation {o.reservation.label})"

    @cached_property
    def active(self) -> _Active:
        """Ids of the active jobs (for dependencies only)."""
        return _Active(self.pending, self.ends)

    # ------------------------------------------------------------------ limits
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

    # ------------------------------------------------------------------ the walk
    def run(self, usage: Usage) -> Plan:
        plan, now, policy = self.plan, self.now, self.policy
        by_id: Mapping[int, Job] = self.pending
        pending = by_id.values()
        queue: Collection[Job] = pending
        waiting_dep: dict[int, int] = {}
        cancelled: set[int] = set()
        for j in compress(pending, map(_depends, pending)):  # the few jobs with dependencies
            status, what = dependency_status(j, self.finished, self.active)
            if status == "cancel":
                plan.cancels.append((j.id, str(what)))
                cancelled.add(j.id)
            elif status == "wait":
                waiting_dep[j.id] = int(what)  # type: ignore[arg-type]
        if cancelled:
            queue = [j for j in pending if j.id not in cancelled]
            by_id = {i: j for i, j in by_id.items() if i not in cancelled}
        arranged = self.order.arrange(queue, by_id) if self.order is not None else None
        if arranged is None:  # no kept order, or one that cannot place a new user's job
            arranged = QueueOrder.compute(now, queue, policy, usage, self.cluster.largest_host).arrange(queue, by_id)
            assert arranged is not None
        ordered, classes, plan.queue_order = arranged
        plan.order = plan.queue_order.ids()  # the ids of `ordered`
        windows = policy.offpeak_windows
        off = policy.utc_offset_s
        offpeak_now = next_window_start(now + off, windows) if windows else None
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

    def _place_now(self, j: Job) -> None:
        """`_place` from now, or from its begin time or the next off-peak window."""
        self._place(j, *self._floor(j))

    def _floor(self, j: Job) -> tuple[float, str | None]:
        """When a job may start at the earliest (now, its begin time or the next off-peak
        window), and the reason when that is later than now."""
        now = self.now
        floor = now
        why: str | None = None
        off = self.policy.utc_offset_s
        windows = self.policy.offpeak_windows
        if j.begin is not None and j.begin > now:
            floor = j.begin
            why = f"begins at {clock_text(j.begin, now, off)}"
        if j.offpeak and windows:
            nxt = self.offpeak_now if floor == now else next_window_start(floor + off, windows)
            if nxt is not None and nxt - off > floor:
                floor = nxt - off
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
            self.plan.reasons[j.id] = "no GPUs on this server"
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

    def _walk_deep(self, ordered: list[Job], classes: list[int], first: int,
                   waiting_dep: Mapping[int, int], later: list[Job]) -> None:
        """The walk past the reservation depth. A job that can only wait (GPUs asked, no begin
        or off-peak, cannot start now, nothing to preempt: `_decide_deep`) gets the same
        reason as `_place` would give and, when estimating, an aggregate estimate
        (`_book_deep`); any other job goes to `_place`. That decision is the same for every
        job of one class (`job_class`) while the free GPUs, the limits in use and the jobs
        named in reasons stay the same, so it is made once per class and reused until one of
        them changes: over a deep queue most jobs cost one dictionary lookup."""
        # (with backfill the first blocked job names nothing and decides nothing: see `_waiting_reason`)
        if not self.estimate and self.top_reserved is not None and (self.fifo_blocked is not None or self.policy.backfill):
            resume = self._decide_deep_bulk(ordered, classes, first, waiting_dep, later)
            if resume is None:
                return
            first = resume
        cl = self.cluster
        reasons, limit_s = self.plan.reasons, self._limit_s
        estimate = self.estimate
        if estimate and self.deep is None:
            self.deep = AggregateLine(cl)
        # decisions by class: (reason, GPUs, type, view, limit, limits, unblocked)
        decided: dict[int, tuple[str, int, str | None, View, float, list[tuple[Limit, bool]], bool]] = {}
        named = (self.fifo_blocked, self.top_reserved, self.gen)
        # the single heap of a view whose GPUs are all one model (the common case), else None
        single_of: dict[str | None, list[float] | None] = {}
        pred = self.pred
        stale = False  # a start, preemption or newly named job may have changed a decision
        placed = self.first
        for j, c in zip(islice(ordered, first, None), islice(classes, first, None)):
            if waiting_dep and j.id in waiting_dep:
                later.append(j)
                continue
            if placed and j.id in placed:
                continue
            if stale:
                stale = False
                if named != (self.fifo_blocked, self.top_reserved, self.gen):
                    named = (self.fifo_blocked, self.top_reserved, self.gen)
                    decided = {}
            d = decided.get(c)
            if d is None:
                d = self._decide_deep(j)
                if d is None:  # not one that can only wait: the full placement
                    self._place_now(j)
                    stale = True
                    continue
                decided[c] = d
                if not estimate and (self.fifo_blocked is None or self.top_reserved is None):
                    # the jobs named in later reasons, as an estimating cycle names them
                    if self.fifo_blocked is None and d[6]:
                        self.fifo_blocked = j.id
                    if self.top_reserved is None and _may_fit(d[1], d[5]):
                        self.top_reserved = j.id
                    stale = True
            reasons[j.id] = d[0]
            if estimate:
                why, k, gt, view, limit, lims, unblocked = d
                limit_s[j.id] = limit
                if self.top_reserved is None or self.fifo_blocked is None:
                    stale = True
                self._book_deep(j, view, k, gt, limit, lims, unblocked, single_of, pred)

    def _decide_deep_bulk(self, ordered: list[Job], classes: list[int], first: int,
                          waiting_dep: Mapping[int, int], later: list[Job]) -> int | None:
        """The deep walk of a cycle that does not estimate, by class instead of by job.

        Decide each class once from its first job (`_decide_deep` changes nothing), write
        every job's reason in bulk, then walk the jobs no class decision covers (they may
        start, preempt or name a job in reasons). While none of them changes the free GPUs,
        the limits in use or the jobs named in reasons, every class
        decision stays what the job-by-job walk would give. When one does, the jobs after it
        are left to that walk: returns where it resumes (None when all is done).

        Classes that differ only in their time limit are one family (`_bulk_family`): it is
        decided once, and each class checks only that its limit lies in the family's range.
        The families of one kind (`_kind`) read what depends on the kind once. Each class's
        family, kind and limit come from tables kept with the priority order
        (`QueueOrder.per_class`), made once per priority calculation, not from the jobs
        (which lie in memory out of queue order). The reasons are given by class
        (`Reasons.add_by_class`): one entry per job is written only when someone reads them."""
        decided: dict[int, str] = {}
        special: set[int] = set()
        order = self.plan.queue_order
        family_of = order.per_class("planner.family", _tokens(_family_key))
        limit_of = order.per_class("planner.limit", _class_limit)
        kind_of = order.per_class("planner.kind", _tokens(_kind_key))
        kinds: dict[object, tuple[list[tuple[Limit, bool]], float, bool]] = {}  # see `_bulk_family`
        keys: list[tuple[object, ...]] | None = None
        families: dict[object, tuple[str, float, float] | None] = {}
        default_limit = self.default_limit
        now, off = self.now, self.policy.utc_offset_s
        jobs, cls = ordered[first:], classes[first:]
        for c, j in dict(zip(reversed(cls), reversed(jobs))).items():  # class -> its first job
            fk: object = family_of[c]
            begins: str | None = None
            if fk is None:  # dependencies, off-peak or a begin time: from the class key
                if keys is None:
                    keys = order.class_keys()
                priority, user, group, k, gt, tl, aid, amr, offpeak, begin, depends, share, gpu_memory = keys[c]
                if depends or share is not None or gpu_memory is not None:  # shares: `_place_share`
                    special.add(c)
                    continue
                if offpeak or begin <= now:  # type: ignore[operator]
                    d = self._decide_deep(j)
                    if d is None:
                        special.add(c)
                    else:
                        decided[c] = d[0]
                    continue
                # a deferred job only waits for its begin time (`_deep_family`), if it may run here
                fk = (priority, user, group, k, gt, aid, amr)
                begins = f"begins at {clock_text(begin, now, off)}"  # type: ignore[arg-type]
            fam = families.get(fk, False)
            if fam is False:
                fam = families[fk] = self._bulk_family(j, kind_of[c], kinds)
            if fam is not None and fam[1] <= (limit_of[c] or default_limit) <= fam[2]:
                decided[c] = fam[0] if begins is None else begins
            else:  # as `_decide_deep` would find: it may start, preempt, or is over its maximum
                special.add(c)
        # the decided classes' jobs wait for their class's reason (the ids from plan.order, not
        # from the jobs: a job read in queue order is a cache miss); the others get their own,
        # here or, after a job that changes the state, in the job-by-job walk
        reasons = self.plan.reasons
        reasons.add_by_class(self.plan.order, classes, decided, first)
        if not special:
            return None
        rest = list(compress(range(first, len(classes)), map(special.__contains__, cls)))
        found: dict[int, str] = {}  # special classes decided below, for their own later jobs
        placed = self.first
        for n in rest:
            j = ordered[n]
            if waiting_dep and j.id in waiting_dep:
                later.append(j)
                continue
            if placed and j.id in placed:
                continue
            c = classes[n]
            why = found.get(c)
            if why is None and not j.depends:  # a failed attempt may have decided its class
                d = self._decide_deep(j)
                if d is not None:
                    why = found[c] = d[0]
            if why is not None:
                reasons[j.id] = why
                continue
            state = (self.gen, self.fifo_blocked, self.top_reserved)
            self._place_now(j)
            if state != (self.gen, self.fifo_blocked, self.top_reserved):
                return n + 1
        return None

    def _bulk_family(self, j: Job, kind: object,
                     kinds: dict[object, tuple[list[tuple[Limit, bool]], float, bool]]) -> tuple[str, float, float] | None:
        """`_deep_family`'s (reason, low, high), for the walk by class, where nothing changes
        from one family to the next: what depends only on the job's kind (its limits, its
        maximum time limit, whether it may preempt at all) is read once per kind (`kinds`, by
        the kind's token). Jobs with a begin time or off-peak go to `_deep_family` itself. The
        `waits` memo that `_deep_family` keeps for the job-by-job walk is left out: no entry
        would be read before the state it describes changes. Both decide in `_only_waits`."""
        k = j.gpus
        gt = j.gpu_type
        view = self.cluster.views.get(gt)
        if k <= 0 or view is None or k > view.max_size or (self.holder_lines and self._may_start_reserved(j)):
            return None
        if j.offpeak or j.begin is not None:
            fd = self._deep_family(j)
            return None if fd is None else (fd[0], fd[6], fd[7])
        known = kinds.get(kind)
        if known is None:
            lims, mtl = self._kind(j)
            known = kinds[kind] = (lims, INF if mtl is None else float(mtl), self._may_ever_preempt(j))
        lims, high, may_preempt = known
        low = self._start_below(view, k, gt)
        wait = self._only_waits(j, k, gt, view, lims, low, may_preempt)
        return None if wait is None else (wait[0], low if wait[1] else -INF, high)

    def _decide_deep(self, j: Job) -> tuple[str, int, str | None, View, float, list[tuple[Limit, bool]], bool] | None:
        """(reason, GPUs, type, view, limit, limits, not blocked by a limit) of a deep job that
        can only wait, or None for one that needs `_place` (no GPUs asked, a begin or off-peak
        floor, over its maximum time limit, or it may start now or preempt)."""
        fam = self._deep_family(j)
        if fam is None:
            return None
        why, k, gt, view, lims, unblocked, low, high = fam
        limit = float(j.time_limit_s or self.default_limit)
        if not low <= limit <= high:
            return None
        return (why, k, gt, view, limit, lims, unblocked)

    def _deep_family(self, j: Job) -> tuple[str, int, str | None, View, list[tuple[Limit, bool]], bool, float, float] | None:
        """`_decide_deep` for every time limit at once: (reason, GPUs, type, view, limits, not
        blocked by a limit, low, high), where a job like `j` with a limit in [low, high] can
        only wait for that reason (below low it may start now, above high it is over its
        maximum time limit), or None when none can only wait."""
        now, cl = self.now, self.cluster
        k = j.gpus
        gt = j.gpu_type
        view = cl.views.get(gt)
        kk = (j.user, j.group, j.array_job_id, j.array_max_running, j.priority)
        kind = self.kinds.get(kk) or self._kind(j)
        if k <= 0 or view is None or k > view.max_size or j.share is not None or j.gpu_memory is not None:
            return None  # (a share: `_place_share`)
        if self.holder_lines and self._may_start_reserved(j):
            return None  # (a holder's job may start inside its reservation now: `_place`)
        lims, mtl = kind
        high = INF if mtl is None else float(mtl)
        if j.offpeak or (j.begin is not None and j.begin > now):
            if self.estimate:
                return None  # its estimate starts from its floor: `_place`
            floor, why = self._floor(j)
            if floor > now:  # it only waits, for the reason `_place` gives first
                return (why or "waiting", k, gt, view, lims, False, -INF, high)
        low = self._start_below(view, k, gt)
        wk = (kk, k, gt, self.fifo_blocked, self.top_reserved)
        wait = self.waits.get(wk)
        if wait is None:
            wait = self._only_waits(j, k, gt, view, lims, low, self._may_ever_preempt(j))
            if wait is None:
                return None
            # a failed preemption fails again: only a start (which clears `waits`) changes it
            self.waits[wk] = wait
        return (wait[0], k, gt, view, lims, wait[1], low if wait[1] else -INF, high)

    def _may_ever_preempt(self, j: Job) -> bool:
        """Could a job of this kind have a right to preempt in this cycle (urgent, or some
        guarantee exists)? Whether it has one for k GPUs is `_victim_index_for`'s question."""
        return self.policy.preemption and (self.quotas.any_guarantee or j.priority == "urgent")

    def _start_below(self, view: View, k: int, gt: str | None) -> float:
        """The time limit below which a job of k GPUs of this type that no limit blocks may
        start now (the shapes that failed to start: `failed_shapes`), -INF when none may."""
        if view.free_pids and (self.policy.backfill or self.fifo_blocked is None):
            return self.failed_shapes.get((k, gt), INF)
        return -INF

    def _only_waits(self, j: Job, k: int, gt: str | None, view: View, lims: list[tuple[Limit, bool]],
                    low: float, may_preempt: bool) -> tuple[str, bool] | None:
        """Why a deep job like `j` (k GPUs of type `gt`, these limits, no begin time or
        off-peak) can only wait, and whether no limit blocks it; None when it may start now
        (`low` is INF: no start of its shape has failed) or may preempt (`may_preempt`: it
        has a right to, as an urgent job or by a guarantee). Shared by `_deep_family` and
        `_bulk_family`, which differ only in what they remember."""
        for lim, per_gpu in lims:
            if lim.now_used + (k if per_gpu else 1) > lim.cap:
                if lim is self.reserve_limit and may_preempt and self._victim_index_for(j, k, view) is not None:
                    return None  # (the reserve is the last limit) it may preempt a borrower
                return (lim.reason, False)
        if low == INF:
            return None  # it may start now, whatever its limit
        if may_preempt and self._victim_index_for(j, k, view) is not None:
            return None  # it may preempt
        return (self._waiting_reason(view, k, gt), True)

    def _book_deep(self, j: Job, view: View, k: int, gt: str | None, limit: float,
                   lims: list[tuple[Limit, bool]], unblocked: bool,
                   single_of: dict[str | None, list[float] | None], pred: AggregateLine | None) -> None:
        """A deep job's expected start: the limits' time lines, then the aggregate line."""
        now, cl, deep, expected = self.now, self.cluster, self.deep, self.expected
        assert deep is not None
        jid = j.id
        t = now
        swaps: list[Limit] | None = None  # limits whose earliest end is replaced at booking
        for lim, per_gpu in lims:  # Limit.earliest, inlined
            a = k if per_gpu else 1
            if lim.line_used + a > lim.cap:
                if a > lim.cap:
                    t = INF
                    break
                line = lim.line
                if line[0][1] == a and lim.line_used <= lim.cap:
                    # the earliest end frees exactly enough: one heapreplace when booked
                    e = line[0][0]
                    if e > t:
                        t = e
                    if swaps is None:
                        swaps = [lim]
                    else:
                        swaps.append(lim)
                    continue
                while lim.line_used + a > lim.cap and line:
                    e, used = heappop(line)
                    lim.line_used -= used
                    if e > t:
                        t = e
        backfill = self.policy.backfill
        if not backfill and t < self.last_start:
            t = self.last_start
        if t == INF:
            expected[jid] = None
            return
        shape = (k, gt)
        sf = self.shape_floor.get(shape)
        if sf is None:
            sf = self.shape_floor[shape] = cl.earliest(view, k)
        if sf == INF:
            expected[jid] = None
            return
        floor = t
        if t < sf:
            t = sf
        if k == 1:  # AggregateLine.take, inlined for one GPU of one model
            h = single_of.get(gt, 0)
            if h == 0:
                h = single_of[gt] = deep.single(cl, view)
            if h is not None:
                start = h[0] if h[0] > t else t
                heapreplace(h, start + limit)
            else:
                start = deep.take(cl, view, k, limit, t)
        else:
            start = deep.take(cl, view, k, limit, t)
        if self.top_reserved is None and start > now:
            self.top_reserved = jid
        if self.fifo_blocked is None and unblocked:
            self.fifo_blocked = jid
        if not backfill:
            self.last_start = start
        end = start + limit
        # an estimate is not a start: the limits' use now stays as it is
        for lim, per_gpu in lims:
            a = k if per_gpu else 1
            if swaps is not None and lim in swaps:
                heapreplace(lim.line, (end, a))
            else:
                lim.line_used += a
                heappush(lim.line, (end, a))
        expected[jid] = start if pred is None else self._predicted_start(j, view, floor, limit, start)

    # ------------------------------------------------------------------ predictions
    def _predicted(self, j: Job, limit: float) -> float:
        p = j.predicted_runtime_s
        return limit if p is None or p > limit else max(1.0, p)

    def _pred_started(self, j: Job, p: int, k: int, limit: float) -> None:
        """A job started now on k free GPUs of pool p: they are busy on the line of predicted
        ends until its predicted end (and in the pool's packing floor)."""
        assert self.pred is not None
        now = self.now
        end = now + self._predicted(j, limit)
        self.pred.started_now(self.cluster.pool_name[p], k, now, end)
        pools = self.pred_pools
        pool = pools[p]
        before = pool[:]
        for _ in range(k):
            if pool and pool[0] <= now:
                pool.pop(0)
                insort(pool, end)
        for v, _ in self.cluster.memberships[p]:  # the packing floors that came from this pool
            pv = self.pred_views.get(id(v))
            if pv is None:
                continue
            packed = pv[1]
            for kk in range(1, len(pool) + 1):
                if pool[kk - 1] != before[kk - 1] and packed[kk] == before[kk - 1]:
                    packed[kk] = min((pools[q][kk - 1] for q in v.pids if len(pools[q]) >= kk), default=INF)
        if j.predicted_runtime_s is not None:
            self.any_pred = True

    def _pred_view(self, view: View) -> tuple[list[float] | None, list[float]]:
        """For the line of predicted ends: the heap of a view whose GPUs are all one model (else
        None), and by GPU count k when the first of its pools has k GPUs that the running jobs
        leave free on that line (a k-GPU job starts no earlier: packing)."""
        assert self.pred is not None
        pools = self.pred_pools
        packed = [self.now] + [min((pools[p][k - 1] for p in view.pids if len(pools[p]) >= k), default=INF)
                               for k in range(1, view.max_size + 1)]
        pv = self.pred_views[id(view)] = (self.pred.single(self.cluster, view), packed)
        return pv

    def _predicted_start(self, j: Job, view: View, floor: float, limit: float, planned: float) -> float:
        """With `use_predictions`: the start on the line of predicted ends (running jobs end at
        their predicted runtime, waiting ones take theirs), never later than `planned` (the
        start its reservation or the time-limit estimate gives). When earlier, the job is in
        `plan.predicted` (its estimate is a prediction, else a bound). Estimates only: no
        reservation depends on a prediction."""
        k = j.gpus
        single, packed = self.pred_views.get(id(view)) or self._pred_view(view)
        if packed[k] > floor:
            floor = packed[k]
        if floor < self.now:
            floor = self.now
        backfill = self.policy.backfill
        if not backfill and floor < self.pred_last:
            floor = self.pred_last
        p = j.predicted_runtime_s
        run = limit if p is None or p > limit else (p if p > 1.0 else 1.0)
        if k == 1 and single is not None:  # AggregateLine.take, inlined for one GPU of one model
            t = single[0] if single[0] > floor else floor
            heapreplace(single, t + run)
        else:
            assert self.pred is not None
            t = self.pred.take(self.cluster, view, k, run, floor)
        if not backfill:
            self.pred_last = t
        if t < planned and self.any_pred:
            self.plan.predicted.add(j.id)
        else:
            t = planned
        if p is not None:  # (its own runtime moves later starts only)
            self.any_pred = True
        return t

    # ------------------------------------------------------------------ cost controls
    def _shape_failed(self, view: View, k: int, gpu_type: str | None, limit: float) -> None:
        """k GPUs of this type cannot start now for `limit`: nor can more GPUs or a longer limit."""
        failed = self.failed_shapes
        for kk in range(k, view.max_size + 1):
            if failed.get((kk, gpu_type), INF) > limit:
                failed[(kk, gpu_type)] = limit

    def _cluster_changed(self) -> None:
        self.gen += 1
        self.shape_floor.clear()
        self.reason_cache.clear()
        self.waits.clear()

    def _waiting_reason(self, view: View, k: int, gpu_type: str | None) -> str:
        key = (k, gpu_type, self.fifo_blocked, self.top_reserved)
        why = self.reason_cache.get(key)
        if why is None:
            if self.fifo_blocked is not None and not self.policy.backfill:
                why = f"behind job {self.fifo_blocked} (first in line)"
            elif self.top_reserved is not None and self.cluster.free_count(view, k):
                why = f"behind job {self.top_reserved} (reserved)"
            else:
                why = f"waiting for {k} free {view.label if k > 1 or view.label != 'GPUs' else 'GPU'}"
                if view.note:  # GPUs in use outside the queue
                    why += f"; {view.note}"
            self.reason_cache[key] = why
        return why

    def _deep_estimate(self, view: View, k: int, gpu_type: str | None, limit: float, floor: float) -> float:
        """Expected start of a job past the reservation depth: the aggregate line from `floor`,
        never earlier than the detailed time line first has k GPUs of this view on one host."""
        cl = self.cluster
        key = (k, gpu_type)
        shape_floor = self.shape_floor.get(key)
        if shape_floor is None:
            shape_floor = self.shape_floor[key] = cl.earliest(view, k)
        if shape_floor == INF:
            return INF
        if self.deep is None:
            self.deep = AggregateLine(cl)
        return self.deep.take(cl, view, k, limit, floor if floor > shape_floor else shape_floor)

    def _book(self, j: Job, lims: list[tuple[Limit, bool]], start: float, end: float,
              counts_now: bool = True, amount: float | None = None) -> None:
        """Book a job on its limits' time lines; `amount`: the GPUs it counts (a share's fraction)."""
        gpus = j.gpus if amount is None else amount
        for lim, per_gpu in lims:
            lim.book(start, end, gpus if per_gpu else 1, self.now if counts_now else -INF)

    # ------------------------------------------------------------------ quotas and preemption
    def _within_guarantee(self, j: Job, k: int) -> bool:
        ug, gg = self.quotas.guarantees(j.user, j.group)
        if ug > 0 and self.user_gpus.get(j.user, 0) + self.claimed.get(j.user, 0) + k <= ug:
            return True
        return bool(gg > 0 and j.group and self.group_gpus.get(j.group, 0) + self.claimed.get("group:" + j.group, 0) + k <= gg)

    def _guarantee_owner(self, j: Job, k: int) -> str:
        ug, _ = self.quotas.guarantees(j.user, j.group)
        if ug > 0 and self.user_gpus.get(j.user, 0) + self.claimed.get(j.user, 0) + k <= ug:
            return f"user {j.user}"
        return f"group {j.group}"

    def _preempt_failed(self, j: Job, k: int) -> bool:
        """A job like this one (or any of its class and GPU type) failed to preempt for k or
        fewer GPUs in this walk, so this one would fail too."""
        failed = self.failed_preempt
        return k >= failed.get(_preempt_memo(j), INF) or k >= failed.get((j.gpu_type, None, None, j.priority), INF)

    def _victim_index(self, view: View, gpu_type: str | None) -> VictimIndex | None:
        """The running jobs on this view's GPUs that are borrowed or preemptible, indexed (None
        when there are none)."""
        cl = self.cluster
        if self.candidates is None:
            self.candidates = {}
            going = {v for c in self.claims for v in c.victims}  # stopping for their preemptors
            young = self.now - self.policy.preempt_min_runtime_s  # started after it: too young
            for r in self.running:
                if not (r.borrowed or r.preemptible) or r.host is None or not r.assigned_gpus:
                    continue
                if r.share is not None or r.gpu_memory is not None:  # a share frees no whole card
                    continue
                if r.id in going or (r.started_at is not None and r.started_at > young):
                    continue
                if self.reserved_gpus and any((r.host, i) in self.reserved_gpus for i in r.assigned_gpus):
                    continue  # its GPUs are reserved: nobody is booked on them there
                p = cl.by_host_index.get((r.host, r.assigned_gpus[0]))
                if p is not None:
                    self.candidates.setdefault(p, []).append(r)
        if not self.candidates:
            return None
        index = self.victim_index.get(gpu_type)
        if index is None:
            pids = set(view.pids)
            index = self.victim_index[gpu_type] = VictimIndex(
                [v for p, js in self.candidates.items() if p in pids for v in js])
        return index

    def _no_victims(self, j: Job, k: int, index: VictimIndex | None) -> None:
        """Remember that a job within its rights found no victims for k GPUs."""
        failed = self.failed_preempt
        memo = _preempt_memo(j)
        failed[memo] = min(k, failed.get(memo, k))
        if index is not None and j.user not in index.users:
            # nothing was kept from it for being its own, so no other user of its class
            # could do better (the victims a job may take depend on nothing else)
            wide = (j.gpu_type, None, None, j.priority)
            failed[wide] = min(k, failed.get(wide, k))

    def _victim_index_for(self, j: Job, k: int, view: View) -> VictimIndex | None:
        """The victim index when `j` has the right to preempt for k GPUs (urgent, or within
        its guarantee) and a running job it may take exists; else None, and the failure is
        remembered. Victims and free GPUs only shrink, and GPUs in use only grow, during a
        walk: a failed attempt (or a job beyond its guarantee) fails again."""
        if self._preempt_failed(j, k):
            return None
        urgent = j.priority == "urgent"
        if not urgent and not (self.quotas.any_guarantee and self._within_guarantee(j, k)):
            memo = _preempt_memo(j)
            self.failed_preempt[memo] = min(k, self.failed_preempt.get(memo, k))
            return None
        index = self._victim_index(view, j.gpu_type)
        if index is None or not index.any_for(j, urgent):  # no running job it may take
            self._no_victims(j, k, index)
            return None
        return index

    def _try_preempt(self, j: Job, k: int, limit: float, view: View, free_cap: int | None = None) -> bool:
        """Preempt for a job with the right to; `free_cap`: how many free GPUs it may use
        besides its victims' (None: all; the urgent reserve's room when the reserve is full)."""
        index = self._victim_index_for(j, k, view)
        if index is None:
            return False
        urgent = j.priority == "urgent"
        cl = self.cluster
        assert self.candidates is not None
        pids = set(view.pids)
        cands = {p: js for p, js in self.candidates.items() if p in pids and js}
        free_usable = {p: sum(1 for i in cl.free[p] if i not in cl.hole[p]) for p in cands}
        if free_cap is not None:
            free_usable = {p: min(n, max(0, free_cap)) for p, n in free_usable.items()}
        chosen = choose_victims(self.now, j, k, cands, free_usable, urgent)
        if chosen is None:
            self._no_victims(j, k, index)
            return False
        p, victims = chosen
        why = self._claim_guarantee(j, k)
        for v in victims:
            self.plan.preemptions.append(Preemption(v.id, j.id, f"preempted by job {j.id} ({why})"))
            self.victims.add(v.id)
            self.candidates[p].remove(v)
        self.victim_index.clear()
        self._hold(j, k, limit, p, victims, self.now + self.policy.preempt_grace_s)
        return True

    def _claim_guarantee(self, j: Job, k: int) -> str:
        """Why `j` may preempt ("urgent", "guarantee of user alice"); a guarantee's GPUs are
        claimed for it, so that the next job of its owner asks for the rest only."""
        if j.priority == "urgent":
            return "urgent"
        why = f"guarantee of {self._guarantee_owner(j, k)}"
        key = j.user if why == f"guarantee of user {j.user}" else "group:" + (j.group or "")
        self.claimed[key] = self.claimed.get(key, 0) + k
        return why

    def _hold(self, j: Job, k: int, limit: float, p: int, victims: Sequence[Job], start: float) -> None:
        """Book `j` from `start` on pool p: on its victims' GPUs, and free ones for the rest."""
        cl = self.cluster
        gpus = [i for v in victims if v.host == cl.pool_host[p] for i in v.assigned_gpus]
        need = k - len(gpus)
        if need > 0:
            gpus += sorted(i for i in cl.free[p] if i not in cl.hole[p] and i not in gpus)[:need]
        cl.reserve_on(p, gpus[:k], limit, start)
        self._cluster_changed()
        self._book(j, self._limits_of(j), start, start + limit)
        self.plan.reasons[j.id] = victims_text(victims)
        self.expected[j.id] = start

    def _hold_claim(self, j: Job, c: Claim) -> bool:
        """A claimant whose victims still run waits for them on their GPUs; False when none
        runs any more (it is then placed as any job, first)."""
        cl = self.cluster
        going = set(c.victims)
        victims = [r for r in self.running if r.id in going and r.host is not None and r.assigned_gpus]
        p = cl.by_host_index.get((victims[0].host, victims[0].assigned_gpus[0])) if victims else None
        if p is None or j.gpus <= 0:
            return False
        limit = float(j.time_limit_s or self.default_limit)
        self._limit_s[j.id] = limit
        if j.priority != "urgent" and self.quotas.any_guarantee and self._within_guarantee(j, j.gpus):
            self._claim_guarantee(j, j.gpus)
        self._hold(j, j.gpus, limit, p, victims, max(self.now, c.until))
        return True
