"""Priority: the order of the pending queue.

Multifactor score = weight_age * age + weight_fairshare * fair-share + weight_class * class
+ weight_size * size: age = waited / age_saturation_s, without a cap unless `policy.age_max`
(so no job waits for ever behind fair-share), the others in [0, 1]: fair-share from
`fairshare.py`, class = rank / 3 (low 0 .. urgent 1), size = GPUs / GPUs of the largest host.
With `policy.strict_classes` (default) the class is also a strict tier: a higher class is
always ahead. With `policy.oldest_first` every job that has waited at least its own time limit
is due: the due jobs go first in their tier, oldest first (`QueueOrder`).
Ties go to the older job, then the lower id (FIFO).

May call: fairshare.py and the model; pure (no I/O, no clock).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Collection, Mapping
from itertools import compress, islice
from operator import attrgetter, itemgetter
from typing import NamedTuple, TypeVar

from ...model import PRIORITY_RANK, Job, Policy
from .fairshare import Usage, fairshare_factors

_submitted = attrgetter("submitted_at")
_id = attrgetter("id")


#: What the planner decides a waiting job by, its id and submit time aside: two jobs of one
#: class that wait in the same cycle state wait for the same reason.
job_class = attrgetter("priority", "user", "group", "gpus", "gpu_type", "time_limit_s", "array_job_id",
                       "array_max_running", "offpeak", "begin", "depends", "share", "gpu_memory")

Key = tuple[int, float, float, int]  # (-(class tier), -(score), submit time, id): smaller first
T = TypeVar("T")


class _Calc(NamedTuple):
    """The constants of one priority calculation."""

    now: float
    lo: float  # submit times before it count as age_max x age_saturation_s (-inf: no cap)
    age_k: float
    oldest_first: bool  # Policy.oldest_first
    default_limit: float  # Policy.default_time_limit_s
    strict: bool  # the class is a strict tier
    w_cls: float
    w_fs: float
    size_k: float
    largest_host: int


class QueueOrder:
    """The queue in priority order as of one priority calculation, and how to place a job
    that arrives after it (Slurm recalculates priorities every PriorityCalcPeriod, not in every
    scheduling pass; `GPUJobs.estimate_interval` is ours).

    Everything in the score but age is a constant of the job's class (`job_class`), so the
    per-job work is one clamp and one product; `arrange` keeps the order for the jobs still
    pending and puts new ones (and requeued ones) where the same calculation puts them.
    Immutable: `arrange` returns the order it used without changing this one.

    With `Policy.oldest_first`, every job that has waited at least its own time limit is due:
    the due jobs go first in their tier, oldest first, so each is placed, and booked on the
    time line, before anything fair-share or size puts ahead of it, and backfill keeps to
    those bookings. Fair-share orders the jobs that have waited less than they asked to run;
    past that, first come, first served, as with FIFO and backfill: a heavy user's jobs are
    not passed for ever by lighter users' newer ones. Whether a job is due depends on the job
    and the time only, so a kept order stays valid as jobs come and go; a job that becomes
    due while an order is kept moves up at the next calculation, as its age does."""

    __slots__ = ("keys", "cids", "classes", "const", "calc", "fs", "_ids", "_top", "_tables")

    def __init__(self, keys: list[Key], cids: list[int], classes: dict[tuple[object, ...], int],
                 const: list[float], calc: _Calc, fs: tuple[dict[str, float], dict[str, float]],
                 ids: list[int] | None = None, shared: tuple[int, dict[str, list]] | None = None):  # type: ignore[type-arg]
        self.keys = keys  # sorted
        self.cids = cids  # the class number of each key's job
        self.classes = classes  # job_class -> class number
        self.const = const  # class number -> everything in -(key) but age and the tier
        self.calc = calc
        self.fs = fs  # fair-share factors per user and per group
        self._ids = ids  # each key's job id, when known
        self._top: int | None = None  # the highest of them, when known
        # `per_class` tables of the calculation's classes (how many, and the tables), shared by
        # every order arranged from it
        self._tables = (len(classes), {}) if shared is None else shared

    @classmethod
    def compute(cls, now: float, jobs: Collection[Job], policy: Policy, usage: Usage,
                largest_host: int) -> QueueOrder:
        """The order of `jobs` at `now` (fair-share from `usage`)."""
        w_age, w_fs, w_cls, w_size = policy.weight_age, policy.weight_fairshare, policy.weight_class, policy.weight_size
        classes: dict[tuple[object, ...], int] = {}
        cids = [classes.setdefault(job_class(j), len(classes)) for j in jobs]
        fs: tuple[dict[str, float], dict[str, float]] = ({}, {})
        if policy.fairshare and w_fs != 0:
            users = {c[1] for c in classes}
            groups = {c[2] for c in classes if c[2]}
            fs = fairshare_factors(usage, policy.user_shares, policy.group_shares, users,  # type: ignore[arg-type]
                                   groups, policy.fairshare_default_share)  # type: ignore[arg-type]
        else:
            w_fs = 0.0
        sat = policy.age_saturation_s
        age_k = w_age / sat if sat > 0 else 0.0
        cap = policy.age_max
        lo = (now - sat * max(0.0, cap) if cap is not None else -math.inf) if sat > 0 else now
        calc = _Calc(now, lo, age_k, policy.oldest_first, float(policy.default_time_limit_s), policy.strict_classes,
                     w_cls, w_fs, w_size / max(1, largest_host), largest_host)
        order = cls([], cids, classes, [], calc, fs)
        order.const = [order._const(c) for c in classes]
        const = order.const
        tiers = order.tiers()
        # (tier, score key, submit time, id, position): ids are unique, so the position is never compared
        keys = [(tiers[c], age_k * ((lo if s < lo else (now if s > now else s)) - now) - const[c], s, i, n)
                for n, (s, i, c) in enumerate(zip(map(_submitted, jobs), map(_id, jobs), cids))]
        if policy.oldest_first:  # the due jobs' score is -inf: first in their tier, oldest first
            due_at = list(map(order._due_at, classes))
            keys = [(t, -math.inf, s, i, n) if s <= due_at[cids[n]] else (t, k, s, i, n) for t, k, s, i, n in keys]
        keys.sort()
        order.cids = [cids[k[4]] for k in keys]
        order.keys = [k[:4] for k in keys]
        return order

    def tiers(self) -> list[int]:
        """The tier key of each class number (`_tier`)."""
        return list(map(self._tier, self.classes))

    def _tier(self, c: tuple[object, ...]) -> int:
        """The tier key of a class: -(class rank) when classes are strict tiers, else 0."""
        return -PRIORITY_RANK.get(c[0], 1) if self.calc.strict else 0  # type: ignore[call-overload]

    def _due_at(self, c: tuple[object, ...]) -> float:
        """A job of class `c` submitted at or before this is due (`Policy.oldest_first`): it
        has waited its time limit (the default limit when it has none)."""
        return self.calc.now - (c[5] or self.calc.default_limit)  # type: ignore[operator]

    def _const(self, c: tuple[object, ...]) -> float:
        """Everything in -(sort key) but age and the tier, for a class."""
        w_cls, w_fs, size_k, largest_host = self.calc[-4:]
        priority, user, group, k = c[0], c[1], c[2], c[3]
        r = PRIORITY_RANK.get(priority, 1)  # type: ignore[call-overload]
        out = w_cls / 3.0 * r + size_k * min(max(k, 0), largest_host)  # type: ignore[call-overload]
        if w_fs:
            fs_user, fs_group = self.fs
            fu = fs_user.get(user, 1.0)  # type: ignore[call-overload]
            out += w_fs * ((fu * fs_group.get(group, 1.0)) ** 0.5 if group else fu)  # type: ignore[call-overload]
        return out

    def key(self, j: Job) -> tuple[Key, int] | None:
        """A job's key and class number in this order (a new class gets a new number), or None
        when its user or group had no fair-share factor in the calculation (their factor
        depends on everyone's: only a new calculation can place it)."""
        now, lo, age_k = self.calc[:3]
        c = job_class(j)
        cid = self.classes.get(c)
        if cid is None:
            if self.calc.w_fs and (j.user not in self.fs[0] or (j.group and j.group not in self.fs[1])):
                return None
            cid = self.classes[c] = len(self.const)
            self.const.append(self._const(c))
        s = j.submitted_at
        tier = self._tier(c)
        if self.calc.oldest_first and s <= self._due_at(c):
            return (tier, -math.inf, s, j.id), cid  # due (a requeued job keeps its submit time)
        return (tier, age_k * ((lo if s < lo else (now if s > now else s)) - now) - self.const[cid], s, j.id), cid

    def class_keys(self) -> list[tuple[object, ...]]:
        """The `job_class` of each class number."""
        return list(self.classes)  # insertion order: class numbers are given in order

    def per_class(self, name: str, make: Callable[[tuple[object, ...]], T]) -> list[T]:
        """`make(job_class)` of each class number. Kept for the classes it was first made for:
        every order arranged from one calculation numbers them alike (arranging only adds
        classes), so a caller that runs every cycle makes them once per calculation, and
        each cycle makes only its new classes'. `make` must depend on the class alone."""
        n, tables = self._tables
        table = tables.get(name)
        if table is None:
            table = tables[name] = list(map(make, islice(self.classes, n)))
        if n < len(self.classes):
            return table + list(map(make, islice(self.classes, n, None)))
        return table

    def _highest(self) -> int:
        """The highest job id this order was made with (-1 for none)."""
        if self._top is None:
            self._top = max(self.ids(), default=-1)
        return self._top

    def ids(self) -> list[int]:
        """The job ids in this order (read-only: it is shared with the orders arranged from
        this one). Read from the keys once: cheaper than from the jobs, which lie in memory in
        another order."""
        if self._ids is None:
            self._ids = list(map(_key_id, self.keys))
        return self._ids

    def arrange(self, jobs: Collection[Job], by_id: Mapping[int, Job] | None = None
                ) -> tuple[list[Job], list[int], QueueOrder] | None:
        """`jobs` in this order with their class numbers: the ones it holds where they were,
        the others (new or requeued since) where it would have put them; and the order kept
        for the next cycle. None if one of them has a user or group it cannot place.
        `by_id`: the jobs by id, when the caller has them so."""
        if by_id is None:
            by_id = dict(zip(map(_id, jobs), jobs))
        keys, cids, ids = self.keys, self.cids, self.ids()
        top = self._highest()
        ordered = list(map(by_id.get, ids))
        if not all(ordered):  # some left (a Job is always true, a missing one None): drop them
            alive = list(map(bool, ordered))
            keys, cids, ids = list(compress(keys, alive)), list(compress(cids, alive)), list(compress(ids, alive))
            ordered = list(compress(ordered, alive))
        if len(ids) < len(by_id):
            # the new ids: usually all above the order's highest (new submissions), found on
            # the sorted ids (nearly sorted already); else (requeued jobs) by set difference
            every = sorted(by_id)
            above = every[bisect_right(every, top):]
            new = above if len(above) == len(by_id) - len(ids) else sorted(by_id.keys() - set(ids))
            keys, cids, ids = list(keys), list(cids), list(ids)
            classes, const = dict(self.classes), list(self.const)
            order = QueueOrder(keys, cids, classes, const, self.calc, self.fs, ids, self._tables)
            for i in new:
                j = by_id[i]
                placed = order.key(j)
                if placed is None:
                    return None
                k, cid = placed
                at = bisect_left(keys, k)
                keys.insert(at, k)
                cids.insert(at, cid)
                ids.insert(at, i)
                ordered.insert(at, j)
            order._top = max(top, new[-1])
        else:
            order = QueueOrder(keys, cids, self.classes, self.const, self.calc, self.fs, ids, self._tables)
            order._top = top
        return ordered, cids, order


_key_id = itemgetter(3)
