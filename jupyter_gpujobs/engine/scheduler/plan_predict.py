"""Expected starts from predicted runtimes, `Policy.use_predictions` (policy, estimates only).

Part of the planner's cycle (planner.py). With `use_predictions`, a second line of GPU ends
is kept beside the time limits' one: running jobs end at their predicted runtime (the
monitor's `Job.predicted_runtime_s`; past it, the median of the owner's longer runs:
`_past_prediction`), waiting ones take theirs. A job's expected start is the
earlier of the two, and it is named in `plan.predicted` when the prediction made it earlier.
No reservation and no start depends on it. The lines are `PredictedLine`s: sorted lists of
when each GPU frees, per model. With backfill, the GPUs a wide job holds idle until it starts
on the point line are holes that the one-GPU jobs behind it use when they end by then, as
backfill lets them (`_take_wide`, `_in_hole`).

Ranges (`plan.expected_range`): two more lines, on which every job runs to the 10th (early
line) and to the 90th percentile (late line) of the runtimes its prediction rests on
(`Job.predicted_runtime_range`, from the user's own history, whatever its confidence). A
running job already past its 10th percentile may end at any moment on the early line; past
its 90th, only its time limit bounds it on the late line, where it never ends before its end
on the point line. A job without history runs to its
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
from collections.abc import Sequence
from statistics import median

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


def _past_prediction(j: Job, now: float) -> float:
    """The predicted end of a running job that ran past its predicted runtime: the median of
    the past runs behind that prediction (`Job.predicted_runtimes`) that were longer than it has
    run so far (it is one of those); when it outlived them all, as long again as its prediction.
    Before, it always ended "as long again": a job whose owner's runs take 10 min or 3 h was
    predicted to end 10 min from now even after running an hour. On the late line it ends no
    earlier. What it changed in the replay: docs/scheduling.md, "How good are the expected
    starts?"."""
    assert j.started_at is not None and j.predicted_runtime_s is not None
    runs = j.predicted_runtimes
    if runs:
        longer = runs[bisect_right(runs, now - j.started_at):]
        if longer:
            return j.started_at + median(longer)
    return now + j.predicted_runtime_s


class PredictedLine:
    """When the GPUs of each model free on one line of predicted ends: a sorted list per
    model. A k-GPU job starts when k of them are free and takes the k that free last by then
    (the GPUs that free earlier stay for the jobs behind it, as backfill gives them). Taking
    the k that free first instead (`AggregateLine.take`) held them from every later job: in
    the replay of benchmarks/replay.py the starts predicted for one-GPU jobs behind wide ones
    came too late (jobs that waited, within max(60 s, 10 %): 0.24 -> 0.28)."""

    __slots__ = ("lines", "by_view")

    def __init__(self, lines: dict[str, list[float]]):
        """From the times each model's GPUs free (sorted here)."""
        for line in lines.values():
            line.sort()
        self.lines = lines
        self.by_view: dict[int, list[list[float]]] = {}

    def lines_of(self, cluster: Cluster, view: View) -> list[list[float]]:
        """The lines of the models of a view's GPUs."""
        ls = self.by_view.get(id(view))
        if ls is None:
            names = dict.fromkeys(cluster.pool_name[p] for p in view.pids)
            ls = self.by_view[id(view)] = [self.lines[n] for n in names]
        return ls

    def started_now(self, model: str, n: int, now: float, end: float) -> None:
        """A job started now on n GPUs of `model` that were free."""
        line = self.lines[model]
        i = bisect_right(line, now)
        n = min(n, i)
        del line[i - n:i]
        for _ in range(n):
            insort(line, end)


def _in_hole(holes: list[tuple[float, float]], run: float, floor: float, before: float) -> float | None:
    """The start of a one-GPU job of `run` seconds in the earliest hole (`Predicting._take_wide`)
    it fits in from `floor` on, if earlier than `before` (else None); the hole keeps what is
    left of it after the job."""
    best = -1
    for n, (h0, h1) in enumerate(holes):
        st = h0 if h0 > floor else floor
        if st < before and st + run <= h1:
            before, best = st, n
    if best < 0:
        return None
    end, h1 = before + run, holes[best][1]
    if h1 - end >= 60.0:
        holes[best] = (end, h1)
    else:
        del holes[best]
    return before


def take_best(lines: list[list[float]], k: int, run: float, floor: float) -> float:
    """`take` on the line (of one model each) whose k-th GPU frees first (INF: none has k)."""
    if len(lines) == 1:
        line = lines[0]
        return take(line, k, run, floor) if len(line) >= k else INF
    best: list[float] | None = None
    for line in lines:
        if len(line) >= k and (best is None or line[k - 1] < best[k - 1]):
            best = line
    return INF if best is None else take(best, k, run, floor)


def take(line: list[float], k: int, run: float, floor: float) -> float:
    """The start of a k-GPU job from `floor` on the sorted line of one model (k <= its
    length): when k GPUs are free; the k that free last by then are busy until start + run."""
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


#: the most holes kept on one line (`Predicting._take_wide`): each one-GPU job looks at them all
MAX_HOLES = 16

#: a view on the lines of predicted ends (`Predicting._pred_view`)
PredView = tuple[list[list[float]], list[float], list[list[float]], list[list[float]]]


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
                if guess <= now:  # past its prediction
                    guess = _past_prediction(r, now)
                end = lo = min(end, guess)
            rng = r.predicted_runtime_range
            if rng is not None and r.started_at is not None:
                lo = min(hi, r.started_at + rng[0])  # (past it: any moment now)
                if r.started_at + rng[1] > now:  # (past it: only its limit bounds it)
                    hi = min(hi, r.started_at + rng[1])
                if hi < end:  # (past its prediction, predicted to end after its 90th percentile)
                    hi = end
            for i in r.assigned_gpus:
                key = (r.host, i)
                busy[key], early[key], late[key] = max(end, now), max(lo, now), max(hi, now)
        for key, end in self.blocked_until.items():
            busy[key] = max(busy.get(key, now), end)
            early[key] = max(early.get(key, now), end)
            late[key] = max(late.get(key, now), end)
        point_lines: dict[str, list[float]] = {}
        early_lines: dict[str, list[float]] = {}
        late_lines: dict[str, list[float]] = {}
        # per pool, when its GPUs free on the point line (running jobs only): a k-GPU job's
        # predicted start is no earlier than the first pool with k of them (packing)
        self.pred_pools = []
        for p, av in enumerate(cl.avail):
            host, model = cl.pool_host[p], cl.pool_name[p]
            keys = [(host, i) for _, i in av]
            pool = [busy.get(key, now) for key in keys]
            point_lines.setdefault(model, []).extend(pool)
            early_lines.setdefault(model, []).extend([early.get(key, now) for key in keys])
            late_lines.setdefault(model, []).extend([late.get(key, now) for key in keys])
            pool.sort()
            self.pred_pools.append(pool)
        self.pred = PredictedLine(point_lines)
        self.pred_early = PredictedLine(early_lines)
        self.pred_late = PredictedLine(late_lines)
        self.pred_views: dict[int, PredView] = {}  # `_pred_view`
        # by point line (its id): GPUs held idle for a wide job until it starts (`_take_wide`)
        self.pred_holes: dict[int, list[tuple[float, float]]] = {}

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

    def _pred_view(self, view: View) -> PredView:
        """For the lines of predicted ends (point, early, late): a view's lines, one per GPU
        model, and by GPU count k when the first of its pools has k GPUs that the running jobs
        leave free on the point line (a k-GPU job starts no earlier: packing)."""
        assert self.pred is not None
        pools, cl = self.pred_pools, self.cluster
        packed = [self.now] + [min((pools[p][k - 1] for p in view.pids if len(pools[p]) >= k), default=INF)
                               for k in range(1, view.max_size + 1)]
        pv = self.pred_views[id(view)] = (self.pred.lines_of(cl, view), packed, self.pred_early.lines_of(cl, view),
                                          self.pred_late.lines_of(cl, view))
        return pv

    def _take_wide(self, line: list[float], k: int, run: float, floor: float) -> float:
        """`take` of a k-GPU job (k > 1) on the point line of one model, with backfill: the
        GPUs it takes that free a minute or more before its start are holes until then, for
        the one-GPU jobs behind it that end by its start (`_in_hole`)."""
        t = line[k - 1] if line[k - 1] > floor else floor
        i = bisect_right(line, t)
        holes = self.pred_holes.setdefault(id(line), [])
        for free in line[i - k:i]:
            if free < t - 60.0 and len(holes) < MAX_HOLES:
                holes.append((free, t))
        del line[i - k:i]
        for _ in range(k):
            insort(line, t + run)
        return t

    def _predicted_start(self, j: Job, view: View, floor: float, limit: float, planned: float) -> float:
        """With `use_predictions`: the start on the line of predicted ends (running jobs end at
        their predicted runtime, waiting ones take theirs), never later than `planned` (the
        start its reservation or the time-limit estimate gives). When earlier, the job is in
        `plan.predicted` (its estimate is a prediction, else a bound). Its range goes to
        `plan.expected_range`. Estimates only: no reservation depends on a prediction."""
        k = j.gpus
        now = self.now
        lines, packed, early_lines, late_lines = self.pred_views.get(id(view)) or self._pred_view(view)
        p = j.predicted_runtime_s
        run = limit if p is None or p > limit else (p if p > 1.0 else 1.0)
        r = j.predicted_runtime_range
        if r is None:
            early, late = run, limit
        else:
            early, late = r
            early = limit if early > limit else early if early > 1.0 else 1.0
            late = limit if late > limit else late if late > 1.0 else 1.0
        f0 = floor if floor > now else now
        one = k == 1 and len(lines) == 1 and bool(lines[0])
        if one:  # `take`, inlined for one GPU of one model
            early_line, late_line = early_lines[0], late_lines[0]
            lo = early_line[0] if early_line[0] > f0 else f0
            del early_line[0]
            insort(early_line, lo + early)
            hi = late_line[0] if late_line[0] > f0 else f0
            del late_line[0]
            insort(late_line, hi + late)
        else:
            lo = take_best(early_lines, k, early, f0)
            hi = take_best(late_lines, k, late, f0)
        if packed[k] > floor:
            floor = packed[k]
        if floor < now:
            floor = now
        backfill = self.policy.backfill
        if not backfill and floor < self.pred_last:
            floor = self.pred_last
        if one:
            line = lines[0]
            t = line[0] if line[0] > floor else floor
            holes = self.pred_holes.get(id(line)) if backfill else None
            in_hole = _in_hole(holes, run, floor, t) if holes else None
            if in_hole is None:
                del line[0]
                insort(line, t + run)
            else:
                t = in_hole
        elif backfill and len(lines) == 1 and len(lines[0]) >= k:
            t = self._take_wide(lines[0], k, run, floor)
        else:
            t = take_best(lines, k, run, floor)
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
