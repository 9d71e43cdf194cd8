"""Is a GPU that no job holds in use outside the queue, by what, and what to do about it.

Decided from what processes hold, never from the memory the driver keeps for itself
(memory.py): where the driver lists processes with their memory, their sum; where it lists
processes without memory (NVML_VALUE_NOT_AVAILABLE, as in some containers), the GPU's memory
used by processes, put on them; where it lists none, the GPU's memory used by processes, which
the engine cannot attribute ("memory the engine cannot attribute: 700 MiB over the baseline").
Beyond `threshold_mb` the GPU is in use outside the queue.

`foreign_use` is pure but for `describe_pid`, which reads a process's name and user through
psutil. The service calls it for each GPU no job holds; nothing here calls the engine.

Whose process it is (pid, name, user) is for admins (`text`, `todo`); everyone else, and every
job's reason, gets `public` and `public_todo`, which say how much is held by how many processes
and nothing of whose: a user must not learn another's processes through the engine, which sees
them as root even where /proc hides them (hidepid).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ...model import GPU
from .base import GPUProcess

#: What stands for who uses a GPU when the pid the driver gives is not a process seen here.
NOT_VISIBLE = "which the engine cannot see: another pid namespace, e.g. a container"


@dataclass(frozen=True)
class ForeignUse:
    """A GPU in use outside the queue."""

    index: int
    memory_mb: int  # what the processes outside the queue hold (or what cannot be attributed)
    text: str  # completes "GPU 0 is ...": "in use outside the queue (2.1 GiB held by pid 4242, python, user bob)"
    todo: str  # what to do about it
    pids: tuple[int, ...] = ()  # the processes, biggest first; empty: nothing attributed
    public: str = ""  # `text` without whose: "in use outside the queue (2.1 GiB held by a process ...)"
    public_todo: str = ""  # `todo` for someone who may not see whose process it is


def size_text(mb: float) -> str:
    """"616 MiB", "2.1 GiB"."""
    return f"{mb:.0f} MiB" if mb < 1024 else f"{mb / 1024:.1f} GiB"


def describe_pid(pid: int) -> str | None:
    """"python, user bob" for a process seen here; None for one that is not (gone, or in
    another pid namespace)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        name = proc.name()
    except psutil.Error:
        return None
    try:
        return f"{name}, user {proc.username()}"
    except (psutil.Error, KeyError):
        return name


def foreign_use(gpu: GPU, processes: list[GPUProcess] | None, threshold_mb: int,
                describe: Callable[[int], str | None] = describe_pid) -> ForeignUse | None:
    """`gpu` (no job holds it) with `processes` the driver lists on it (None: it cannot list
    them): in use outside the queue beyond `threshold_mb`, or None."""
    procs = list(processes or [])
    if procs and all(p.used_memory_mb is not None for p in procs):
        held = sum(p.used_memory_mb or 0 for p in procs)
    else:
        held = gpu.memory_used_mb
    if held <= threshold_mb:
        return None
    override = f"an admin can hand it out anyway: jupyter gpujobs gpus --override {gpu.index} --reason '...'"
    if not procs:
        text = f"in use outside the queue (memory the engine cannot attribute: {size_text(held)} over the baseline)"
        todo = (f"compare with `nvidia-smi -i {gpu.index} --query-gpu=memory.used,memory.reserved --format=csv`; "
                f"if that memory is no process's, raise c.GPUJobs.foreign_memory_threshold above {held} (MiB); "
                f"or {override}")
        return ForeignUse(gpu.index, held, text, todo, (), text, todo)
    procs.sort(key=lambda p: p.used_memory_mb or 0, reverse=True)
    top = procs[0]
    who = describe(top.pid)
    whose = f"pid {top.pid}, {who}" if who else f"pid {top.pid}, {NOT_VISIBLE}"
    lead = "held by " if len(procs) == 1 else f"held by {len(procs)} processes, most by "
    text = f"in use outside the queue ({size_text(held)} {lead}{whose})"
    if who:
        user = who.rpartition("user ")[2] if "user " in who else "its owner"
        todo = f"ask {user} to stop pid {top.pid} or to run it through the queue; {override}"
    else:
        todo = (f"find pid {top.pid} with nvidia-smi where the driver's pids are seen (the host) and stop it; "
                f"{override}")
    count = "a process" if len(procs) == 1 else f"{len(procs)} processes"
    public = f"in use outside the queue ({size_text(held)} held by {count} the queue did not start)"
    public_todo = ("if it is your process, stop it or run it through the queue (`jupyter gpujobs submit`); "
                   "else ask an admin: `jupyter gpujobs gpus` shows them whose it is")
    return ForeignUse(gpu.index, held, text, todo, tuple(p.pid for p in procs), public, public_todo)


__all__ = ["NOT_VISIBLE", "ForeignUse", "describe_pid", "foreign_use", "size_text"]
