"""Prometheus text exposition of the engine (`GET metrics`), through prometheus_client with a
registry of its own (never the process-global one, so two engines in one process or a test
never see each other's series).

GPU gauges carry the DCGM exporter's names and labels (gpu, UUID, modelName, Hostname), so
dashboards made for dcgm-exporter work unchanged:

- DCGM_FI_DEV_GPU_UTIL (%), DCGM_FI_DEV_FB_USED / DCGM_FI_DEV_FB_FREE (MiB),
  DCGM_FI_DEV_GPU_TEMP (C), DCGM_FI_DEV_POWER_USAGE (W), DCGM_FI_DEV_ECC_DBE_VOL_TOTAL
  (uncorrected volatile ECC errors), DCGM_FI_DEV_XID_ERRORS (last Xid; 0 for none).

Engine series are prefixed `gpujobs_`: GPU allocation and draining, queue length by
priority class, jobs by state, the wait-time histogram (submission to start), scheduler cycle
times, open findings by kind.
"""

from __future__ import annotations

import bisect
import socket
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ...model import PRIORITIES, JobState

#: Upper bounds (s) of the wait-time histogram buckets.
WAIT_BUCKETS: tuple[float, ...] = (1, 5, 10, 30, 60, 300, 600, 1800, 3600, 4 * 3600, 12 * 3600, 86400, 3 * 86400)

GPU_LABELS = ["gpu", "UUID", "modelName", "Hostname"]


class WaitHistogram:
    """Cumulative histogram of queue waits (seconds), fed at every job start."""

    def __init__(self, buckets: Sequence[float] = WAIT_BUCKETS):
        self.buckets = tuple(sorted(buckets))
        self.counts = [0] * (len(self.buckets) + 1)
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        seconds = max(0.0, float(seconds))
        self.counts[bisect.bisect_left(self.buckets, seconds)] += 1
        self.sum += seconds

    def cumulative(self) -> list[tuple[str, float]]:
        out = []
        total = 0
        for bound, count in zip(self.buckets, self.counts):
            total += count
            out.append((_bound(bound), float(total)))
        out.append(("+Inf", float(total + self.counts[-1])))
        return out


def _bound(value: float) -> str:
    return str(int(value)) + ".0" if float(value).is_integer() else repr(value)


class EngineCollector:
    """Builds every series at scrape time from the monitor's latest readings and the engine."""

    def __init__(self, monitor: Any):
        self.monitor = monitor
        self.hostname = socket.gethostname()

    def describe(self) -> Iterable[Metric]:
        return []  # collected at scrape time only; no registration-time collect()

    def collect(self) -> Iterator[Metric]:
        m = self.monitor
        service = m.service
        views = {(g["host"], g["index"]): g for g in service.gpu_views()}
        samples = m.sampler.latest if m.sampler.latest else m.sampler.read()
        fams = {
            "util": GaugeMetricFamily("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", labels=GPU_LABELS),
            "used": GaugeMetricFamily("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", labels=GPU_LABELS),
            "free": GaugeMetricFamily("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", labels=GPU_LABELS),
            "reserved": GaugeMetricFamily("DCGM_FI_DEV_FB_RESERVED", "Framebuffer memory the driver reserves "
                                          "(in MiB), not counted as used.", labels=GPU_LABELS),
            "temp": GaugeMetricFamily("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", labels=GPU_LABELS),
            "power": GaugeMetricFamily("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", labels=GPU_LABELS),
            "ecc": GaugeMetricFamily("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
                                     "Uncorrected (double-bit) volatile ECC errors.", labels=GPU_LABELS),
            "xid": GaugeMetricFamily("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.",
                                     labels=GPU_LABELS),
            "alloc": GaugeMetricFamily("gpujobs_gpu_allocated", "1 when a job holds the GPU.",
                                       labels=[*GPU_LABELS, "job", "user"]),
            "drain": GaugeMetricFamily("gpujobs_gpu_draining", "1 when no new job may start on the GPU.",
                                       labels=GPU_LABELS),
        }
        host_of = m.sampler.host
        for s in samples:
            view = views.get((host_of, s.index), {})
            labels = [str(s.index), s.uuid, str(view.get("name", "")), self.hostname]
            if s.utilization is not None:
                fams["util"].add_metric(labels, s.utilization)
            if s.memory_used_mb is not None:
                fams["used"].add_metric(labels, s.memory_used_mb)
                if s.memory_total_mb is not None:
                    free = s.memory_total_mb - s.memory_used_mb - (s.memory_reserved_mb or 0)
                    fams["free"].add_metric(labels, max(0, free))
            if s.memory_reserved_mb is not None:
                fams["reserved"].add_metric(labels, s.memory_reserved_mb)
            if s.temperature_c is not None:
                fams["temp"].add_metric(labels, s.temperature_c)
            if s.power_w is not None:
                fams["power"].add_metric(labels, s.power_w)
            if s.ecc_errors is not None:
                fams["ecc"].add_metric(labels, s.ecc_errors)
            fams["xid"].add_metric(labels, s.xid or 0)
            job = view.get("job_id")
            fams["alloc"].add_metric([*labels, str(job or ""), str(view.get("user") or "")], 1 if job else 0)
            fams["drain"].add_metric(labels, 1 if view.get("draining") else 0)
        yield from fams.values()

        queue = GaugeMetricFamily("gpujobs_queue_length", "Pending jobs by priority class.", labels=["priority"])
        queued_gpus = GaugeMetricFamily("gpujobs_queue_gpus", "GPUs asked for by pending jobs, by priority class.",
                                        labels=["priority"])
        by_class = dict.fromkeys(PRIORITIES, 0)
        gpus_by_class = dict.fromkeys(PRIORITIES, 0)
        for job in service.queue():
            by_class[job.priority] = by_class.get(job.priority, 0) + 1
            gpus_by_class[job.priority] = gpus_by_class.get(job.priority, 0) + job.gpus
        for name, n in by_class.items():
            queue.add_metric([name], n)
            queued_gpus.add_metric([name], gpus_by_class[name])
        yield queue
        yield queued_gpus

        states = GaugeMetricFamily("gpujobs_jobs", "Jobs by state (all stored jobs).", labels=["state"])
        counts = service.store.count_by_state()
        for st in JobState:
            states.add_metric([st.value], counts.get(st.value, 0))
        yield states

        hist = m.wait_histogram
        wait = HistogramMetricFamily("gpujobs_wait_seconds", "Queue wait of started jobs (submission to start).")
        wait.add_metric([], hist.cumulative(), sum_value=hist.sum)
        yield wait

        cycles = list(service.cycle_seconds)
        cycle = GaugeMetricFamily("gpujobs_scheduler_cycle_seconds",
                                  "Scheduling cycle time over the recent cycles.", labels=["stat"])
        if cycles:
            ordered = sorted(cycles)
            cycle.add_metric(["last"], cycles[-1])
            cycle.add_metric(["mean"], sum(cycles) / len(cycles))
            cycle.add_metric(["p50"], ordered[len(ordered) // 2])
            cycle.add_metric(["p99"], ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))])
            cycle.add_metric(["max"], ordered[-1])
        yield cycle

        findings = GaugeMetricFamily("gpujobs_findings_open", "Open findings by kind.", labels=["kind"])
        for kind, n in sorted(m.open_finding_counts().items()):
            findings.add_metric([kind], n)
        yield findings

        sample_cost = GaugeMetricFamily("gpujobs_sampler_cpu_seconds",
                                        "CPU time of the last GPU sampling tick (reading, storing, detectors).")
        sample_cost.add_metric([], m.last_tick_cpu_s)
        yield sample_cost


def make_registry(monitor: Any) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(monitor))  # type: ignore[arg-type]
    return registry


def render(registry: CollectorRegistry) -> tuple[bytes, str]:
    """(body, content type) of one scrape."""
    return generate_latest(registry), CONTENT_TYPE_LATEST


__all__ = ["WAIT_BUCKETS", "EngineCollector", "WaitHistogram", "make_registry", "render"]
