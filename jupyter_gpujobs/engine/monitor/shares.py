"""The share watcher: a job holding part of one GPU that uses more of its memory than its share,
for longer than a short grace, is stopped with the reason ("used 23.1 GB of its 20 GB share on
GPU 1").

A job's use of a GPU is the sum of the GPU memory of its processes on it, as the backend reports
per process (NVML's usedGpuMemory, the fake backend's declared amounts), each process mapped to
its job by the resolver (rogue.py: the job's supervisor tree, or GPUJOBS_JOB_ID). A process whose
memory the driver does not report counts 0. `ShareWatcher.check` is pure: it is given the
readings and the time and returns what to warn of and what to stop; the Monitor carries it out
through the service.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ...model import GPU, Job
from ..shares import over_share_reason, share_bytes
from .diagnosis import ProcessInfo

_MB = 1 << 20


@dataclass(frozen=True)
class Overuse:
    """A job over its memory share on one GPU."""

    job: Job
    gpu_index: int
    used_bytes: int
    limit_bytes: int
    since: float  # when it was first seen over
    stop: bool  # over for the whole grace: stop it now (else: warn, once)

    @property
    def reason(self) -> str:
        return over_share_reason(self.used_bytes, self.limit_bytes, self.gpu_index)


class ShareWatcher:
    """Remembers since when each job has been over its share."""

    def __init__(self, grace_s: float = 10.0):
        self.grace_s = grace_s
        self.over_since: dict[tuple[int, int], float] = {}  # (job id, GPU index) -> first seen over
        self.used_mb: dict[tuple[int, int], int] = {}  # (job id, GPU index) -> last reading (MB)

    def check(self, now: float, running: Iterable[Job], gpus: Mapping[int, GPU],
              processes: Iterable[ProcessInfo]) -> list[Overuse]:
        """The share jobs among `running` over their share: each one once per reading, with
        `stop` set once it has been over for `grace_s`. A job back within its share starts
        its grace afresh next time."""
        used: dict[tuple[int, int], int] = {}
        for p in processes:
            if p.owner_job is not None and p.used_memory_mb:
                key = (p.owner_job, p.gpu_index)
                used[key] = used.get(key, 0) + p.used_memory_mb
        out: list[Overuse] = []
        seen: set[tuple[int, int]] = set()
        usage: dict[tuple[int, int], int] = {}
        for job in running:
            for index in job.assigned_gpus:
                gpu = gpus.get(index)
                if gpu is None:
                    continue
                limit = share_bytes(job, gpu)
                if limit is None:
                    continue
                key = (job.id, index)
                mb = used.get(key, 0)
                usage[key] = mb
                if mb * _MB <= limit:
                    continue
                seen.add(key)
                since = self.over_since.setdefault(key, now)
                out.append(Overuse(job, index, mb * _MB, limit, since, now - since >= self.grace_s))
        for key in [k for k in self.over_since if k not in seen]:
            del self.over_since[key]
        self.used_mb = usage
        return out


__all__ = ["Overuse", "ShareWatcher"]
