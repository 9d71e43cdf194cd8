"""Whose is a process on a GPU? And, under `rogue_policy = "kill"`, stopping the ones that
belong to no allocation.

A process belongs to a job when it is in the process tree of that job's supervisor (the
local runner's shim, whose pid and start time are in the job's runner handle), or when its
environment carries `GPUJOBS_JOB_ID` (kernels started by the provisioner have it). What a
process's environment says is read once per (pid, start time) and cached.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Mapping

import psutil

from ..gpus import GPUProcess
from .diagnosis import ProcessInfo

log = logging.getLogger("jupyter_gpujobs")


class ProcessResolver:
    """Maps the processes a backend reports on its GPUs to the jobs they belong to."""

    def __init__(self, ignore_names: tuple[str, ...] = ()):
        self.ignore_names = {n.lower() for n in ignore_names}
        self._static: dict[tuple[int, float], tuple[int | None, str | None, str]] = {}
        self._unresolved: set[tuple[int, int]] = set()  # (GPU, pid) not visible at the last reading
        self._protected = {os.getpid()}
        try:
            self._protected.update(p.pid for p in psutil.Process().parents())
        except psutil.Error:
            pass

    def _static_info(self, proc: psutil.Process, create_time: float) -> tuple[int | None, str | None, str]:
        key = (proc.pid, create_time)
        info = self._static.get(key)
        if info is None:
            env_job: int | None = None
            try:
                value = proc.environ().get("GPUJOBS_JOB_ID")
                env_job = int(value) if value and value.isdigit() else None
            except (psutil.Error, OSError):
                pass
            try:
                user: str | None = proc.username()
            except (psutil.Error, KeyError):
                user = None
            try:
                name = proc.name()
            except psutil.Error:
                name = ""
            info = (env_job, user, name)
            if len(self._static) > 4096:
                self._static.clear()
            self._static[key] = info
        return info

    def resolve(self, processes: Mapping[int, list[GPUProcess]],
                supervisors: Mapping[int, tuple[int, float | None]]) -> list[ProcessInfo]:
        """`supervisors`: shim pid -> (job id, shim create time). One ProcessInfo per (process, GPU)."""
        out: list[ProcessInfo] = []
        unresolved: set[tuple[int, int]] = set()
        for index, procs in processes.items():
            for gp in procs:
                try:
                    proc = psutil.Process(gp.pid)
                    create_time = proc.create_time()
                except psutil.NoSuchProcess:
                    # gone since the backend listed it, or (in a container) a pid of another pid
                    # namespace, whose owner cannot be told from here: the second kind stays, so
                    # it counts from its second reading on
                    unresolved.add((index, gp.pid))
                    if (index, gp.pid) in self._unresolved:
                        out.append(ProcessInfo(pid=gp.pid, gpu_index=index, owner_job=None,
                                               used_memory_mb=gp.used_memory_mb, unresolved=True))
                    continue
                except psutil.Error:
                    continue
                env_job, user, name = self._static_info(proc, create_time)
                owner = self._tree_owner(proc, supervisors)
                if owner is None:
                    owner = env_job
                ignored = name.lower() in self.ignore_names or gp.pid in self._protected
                out.append(ProcessInfo(pid=gp.pid, gpu_index=index, owner_job=owner, user=user, name=name,
                                       used_memory_mb=gp.used_memory_mb, create_time=create_time,
                                       ignored=ignored))
        self._unresolved = unresolved
        return out

    @staticmethod
    def _tree_owner(proc: psutil.Process, supervisors: Mapping[int, tuple[int, float | None]]) -> int | None:
        if not supervisors:
            return None
        try:
            chain = [proc, *proc.parents()]
        except psutil.Error:
            return None
        for p in chain:
            hit = supervisors.get(p.pid)
            if hit is None:
                continue
            job_id, started = hit
            try:
                if started is not None and abs(p.create_time() - started) > 1.0:
                    continue  # a recycled pid, not the supervisor
            except psutil.Error:
                continue
            return job_id
        return None


class RogueKiller:
    """SIGTERM a rogue process, SIGKILL it after `grace_s` if it is still there."""

    def __init__(self, grace_s: float = 10.0):
        self.grace_s = grace_s
        self._pending: dict[tuple[int, float], float] = {}  # (pid, create time) -> SIGKILL deadline

    def kill(self, info: ProcessInfo, protected: set[int]) -> str:
        """Stop `info`'s process; returns what was done ("terminated", "killed", or why not)."""
        if info.unresolved:
            return "not killed: the process is not visible from the engine"
        if info.pid in protected or info.pid == os.getpid():
            return "not killed: protected process"
        key = (info.pid, info.create_time or 0.0)
        try:
            proc = psutil.Process(info.pid)
            if info.create_time is not None and abs(proc.create_time() - info.create_time) > 1.0:
                return "not killed: the pid was reused"
            deadline = self._pending.get(key)
            if deadline is None:
                proc.send_signal(signal.SIGTERM)
                self._pending[key] = time.monotonic() + self.grace_s
                log.warning("gpujobs: sent SIGTERM to rogue process %d (rogue_policy=kill)", info.pid)
                return "terminated"
            if time.monotonic() >= deadline:
                proc.kill()
                log.warning("gpujobs: sent SIGKILL to rogue process %d (rogue_policy=kill)", info.pid)
                return "killed"
            return "terminated"
        except psutil.NoSuchProcess:
            self._pending.pop(key, None)
            return "killed"
        except psutil.AccessDenied:
            return "not killed: permission denied (run the engine as a user allowed to signal it)"

    def forget_missing(self, alive: set[tuple[int, float]]) -> None:
        for key in [k for k in self._pending if k not in alive]:
            del self._pending[key]


__all__ = ["ProcessResolver", "RogueKiller"]
