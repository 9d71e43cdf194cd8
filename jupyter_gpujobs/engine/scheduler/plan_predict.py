"""Expected starts from predicted runtimes, `Policy.use_predictions` (policy, estimates only).

Part of the planner's cycle (planner.py). With `use_predictions`, a second line of GPU ends
is kept beside the time limits' one: running jobs end at their predicted runtime (the
monitor's `Job.predicted_runtime_s`), waiting ones take theirs. A job's expected start is the
earlier of the two, and it is named in `plan.predicted` when the prediction made it earlier.
No reservation and no start depends on it. The one-GPU heap is `AggregateLine.take`
inlined, as in plan_deep.py.

It is a mixin of the planner's `_Cycle` (planner.py): its methods read and write the
cycle's state, which `_Cycle.__init__` sets up in one place, and call the cycle's other
parts through `self`. It imports only the scheduler's pure modules and the model.
"""

from __future__ import annotations

from bisect import insort
from heapq import heapreplace

from ...model import Job
from .placement import INF, View


class Predicting:
    """Expected starts on the line of predicted ends."""

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
