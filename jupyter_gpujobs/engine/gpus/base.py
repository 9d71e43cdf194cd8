"""The one interface every GPU source speaks (`GPUBackend`), the records it returns
(`GPUProcess`, `GPUSample`) and the backend for a machine without GPUs (`NoGPUBackend`).

Backends report what is on the machine; they never decide anything. The scheduler must
not import this package: the service hands it plain `model.GPU` values.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

from ...model import GPU

#: The host name every backend of the embedded single-server engine reports.
LOCAL_HOST = "localhost"


@dataclass(frozen=True)
class GPUProcess:
    """A process that uses a GPU, as the driver (or the fake backend) sees it."""

    pid: int
    used_memory_mb: int | None = None  # None where the driver does not say


@dataclass(frozen=True)
class GPUSample:
    """One reading of one GPU. Fields a backend cannot read are None."""

    index: int
    uuid: str
    time: float  # epoch seconds of the reading
    utilization: float | None = None  # percent 0-100
    memory_used_mb: int | None = None  # used by processes, without the driver's reservation (memory.py)
    memory_total_mb: int | None = None
    memory_reserved_mb: int | None = None  # kept by the driver for itself, as nvidia-smi's memory.reserved
    temperature_c: float | None = None
    power_w: float | None = None
    ecc_errors: int | None = None  # uncorrected ECC errors since the driver loaded
    xid: int | None = None  # last Xid error seen, where available
    healthy: bool = True
    processes: int = 0  # how many processes use it


class GPUBackend(abc.ABC):
    """Inventory and live readings of the GPUs of this machine."""

    #: "nvml" | "fake" | "none"
    name: str = "none"

    @abc.abstractmethod
    def inventory(self) -> list[GPU]:
        """Every GPU, with current memory use (by processes; the driver's reservation apart)
        and utilization."""

    @abc.abstractmethod
    def processes(self) -> dict[int, list[GPUProcess]]:
        """GPU index -> the processes using it (every index present, possibly empty). A pid
        is the driver's: in a container it may be one of another pid namespace."""

    @abc.abstractmethod
    def sample(self) -> list[GPUSample]:
        """One reading per GPU."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the backend holds (NVML handle); safe to call twice."""

    def device_nodes(self) -> dict[int, str]:
        """GPU index -> its character device (/dev/nvidiaN): what a job's device cgroup allows
        or denies. Empty where there are none."""
        return {}

    def instance_nodes(self) -> dict[int, tuple[str, ...]]:
        """GPU index of a MIG instance -> the capability devices that open it
        (/dev/nvidia-caps/nvidia-capN of its GPU instance and compute instance). A MIG
        instance shares its card's node (`device_nodes`) with the card's other instances, so
        the fence tells them apart by these: a job is denied those of the instances it was not
        given. Empty where there are none (no MIG, or a driver that gives no such devices)."""
        return {}

    def remove_device_nodes(self) -> None:  # noqa: B027 - optional hook
        """Remove the device nodes the backend made itself (fake GPUs'); a driver's stay."""


class NoGPUBackend(GPUBackend):
    """A machine with no usable GPU: 0 GPUs, and the reason why kept in `reason`."""

    name = "none"

    def __init__(self, reason: str = ""):
        self.reason = reason

    def inventory(self) -> list[GPU]:
        return []

    def processes(self) -> dict[int, list[GPUProcess]]:
        return {}

    def sample(self) -> list[GPUSample]:
        return []
