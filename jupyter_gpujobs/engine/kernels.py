"""GPU kernels: jobs whose process the engine does not start (`EXTERNAL_KINDS`).

Owns their end (`finish_external` from the front end, `end_external` from the engine) and
their confinement once their provisioner asks (`adopt`): the watch of the adopted processes
until the last is gone (`watch_adopted`), and the idle reclaim of a kernel whose Jupyter
server is gone. The per-job state of an adopted kernel (handle, end asked, since when empty,
idle watch) lives in `state.EngineState`, so that it ends with its job.

It may call the runner's adoption calls (`adopt`, `adopted_run`, `adopted_alive`,
`stop_adopted`), `inventory.Inventory` (the GPUs, the device fence), `access.Access` (whose
job it is) and `events.Events.set_state` (the end of a kernel job).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import psutil

from ..model import InvalidInput, Job, JobState, format_duration, parse_reason
from .access import Access
from .errors import Conflict, PermissionDenied
from .events import Events
from .inventory import Inventory
from .runners import LaunchRequest
from .runners.cgroups import PARENT as CGROUP_PARENT
from .runners.users import lookup, run_as
from .state import END_STATES, EXTERNAL_KINDS, EngineState

log = logging.getLogger("jupyter_gpujobs")


class Kernels:
    #: Utilization (percent) under which the GPUs of an orphaned kernel count as unused.
    IDLE_GPU_THRESHOLD = 5.0
    #: An adopted kernel with no process left for this long has ended (its Jupyter server is
    #: gone, or it would have said so); a restart of the kernel takes far less.
    KERNEL_GONE_S = 30.0

    def __init__(self, state: EngineState, inventory: Inventory, access: Access, events: Events):
        self.state = state
        self.inventory = inventory
        self.access = access
        self.events = events

    def finish_external(self, job_id: int, user: str, state: Any = "COMPLETED", reason: Any = None) -> Job:
        """The end of a job the engine did not launch (a kernel): shut down, crashed, idle.
        `state`: COMPLETED, FAILED, CANCELLED or TIMEOUT; `reason` defaults to the state."""
        if not isinstance(state, str) or state.upper() not in END_STATES:
            raise InvalidInput("state", f"cannot end a job as {str(state)[:40]!r}; expected {', '.join(END_STATES)}")
        end = JobState(state.upper())
        reason = parse_reason(reason) or end.value.lower()
        job = self.state.get(job_id)
        self.access.check_owner(job, user)
        if job.kind not in EXTERNAL_KINDS:
            raise InvalidInput("kind", f"job {job_id} is a {job.kind} job; cancel it instead")
        if job.state.is_final:
            return job
        if job.state is JobState.RUNNING:
            return self.end_external(job, end, user, reason)
        return self.events.set_state(job_id, end, user, reason, expect=(JobState.PENDING, JobState.RUNNING)) or job

    def adopt(self, job_id: int, user: str, pid: Any, launcher: int) -> dict[str, Any]:
        """Put a running GPU kernel's process (and its children) under the engine's watch: its
        own cgroup with the device fence and limits a job of its own would get, so that its
        time limit, cancel and GPU release hold even when the Jupyter server that launched it
        is gone. Called by the kernel provisioner right after the launch (and each restart).

        The process must belong to the job's owner (its real uid), descend from `launcher`
        (the caller's process: the Jupyter server that started the kernel) and be in no other
        job's cgroup: nobody confines a stranger's process, nor takes one out of its own job.
        Returns {"confined": bool, "isolation": what is in force}."""
        s = self.state
        if isinstance(pid, bool) or not isinstance(pid, int) or not 1 < pid < 1 << 31:
            raise InvalidInput("pid", f"expected a process id, got {str(pid)[:40]!r}")
        job = s.get(job_id)
        self.access.check_owner(job, user)
        if job.kind not in EXTERNAL_KINDS:
            raise InvalidInput("kind", f"job {job_id} is a {job.kind} job; the engine already supervises it")
        if job.state is not JobState.RUNNING or job.id in s.ending:
            raise Conflict("state", f"job {job_id} is {job.state.value}, not running: nothing to confine")
        if s.mirrored:
            return {"confined": False, "isolation": "the kernel is a Slurm job; Slurm confines it"}
        procs = _process_tree(pid, _owner_uid(job.user, s.run_as_owner), launcher)
        handle = s.adopted.get(job.id)
        own = s.runner.adopted_run(handle)
        for proc_pid, run in procs:
            if run and run != own:
                raise PermissionDenied(f"process {proc_pid} belongs to another GPU job ({run}); "
                                       "it cannot join this one")
        gpus = [g for g in self.inventory.inventory if g.index in job.assigned_gpus and g.host in (None, job.host)]
        # a kernel in an image (issue 29): the container its launcher runs once confined
        extra = {"container": s.containers.launch(job.id, job.image, job.cwd or str(self.access.root_for(job.user)),
                                                  self.inventory.job_devices(gpus), run_as(job.user, s.run_as_owner))
                 } if job.image else {}
        req = LaunchRequest(job_id=job.id, command=[], cwd="", mem_bytes=job.mem_bytes, cpus=job.cpus,
                            deny_devices=self.inventory.deny_devices(gpus), container=extra.get("container"))
        try:
            new = s.runner.adopt(req, [p for p, _ in procs], handle)
        except OSError as err:
            log.warning("gpujobs: could not confine kernel job %s (pid %s): %s", job.id, pid, err)
            return {"confined": False, "isolation": f"not confined: {err.strerror or err}", **extra}
        if new is None:
            return {"confined": False, "isolation": self.inventory.isolation, **extra}
        new["launcher"] = _process_key(launcher)  # whose death leaves the kernel to the engine
        if handle != new:
            s.store.update_job(job.id, runner_handle=new)
            s.adopted[job.id] = new
        s.empty_since.pop(job.id, None)
        return {"confined": True, "isolation": self.inventory.isolation, **extra}

    def end_external(self, job: Job, state: JobState, actor: str, reason: str) -> Job:
        """End a running kernel job. A confined one keeps its GPUs until its last process is
        gone: everything left in its cgroup is killed and the end is recorded once it is empty
        (`watch_adopted`), so no process of it runs on a GPU given to another job."""
        s = self.state
        if job.id in s.ending:  # the first end asked wins (a time limit over the death it causes)
            state, actor, reason = s.ending[job.id]
        handle = s.adopted.get(job.id)
        if handle is not None and not s.runner.stop_adopted(handle):
            s.ending[job.id] = (state, actor, reason)
            return job
        return self.events.set_state(job.id, state, actor, reason, expect=(JobState.RUNNING,)) or s.get(job.id)

    def _reclaim_orphan(self, job_id: int, handle: dict[str, Any], now: float) -> None:
        """Idle reclaim for a confined kernel whose Jupyter server is gone (nobody else can):
        its `idle_timeout` (from the provisioner) counts while its GPUs are unused. Checked
        once a second; the GPUs' utilization is the inventory's."""
        s = self.state
        job = s.running.get(job_id)
        idle_timeout = (job.payload or {}).get("idle_timeout") if job is not None else None
        if job is None or not isinstance(idle_timeout, (int, float)) or idle_timeout <= 0:
            return
        checked, idle_since = s.orphan_idle.get(job_id, (0.0, None))
        if now - checked < 1.0:
            return
        if _process_alive(handle.get("launcher")):
            s.orphan_idle.pop(job_id, None)
            return
        used = max((g.utilization for g in self.inventory.inventory
                    if g.index in job.assigned_gpus and g.host in (None, job.host)), default=0.0)
        if used >= self.IDLE_GPU_THRESHOLD:
            idle_since = None
        elif idle_since is None:
            idle_since = now
        s.orphan_idle[job_id] = (now, idle_since)
        if idle_since is not None and now - idle_since >= idle_timeout:
            self.end_external(job, JobState.CANCELLED, "engine",
                              f"idle for {format_duration(idle_timeout)} after its Jupyter server was gone")

    def watch_adopted(self) -> None:
        s = self.state
        now = s.clock()
        for job_id, handle in list(s.adopted.items()):
            ending = s.ending.get(job_id)
            if ending is not None:
                if s.runner.stop_adopted(handle):
                    self.events.set_state(job_id, *ending, expect=(JobState.RUNNING,))
                continue
            if s.runner.adopted_alive(handle):
                s.empty_since.pop(job_id, None)
                self._reclaim_orphan(job_id, handle, now)
                continue
            since = s.empty_since.setdefault(job_id, now)
            if now - since >= self.KERNEL_GONE_S:
                self.events.set_state(job_id, JobState.FAILED, "engine",
                                      "kernel gone: none of its processes is left (was its Jupyter server stopped?)",
                                      expect=(JobState.RUNNING,))


def _owner_uid(user: str, mode: str) -> int:
    """The Unix uid a job of `user` runs as (the engine's own where jobs run as the engine)."""
    name = run_as(user, mode)
    entry = lookup(name) if name else None
    return entry.pw_uid if entry is not None else os.geteuid()


def _process_key(pid: int) -> list[float]:
    """[pid, start time]: names a process so that a recycled pid is not taken for it."""
    try:
        return [pid, psutil.Process(pid).create_time()]
    except psutil.Error:
        return [pid, 0.0]


def _process_alive(key: Any) -> bool:
    """Is the process `_process_key` named still running (True when unknown)?"""
    if not isinstance(key, list) or len(key) != 2:
        return True
    try:
        proc = psutil.Process(int(key[0]))
        return abs(proc.create_time() - float(key[1])) < 0.5 and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _process_tree(pid: int, uid: int, launcher: int) -> list[tuple[int, str]]:
    """`pid` and its descendants, each with the name of the GPU job run whose cgroup holds it
    ("" for none). Refuses a process that does not exist, whose real uid is not `uid`, or that
    `launcher` did not start (directly or not)."""
    try:
        top = psutil.Process(pid)
        procs = [top, *top.children(recursive=True)]
        if top.uids().real != uid:
            raise PermissionDenied(f"process {pid} is not yours: only your own processes can join your job")
        if launcher not in {p.pid for p in top.parents()}:
            raise PermissionDenied(f"process {pid} was not started by the caller (process {launcher}); "
                                   "only the Jupyter server that launched a kernel can have it confined")
    except psutil.NoSuchProcess:
        raise InvalidInput("pid", f"no process {pid} is running") from None
    except psutil.AccessDenied:
        raise PermissionDenied(f"process {pid} is not yours") from None
    out = []
    for proc in procs:
        run = ""
        try:
            with open(f"/proc/{proc.pid}/cgroup") as f:
                for line in f:
                    _, _, path = line.rstrip("\n").partition(":")[2].partition(":")
                    if f"/{CGROUP_PARENT}/" in f"{path}/":
                        run = path.split(f"/{CGROUP_PARENT}/", 1)[1].split("/", 1)[0]
                        break
        except OSError:
            continue  # exited meanwhile
        out.append((proc.pid, run))
    return out
