"""Enforcement of GPU shares (a job holding part of one GPU, `Job.share` / `Job.gpu_memory`):
what is in force, in layers, and what a share job gets in its environment.

1. always: the engine's watcher (monitor/shares.py) reads each job's GPU memory per process
   and stops a job over its memory share after `grace_s` ("used 23.1 GB of its 20 GB share on
   GPU 1"); the job's environment carries hints that keep common frameworks inside the share
   (`share_environment`);
2. with MPS (`c.GPUJobs.mps = True` and nvidia-cuda-mps-control present, runners/mps.py): the
   driver enforces each share's pinned memory limit and thread percentage as well;
3. MIG instances an admin made are GPUs of their own (gpus/nvml.py), enforced by the hardware.

`Shares` holds these settings for one engine, the last memory use the watcher measured per
(job, GPU), and says in one line what is in force (`describe`: `jupyter gpujobs gpus`, GET gpus
and GET info).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..model import GPU, Job, format_duration, share_fraction, share_memory_bytes
from .runners.mps import MPSControl, mps_job_env

_MB = 1 << 20

def share_bytes(job: Job, gpu: GPU) -> int | None:
    """The GPU memory `job` may use on `gpu` (bytes); None for a job of whole GPUs."""
    return share_memory_bytes(job, gpu.memory_total_mb * _MB)


def format_gb(n_bytes: float) -> str:
    """`24804016128` -> `"23.1 GB"`, `21474836480` -> `"20 GB"` (GB of 2^30 bytes, as GPU
    memory is counted in this product)."""
    text = f"{n_bytes / 2**30:.1f}"
    return (text[:-2] if text.endswith(".0") else text) + " GB"


def over_share_reason(used_bytes: int, limit_bytes: int, gpu_index: int) -> str:
    """Why a job over its share is stopped: "used 23.1 GB of its 20 GB share on GPU 1"."""
    return f"used {format_gb(used_bytes)} of its {format_gb(limit_bytes)} share on GPU {gpu_index}"


def share_environment(limit_bytes: int, total_bytes: int, share: float | None) -> tuple[dict[str, str], dict[str, str]]:
    """(hints, facts) for a job allowed `limit_bytes` of a GPU of `total_bytes`.

    hints (the job's own environment wins over them): XLA_PYTHON_CLIENT_MEM_FRACTION (JAX
    preallocates that fraction instead of 75%), TF_FORCE_GPU_ALLOW_GROWTH=true (TensorFlow
    allocates as it needs instead of all); facts: GPUJOBS_GPU_MEMORY (bytes),
    GPUJOBS_GPU_MEMORY_FRACTION (of the card; a PyTorch job keeps inside it with
    `torch.cuda.set_per_process_memory_fraction(float(os.environ["GPUJOBS_GPU_MEMORY_FRACTION"]))`)
    and GPUJOBS_GPU_SHARE (the share asked for, when one was)."""
    fraction = min(1.0, limit_bytes / total_bytes) if total_bytes > 0 else 1.0
    down = math.floor(fraction * 1000) / 1000  # never round a limit up
    hints = {
        "XLA_PYTHON_CLIENT_MEM_FRACTION": f"{math.floor(fraction * 100) / 100:.2f}",
        "TF_FORCE_GPU_ALLOW_GROWTH": "true",
    }
    facts = {"GPUJOBS_GPU_MEMORY": str(int(limit_bytes)), "GPUJOBS_GPU_MEMORY_FRACTION": f"{down:.3f}"}
    if share is not None:
        facts["GPUJOBS_GPU_SHARE"] = f"{share:g}"
    return hints, facts


@dataclass
class Shares:
    """How this engine enforces GPU shares, and what the watcher last measured."""

    grace_s: float = 10.0
    mps_wanted: bool = False  # c.GPUJobs.mps
    mps: MPSControl | None = None  # set when wanted, on real GPUs
    backend: str = "fake"  # the GPU backend's name
    runner_schedules_itself: bool = False  # Slurm: its own GPU sharing, not watched here
    #: (job id, GPU index) -> GPU memory (MB) the job's processes used at the last reading
    used_mb: dict[tuple[int, int], int] = field(default_factory=dict)

    @property
    def watched(self) -> bool:
        return not self.runner_schedules_itself

    @property
    def mps_active(self) -> bool:
        return self.mps is not None and self.mps.problem is None

    def mode(self) -> str:
        """"mps" (the driver's limits and the watcher), "watcher", or "off"."""
        if not self.watched:
            return "off"
        return "mps" if self.mps_active else "watcher"

    def describe(self, gpus: list[GPU] | None = None) -> str:
        """What enforces shares here, in one line."""
        if not self.watched:
            return "GPU shares: enforced by the cluster's scheduler, not watched by the engine"
        grace = format_duration(self.grace_s)
        watcher = f"stopped by the engine when over their memory share for {grace}"
        if self.mps_active:
            text = f"GPU shares: MPS limits (pinned memory, thread percentage) per shared GPU; {watcher}"
        elif self.mps_wanted and self.backend == "fake":
            text = f"GPU shares: {watcher}; MPS is not used on fake GPUs"
        elif self.mps_wanted:
            problem = self.mps.problem if self.mps is not None else "not set up"
            text = f"GPU shares: {watcher}; MPS asked for but {problem}, so the watcher alone enforces them"
        else:
            text = f"GPU shares: {watcher} (MPS off)"
        migs = [g for g in gpus or [] if g.uuid.startswith("MIG-")]
        if migs:
            text += f"; MIG: {len(migs)} instance(s), isolated by the hardware"
        return text

    def environment(self, job: Job, gpus: list[GPU]) -> tuple[dict[str, str], dict[str, str]]:
        """(hints, facts) of a job's environment for its share (both empty for whole GPUs):
        `share_environment`, plus the MPS limits when MPS is in force (facts: they win)."""
        if len(gpus) != 1:
            return {}, {}
        gpu = gpus[0]
        limit = share_bytes(job, gpu)
        if limit is None:
            return {}, {}
        total = gpu.memory_total_mb * _MB
        hints, facts = share_environment(limit, total, job.share)
        if self.mps_active and self.mps is not None:
            dirs = self.mps.ensure(gpu.uuid)
            if dirs is not None:
                facts.update(mps_job_env(dirs[0], dirs[1], limit, share_fraction(job, total)))
        return hints, facts

    def holders(self, jobs: list[Job], gpu: GPU) -> list[dict[str, Any]]:
        """Who holds how much of one GPU: each running job on it with its share (None: the whole
        card), its memory limit and the memory it used at the watcher's last reading (MB)."""
        out = []
        for job in jobs:
            limit = share_bytes(job, gpu)
            out.append({
                "job_id": job.id, "user": job.user,
                "share": None if limit is None else round(share_fraction(job, gpu.memory_total_mb * _MB), 4),
                "memory_mb": (limit // _MB) if limit is not None else gpu.memory_total_mb,
                "used_mb": self.used_mb.get((job.id, gpu.index)),
            })
        return out
