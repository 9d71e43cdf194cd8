"""Expected starts from predicted runtimes, `Policy.use_predictions` (policy, estimates only).

Part of the planner's cycle (planner.py). With `use_predictions`, a second line of GPU ends
is kept beside the time limits' one: running jobs end at their predicted runtime (the
monitor's `Job.predicted_runtime_s`), waiting ones take theirs. A job's expected start is the
earlier of the two, and it is named in `plan.predicted` when the prediction made it earlier.
No reservation and no start depends on it. The lines are `PredictedLine`s: sorted lists of
when each GPU frees, per model.

Ranges (`plan.expected_range`): two more lines, on which every job runs to the 10th (early
line) and to the 90th percentile (late line) of the runtimes its prediction rests on
(`Job.predicted_runtime_range`, from the user's own history, whatever its confidence). A
running job already past its 10th percentile may end at any moment on the early line; past
its 90th, only its time limit bounds it on the late line. A job without history runs to its
time limit on the late line and to its point prediction (or limit) on the early one. A
waiting job's range is [its start on the early line, its start on the late line], never
past the time limits' bound (kept when jobs run to their limits) and always holding its
expected start.

It is a mixin of the planner's `_Cycle` (planner.py): its methods read and write the
cycle's state, which `_Cycle.__init__` sets up in one place, and call the cycle's other
parts through `self`. It imports only the scheduler's pure modules and the model.
"""

from __future__ import annotations

from bisect import bisect_right, insort
from collections.abc import Mapping, Sequence

from ...model import Job
from .placement import INF, Cluster, View


def _runs(j: Job, limit: float) -> tuple[float, float, float]:
    """(early, point, late) runtimes of a job on the three lines, within its time limit."""
    p = j.predicted_runtime_s
    point = limit if p is None or p > limit else max(1.0, p)
    r = j.predicted_runtime_range
    if r is None:
        return point, point, limit
    return min(limit, max(1.0, r[0])), point, min(limit, max(1.0, r[1]))


class PredictedLine:
    """When the GPUs of each model free on one line of predicted ends: a sorted list per
    model. A k-GPU job starts when k of them are free and takes the k that free last by then
    (the GPUs that free earlier stay for the jobs behind it, as backfill gives them). Taking
    the k that free first instead (`AggregateLine.take`) held them from every later job: in
    the replay of benchmarks/replay.py the starts predicted for one-GPU jobs behind wide ones
    came too late (jobs that waited, within max(60 s, 10 %): 0.24 -> 0.29)."""

    __slots__ = ("lines", "by_view")

    def __init__(self, cluster: Cluster, busy_until: Mapping[tuple[str, int], float]):
        now = cluster.now
        self.lines: dict[str, list[float]] = {}
        for p, name in enumerate(cluster.pool_name):
            host = cluster.pool_host[p]
            self.lines.setdefault(name, []).extend(busy_until.get((host, i), now) for _, i in cluster.avail[p])
        for line in self.lines.values():
            line.sort()
        self.by_view: dict[int, list[list[float]]] = {}

    def _lines(self, cluster: Cluster, view: View) -> list[list[float]]:
        ls = self.by_view.get(id(view))
        if ls is None:
            names = dict.fromkeys(cluster.pool_name[p] for p in view.pids)
            ls = self.by_view[id(view)] = [self.lines[n] for n in names]
        return ls

    def single(self, cluster: Cluster, view: View) -> list[float] | None:
        """The line of a view whose GPUs are all one model, else None."""
        ls = self._lines(cluster, view)
        return ls[0] if len(ls) == 1 else None

    def take(self, cluster: Cluster, view: View, k: int, run: float, floor: float) -> float:
        """The start of a k-GPU job from `floor` on; its GPUs are busy until start + run."""
        best: list[float] | None = None
        for line in self._lines(cluster, view):
            if len(line) >= k and (best is None or line[k - 1] < best[k - 1]):
                best = line
        return INF if best is None else take(best, k, run, floor)

    def started_now(self, model: str, n: int, now: float, end: float) -> None:
        """A job started now on n GPUs of `model` that were free."""
        line = self.lines[model]
        i = bisect_right(line, now)
        n = min(n, i)
        del line[i - n:i]
        for _ in range(n):
            insort(line, end)


def take(line: list[float], k: int, run: float, floor: float) -> float:
    """`PredictedLine.take` on the sorted line of one model (k <= its length)."""
    t = line[k - 1]
    if t < floor:
        t = floor
    if k == 1:
        del line[0]
    else:
        i = bisect_right(line, t)
        del line[i - k:i]
        for _ in range(k - 1):
            insort(line, t + run)
    insort(line, t + run)
    return t


class Predicting:
    """Expected starts on the line of predicted ends, and their ranges."""

    def _init_predictions(self, running: Sequence[Job]) -> None:
        """The lines of predicted ends (point, early, late) from the running jobs."""
        now, cl = self.now, self.cluster
        busy: dict[tuple[str, int], float] = {}
        early: dict[tuple[str, int], float] = {}
        late: dict[tuple[str, int], float] = {}
        for r in running:
            if r.host is None:
                continue
            end = lo = hi = self.ends[r.id]
            if r.predicted_runtime_s is not None and r.started_at is not None:
                self.any_pred = True
                guess = r.started_at + r.predicted_runtime_s
                if guess <= now:  # past its prediction: as long again, within its limit
                    guess = now + r.predicted_runtime_s
                end = lo = min(end, guess)
            rng = r.predicted_runtime_range
            if rng is not None and r.started_at is not None:
                lo = min(hi, r.started_at + rng[0])  # (past it: any moment now)
                if r.started_at + rng[1] > now:  # (past it: only its limit bounds it)
                    hi = min(hi, r.started_at + rng[1])
            for i in r.assigned_gpus:
                key = (r.host, i)
                busy[key], early[key], late[key] = max(end, now), max(lo, now), max(hi, now)
        for key, end in self.blocked_until.items():
            busy[key] = max(busy.get(key, now), end)
            early[key] = max(early.get(key, now), end)
            late[key] = max(late.get(key, now), end)
        self.pred = PredictedLine(cl, busy)
        self.pred_early = PredictedLine(cl, early)
        self.pred_late = PredictedLine(cl, late)
        # per pool, when its GPUs free on that line (running jobs only): a k-GPU job's
        # predicted start is no earlier than the first pool with k of them (packing)
        self.pred_pools = [sorted(busy.get((cl.pool_host[p], i), now) for _, i in av)
                           for p, av in enumerate(cl.avail)]
        self.pred_views: dict[int, tuple[list[float] | None, list[float]]] = {}  # `_pred_view`

    def _predicted(self, j: Job, limit: float) -> float:
        p = j.predicted_runtime_s
        return limit if p is None or p > limit else max(1.0, p)

    def _pred_started(self, j: Job, p: int, k: int, limit: float) -> None:
        """A job started now on k free GPUs of pool p: they are busy on the line of predicted
        ends until its predicted end (and in the pool's packing floor)."""
        assert self.pred is not None
        now = self.now
        end = now + self._predicted(j, limit)
        model = self.cluster.pool_name[p]
        self.pred.started_now(model, k, now, end)
        early, _, late = _runs(j, limit)
        self.pred_early.started_now(model, k, now, now + early)
        self.pred_late.started_now(model, k, now, now + late)
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
        """For the line of predicted ends: the line of a view whose GPUs are all one model (else
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
        early, _, late = _runs(j, limit)
        lo = self.pred_early.take(self.cluster, view, k, early, floor if floor > self.now else self.now)
        hi = self.pred_late.take(self.cluster, view, k, late, floor if floor > self.now else self.now)
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
        if single is not None:
            t = take(single, k, run, floor)
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
        if t < INF:
            self.plan.expected_range[j.id] = (lo if lo < t else t, t if hi < t else hi if hi < planned else planned)
        return t
