"""Pure detectors: from what the monitor saw, which findings a person should hear about.

- `detect_oom`: a job that ran out of GPU memory (a CUDA OOM message in its log, the runner's
  "out of memory" reason, or memory at the card's limit before it failed);
- `detect_repeated_failures`: the same job of one user (same name, or same command when it
  has no name) failed N times in a row;
- `detect_idle_hog`: a running job that has held its GPUs at ~0 % utilization for a while;
- `GPUErrorTracker` / `detect_gpu_errors`: a GPU whose uncorrected ECC count rises, that
  reports Xid errors, or that reads unhealthy, again and again;
- `detect_rogues`: processes on a GPU that no running job accounts for.

(`job_set_aside`: a job the scheduler could not handle, reported by the monitor from the
engine's `set_aside`. `reservation_proposal` and `offpeak_suggestion`: recurring demand worth
a reservation, and quiet hours worth making off-peak, from habits.py.)

Each detector returns `Finding`s (or None) with a stable `key`, so the monitor stores one
open finding per condition. No I/O, no clock: every input is a plain value.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...model import Job, JobState, format_duration
from ..runners.shim import OOM_PATTERNS  # one list: the supervisor reads it at every failure

KINDS = ("oom", "repeated_failure", "idle_hog", "gpu_errors", "gpu_drained", "rogue_process", "job_set_aside",
         "reservation_proposal", "offpeak_suggestion")


@dataclass
class Finding:
    kind: str  # one of KINDS
    key: str  # one open finding per key
    message: str
    severity: str = "warning"  # "info" | "warning" | "error"
    job_id: int | None = None
    user: str | None = None
    host: str | None = None
    gpu_index: int | None = None
    pid: int | None = None
    data: dict[str, Any] = field(default_factory=dict)


def job_label(job: Job) -> str:
    """`job 12 ('train' of alice)` / `job 12 (of alice)`."""
    return f"job {job.id} ('{job.name}' of {job.user})" if job.name else f"job {job.id} (of {job.user})"


def oom_in_log(text: str) -> str | None:
    """The first OOM pattern in a log text, if any."""
    low = text.lower()
    for pattern in OOM_PATTERNS:
        if pattern.lower() in low:
            return pattern
    return None


def detect_oom(job: Job, log_tail: str, memory_max_fraction: float | None = None,
               memory_max_mb: float | None = None, memory_total_mb: float | None = None,
               limit_fraction: float = 0.95) -> Finding | None:
    """A finished job that ran out of GPU memory, from its log tail, its end reason and the
    peak memory the sampler saw on its GPUs (fraction of one card's memory)."""
    if job.state not in (JobState.FAILED, JobState.LOST, JobState.CANCELLED, JobState.TIMEOUT):
        return None
    pattern = oom_in_log(log_tail)
    label = job_label(job)
    if pattern is None and "out of memory" in (job.reason or "").lower():
        pattern = "out of memory"
    data: dict[str, Any] = {"peak_memory_fraction": memory_max_fraction, "peak_memory_mb": memory_max_mb,
                            "memory_total_mb": memory_total_mb}
    if pattern is not None and job.state is not JobState.CANCELLED:
        message = f"{label} ran out of GPU memory ('{pattern}' in its log)"
        if memory_max_mb and memory_total_mb:
            message += f"; peak use {memory_max_mb / 1024:.1f} of {memory_total_mb / 1024:.1f} GiB"
        message += ": use a smaller batch or model, or ask for a GPU with more memory"
        return Finding("oom", f"oom:{job.id}", message, "error", job_id=job.id, user=job.user,
                       data={**data, "pattern": pattern})
    if (job.state in (JobState.FAILED, JobState.LOST) and memory_max_fraction is not None
            and memory_max_fraction >= limit_fraction):
        peak = f"{memory_max_fraction:.0%} of a GPU's memory"
        if memory_max_mb and memory_total_mb:
            peak = f"{memory_max_mb / 1024:.1f} of {memory_total_mb / 1024:.1f} GiB"
        message = (f"{label} failed with its GPU memory at the limit ({peak}): probably out of memory; "
                   "use a smaller batch or model, or ask for a GPU with more memory")
        return Finding("oom", f"oom:{job.id}", message, "error", job_id=job.id, user=job.user, data=data)
    return None


def failure_cause(job: Job, oom: bool = False) -> str:
    """A short cause of a failed job: "out of memory", "exit code 3", "killed by signal SIGSEGV"."""
    if oom or "out of memory" in (job.reason or "").lower():
        return "out of memory"
    reason = (job.reason or "").strip()
    if reason.startswith("failed (") and reason.endswith(")"):
        reason = reason[len("failed ("):-1]
    if reason:
        return reason
    if job.exit_code is not None:
        return f"exit code {job.exit_code}"
    return job.state.value.lower()


def detect_repeated_failures(latest: Sequence[Job], causes: Mapping[int, str] | None = None,
                             threshold: int = 3) -> Finding | None:
    """`latest`: the same user's ended runs of one job (same name or command), newest first.
    A finding when the newest `threshold` or more all failed; `causes` (job id -> cause)
    overrides `failure_cause` (e.g. an OOM seen in the log)."""
    if threshold <= 0 or not latest:
        return None
    streak: list[Job] = []
    for job in latest:
        if job.state in (JobState.FAILED, JobState.LOST):
            streak.append(job)
        elif job.state is JobState.CANCELLED and not job.started_at:
            continue  # cancelled in the queue: says nothing about the job
        else:
            break
    if len(streak) < threshold:
        return None
    causes = dict(causes or {})
    cause_of = [causes.get(j.id) or failure_cause(j) for j in streak]
    newest = streak[0]
    if len(set(cause_of)) == 1:
        cause = cause_of[0]
    else:
        cause = f"last: {cause_of[0]}"
    what = f"'{newest.name}'" if newest.name else f"'{' '.join(newest.command)[:60]}'"
    message = f"job {what} of {newest.user} failed {len(streak)} times in a row: {cause}"
    signature = newest.name or "\0".join(newest.command)
    return Finding("repeated_failure", f"failures:{newest.user}:{signature}", message, "warning",
                   job_id=newest.id, user=newest.user,
                   data={"jobs": [j.id for j in streak], "causes": cause_of, "count": len(streak)})


def detect_idle_hog(job: Job, idle_since: float | None, now: float, after_s: float,
                    threshold: float) -> Finding | None:
    """A running job whose GPUs have all been at or below `threshold` % utilization since
    `idle_since` (None: not idle now), for at least `after_s` seconds."""
    if job.state is not JobState.RUNNING or not job.assigned_gpus or idle_since is None:
        return None
    idle_for = now - idle_since
    if idle_for < after_s:
        return None
    gpus = ",".join(str(i) for i in job.assigned_gpus)
    plural = "s" if len(job.assigned_gpus) > 1 else ""
    message = (f"{job_label(job)} has held GPU{plural} {gpus} at ~0% utilization (<= {threshold:g}%) "
               f"for {format_duration(idle_for)}; release it if it is not needed")
    return Finding("idle_hog", f"idle:{job.id}", message, "warning", job_id=job.id, user=job.user,
                   host=job.host, gpu_index=job.assigned_gpus[0],
                   data={"gpus": list(job.assigned_gpus), "idle_since": idle_since, "idle_s": round(idle_for, 1),
                         "threshold": threshold})


# ----------------------------------------------------------------------------- GPU errors


@dataclass
class GPUErrorState:
    """Errors counted on one GPU since the monitor started watching it."""

    ecc_baseline: int | None = None
    ecc_last: int | None = None
    last_xid: int | None = None
    xids: list[int] = field(default_factory=list)
    unhealthy_readings: int = 0
    was_healthy: bool = True

    @property
    def ecc_new(self) -> int:
        if self.ecc_baseline is None or self.ecc_last is None:
            return 0
        return max(0, self.ecc_last - self.ecc_baseline)

    @property
    def total(self) -> int:
        """Error events: new uncorrected ECC errors, Xid events and unhealthy spells."""
        return self.ecc_new + len(self.xids) + self.unhealthy_readings


def update_gpu_errors(state: GPUErrorState, ecc_errors: int | None, xid: int | None, healthy: bool) -> bool:
    """Fold one reading into `state`; True when it added an error."""
    before = state.total
    if ecc_errors is not None:
        if state.ecc_baseline is None:
            state.ecc_baseline = ecc_errors
        state.ecc_last = ecc_errors
    if xid is not None and xid != state.last_xid:
        state.xids.append(int(xid))
    state.last_xid = xid if xid is not None else state.last_xid
    if not healthy and state.was_healthy:
        state.unhealthy_readings += 1  # one per unhealthy spell, not per reading
    state.was_healthy = healthy
    return state.total > before


def detect_gpu_errors(host: str, index: int, uuid: str, name: str, state: GPUErrorState,
                      drain_after: int = 0, repeat: int = 2) -> Finding | None:
    """A GPU with `repeat` or more error events. With `drain_after` > 0 and at least that many,
    the finding asks to drain it (`data["drain"]`): the scheduler then starts nothing there."""
    if state.total < max(1, repeat):
        return None
    parts = []
    if state.ecc_new:
        parts.append(f"{state.ecc_new} new uncorrected ECC error(s)")
    if state.xids:
        parts.append("Xid " + ", ".join(str(x) for x in state.xids[-5:]))
    if state.unhealthy_readings:
        parts.append(f"unreadable {state.unhealthy_readings} time(s)")
    drain = drain_after > 0 and state.total >= drain_after
    message = f"GPU {index} ({name}) on {host} has repeated errors: {'; '.join(parts)}"
    message += "; draining it: no new jobs start there" if drain else "; consider draining it"
    return Finding("gpu_errors", f"gpu-errors:{host}:{uuid}", message, "error", host=host, gpu_index=index,
                   data={"uuid": uuid, "errors": state.total, "ecc_new": state.ecc_new, "xids": list(state.xids),
                         "unhealthy": state.unhealthy_readings, "drain": drain})


# ----------------------------------------------------------------------------- rogue processes


@dataclass(frozen=True)
class ProcessInfo:
    """A process seen on a GPU, as the monitor resolved it."""

    pid: int
    gpu_index: int
    owner_job: int | None  # the job whose supervisor tree or GPUJOBS_JOB_ID it belongs to
    user: str | None = None
    name: str = ""
    used_memory_mb: int | None = None
    create_time: float | None = None
    ignored: bool = False  # e.g. a display server the admin listed in rogue_ignore
    unresolved: bool = False  # the pid is not visible here (gone, or another pid namespace)


def detect_rogues(host: str, processes: Iterable[ProcessInfo], allocated: Mapping[int, Job],
                  gpu_names: Mapping[int, str] | None = None) -> list[Finding]:
    """Processes using a GPU without an allocation: on a GPU no job holds, or held by a job
    they do not belong to. `allocated`: GPU index -> the running job holding it."""
    out: list[Finding] = []
    names = gpu_names or {}
    for p in processes:
        if p.ignored:
            continue
        holder = allocated.get(p.gpu_index)
        if holder is not None and (p.owner_job == holder.id or p.unresolved):
            continue  # the holder's own process (or one that cannot be told apart from it)
        extras = [x for x in (p.name, f"user {p.user}" if p.user else "") if x]
        who = f"process {p.pid}" + (f" ({', '.join(extras)})" if extras else "")
        gpu = f"GPU {p.gpu_index}" + (f" ({names[p.gpu_index]})" if p.gpu_index in names else "")
        if holder is None:
            where = f"{gpu}, which no job holds"
        else:
            where = f"{gpu}, allocated to {job_label(holder)}"
        if p.owner_job is not None:
            message = f"{who} of job {p.owner_job} uses {where}, outside its own allocation"
        else:
            message = f"{who} uses {where}, without an allocation (started outside the queue)"
        if p.used_memory_mb:
            message += f"; it holds {p.used_memory_mb} MB"
        key = f"rogue:{host}:{p.gpu_index}:{p.pid}:{int(p.create_time or 0)}"
        out.append(Finding("rogue_process", key, message, "warning", job_id=holder.id if holder else None,
                           user=p.user, host=host, gpu_index=p.gpu_index, pid=p.pid,
                           data={"process": p.name, "owner_job": p.owner_job, "used_memory_mb": p.used_memory_mb,
                                 "holder_job": holder.id if holder else None,
                                 "holder_user": holder.user if holder else None}))
    return out


__all__ = [
    "KINDS", "OOM_PATTERNS", "Finding", "GPUErrorState", "ProcessInfo", "detect_gpu_errors", "detect_idle_hog",
    "detect_oom", "detect_repeated_failures", "detect_rogues", "failure_cause", "job_label", "oom_in_log",
    "update_gpu_errors",
]
