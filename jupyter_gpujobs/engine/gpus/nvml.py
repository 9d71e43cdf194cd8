"""Real NVIDIA GPUs through NVML (the `pynvml` module of nvidia-ml-py).

Every NVML query is guarded on its own: a GPU whose temperature cannot be read still appears
in the inventory, and a GPU that fell off the bus ("GPU is lost") is reported unhealthy
instead of breaking the listing. Xid errors are collected, where the driver supports it,
from an NVML event set polled without waiting at each sample.

MIG: a GPU an admin partitioned with MIG (`nvmlDeviceGetMigMode` says enabled) is not
schedulable itself; each of its MIG instances is (`nvmlDeviceGetMaxMigDeviceCount`,
`nvmlDeviceGetMigDeviceHandleByIndex`): a device with the MIG UUID NVML gives ("MIG-…", what a
job gets in CUDA_VISIBLE_DEVICES), the type "<card> <profile>" ("NVIDIA H200 1g.18gb"), its own
memory and processes, and an index after the whole GPUs' (whole GPUs keep their NVML index,
which CUDA_VISIBLE_DEVICES uses with CUDA_DEVICE_ORDER=PCI_BUS_ID). Temperature, power, ECC
errors and the device node of an instance are its card's. The partitioning is read when the
backend opens (restart the engine after changing it); the engine never changes MIG settings.

Memory: used means used by processes (memory.py). NVML's v2 memory info
(`nvmlDeviceGetMemoryInfo(handle, version=nvmlMemory_v2)`, used without the driver's reserved
memory) where the driver and nvidia-ml-py have it, else v1 less a per-GPU idle baseline; a
device whose v2 query is not supported (an older driver or nvidia-ml-py, a MIG instance) is
read with v1 from then on.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import time
from dataclasses import dataclass
from typing import Any

from ...model import GPU
from .base import LOCAL_HOST, GPUBackend, GPUProcess, GPUSample
from .memory import MemoryReading, MemorySplitter

_MB = 1024 * 1024


def _cap_device(proc_file: str) -> str | None:
    """The /dev/nvidia-caps device a driver's capability file names (`DeviceFileMinor: N`),
    when it is there as a character device; else None."""
    try:
        with open(proc_file) as f:
            minor = next((line.split(":", 1)[1].strip() for line in f if line.startswith("DeviceFileMinor:")), None)
        if minor is None:
            return None
        path = f"/dev/nvidia-caps/nvidia-cap{int(minor)}"
        return path if stat.S_ISCHR(os.stat(path).st_mode) else None
    except (OSError, ValueError):
        return None


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


_PROFILE = re.compile(r"\d+g\.\d+gb(?:\+me)?", re.IGNORECASE)


def mig_name(card_name: str, instance_name: str | None, memory_mb: int | None) -> str:
    """The type of a MIG instance: "<card> <profile>" ("NVIDIA H200 1g.18gb"), the profile read
    from NVML's name of the instance ("NVIDIA H200 MIG 1g.18gb"), else from its memory."""
    match = _PROFILE.search(instance_name or "")
    if match:
        return f"{card_name} {match.group(0).lower()}"
    return f"{card_name} MIG {round((memory_mb or 0) / 1024)}gb"


@dataclass(frozen=True)
class _Device:
    index: int  # the engine's index: the NVML index of a whole GPU, count + n of a MIG instance
    uuid: str
    name: str
    handle: Any
    card: int  # the NVML index of the card (itself for a whole GPU)


class NVMLBackend(GPUBackend):
    """GPUs read through NVML. Build with `NVMLBackend.open()` (it calls nvmlInit)."""

    name = "nvml"

    def __init__(self, nvml: Any, log: logging.Logger, host: str = LOCAL_HOST):
        self.nvml = nvml
        self.log = log
        self.host = host
        self._closed = False
        self._warned: set[tuple[int, str]] = set()
        self._handles: dict[int, Any] = {}  # engine index -> NVML handle (a MIG instance's own)
        self._static: list[tuple[int, str, str]] = []  # index, uuid, name of each schedulable device
        self._card_of: dict[int, int] = {}  # engine index -> NVML index of its card
        self._card_handles: dict[int, Any] = {}  # NVML index -> handle of the card
        self._card_uuids: dict[str, list[int]] = {}  # card UUID -> engine indices on it (Xid events)
        self.mig_cards: dict[int, int] = {}  # NVML index of a card in MIG mode -> its instances
        self._v2: dict[int, bool] = {}  # engine index -> False once its v2 memory info is known missing
        self.splitter = MemorySplitter()
        count = nvml.nvmlDeviceGetCount()
        devices: list[_Device] = []
        next_mig = count
        for i in range(count):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            uuid = self._call(i, "uuid", nvml.nvmlDeviceGetUUID, handle)
            name = self._call(i, "name", nvml.nvmlDeviceGetName, handle)
            card_uuid = _text(uuid) if uuid is not None else f"GPU-unknown-{i}"
            card_name = _text(name) if name is not None else "NVIDIA GPU"
            self._card_handles[i] = handle
            instances = self._mig_instances(i, handle, card_name)
            if instances is None:
                devices.append(_Device(i, card_uuid, card_name, handle, i))
            else:
                self.mig_cards[i] = len(instances)
                if not instances:
                    self.log.warning("gpujobs: GPU %d (%s) is in MIG mode without MIG instances: nothing can run "
                                "on it until an admin creates some", i, card_name)
                for mig_uuid, mig_type, mig_handle in instances:
                    devices.append(_Device(next_mig, mig_uuid, mig_type, mig_handle, i))
                    next_mig += 1
            self._card_uuids[card_uuid] = [d.index for d in devices if d.card == i]
        for d in devices:
            self._handles[d.index] = d.handle
            self._static.append((d.index, d.uuid, d.name))
            self._card_of[d.index] = d.card
        self._last_xid: dict[int, int] = {}
        self._events: Any = None
        try:
            self._events = nvml.nvmlEventSetCreate()
            for handle in self._card_handles.values():
                try:
                    nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, self._events)
                except Exception:
                    pass
        except Exception:
            self._events = None

    @classmethod
    def open(cls, log: logging.Logger) -> NVMLBackend:
        """nvmlInit and read the devices; raises what NVML raises (no library, no driver)."""
        import pynvml

        pynvml.nvmlInit()
        try:
            return cls(pynvml, log)
        except Exception:
            pynvml.nvmlShutdown()
            raise

    # ---------------------------------------------------------------- helpers

    def _mig_instances(self, card: int, handle: Any, card_name: str) -> list[tuple[str, str, Any]] | None:
        """(MIG UUID, type, handle) of each MIG instance of a card in MIG mode; None for a card
        not in MIG mode (or a driver without MIG). Every query is guarded: an instance that
        cannot be read is left out, with a log line."""
        nvml = self.nvml
        get_mode = getattr(nvml, "nvmlDeviceGetMigMode", None)
        if get_mode is None:
            return None
        try:
            current, _pending = get_mode(handle)
        except Exception:
            return None  # not MIG-capable (NVML_ERROR_NOT_SUPPORTED)
        if current != getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1):
            return None
        try:
            slots = int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))
        except Exception as err:
            self.log.warning("gpujobs: GPU %d is in MIG mode but NVML cannot count its MIG devices: %s", card, err)
            return []
        out: list[tuple[str, str, Any]] = []
        for k in range(slots):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, k)
            except Exception:
                continue  # an empty slot (NVML_ERROR_NOT_FOUND)
            uuid = self._call(card, f"MIG {k} uuid", nvml.nvmlDeviceGetUUID, mig)
            if uuid is None:
                self.log.warning("gpujobs: MIG device %d of GPU %d has no readable UUID; not scheduled", k, card)
                continue
            name = self._call(card, f"MIG {k} name", nvml.nvmlDeviceGetName, mig)
            mem = self._call(card, f"MIG {k} memory", nvml.nvmlDeviceGetMemoryInfo, mig)
            out.append((_text(uuid), mig_name(card_name, _text(name) if name is not None else None,
                                               int(mem.total // _MB) if mem is not None else None), mig))
        return out

    def _call(self, index: int, what: str, fn: Any, *args: Any) -> Any:
        """fn(*args), or None when it fails (logged once per GPU and query)."""
        try:
            return fn(*args)
        except Exception as err:
            if (index, what) not in self._warned:
                self._warned.add((index, what))
                self.log.debug("gpujobs: NVML could not read %s of GPU %d: %s", what, index, err)
            return None

    def _read_memory(self, index: int) -> MemoryReading:
        """The driver's memory reading of a device: v2 where it has it, else v1. Raises what
        NVML raises for v1."""
        nvml, handle = self.nvml, self._handles[index]
        version = getattr(nvml, "nvmlMemory_v2", None)
        if version is not None and self._v2.get(index, True):
            try:
                mem = nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
                used, reserved = int(mem.used // _MB), int(mem.reserved // _MB)
                return MemoryReading(int(mem.total // _MB), used + reserved, used, reserved)
            except TypeError:  # nvidia-ml-py older than the version argument
                self._v2[index] = False
            except Exception as err:
                missing = tuple(getattr(nvml, name) for name in (
                    "NVMLError_FunctionNotFound", "NVMLError_NotSupported", "NVMLError_ArgumentVersionMismatch")
                    if isinstance(getattr(nvml, name, None), type))
                if isinstance(err, missing):
                    self._v2[index] = False  # a driver without v2 (or a MIG instance): v1 from now on
                    self.log.info("gpujobs: GPU %d: no NVML v2 memory info (%s); memory used is v1's less "
                                  "the idle baseline", index, err)
        mem = nvml.nvmlDeviceGetMemoryInfo(handle)
        return MemoryReading(int(mem.total // _MB), int(mem.used // _MB))

    def _memory(self, index: int, listed: list[GPUProcess] | None | bool = False
                ) -> tuple[int | None, int | None, int | None, bool]:
        """(total MB, used by processes MB, reserved MB, healthy). `listed`: the processes NVML
        lists on it (None: it cannot); False: list them here if the reading needs them (v1)."""
        try:
            reading = self._read_memory(index)
        except Exception as err:
            lost = isinstance(err, getattr(self.nvml, "NVMLError_GpuIsLost", ())) or "lost" in str(err).lower()
            if (index, "memory") not in self._warned:
                self._warned.add((index, "memory"))
                self.log.warning("gpujobs: NVML could not read memory of GPU %d: %s", index, err)
            return None, None, None, not lost
        if listed is False:
            listed = self._list_processes(index) if reading.used_v2_mb is None else None
        count = len(listed) if isinstance(listed, list) else None
        used, reserved = self.splitter.split(index, reading, count)
        return reading.total_mb, used, reserved, True

    def _utilization(self, index: int) -> float | None:
        rates = self._call(index, "utilization", self.nvml.nvmlDeviceGetUtilizationRates, self._handles[index])
        return float(rates.gpu) if rates is not None else None

    def device_nodes(self) -> dict[int, str]:
        """/dev/nvidia<minor> of each GPU (the minor number need not equal the index); read once."""
        nodes: dict[int, str] | None = getattr(self, "_nodes", None)
        if nodes is None:
            nodes = {}
            for index, _, _ in self._static:  # a MIG instance: its card's node
                card = self._card_of[index]
                minor = self._call(card, "minor number", self.nvml.nvmlDeviceGetMinorNumber,
                                   self._card_handles[card])
                if minor is not None:
                    nodes[index] = f"/dev/nvidia{int(minor)}"
            self._nodes = nodes
        return dict(nodes)

    def instance_nodes(self) -> dict[int, tuple[str, ...]]:
        """MIG instance index -> /dev/nvidia-caps/nvidia-capN of its GPU instance's and its
        compute instance's access (the driver's `DeviceFileMinor` of each, under
        /proc/driver/nvidia/capabilities/gpu<card minor>/mig/); read once. An instance whose
        devices are not found (caps kept in /proc only, an older driver) has none: the card's
        node alone then fences it, and that is logged."""
        found: dict[int, tuple[str, ...]] | None = getattr(self, "_caps", None)
        if found is not None:
            return dict(found)
        found, nodes, nvml = {}, self.device_nodes(), self.nvml
        for index, _, _ in self._static:
            card = self._card_of[index]
            if card not in self.mig_cards or index not in nodes:
                continue
            gi = self._call(index, "GPU instance id", nvml.nvmlDeviceGetGpuInstanceId, self._handles[index])
            ci = self._call(index, "compute instance id", nvml.nvmlDeviceGetComputeInstanceId, self._handles[index])
            base = f"/proc/driver/nvidia/capabilities/gpu{nodes[index].removeprefix('/dev/nvidia')}/mig/gi{gi}"
            paths = tuple(p for p in (_cap_device(f"{base}/access"), _cap_device(f"{base}/ci{ci}/access")) if p)
            if gi is None or ci is None or len(paths) < 2:
                self.log.warning("gpujobs: the capability devices of MIG instance %d were not found under %s: "
                                 "jobs on this card's other instances may open it (see docs/security.md)", index, base)
            if paths:
                found[index] = paths
        self._caps = found
        return dict(found)

    def _poll_xids(self) -> None:
        if self._events is None:
            return
        for _ in range(64):
            try:
                event = self.nvml.nvmlEventSetWait(self._events, 0)
            except Exception:
                return  # timeout: no event pending (or not supported)
            try:
                uuid = _text(self.nvml.nvmlDeviceGetUUID(event.device))
                for index in self._card_uuids.get(uuid, []):  # a card in MIG mode: all its instances
                    self._last_xid[index] = int(event.eventData)
                    self.log.warning("gpujobs: GPU %d reported Xid %s", index, event.eventData)
            except Exception:
                continue

    # ---------------------------------------------------------------- the interface

    def inventory(self) -> list[GPU]:
        out = []
        for index, uuid, name in self._static:
            total, used, reserved, healthy = self._memory(index)
            util = self._utilization(index)
            out.append(GPU(index=index, uuid=uuid, name=name, host=self.host,
                           memory_total_mb=total or 0, memory_used_mb=used or 0, memory_reserved_mb=reserved or 0,
                           utilization=util if util is not None else 0.0, healthy=healthy))
        return out

    def _list_processes(self, index: int) -> list[GPUProcess] | None:
        """The compute and graphics processes NVML lists on a device; None when it can list
        neither."""
        seen: dict[int, GPUProcess] = {}
        answered = False
        for what in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            fn = getattr(self.nvml, what, None)
            if fn is None:
                continue
            found = self._call(index, what, fn, self._handles[index])
            if found is None:
                continue
            answered = True
            for p in found:
                used = getattr(p, "usedGpuMemory", None)
                if not isinstance(used, int) or used < 0 or used >= 2**63:
                    used_mb = None  # NVML_VALUE_NOT_AVAILABLE (e.g. in containers)
                else:
                    used_mb = int(used // _MB)
                seen.setdefault(int(p.pid), GPUProcess(int(p.pid), used_mb))
        return list(seen.values()) if answered else None

    def processes(self) -> dict[int, list[GPUProcess]]:
        return {index: self._list_processes(index) or [] for index, _, _ in self._static}

    def sample(self) -> list[GPUSample]:
        nvml = self.nvml
        self._poll_xids()
        now = time.time()
        procs = {index: self._list_processes(index) for index, _, _ in self._static}
        out = []
        for index, uuid, _ in self._static:
            handle = self._card_handles[self._card_of[index]]  # a MIG instance reads its card's
            total, used, reserved, healthy = self._memory(index, procs[index])
            temp = self._call(index, "temperature", nvml.nvmlDeviceGetTemperature, handle,
                              nvml.NVML_TEMPERATURE_GPU)
            power = self._call(index, "power", nvml.nvmlDeviceGetPowerUsage, handle)
            ecc = self._call(index, "ecc", nvml.nvmlDeviceGetTotalEccErrors, handle,
                             nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC)
            out.append(GPUSample(
                index=index, uuid=uuid, time=now, utilization=self._utilization(index),
                memory_used_mb=used, memory_total_mb=total, memory_reserved_mb=reserved,
                temperature_c=float(temp) if temp is not None else None,
                power_w=round(power / 1000.0, 1) if power is not None else None,
                ecc_errors=int(ecc) if ecc is not None else None,
                xid=self._last_xid.get(index), healthy=healthy,
                processes=len(procs[index] or []),
            ))
        return out

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._events is not None:
                self.nvml.nvmlEventSetFree(self._events)
        except Exception:
            pass
        try:
            self.nvml.nvmlShutdown()
        except Exception:
            pass
