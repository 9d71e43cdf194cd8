"""GPU backends with real processes: fake spec -> inventory, the no-GPU fallback, and the
live values of fake GPUs from the processes that use them."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from jupyter_gpujobs.engine.gpus import (
    FakeBackend,
    GPUBackend,
    GPUSample,
    NoGPUBackend,
    fake_uuid,
    make_backend,
)
from jupyter_gpujobs.model import InvalidInput, parse_fake_gpus

PY = sys.executable
LOG = logging.getLogger("test_gpus")


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        p.kill()
        p.wait()


#: These tests' fake GPUs see only processes marked with this fleet, not jobs of other servers
#: running on the machine at the same time.
FLEET = f"test-gpus-{os.getpid()}"


def _spawn(procs: list[subprocess.Popen[bytes]], code: str, **env: str) -> subprocess.Popen[bytes]:
    p = subprocess.Popen([PY, "-c", code], env={**os.environ, "GPUJOBS_FAKE_FLEET": FLEET, **env})
    procs.append(p)
    return p


BUSY = "while True: pass"
SLEEP = "import time; time.sleep(60)"


def test_fake_spec_gives_inventory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUJOBS_FAKE_GPUS", raising=False)
    backend = make_backend("4xA100-80GB,2xT4", LOG)
    assert isinstance(backend, GPUBackend) and backend.name == "fake"
    gpus = backend.inventory()
    assert [g.index for g in gpus] == list(range(6))
    assert [g.name for g in gpus] == ["A100-80GB"] * 4 + ["T4"] * 2
    assert [g.memory_total_mb for g in gpus] == [81920] * 4 + [15360] * 2
    assert {g.host for g in gpus} == {"localhost"}
    assert len({g.uuid for g in gpus}) == 6
    assert all(g.uuid.startswith("GPU-fake-") for g in gpus)
    # stable across backends and restarts
    assert [g.uuid for g in make_backend("4xA100-80GB,2xT4", LOG).inventory()] == [g.uuid for g in gpus]
    assert gpus[0].uuid == fake_uuid(0, "A100-80GB") != fake_uuid(0, "T4")
    backend.close()


def test_fake_spec_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUJOBS_FAKE_GPUS", "2xH100")
    backend = make_backend(None, LOG)
    assert backend.name == "fake"
    assert [g.name for g in backend.inventory()] == ["H100", "H100"]


def test_bad_fake_spec_names_the_setting() -> None:
    with pytest.raises(InvalidInput) as err:
        make_backend("4x!!", LOG)
    assert err.value.field == "fake_gpus"


def test_no_gpu_backend_when_no_nvml(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv("GPUJOBS_FAKE_GPUS", raising=False)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # nvidia-ml-py absent: import fails
    with caplog.at_level(logging.WARNING, logger="test_gpus"):
        backend = make_backend(None, LOG)
    assert isinstance(backend, NoGPUBackend) and backend.name == "none"
    assert backend.inventory() == [] and backend.sample() == [] and backend.processes() == {}
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1
    assert "No NVIDIA GPUs found (NVML: nvidia-ml-py is not installed" in messages[0]
    assert "GPUJOBS_FAKE_GPUS=2xA100" in messages[0]


def test_real_nvml_or_clear_fallback(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """With the library installed: NVML on a GPU machine, otherwise 0 GPUs saying why."""
    monkeypatch.delenv("GPUJOBS_FAKE_GPUS", raising=False)
    with caplog.at_level(logging.WARNING, logger="test_gpus"):
        backend = make_backend(None, LOG)
    try:
        if backend.name == "nvml":
            gpus = backend.inventory()
            assert gpus and all(g.uuid.startswith("GPU-") and g.memory_total_mb > 0 for g in gpus)
            assert len(backend.sample()) == len(gpus)
            assert set(backend.processes()) == {g.index for g in gpus}
        else:
            assert backend.name == "none" and backend.inventory() == []
            assert any("No NVIDIA GPUs found (NVML: " in r.getMessage() for r in caplog.records)
    finally:
        backend.close()


def _wait_for(backend: FakeBackend, index: int, n: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while len(backend.processes()[index]) != n:
        assert time.monotonic() < deadline, backend.processes()
        time.sleep(0.05)


def test_fake_busy_gpu_looks_busy_and_sleeping_one_idle(procs: list[subprocess.Popen[bytes]]) -> None:
    backend = FakeBackend(parse_fake_gpus("3xA100"), fleet=FLEET)
    busy = _spawn(procs, BUSY, GPUJOBS_FAKE_GPU_USE="0")  # a "rogue" process set by hand
    sleeper = _spawn(procs, SLEEP, GPUJOBS_FAKE="1", CUDA_VISIBLE_DEVICES="1")  # as the runner sets it
    _wait_for(backend, 0, 1)
    _wait_for(backend, 1, 1)
    backend.sample()  # a reading; the next one measures the interval after it
    # The busy loop's utilization is its CPU share over the interval: on a loaded machine one
    # interval can be short of it, so wait for a reading that shows it busy (no fixed window).
    deadline = time.monotonic() + 60
    while True:
        time.sleep(0.6)
        samples = backend.sample()
        gpus = backend.inventory()  # the same scan as the sample
        if (samples[0].utilization or 0) >= 25 or time.monotonic() > deadline:
            break
    assert all(isinstance(s, GPUSample) for s in samples) and len(samples) == 3
    assert [p.pid for p in backend.processes()[0]] == [busy.pid]
    assert [p.pid for p in backend.processes()[1]] == [sleeper.pid]
    assert backend.processes()[2] == []
    assert samples[0].utilization is not None and samples[0].utilization >= 25, samples[0]  # 2 shared cores: be lenient
    assert samples[1].utilization is not None and samples[1].utilization <= 10, samples[1]
    assert samples[2].utilization == 0 and samples[2].memory_used_mb == 0
    assert gpus[0].utilization >= 25 and gpus[1].utilization <= 10
    assert gpus[0].memory_used_mb > 0 and gpus[1].memory_used_mb > 0
    assert samples[0].temperature_c is not None and samples[1].temperature_c is not None
    assert samples[0].temperature_c > samples[1].temperature_c
    assert samples[0].power_w is not None and samples[1].power_w is not None
    assert samples[0].power_w > samples[1].power_w
    # when the process ends the GPU is free again
    busy.kill()
    busy.wait()
    _wait_for(backend, 0, 0)
    time.sleep(0.3)
    assert backend.inventory()[0].utilization == 0


def test_fake_declared_values_and_multi_gpu(procs: list[subprocess.Popen[bytes]]) -> None:
    backend = FakeBackend(parse_fake_gpus("2xT4"), fleet=FLEET)
    p = _spawn(procs, SLEEP, GPUJOBS_FAKE="1", CUDA_VISIBLE_DEVICES="0,1",
               GPUJOBS_FAKE_UTIL="42", GPUJOBS_FAKE_MEM_MB="3000")
    # not a fake-GPU user: CUDA_VISIBLE_DEVICES without the marker, or an index that does not exist
    _spawn(procs, SLEEP, CUDA_VISIBLE_DEVICES="0")
    _spawn(procs, SLEEP, GPUJOBS_FAKE_GPU_USE="7")
    _wait_for(backend, 1, 1)
    time.sleep(0.3)
    gpus = backend.inventory()
    assert [g.utilization for g in gpus] == [42, 42]
    assert [g.memory_used_mb for g in gpus] == [3000, 3000]
    assert [[x.pid for x in v] for v in backend.processes().values()] == [[p.pid], [p.pid]]
    assert [x.used_memory_mb for x in backend.processes()[0]] == [3000]


def test_fake_sample_is_cheap(procs: list[subprocess.Popen[bytes]]) -> None:
    backend = FakeBackend(parse_fake_gpus("8xA100"), fleet=FLEET)
    for i in range(8):
        _spawn(procs, SLEEP, GPUJOBS_FAKE="1", CUDA_VISIBLE_DEVICES=str(i))
    _wait_for(backend, 7, 1)
    runs = []
    for _ in range(10):
        time.sleep(0.26)  # past the shared-scan window: each sample rescans
        t0 = time.process_time()
        samples = backend.sample()
        runs.append(time.process_time() - t0)
        assert len(samples) == 8 and all(s.processes == 1 for s in samples)
    runs.sort()
    assert runs[len(runs) // 2] < 0.02, runs  # median CPU seconds per sample over 8 GPUs


def test_fake_gpus_of_another_server_are_not_seen(procs: list[subprocess.Popen[bytes]]) -> None:
    backend = FakeBackend(parse_fake_gpus("1xA100"), fleet=FLEET)
    mine = _spawn(procs, SLEEP, GPUJOBS_FAKE="1", CUDA_VISIBLE_DEVICES="0")
    _spawn(procs, SLEEP, GPUJOBS_FAKE="1", CUDA_VISIBLE_DEVICES="0", GPUJOBS_FAKE_FLEET="another-server")
    _wait_for(backend, 0, 1)
    time.sleep(0.3)
    assert [p.pid for p in backend.processes()[0]] == [mine.pid]
