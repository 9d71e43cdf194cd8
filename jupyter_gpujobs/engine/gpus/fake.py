"""Fake GPUs: a product feature for machines without GPUs (tests, demos, binder), not a mock.

The inventory comes from a spec such as `"4xA100-80GB,2xT4"` (`model.parse_fake_gpus`); the
live values come from the real processes that "use" a fake GPU.

Which processes use fake GPU N (read from each process's initial environment,
/proc/PID/environ):

1. `GPUJOBS_FAKE_GPU_USE=<indices>` (comma separated, e.g. `0,2`): the process uses those
   fake GPUs. Set it by hand to play a "rogue" process that grabbed a card outside the queue.
2. otherwise `GPUJOBS_FAKE=1` together with `CUDA_VISIBLE_DEVICES=<indices>`: what the local
   runner gives a job on fake GPUs. Entries of CUDA_VISIBLE_DEVICES may also be fake UUIDs.

Several servers with fake GPUs on one machine (tests, a multi-user demo) each see only their
own jobs: a server's backend has a *fleet* name, its jobs and kernels carry it in
`GPUJOBS_FAKE_FLEET`, and a process marked with another fleet is not on its GPUs. A process
with no fleet (a hand-made "rogue") is seen by every backend, as a real process on a real GPU is.

Children inherit these variables, so a job's whole process tree counts; a process that
clears its environment is no longer seen. Indices that do not exist are ignored.

MIG: a card of the spec with MIG instances (`"1xH200-141GB[mig:1g.18gb*7]"`, see
`model.parse_fake_gpus`) is not schedulable itself, as a real one in MIG mode is not; each
instance is a GPU of its own: the next index, the type "<model> <profile>" ("H200 1g.18gb"),
the profile's memory and a UUID `MIG-fake-<card>-<instance>-<12 hex>`, which is what a job on
it gets in CUDA_VISIBLE_DEVICES (as on real MIG instances).

What a fake GPU reports:

- utilization: the sum over its processes of each one's CPU use in percent (since the last
  reading; since the process started on the first one), capped at 100 - a busy loop looks
  busy, a sleeping job idle. A process may declare its value instead with
  `GPUJOBS_FAKE_UTIL=<percent>`.
- memory used: the sum of `GPUJOBS_FAKE_MEM_MB=<MB>` of its processes, or
  `DEFAULT_PROCESS_MEM_MB` for one that does not say; capped at the card's memory.
  `processes()` gives each process's own amount, as NVML's per-process used memory does.
  A job "allocates" GPU memory with `python -m jupyter_gpujobs.gpualloc 23G` (gpualloc.py),
  which holds that much while it runs; on real GPUs the same command allocates it for real.
  A process's environment is read again while it is young (its first 2 s; 30 s while it
  declares no memory), so a process that re-executes itself with a new GPUJOBS_FAKE_MEM_MB, as
  gpualloc does, is seen with it.
- temperature and power: plausible functions of utilization.

What real drivers do, said in the spec's brackets (`model.parse_fake_gpus`), so tests meet it:

- `reserved:616M`: memory the driver keeps for itself, as on an idle H200 (driver 580). The
  driver's v1 "used" counts it, its v2 "used" does not; both go through the same arithmetic as
  NVML's (memory.py), so `memory_used_mb` is what processes use and `memory_reserved_mb` the rest.
- `nvml:v1`: a driver without the v2 memory info: memory used is v1's less the idle baseline.
- `pidns:other`: `processes()` gives pids of another pid namespace, as NVML does for a
  containerized engine (each pid + PIDNS_OFFSET, which is no pid here).

Device nodes: given a `device_dir` (a root engine gives `/dev/gpujobs-fake/<fleet>`, where
every job's user can open them, and removes them when it stops), the backend makes a real
character device per fake card there, `nvidia<card>` with the NVIDIA major (195) and no driver
behind it (needs root; without, there are none); the MIG instances of a card share its node. A job's device cgroup allows
or denies them like real ones: an allowed node opens with ENXIO ("no such device or
address"), a denied one with EPERM, which tests the GPU fence without a GPU.

Cost: the environment of a process is read once per (pid, start time) and cached; a reading
lists /proc and reads /proc/PID/stat only of new pids and of the processes that use a fake
GPU, so one sample over 8 GPUs costs well under a millisecond on a quiet machine.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ...model import GPU, FakeGPUSpec, mig_profile_memory_mb
from .base import LOCAL_HOST, GPUBackend, GPUProcess, GPUSample
from .memory import MemoryReading, MemorySplitter

#: Memory a process on a fake GPU holds when it does not declare GPUJOBS_FAKE_MEM_MB.
DEFAULT_PROCESS_MEM_MB = 500

#: Board power (W) at full load, by model prefix; idle is ~15% of it.
_TDP_W = {"H200": 700, "H100": 700, "A100": 400, "V100": 300, "T4": 70, "L4": 72, "L40S": 350,
          "A10": 150, "RTX4090": 450, "P100": 250, "K80": 300}

_SCAN_TTL_S = 0.25  # readings closer together than this share one scan
_RECHECK_S = 30.0  # re-verify the start time of cached non-GPU pids this often (pid reuse)
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_LINUX = sys.platform.startswith("linux") and os.path.isdir("/proc/self")
NVIDIA_MAJOR = 195  # the character device major of /dev/nvidiaN
#: the minors of the fake MIG instances' capability devices (major NVIDIA_MAJOR, minor this plus
#: the instance's index): a driver's are /dev/nvidia-caps/nvidia-capN of a major of their own;
#: here they sit above any card's minor and below nvidia-modeset's (254) and nvidiactl's (255)
FAKE_CAP_MINOR_BASE = 128
#: Added to a pid under `pidns:other`: above the largest pid_max (2**22), so no process here has it.
PIDNS_OFFSET = 1 << 22


def fake_uuid(index: int, model: str, fleet: str | None = None) -> str:
    """A stable UUID for fake GPU `index` of `model` in `fleet`: `GPU-fake-0000-<12 hex>`.
    Two backends of one fleet have the same UUIDs, so they claim the same GPUs (claim.py)."""
    key = f"{fleet}:{index}:{model}" if fleet else f"{index}:{model}"
    digest = hashlib.sha1(key.encode()).hexdigest()
    return f"GPU-fake-{index:04d}-{digest[:12]}"


def fake_mig_uuid(card: int, instance: int, profile: str, fleet: str | None = None) -> str:
    """A stable UUID for MIG instance `instance` of fake card `card`: `MIG-fake-<card>-<i>-<12 hex>`."""
    key = f"{fleet}:mig:{card}:{instance}:{profile}" if fleet else f"mig:{card}:{instance}:{profile}"
    digest = hashlib.sha1(key.encode()).hexdigest()
    return f"MIG-fake-{card:04d}-{instance}-{digest[:12]}"


@dataclass(frozen=True)
class _FakeGPU:
    index: int  # the schedulable device's index
    uuid: str
    model: str
    memory_mb: int
    card: int  # the physical card it is (or is a MIG instance of)
    reserved_mb: int = 0  # what the driver keeps for itself (NVML v1 "used" counts it)
    nvml_v2: bool = True  # the driver has NVML's v2 memory info
    other_pidns: bool = False  # processes are reported with pids of another pid namespace


@dataclass
class _ProcInfo:
    start: float  # start time (ticks since boot on Linux, epoch seconds elsewhere)
    gpus: tuple[int, ...] = ()
    util: float | None = None  # declared GPUJOBS_FAKE_UTIL
    mem_mb: int | None = None  # declared GPUJOBS_FAKE_MEM_MB
    checked: float = 0.0  # monotonic time of the last start-time check
    cpu_s: float | None = None  # CPU seconds at the last reading
    cpu_at: float = 0.0  # monotonic time of that reading
    cpu_percent: float = 0.0
    first_seen: float = 0.0  # monotonic time this (pid, start) was first read


#: A process is re-read for this long after it was first seen: between fork and exec it still
#: has its parent's environment, and caching that as "no fake GPU" would hide a new job.
_YOUNG_S = 2.0
#: A process on a fake GPU that declares no memory is read again for this long: one that
#: re-executes itself with GPUJOBS_FAKE_MEM_MB (gpualloc.py) may do so late on a loaded machine.
_DECLARE_S = 30.0


@dataclass
class _Scan:
    at: float
    by_gpu: dict[int, list[tuple[int, _ProcInfo]]] = field(default_factory=dict)


def _parse_indices(value: str, uuid_index: dict[str, int]) -> tuple[int, ...]:
    out: list[int] = []
    for token in value.split(","):
        token = token.strip()
        if token.isdigit():
            out.append(int(token))
        elif token in uuid_index:
            out.append(uuid_index[token])
    return tuple(dict.fromkeys(out))


def _parse_float(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        return None


# ---- process access: /proc on Linux, psutil elsewhere -----------------------------------


def _linux_stat(pid: int) -> tuple[str, float, float] | None:
    """(state, CPU seconds, start ticks) from /proc/PID/stat, None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    rest = data[data.rfind(b")") + 2:].split()
    try:
        return rest[0].decode(), (int(rest[11]) + int(rest[12])) / _CLK_TCK, float(rest[19])
    except (IndexError, ValueError):
        return None


def _linux_environ(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _linux_uptime() -> float:
    try:
        with open("/proc/uptime", "rb") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0


def _node(path: str, minor: int) -> str:
    """A character device (major NVIDIA_MAJOR, `minor`) at `path`, open to all as a driver's
    (fenced by the cgroup); one of another kind there is replaced. OSError without root."""
    import stat

    want = os.makedev(NVIDIA_MAJOR, minor)
    try:
        st = os.lstat(path)
        if not (stat.S_ISCHR(st.st_mode) and st.st_rdev == want):
            os.unlink(path)
            raise FileNotFoundError(path)
    except FileNotFoundError:
        os.mknod(path, 0o666 | stat.S_IFCHR, want)
        os.chmod(path, 0o666)
    return path


class FakeBackend(GPUBackend):
    """GPUs from a fake spec whose live values come from the processes that use them."""

    name = "fake"

    def __init__(self, specs: list[FakeGPUSpec], host: str = LOCAL_HOST,
                 clock: Callable[[], float] = time.time, fleet: str | None = None,
                 device_dir: str | None = None):
        self.host = host
        self.clock = clock
        self.fleet = fleet  # None: count every marked process on the machine
        self._gpus: list[_FakeGPU] = []  # the schedulable devices: whole cards and MIG instances
        card = 0
        for spec in specs:
            base = re.sub(r"-\d+GB$", "", spec.model, flags=re.IGNORECASE)
            for _ in range(spec.count):
                driver = {"nvml_v2": spec.nvml_v2, "other_pidns": spec.other_pidns}
                if not spec.mig:
                    index = len(self._gpus)
                    self._gpus.append(_FakeGPU(index, fake_uuid(index, spec.model, fleet), spec.model,
                                               spec.memory_mb, card, spec.reserved_mb, **driver))
                for k, profile in enumerate(spec.mig):
                    self._gpus.append(_FakeGPU(len(self._gpus), fake_mig_uuid(card, k, profile, fleet),
                                               f"{base} {profile}", mig_profile_memory_mb(profile), card, **driver))
                card += 1
        self._cards = card
        self._uuid_index = {g.uuid: g.index for g in self._gpus}
        self._procs: dict[int, _ProcInfo] = {}
        self._scan: _Scan | None = None
        self._caps: dict[int, str] = {}  # MIG instance index -> its capability device (`_make_nodes`)
        self._nodes = self._make_nodes(device_dir) if device_dir else {}
        self.splitter = MemorySplitter()

    def _make_nodes(self, device_dir: str) -> dict[int, str]:
        """Character devices (major 195, minor = card) for the fake cards, and one capability
        device for each MIG instance (`instance_nodes`); none without root."""
        nodes = {}
        try:
            os.makedirs(device_dir, mode=0o755, exist_ok=True)
            for folder in (os.path.dirname(device_dir), device_dir):
                os.chmod(folder, 0o755)  # every job's user opens its nodes (a shared engine's umask is 077)
            for index in range(self._cards):
                nodes[index] = _node(os.path.join(device_dir, f"nvidia{index}"), index)
            for g in self._gpus:  # (a fleet of over 125 devices: its later instances get none)
                if g.uuid.startswith("MIG-") and FAKE_CAP_MINOR_BASE + g.index < 254:
                    self._caps[g.index] = _node(os.path.join(device_dir, f"nvidia-cap{g.index}"),
                                                FAKE_CAP_MINOR_BASE + g.index)
        except OSError:
            self._caps = {}
            return {}
        return nodes

    def device_nodes(self) -> dict[int, str]:
        """GPU index -> its card's node (the MIG instances of a card share it)."""
        return {g.index: self._nodes[g.card] for g in self._gpus if g.card in self._nodes}

    def instance_nodes(self) -> dict[int, tuple[str, ...]]:
        """MIG instance index -> its capability device (one each here; a driver has two)."""
        return {index: (path,) for index, path in self._caps.items()}

    def remove_device_nodes(self) -> None:
        """Remove the nodes made for these GPUs, and their folder once empty."""
        nodes = list(self._nodes.values()) + list(self._caps.values())
        self._nodes, self._caps = {}, {}
        for path in nodes:
            try:
                os.unlink(path)
            except OSError:
                pass
        if nodes:
            try:
                os.rmdir(os.path.dirname(nodes[0]))
            except OSError:
                pass  # something else lives there too

    # ---------------------------------------------------------------- the interface

    def inventory(self) -> list[GPU]:
        scan = self._current()
        out = []
        for g in self._gpus:
            procs = scan.by_gpu.get(g.index, [])
            used, reserved = self._memory(g, procs)
            out.append(GPU(index=g.index, uuid=g.uuid, name=g.model, host=self.host, memory_total_mb=g.memory_mb,
                           memory_used_mb=used, memory_reserved_mb=reserved, utilization=self._utilization(procs)))
        return out

    def processes(self) -> dict[int, list[GPUProcess]]:
        scan = self._current()
        return {g.index: [GPUProcess(pid + (PIDNS_OFFSET if g.other_pidns else 0),
                                     info.mem_mb if info.mem_mb is not None else DEFAULT_PROCESS_MEM_MB)
                          for pid, info in scan.by_gpu.get(g.index, [])]
                for g in self._gpus}

    def sample(self) -> list[GPUSample]:
        scan = self._current()
        now = self.clock()
        out = []
        for g in self._gpus:
            procs = scan.by_gpu.get(g.index, [])
            util = self._utilization(procs)
            tdp = next((w for prefix, w in _TDP_W.items() if g.model.upper().startswith(prefix)), 250)
            used, reserved = self._memory(g, procs)
            out.append(GPUSample(
                index=g.index, uuid=g.uuid, time=now, utilization=util,
                memory_used_mb=used, memory_total_mb=g.memory_mb, memory_reserved_mb=reserved,
                temperature_c=round(32.0 + 0.5 * util, 1),
                power_w=round(tdp * (0.15 + 0.85 * util / 100.0), 1),
                ecc_errors=0, xid=None, healthy=True, processes=len(procs),
            ))
        return out

    # ---------------------------------------------------------------- values

    @staticmethod
    def _utilization(procs: list[tuple[int, _ProcInfo]]) -> float:
        total = 0.0
        for _, info in procs:
            total += info.util if info.util is not None else info.cpu_percent
        return round(max(0.0, min(100.0, total)), 1)

    def _memory(self, g: _FakeGPU, procs: list[tuple[int, _ProcInfo]]) -> tuple[int, int]:
        """(used by processes, reserved) MiB, read as NVML would be: the driver's v1 "used"
        counts the reservation, its v2 "used" does not (memory.py)."""
        held = sum(info.mem_mb if info.mem_mb is not None else DEFAULT_PROCESS_MEM_MB for _, info in procs)
        held = max(0, min(g.memory_mb - g.reserved_mb, held))
        reading = MemoryReading(g.memory_mb, held + g.reserved_mb, held if g.nvml_v2 else None,
                                g.reserved_mb if g.nvml_v2 else None)
        return self.splitter.split(g.index, reading, len(procs))

    # ---------------------------------------------------------------- scanning

    def _current(self) -> _Scan:
        mono = time.monotonic()
        if self._scan is None or mono - self._scan.at >= _SCAN_TTL_S:
            self._scan = self._do_scan(mono)
        return self._scan

    def _classify(self, environ: dict[str, str]) -> tuple[tuple[int, ...], float | None, int | None]:
        owner = environ.get("GPUJOBS_FAKE_FLEET")
        if owner and self.fleet and owner != self.fleet:
            return (), None, None  # a job of another server's fake GPUs
        use = environ.get("GPUJOBS_FAKE_GPU_USE")
        if use is not None:
            gpus = _parse_indices(use, self._uuid_index)
        elif environ.get("GPUJOBS_FAKE") == "1" and environ.get("CUDA_VISIBLE_DEVICES"):
            gpus = _parse_indices(environ["CUDA_VISIBLE_DEVICES"], self._uuid_index)
        else:
            return (), None, None
        gpus = tuple(i for i in gpus if 0 <= i < len(self._gpus))
        mem = _parse_float(environ.get("GPUJOBS_FAKE_MEM_MB"))
        return gpus, _parse_float(environ.get("GPUJOBS_FAKE_UTIL")), (int(mem) if mem is not None else None)

    def _do_scan(self, mono: float) -> _Scan:
        if _LINUX:
            return self._scan_linux(mono)
        return self._scan_psutil(mono)

    def _scan_linux(self, mono: float) -> _Scan:
        scan = _Scan(at=mono)
        try:
            pids = [int(n) for n in os.listdir("/proc") if n.isdigit()]
        except OSError:
            return scan
        live = set(pids)
        for gone in [p for p in self._procs if p not in live]:
            del self._procs[gone]
        uptime: float | None = None
        for pid in pids:
            info = self._procs.get(pid)
            young = info is not None and mono - info.first_seen < _YOUNG_S
            if info is not None and not info.gpus and not young and mono - info.checked < _RECHECK_S:
                continue  # known not to use a fake GPU
            stat = _linux_stat(pid)
            if stat is None:
                self._procs.pop(pid, None)
                continue
            state, cpu_s, start = stat
            if info is None or info.start != start:
                info = self._new_info(pid, start, self._environ_linux(pid))
                info.first_seen = mono
                self._procs[pid] = info
            elif young or (info.gpus and info.mem_mb is None and mono - info.first_seen < _DECLARE_S):
                fresh = self._new_info(pid, start, self._environ_linux(pid))
                if (fresh.gpus, fresh.util, fresh.mem_mb) != (info.gpus, info.util, info.mem_mb):
                    # it exec'ed into a job, or with other declared values, since the last scan
                    info.gpus, info.util, info.mem_mb = fresh.gpus, fresh.util, fresh.mem_mb
            info.checked = mono
            if not info.gpus or state in ("Z", "X"):
                continue
            if info.cpu_s is None:
                if uptime is None:
                    uptime = _linux_uptime()
                age = uptime - start / _CLK_TCK
                info.cpu_percent = 100.0 * cpu_s / age if age > 0.05 else 0.0
            elif mono > info.cpu_at:
                info.cpu_percent = 100.0 * (cpu_s - info.cpu_s) / (mono - info.cpu_at)
            info.cpu_s, info.cpu_at = cpu_s, mono
            for index in info.gpus:
                scan.by_gpu.setdefault(index, []).append((pid, info))
        return scan

    def _environ_linux(self, pid: int) -> dict[str, str]:
        data = _linux_environ(pid)
        if b"GPUJOBS_FAKE" not in data:
            return {}
        env: dict[str, str] = {}
        for item in data.split(b"\0"):
            key, sep, value = item.partition(b"=")
            if sep and (key.startswith(b"GPUJOBS_FAKE") or key == b"CUDA_VISIBLE_DEVICES"):
                env[key.decode(errors="replace")] = value.decode(errors="replace")
        return env

    def _new_info(self, pid: int, start: float, environ: dict[str, str]) -> _ProcInfo:
        gpus, util, mem = self._classify(environ) if environ else ((), None, None)
        return _ProcInfo(start=start, gpus=gpus, util=util, mem_mb=mem)

    def _scan_psutil(self, mono: float) -> _Scan:  # pragma: no cover - non-Linux
        import psutil

        scan = _Scan(at=mono)
        live: set[int] = set()
        for proc in psutil.process_iter():
            pid = proc.pid
            live.add(pid)
            try:
                start = proc.create_time()
                info = self._procs.get(pid)
                if info is None or info.start != start:
                    try:
                        environ = {k: v for k, v in proc.environ().items()
                                   if k.startswith("GPUJOBS_FAKE") or k == "CUDA_VISIBLE_DEVICES"}
                    except (psutil.AccessDenied, psutil.ZombieProcess):
                        environ = {}
                    info = self._new_info(pid, start, environ)
                    self._procs[pid] = info
                if not info.gpus:
                    continue
                times = proc.cpu_times()
                cpu_s = times.user + times.system
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            if info.cpu_s is None:
                age = time.time() - info.start
                info.cpu_percent = 100.0 * cpu_s / age if age > 0.05 else 0.0
            elif mono > info.cpu_at:
                info.cpu_percent = 100.0 * (cpu_s - info.cpu_s) / (mono - info.cpu_at)
            info.cpu_s, info.cpu_at = cpu_s, mono
            for index in info.gpus:
                scan.by_gpu.setdefault(index, []).append((pid, info))
        for gone in [p for p in self._procs if p not in live]:
            del self._procs[gone]
        return scan
