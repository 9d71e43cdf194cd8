"""What "memory in use" on a GPU means: memory that processes use, never the memory the driver
keeps for itself.

Drivers report a GPU's memory two ways. NVML's v1 memory info (`nvmlDeviceGetMemoryInfo`)
counts in "used" the memory the driver reserves (616 MiB on an idle H200 with driver 580:
nvidia-smi shows `memory.used 0 MiB, memory.reserved 616 MiB`); the v2 memory info
(`nvmlDeviceGetMemoryInfo_v2`, `nvmlMemory_v2_t`) gives `used` without it and `reserved`
apart. `MemorySplitter` turns either into (used by processes, reserved): v2 as it is; v1 minus
a per-GPU idle baseline, the lowest v1 "used" seen while the driver listed no process on the
GPU (and 0 until such a reading).

Both GPU backends (nvml.py, fake.py) give their readings to it, so the fake GPUs go through
the same arithmetic as real ones. It calls nothing.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MemoryReading:
    """What a driver says of one GPU's memory (MiB)."""

    total_mb: int
    used_v1_mb: int  # NVML v1 "used": the processes' memory plus the driver's reservation
    used_v2_mb: int | None = None  # NVML v2 "used" (without reserved); None: the driver has no v2
    reserved_v2_mb: int | None = None  # NVML v2 "reserved"


class MemorySplitter:
    """Per-GPU idle baselines, and each reading split into (used by processes, reserved)."""

    def __init__(self) -> None:
        self.baseline_mb: dict[int, int] = {}  # GPU index -> lowest v1 "used" seen with no process on it

    def split(self, index: int, reading: MemoryReading, processes_listed: int | None) -> tuple[int, int]:
        """(MiB used by processes, MiB the driver reserves) of GPU `index`. `processes_listed`:
        how many processes the driver lists on it; None where it cannot list them (then no
        baseline is learned from this reading)."""
        if reading.used_v2_mb is not None:
            return max(0, reading.used_v2_mb), max(0, reading.reserved_v2_mb or 0)
        if processes_listed == 0:
            known = self.baseline_mb.get(index)
            self.baseline_mb[index] = reading.used_v1_mb if known is None else min(known, reading.used_v1_mb)
        base = self.baseline_mb.get(index, 0)
        return max(0, reading.used_v1_mb - base), base


__all__ = ["MemoryReading", "MemorySplitter"]
