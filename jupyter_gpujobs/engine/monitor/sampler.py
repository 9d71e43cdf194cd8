"""The sampler: reads every GPU through the GPU backend at each `sample_interval` and keeps
what the rest of the monitor needs from those readings.

- writes each reading to the store (raw rows), and once a minute rolls complete minutes and
  hours up and prunes each resolution past its retention (store/monitoring.py `rollup`);
- folds the readings of each running job's GPUs into that job's stats (utilization mean and
  peak over its GPUs, memory summed over its GPUs, mean and peak, peak fraction of one card);
- tracks since when each running job has been idle (every GPU at or below the threshold);
- counts error events per GPU (uncorrected ECC, Xid, unhealthy) for the GPU-error detector;
- keeps the latest readings for the metrics endpoint.

It decides nothing: the Monitor turns what it tracks into findings.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from ...model import GPU, Job, JobState
from ..gpus import GPUBackend, GPUSample
from ..store import Store
from ..store import monitoring as mstore
from .carry import carry_on
from .diagnosis import GPUErrorState, update_gpu_errors

log = logging.getLogger("jupyter_gpujobs")


class Sampler:
    """One GPU backend, one store; `tick(now, running)` takes and records one reading."""

    def __init__(self, backend: GPUBackend, store: Store, *, host: str = "localhost",
                 raw_keep_s: float = 6 * 3600, minute_keep_s: float = 14 * 86400,
                 hour_keep_s: float = 400 * 86400, idle_threshold: float = 1.0,
                 rollup_every_s: float = 60.0):
        self.backend = backend
        self.store = store
        self.host = host
        self.raw_keep_s = raw_keep_s
        self.minute_keep_s = minute_keep_s
        self.hour_keep_s = hour_keep_s
        self.idle_threshold = idle_threshold
        self.rollup_every_s = rollup_every_s
        self.latest: list[GPUSample] = []
        self.latest_at: float | None = None
        self.job_stats: dict[int, mstore.JobStats] = {}
        self.idle_since: dict[int, float] = {}
        self.gpu_errors: dict[str, GPUErrorState] = {}
        self.errors_changed: set[str] = set()  # GPU uuids whose error count rose at the last tick
        self._last_rollup = 0.0
        self._inventory_key: tuple[Any, ...] = ()

    # ------------------------------------------------------------------ readings

    def record_inventory(self, gpus: Iterable[GPU], now: float) -> None:
        """Remember the GPUs' models (gpu_info) when the inventory changes."""
        gpus = list(gpus)
        key = tuple((g.uuid, g.index, g.name, g.memory_total_mb) for g in gpus)
        if key != self._inventory_key:
            mstore.record_gpus(self.store, gpus, now)
            self._inventory_key = key

    def read(self) -> list[GPUSample]:
        try:
            return self.backend.sample()
        except Exception:
            log.exception("gpujobs: reading GPU samples failed")
            return []

    def tick(self, now: float, running: Iterable[Job]) -> list[GPUSample]:
        """Read the GPUs, fold the readings into job stats, idle times and error counts, store
        them; roll up and prune once every `rollup_every_s`."""
        samples = self.read()
        self.latest = samples
        self.latest_at = now
        by_index = {s.index: s for s in samples}
        changed = self._fold_jobs(now, running, by_index)
        self.errors_changed = set()
        for s in samples:
            state = self.gpu_errors.setdefault(s.uuid, GPUErrorState())
            if update_gpu_errors(state, s.ecc_errors, s.xid, s.healthy):
                self.errors_changed.add(s.uuid)
        with carry_on("storing GPU samples"):
            mstore.add_samples(self.store, [mstore.SampleValues.of(self.host, s) for s in samples], stats=changed)
        if now - self._last_rollup >= self.rollup_every_s:
            self._last_rollup = now
            with carry_on("rolling up GPU samples"):
                mstore.rollup(self.store, now, self.raw_keep_s, self.minute_keep_s, self.hour_keep_s)
        return samples

    def _fold_jobs(self, now: float, running: Iterable[Job], by_index: dict[int, GPUSample]) -> list[mstore.JobStats]:
        changed = []
        seen = set()
        for job in running:
            if job.state is not JobState.RUNNING or not job.assigned_gpus:
                continue
            if job.host not in (None, self.host):
                continue
            readings = [by_index[i] for i in job.assigned_gpus if i in by_index]
            if not readings:
                continue
            seen.add(job.id)
            utils = [s.utilization for s in readings if s.utilization is not None]
            mems = [s.memory_used_mb for s in readings if s.memory_used_mb is not None]
            totals = [s.memory_total_mb for s in readings if s.memory_total_mb]
            fractions = [s.memory_used_mb / s.memory_total_mb for s in readings
                         if s.memory_used_mb is not None and s.memory_total_mb]
            stats = self.job_stats.get(job.id)
            if stats is None:
                stats = mstore.job_stats(self.store, job.id) or mstore.JobStats(job_id=job.id)
                stats.final = False
                self.job_stats[job.id] = stats
            stats.add(now, sum(utils) / len(utils) if utils else None, float(sum(mems)) if mems else None,
                      sum(totals) if totals else None, max(fractions) if fractions else None)
            changed.append(stats)
            if utils and max(utils) <= self.idle_threshold:
                self.idle_since.setdefault(job.id, now)
            else:
                self.idle_since.pop(job.id, None)
        for gone in [j for j in self.idle_since if j not in seen]:
            del self.idle_since[gone]
        return changed

    # ------------------------------------------------------------------ jobs

    def finish_job(self, job_id: int) -> mstore.JobStats | None:
        """A job ended: its stats become final (stored) and its tracking stops."""
        self.idle_since.pop(job_id, None)
        stats = self.job_stats.pop(job_id, None)
        if stats is None:
            stats = mstore.job_stats(self.store, job_id)
            if stats is None or stats.final:
                return stats
        stats.final = True
        with carry_on(f"storing the stats of job {job_id}"):
            mstore.save_job_stats(self.store, [stats])
        return stats

    def stats_of(self, job_id: int) -> mstore.JobStats | None:
        return self.job_stats.get(job_id) or mstore.job_stats(self.store, job_id)


__all__ = ["Sampler"]
