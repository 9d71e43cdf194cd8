"""Memory in use on a GPU is what processes use, never the driver's reservation (issue 26).

On a real H200 (driver 580) nvidia-smi says `memory.used 0 MiB, memory.reserved 616 MiB` at
idle, and an engine that read NVML's v1 "used" took every idle GPU as in use outside the queue.
The fake GPUs model that driver (`[reserved:616M]`, `[nvml:v1]` for one without the v2 memory
info, `[pidns:other]` for NVML's pids in a container); real processes hold their memory.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from jupyter_gpujobs.engine.gpus import (
    PIDNS_OFFSET,
    FakeBackend,
    GPUProcess,
    MemoryReading,
    MemorySplitter,
    foreign_use,
)
from jupyter_gpujobs.engine.gpus.nvml import NVMLBackend
from jupyter_gpujobs.engine.monitor.rogue import ProcessResolver
from jupyter_gpujobs.model import GPU, InvalidInput, parse_fake_gpus

FLEET = f"test-gpu-memory-{os.getpid()}"
H200 = "H200-141GB[reserved:616M]"


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        p.kill()
        p.wait()


def hold(procs: list[subprocess.Popen[bytes]], gpus: str, mb: int) -> subprocess.Popen[bytes]:
    """A real process that holds `mb` of fake GPUs `gpus` ("0,1") outside any queue."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                         env={**os.environ, "GPUJOBS_FAKE_FLEET": FLEET, "GPUJOBS_FAKE_GPU_USE": gpus,
                              "GPUJOBS_FAKE_MEM_MB": str(mb)})
    procs.append(p)
    return p


def backend(spec: str) -> FakeBackend:
    return FakeBackend(parse_fake_gpus(spec), fleet=FLEET)


def wait_for(predicate: Any, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.05)
    return value


def test_the_driver_options_of_a_fake_spec() -> None:
    (spec,) = parse_fake_gpus("2xH200-141GB[reserved:616M;nvml:v1;pidns:other]")
    assert (spec.count, spec.reserved_mb, spec.nvml_v2, spec.other_pidns) == (2, 616, False, True)
    (spec,) = parse_fake_gpus("1xH200-141GB[mig:1g.18gb*7][reserved:616M]")
    assert len(spec.mig) == 7 and spec.reserved_mb == 616 and spec.nvml_v2
    for bad, says in [("1xT4[reserved:20G]", "not less than the card's memory"),
                      ("1xT4[reserved:lots]", "cannot read the size"),
                      ("1xT4[nvml:v3]", "cannot read [nvml:v3]")]:
        with pytest.raises(InvalidInput, match=r"fake_gpus") as err:
            parse_fake_gpus(bad)
        assert says in str(err.value)


@pytest.mark.parametrize("driver", ["", ";nvml:v1"], ids=["nvml-v2", "nvml-v1-baseline"])
def test_an_idle_gpu_uses_nothing_and_shows_the_reservation_apart(driver: str,
                                                                 procs: list[subprocess.Popen[bytes]]) -> None:
    """The H200 of the issue, with the driver's v2 memory info and without it."""
    b = backend(f"2x{H200[:-1]}{driver}]")
    for g in b.inventory():
        assert (g.memory_used_mb, g.memory_reserved_mb) == (0, 616)
        assert foreign_use(g, b.processes()[g.index], 300) is None
    assert [(s.memory_used_mb, s.memory_reserved_mb) for s in b.sample()] == [(0, 616), (0, 616)]

    hold(procs, "1", 2000)
    gpus = wait_for(lambda: (inv := b.inventory())[1].memory_used_mb and inv)
    assert [(g.memory_used_mb, g.memory_reserved_mb) for g in gpus] == [(0, 616), (2000, 616)]
    (sample,) = [s for s in b.sample() if s.index == 1]
    assert (sample.memory_used_mb, sample.memory_reserved_mb, sample.processes) == (2000, 616, 1)


def test_without_v2_the_baseline_is_learned_only_while_no_process_is_listed(
        procs: list[subprocess.Popen[bytes]]) -> None:
    """A driver without v2 memory info, and a process on the GPU before the engine starts: its
    v1 "used" cannot be told apart from the reservation until the GPU is seen idle."""
    p = hold(procs, "0", 1000)
    b = backend(f"1x{H200[:-1]};nvml:v1]")
    wait_for(lambda: b.processes()[0])
    assert b.inventory()[0].memory_used_mb == 1616  # no baseline yet: all of v1's "used"
    p.kill()
    p.wait()
    wait_for(lambda: not b.processes()[0])
    assert (b.inventory()[0].memory_used_mb, b.inventory()[0].memory_reserved_mb) == (0, 616)
    hold(procs, "0", 1000)
    assert wait_for(lambda: b.inventory()[0].memory_used_mb) == 1000

    splitter = MemorySplitter()  # a driver that cannot list processes: no baseline from it
    assert splitter.split(0, MemoryReading(1000, 616), None) == (616, 0)
    assert splitter.split(0, MemoryReading(1000, 616), 0) == (0, 616)
    assert splitter.split(0, MemoryReading(1000, 900), 2) == (284, 616)


def gpu(used: int, reserved: int = 616, index: int = 0) -> GPU:
    return GPU(index=index, uuid=f"GPU-{index}", name="H200", memory_total_mb=144384, memory_used_mb=used,
               memory_reserved_mb=reserved)


def test_foreign_use_is_what_processes_hold_beyond_the_threshold() -> None:
    who = {4242: "python, user bob", 4243: "python, user bob"}.get
    assert foreign_use(gpu(0), [], 300, who) is None  # 616 MiB reserved: not foreign
    assert foreign_use(gpu(250), [GPUProcess(4242, 250)], 300, who) is None

    one = foreign_use(gpu(2150), [GPUProcess(4242, 2150)], 300, who)
    assert one is not None and one.memory_mb == 2150 and one.pids == (4242,)
    assert one.text == "in use outside the queue (2.1 GiB held by pid 4242, python, user bob)"
    assert one.todo.startswith("ask bob to stop pid 4242") and "gpus --override 0" in one.todo

    two = foreign_use(gpu(900), [GPUProcess(4243, 200), GPUProcess(4242, 700)], 300, who)
    assert two is not None and two.text == ("in use outside the queue (900 MiB held by 2 processes, most by "
                                            "pid 4242, python, user bob)")
    # the driver lists a process without its memory (as in some containers): the GPU's use is its
    unknown = foreign_use(gpu(700), [GPUProcess(4242, None)], 300, who)
    assert unknown is not None and unknown.memory_mb == 700

    nobody = foreign_use(gpu(700, index=3), [], 300, who)
    assert nobody is not None and nobody.pids == ()
    assert nobody.text == "in use outside the queue (memory the engine cannot attribute: 700 MiB over the baseline)"
    assert "foreign_memory_threshold above 700" in nobody.todo and "nvidia-smi -i 3" in nobody.todo


def test_processes_reported_with_the_pids_of_another_pid_namespace(procs: list[subprocess.Popen[bytes]]) -> None:
    """NVML in a container gives pids the engine cannot see: the GPU is still in use outside
    the queue, and says it cannot tell whose; the monitor counts such a pid from its second reading."""
    b = backend(f"1x{H200[:-1]};pidns:other]")
    p = hold(procs, "0", 2000)
    (listed,) = wait_for(lambda: b.processes()[0])
    assert listed.pid == p.pid + PIDNS_OFFSET and listed.used_memory_mb == 2000
    found = foreign_use(b.inventory()[0], [listed], 300)
    assert found is not None and found.text == (
        f"in use outside the queue (2.0 GiB held by pid {listed.pid}, which the engine cannot see: another pid "
        "namespace, e.g. a container)")
    assert found.todo.startswith(f"find pid {listed.pid} with nvidia-smi")
    resolver = ProcessResolver()
    assert resolver.resolve(b.processes(), {}) == []
    (seen,) = resolver.resolve(b.processes(), {})
    assert seen.unresolved and seen.pid == listed.pid and seen.used_memory_mb == 2000


class _Driver:
    """What nvidia-ml-py answers for one idle H200 on driver 580, the calls `NVMLBackend` makes
    (pynvml's own error classes); `v2` False: a driver or nvidia-ml-py without the v2 memory info."""

    nvmlMemory_v2 = 0x02000028
    NVML_TEMPERATURE_GPU = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0

    def __init__(self, v2: bool, processes: list[Any]):
        import pynvml

        self.NVMLError_FunctionNotFound = pynvml.NVMLError_FunctionNotFound
        self.NVMLError_NotSupported = pynvml.NVMLError_NotSupported
        self.v2, self.procs, self.calls = v2, processes, []

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        return f"handle{i}"

    def nvmlDeviceGetUUID(self, handle: str) -> str:
        return "GPU-6f1c"

    def nvmlDeviceGetName(self, handle: str) -> bytes:
        return b"NVIDIA H200"

    def nvmlDeviceGetMemoryInfo(self, handle: str, version: int | None = None) -> Any:
        self.calls.append(version)
        mib, total, reserved = 1 << 20, 143771 << 20, 616 << 20
        held = sum(p.usedGpuMemory for p in self.procs)
        if version is None:
            return SimpleNamespace(total=total, used=reserved + held, free=total - reserved - held)
        if not self.v2:
            raise self.NVMLError_FunctionNotFound(13)
        return SimpleNamespace(version=version, total=total, reserved=reserved, used=held + mib // 2,
                               free=total - reserved - held)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: str) -> list[Any]:
        return self.procs

    def nvmlDeviceGetUtilizationRates(self, handle: str) -> Any:
        return SimpleNamespace(gpu=0)

    def nvmlEventSetCreate(self) -> None:
        raise self.NVMLError_NotSupported(3)

    def nvmlDeviceGetTemperature(self, *args: Any) -> None:
        raise self.NVMLError_NotSupported(3)

    nvmlDeviceGetPowerUsage = nvmlDeviceGetTotalEccErrors = nvmlDeviceGetTemperature


@pytest.mark.parametrize("v2", [True, False], ids=["nvml-v2", "nvml-v1-baseline"])
def test_nvml_reads_memory_used_by_processes(v2: bool) -> None:
    driver = _Driver(v2, [])
    nvml = NVMLBackend(driver, logging.getLogger("test_gpu_memory"))
    (idle,) = nvml.inventory()
    assert (idle.memory_used_mb, idle.memory_reserved_mb) == (0, 616)
    driver.procs = [SimpleNamespace(pid=4242, usedGpuMemory=2000 << 20)]
    (busy,) = nvml.sample()
    assert (busy.memory_used_mb, busy.memory_reserved_mb, busy.processes) == (2000, 616, 1)
    # a driver without v2 is asked once, then read with v1 (less the idle baseline)
    assert driver.calls.count(driver.nvmlMemory_v2) == (2 if v2 else 1)
