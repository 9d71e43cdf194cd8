"""The GPUs as the engine hands them out: the inventory, its use outside the queue, the fence.

Owns the cached inventory (read from the GPU backend at most every 2 s), which GPUs are in use
by processes outside the queue (`GPU.foreign`) and the admins' overrides of that
(`foreign_ignored`), what confines jobs here (`isolation`, `limits_enforceable`), the device
nodes a job is fenced off (`deny_devices`) and the GPUs' view for the API (`gpu_views`).
The machine-wide claim of the GPUs (`claim.GPUClaim`) is held by the cycle that uses it.
It may call the GPU backend, the runner's isolation, and read the running jobs in
`state.EngineState`.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from ..model import GPU, Job
from .errors import Conflict
from .gpus.foreign import ForeignUse, foreign_use
from .runners.cgroups import FENCE_OFF
from .state import EngineState

log = logging.getLogger("jupyter_gpujobs")


class Inventory:
    def __init__(self, state: EngineState):
        self.state = state
        self.gpus: list[GPU] = []
        self.read_at = 0.0
        self.foreign: dict[tuple[str, int], str] = {}  # (host, index) -> what uses it
        self.foreign_todo: dict[tuple[str, int], str] = {}  # (host, index) -> what to do about it
        # (host, index) -> both without whose process it is (for non-admins and the jobs' reasons)
        self.foreign_public: dict[tuple[str, int], tuple[str, str]] = {}
        self.foreign_ignored: dict[tuple[str, int], str] = {}  # (host, index) -> who overrode it

    def refresh(self, force: bool = False) -> list[GPU]:
        now = self.state.clock()
        if force or now - self.read_at > 2.0:
            try:
                self.gpus = self._mark_foreign(self.state.gpus.inventory())
            except Exception:
                log.exception("gpujobs: reading the GPU inventory failed")
            self.read_at = now
        return self.gpus

    @property
    def inventory(self) -> list[GPU]:
        return self.refresh()

    def _mark_foreign(self, gpus: list[GPU]) -> list[GPU]:
        """Mark the GPUs no job holds on which processes hold memory beyond the threshold (never
        the driver's reservation, gpus/foreign.py): in use outside the queue (`GPU.foreign`,
        with what and whose, and `foreign_todo`), unless an admin overrode it; an override
        ends when the GPU is seen unused."""
        threshold = self.state.foreign_memory_threshold_mb
        if threshold is None:
            return gpus
        held = {(j.host, i) for j in self.state.running.values() if j.host for i in j.assigned_gpus}
        # processes hold no more than the GPU's memory used by processes: only those over are asked
        used = [g for g in gpus if (g.host, g.index) not in held and g.memory_used_mb > threshold]
        processes: dict[int, Any] = {}
        if used:
            try:
                processes = self.state.gpus.processes()
            except Exception:
                log.exception("gpujobs: listing the processes on the GPUs failed")
        found: dict[tuple[str, int], ForeignUse] = {}
        for g in used:
            use = foreign_use(g, processes.get(g.index), threshold)
            if use is not None:
                found[(g.host, g.index)] = use
        for key in [k for k in self.foreign_ignored if k not in held and k not in found]:
            del self.foreign_ignored[key]
            log.info("gpujobs: GPU %s on %s is no longer used outside the queue; the override ends", key[1], key[0])
        self.foreign = {key: use.text for key, use in found.items()}
        self.foreign_todo = {key: use.todo for key, use in found.items()}
        self.foreign_public = {key: (use.public, use.public_todo) for key, use in found.items()}
        if not found:
            return gpus
        # the scheduler's reasons reach the job's owner: without whose process it is
        return [replace(g, foreign=self.foreign_public[(g.host, g.index)][0])
                if (g.host, g.index) in self.foreign and (g.host, g.index) not in self.foreign_ignored else g
                for g in gpus]

    def ignore_foreign(self, host: str, index: int, ignore: bool, actor: str, reason: str = "") -> None:
        """An admin lets the queue hand out a GPU in use outside the queue (`ignore`), until it
        is seen unused, or takes that back. Conflict when nothing uses the GPU outside the queue."""
        key = (host, index)
        if ignore and key not in self.foreign_ignored and key not in self.foreign:
            raise Conflict("gpu", f"GPU {index} on {host} is not in use outside the queue; nothing to override")
        if ignore:
            self.foreign_ignored[(host, index)] = f"{actor}{': ' + reason if reason else ''}"
        else:
            self.foreign_ignored.pop((host, index), None)
        log.warning("gpujobs: %s %s the use of GPU %s on %s outside the queue%s", actor,
                    "overrode" if ignore else "no longer overrides", index, host, f" ({reason})" if reason else "")
        self.refresh(force=True)
        self.state.wake()

    # ------------------------------------------------------------------ confinement

    @property
    def isolation(self) -> str:
        """What confines the jobs here, in one line ("GPU fence: device cgroup; ...")."""
        iso = getattr(self.state.runner, "isolation", None)
        return iso.describe() if iso is not None else FENCE_OFF

    def limits_enforceable(self) -> tuple[bool, bool]:
        """Can this engine's jobs be given (a host memory limit, a CPU limit)?"""
        iso = getattr(self.state.runner, "isolation", None)
        return iso.limits() if iso is not None and iso.enabled else (False, False)

    def deny_devices(self, gpus: list[GPU]) -> list[str]:
        """The device nodes of this machine's GPUs other than `gpus` (a job's device fence): the
        nodes of cards it was given none of, and the capability devices of MIG instances it was
        not given (the instances of a card share its node)."""
        backend = self.state.gpus
        nodes, caps = backend.device_nodes(), backend.instance_nodes()
        mine = {g.index for g in gpus}
        given = {nodes[i] for i in mine if i in nodes} | {c for i in mine for c in caps.get(i, ())}
        every = set(nodes.values()) | {c for cs in caps.values() for c in cs}
        return sorted(every - given)

    def job_devices(self, gpus: list[GPU]) -> list[str]:
        """The device nodes of `gpus` (what a job's container gets, issue 29), in their order."""
        nodes = self.state.gpus.device_nodes()
        return list(dict.fromkeys(nodes[g.index] for g in gpus if g.index in nodes))

    # ------------------------------------------------------------------ the view

    def gpu_views(self) -> list[dict[str, Any]]:
        """Every GPU with the jobs that hold it (an engine that schedules its jobs itself; the
        mirror has its own)."""
        holding: dict[tuple[str, int], list[Job]] = {}
        for job in self.state.running.values():
            if job.host:
                for index in job.assigned_gpus:
                    holding.setdefault((job.host, index), []).append(job)
        out = []
        for g in self.inventory:
            jobs = holding.get((g.host, g.index), [])
            holder = jobs[0] if jobs else None
            out.append({
                "index": g.index, "uuid": g.uuid, "name": g.name, "host": g.host,
                # used by processes; what the driver keeps for itself apart (as nvidia-smi)
                "memory_total_mb": g.memory_total_mb, "memory_used_mb": g.memory_used_mb,
                "memory_reserved_mb": g.memory_reserved_mb,
                "utilization": g.utilization, "healthy": g.healthy, "draining": g.draining,
                "job_id": holder.id if holder else None, "user": holder.user if holder else None,
                # in use outside the queue: busy, unless an admin overrode it ("foreign_override": who)
                "foreign": None if holder else self.foreign.get((g.host, g.index)),
                "foreign_todo": None if holder else self.foreign_todo.get((g.host, g.index)),
                # the same without whose process it is (Access.gpu_views_for shows these to non-admins)
                "foreign_public": None if holder else self.foreign_public.get((g.host, g.index)),
                "foreign_override": None if holder else self.foreign_ignored.get((g.host, g.index)),
                # who holds how much of it: each job with its share (None: the whole card), its
                # memory limit and use (MB); a MIG instance is a GPU of its own ("mig")
                "holders": self.state.shares.holders(jobs, g),
                "mig": g.uuid.startswith("MIG-"),
            })
        return out

