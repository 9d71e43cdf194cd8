"""The planner's memo tables (speed only: every decision is the one the plain walk makes).

Benchmark: `benchmarks/bench_scheduler.py`, the "burst" and "steady" deciding cycles at 10k
pending x 512 GPUs (and `benchmarks/bench_instructions.py` for their instruction counts);
see docs/scheduling.md, "What keeps a cycle cheap on a deep queue", "Memos" and "Victim
index". On 2026-12-04 (`--repeat 3`, two runs each, same session) the burst deciding cycle at
10k x 512 took 9.4x and 8.0x the plain sort without the start-now shape memo and the
preemption memo, 7.9x and 6.8x with them; the steady cycle reads `failed_shapes` through the
deep walk (`_start_below`, plan_deep.py). Correctness: tests/test_scheduler_depth.py (the
shape and preemption memos, the victim index against `may_preempt`, the deciding cycle
against the detailed walk of every job).

Part of the planner's cycle (planner.py). It owns, for one cycle:
- `failed_shapes`: once k GPUs of a type cannot start now for time limit T, no later job with
  k' >= k GPUs of that type and a limit >= T is tried (free GPUs and holes only shrink in a
  walk); `_start_below` reads it for the deep walk;
- `failed_preempt`: a failed preemption attempt, remembered for (type, user, group, class),
  for every urgent job of the type (an urgent job's victims do not depend on who asks), and
  for the whole class and type when no victim was kept from it for being its own;
- the victim index (`VictimIndex` per GPU type, preemption.py): whether any running job may
  be preempted by a job, in a few lookups instead of a pass over the running jobs;
- `reason_cache`, `shape_floor`, `waits`: a waiting job's reason and the earliest start of a
  shape, cleared whenever the free GPUs change (`_cluster_changed`, which counts `gen`).
The rules they shortcut live elsewhere: the right to preempt in plan_preempt.py, the reason
texts' policy in `_waiting_reason` below, the starts in placement.py.

It is a mixin of the planner's `_Cycle` (planner.py): its methods read and write the
cycle's state, which `_Cycle.__init__` sets up in one place, and call the cycle's other
parts through `self`. It imports only the scheduler's pure modules and the model.
"""

from __future__ import annotations

from ...model import Job
from .placement import INF, View
from .preemption import VictimIndex


def _preempt_memo(j: Job) -> tuple[str | None, str | None, str | None, str]:
    """What a preemption attempt's outcome depends on besides the GPUs asked: an urgent job's
    victims do not depend on who asks (`preemption.may_preempt`), a guarantee's do."""
    if j.priority == "urgent":
        return (j.gpu_type, None, None, "urgent")
    return (j.gpu_type, j.user, j.group, j.priority)


class Memos:
    """Memo tables of one cycle: failed shapes and preemptions, victim index, reasons."""

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

    def _start_below(self, view: View, k: int, gt: str | None) -> float:
        """The time limit below which a job of k GPUs of this type that no limit blocks may
        start now (the shapes that failed to start: `failed_shapes`), -INF when none may."""
        if view.free_pids and (self.policy.backfill or self.fifo_blocked is None):
            return self.failed_shapes.get((k, gt), INF)
        return -INF

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
