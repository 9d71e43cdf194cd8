"""The walk past the reservation depth by class and family (speed; the estimate is the policy's).

Benchmark: `benchmarks/bench_scheduler.py`, the "steady" deciding cycle at 10k pending x 512
GPUs (the cycle the server runs over and over; target <= 20 ms) and the "all" (estimating)
one; `benchmarks/bench_instructions.py` counts its instructions. On 2026-12-04 (`--repeat 3`,
two runs each, same session) the steady deciding cycle at 10k x 512 took 5.7x and 6.6x the
plain sort of the queue with every deep job walked by `_place`, and 2.3x and 2.7x with this
walk (docs/scheduling.md, "What keeps a cycle cheap on a deep queue"). Correctness: tests/test_scheduler_depth.py checks that every reason
and start is the one the job-by-job walk (`_place`) gives.

Past `Policy.reservation_depth` (policy: like Slurm's bf_max_job_test) a job that can only
wait gets the reason `_place` would give it and, when the cycle estimates, an expected start
from the aggregate line (`placement.AggregateLine`, clamped to the detailed time line): that
estimate is the documented approximation of docs/scheduling.md. What is speed only: the
decision is made once per class of jobs (`priority.job_class`) while the free GPUs, the limits
in use and the jobs named in reasons stay the same (`_walk_deep`); a deciding cycle writes
every class's reason in bulk (`_decide_deep_bulk`), deciding classes that differ only in their
time limit once per family (`_bulk_family`) and what depends on a job's kind once per kind;
the one-GPU case of `AggregateLine.take` and `Limit.earliest` are inlined in `_book_deep`.

It is a mixin of the planner's `_Cycle` (planner.py): its methods read and write the
cycle's state, which `_Cycle.__init__` sets up in one place, and call the cycle's other
parts through `self`. It imports only the scheduler's pure modules and the model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from heapq import heappop, heappush, heapreplace
from itertools import compress, islice
from operator import itemgetter

from ...model import Job
from .deferral import as_clock, clock_text
from .placement import INF, AggregateLine, View
from .plan_rules import _may_fit
from .quotas import Limit


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


class DeepWalk:
    """The walk past the reservation depth, by class and by family."""

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
        now, off = self.now, as_clock(self.policy)
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
