"""Per-job cgroups: a process tree that cannot escape, a GPU device fence, and host memory and
CPU limits.

`detect()` finds what this host lets the engine do (read once, from /proc/self/mountinfo):

- a cgroup v2 hierarchy (`cgroup2`, e.g. /sys/fs/cgroup or /sys/fs/cgroup/unified on a hybrid
  host) where the engine can make a child: it tracks the job's processes (`cgroup.events`:
  populated) and stops them all at once (`cgroup.kill`), however they daemonize;
- cgroup v1 controllers (`devices`, `memory`, `cpu`, `freezer`) it can write: the device fence
  (`devices.deny` of the GPUs not allocated), memory and CPU limits, and the v1 way to stop a
  tree (freeze, SIGKILL every pid, thaw) where v2 is missing.

A job's cgroups are `<hierarchy>/gpujobs/<run name>` in each; `paths()` names them, the
shim creates them and puts the job's first process in them before it execs, the runner stops
and removes them. What is in force is said in one line (`Isolation.describe()`):
"GPU fence: device cgroup" or "GPU fence: none, CUDA_VISIBLE_DEVICES only".

Where there is no v1 `devices` controller (a v2-only host) the fence is a BPF device program
attached to the job's v2 cgroup, as systemd and Slurm do (`bpf.py`); where the kernel refuses
to load one the host reports "GPU fence: none". Mode "v2" uses the v2 hierarchy alone, as on a
v2-only host, also where v1 controllers exist.

Standard library only: the shim imports this module on the dispatch path.
"""

from __future__ import annotations

import errno
import functools
import os
import signal
import stat
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

#: The folder under each hierarchy that holds the jobs' cgroups.
PARENT = "gpujobs"
#: v1 controllers used, in the order their cgroups are joined.
V1_CONTROLLERS = ("freezer", "devices", "memory", "cpu")
FENCE_ON = "GPU fence: device cgroup"
FENCE_OFF = "GPU fence: none, CUDA_VISIBLE_DEVICES only"


class Isolation:
    """What this host lets the engine confine a job with. (A plain class: `dataclasses` would
    cost the shim's start-up several milliseconds.)"""

    def __init__(self, v2: str | None = None, v1: dict[str, str] | None = None,
                 v2_controllers: tuple[str, ...] = (), why_not: str = "", bpf: bool = False):
        self.v2 = v2  # a writable cgroup v2 mount point
        self.v1 = dict(v1 or {})  # controller -> its writable mount point
        self.v2_controllers = v2_controllers  # controllers enabled for jobs in v2 (memory, cpu)
        self.why_not = why_not  # why cgroups are not used, when they are not
        self.bpf = bpf  # the device fence is a BPF program on the v2 cgroup (no v1 devices controller)
        self.tmp = ""  # what a job's /tmp is (set by the local runner: "private /tmp ..."), for describe()

    def __repr__(self) -> str:
        return f"Isolation({self.describe()!r})"

    @property
    def enabled(self) -> bool:
        return bool(self.v2 or self.v1)

    @property
    def fence(self) -> bool:
        return "devices" in self.v1 or self.bpf

    def describe(self) -> str:
        """One line for the log, `jupyter gpujobs gpus` and the panel."""
        text = (f"{FENCE_ON} (BPF)" if self.bpf else FENCE_ON) if self.fence else FENCE_OFF
        tmp = f"; {self.tmp}" if self.tmp else ""
        if not self.enabled:
            return f"{text}; process tree: subreaper supervision ({self.why_not or 'no writable cgroups'}){tmp}"
        kinds = " + ".join(k for k, on in (("v2", self.v2), ("v1", self.v1)) if on)
        memory, cpu = self.limits()
        limits = " and ".join(k for k, on in (("memory", memory), ("CPU", cpu)) if on) or "none"
        return f"{text}; each job in its own cgroup ({kinds}); host limits: {limits}{tmp}"

    def limits(self) -> tuple[bool, bool]:
        """Can a job be given (a memory limit, a CPU limit)?"""
        return ("memory" in self.v2_controllers or "memory" in self.v1,
                "cpu" in self.v2_controllers or "cpu" in self.v1)

    def paths(self, name: str) -> dict[str, str]:
        """The cgroups of the run `name`: {"v2": path, "<v1 controller>": path, ...}."""
        out = {}
        if self.v2:
            out["v2"] = os.path.join(self.v2, PARENT, name)
        for ctl, mount in self.v1.items():
            out[ctl] = os.path.join(mount, PARENT, name)
        return out


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(fs type, mount point, super options) of the cgroup mounts."""
    out = []
    try:
        with open("/proc/self/mountinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return out
    for line in lines:
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        parts = left.split()
        fstype, _source, options = (right.split() + ["", "", ""])[:3]
        if fstype in ("cgroup", "cgroup2") and len(parts) > 4:
            point = parts[4].replace("\\040", " ")
            out.append((fstype, point, set(options.split(","))))
    return out


def _writable_parent(mount: str) -> bool:
    parent = os.path.join(mount, PARENT)
    try:
        os.makedirs(parent, exist_ok=True)
        probe = os.path.join(parent, f".probe-{os.getpid()}")
        os.mkdir(probe)
        os.rmdir(probe)
        return True
    except OSError:
        return False


def _enable_v2_controllers(mount: str) -> tuple[str, ...]:
    """Turn on memory and cpu for the jobs' cgroups where the v2 root offers them."""
    enabled = []
    for ctl in ("memory", "cpu"):
        try:
            with open(os.path.join(mount, "cgroup.controllers")) as f:
                if ctl not in f.read().split():
                    continue
            for folder in (mount, os.path.join(mount, PARENT)):
                with open(os.path.join(folder, "cgroup.subtree_control"), "w") as f:
                    f.write(f"+{ctl}")
            enabled.append(ctl)
        except OSError:
            continue
    return tuple(enabled)


def detect(mode: str = "auto") -> Isolation:
    """What this host allows. `mode`: "auto" (use cgroups where writable), "v2" (the v2
    hierarchy alone, as on a v2-only host) or "off"."""
    if mode == "off":
        return Isolation(why_not="cgroups turned off in the settings")
    if mode not in ("auto", "v2"):
        raise ValueError(f"cgroups must be 'auto', 'v2' or 'off', not {mode!r}")
    if not os.path.isdir("/sys/fs/cgroup"):
        return Isolation(why_not="no cgroups on this host")
    iso = Isolation()
    for fstype, point, options in _mounts():
        if fstype == "cgroup2" and iso.v2 is None:
            # cgroup.kill (Linux 5.14) exists in every cgroup but the root
            if _writable_parent(point) and os.path.exists(os.path.join(point, PARENT, "cgroup.kill")):
                iso.v2 = point
        elif fstype == "cgroup" and mode == "auto":
            for ctl in V1_CONTROLLERS:
                if ctl in options and ctl not in iso.v1 and _writable_parent(point):
                    iso.v1[ctl] = point
    if iso.v2:
        iso.v2_controllers = _enable_v2_controllers(iso.v2)
        if "devices" not in iso.v1:
            from . import bpf

            iso.bpf = bpf.supported()
    if not iso.enabled:
        iso.why_not = "no writable cgroups (not root, or an unprivileged container)"
    return iso


# ---------------------------------------------------------------------- one job's cgroups
# `cg` is what Isolation.paths() returned: {"v2": path, "devices": path, ...}


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def char_device(path: str) -> tuple[int, int] | None:
    """(major, minor) of the character device at `path`, or None."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISCHR(st.st_mode):
        return None
    return os.major(st.st_rdev), os.minor(st.st_rdev)


def create(cg: dict[str, str], deny_devices: Sequence[str] = (), mem_bytes: int | None = None,
           cpus: float | None = None, v2_controllers: tuple[str, ...] = (), bpf_fence: bool = False,
           readable: bool = False) -> None:
    """Make the run's cgroups with its device fence and limits (OSError when the host refuses).
    `bpf_fence`: fence with a BPF program on the v2 cgroup (no v1 devices controller).
    `readable`: open to read as the host's own cgroups are (0755), for a container runtime the
    job runs as its owner, which reads its cgroup's state (rootless runc: "unable to get cgroup
    freezer state ... permission denied"); else root's alone (0700, whatever the engine's
    umask), so no user lists another's job's processes (cgroup.procs) or reads its use."""
    for path in cg.values():
        os.makedirs(path, exist_ok=True)
        os.chmod(path, 0o755 if readable else 0o700)
    denied = [dev for dev in (char_device(node) for node in deny_devices) if dev is not None]
    if "devices" in cg:
        for major, minor in denied:
            _write(os.path.join(cg["devices"], "devices.deny"), f"c {major}:{minor} rwm")
    elif bpf_fence and "v2" in cg and denied:
        from . import bpf

        bpf.deny_devices(cg["v2"], denied)
    if mem_bytes:
        if "v2" in cg and "memory" in v2_controllers:
            _write(os.path.join(cg["v2"], "memory.max"), str(int(mem_bytes)))
            _write(os.path.join(cg["v2"], "memory.swap.max"), "0")
        elif "memory" in cg:
            _write(os.path.join(cg["memory"], "memory.limit_in_bytes"), str(int(mem_bytes)))
            try:  # no swapping past the limit either (only where swap accounting is on)
                _write(os.path.join(cg["memory"], "memory.memsw.limit_in_bytes"), str(int(mem_bytes)))
            except OSError:
                pass
        else:
            raise OSError(errno.ENOTSUP, "this host has no writable memory cgroup for a memory limit")
    if cpus:
        period = 100_000
        quota = max(1000, int(cpus * period))
        if "v2" in cg and "cpu" in v2_controllers:
            _write(os.path.join(cg["v2"], "cpu.max"), f"{quota} {period}")
        elif "cpu" in cg:
            _write(os.path.join(cg["cpu"], "cpu.cfs_period_us"), str(period))
            _write(os.path.join(cg["cpu"], "cpu.cfs_quota_us"), str(quota))
        else:
            raise OSError(errno.ENOTSUP, "this host has no writable cpu cgroup for a CPU limit")


def procs_files(cg: dict[str, str]) -> list[str]:
    """The files a process writes its pid to, to enter every cgroup of the run."""
    return [os.path.join(cg[k], "cgroup.procs") for k in ("v2", *V1_CONTROLLERS) if k in cg]


# A job's first process enters its cgroups on the dispatch path, so how it enters them counts:
# writing a pid to `cgroup.procs` takes the kernel's global threadgroup lock for writing, which
# waits for an RCU grace period (10 ms and more on a loaded host) on every dispatch. Two ways in
# skip that lock: a child cloned straight into its v2 cgroup (clone3 with CLONE_INTO_CGROUP,
# Linux 5.7), and a single-threaded process moving itself by writing "0" to a v1 `tasks` file.

_CLONE3 = 435  # the same number on every architecture
_CLONE_INTO_CGROUP = 0x200000000


@functools.cache
def load_clone3() -> Callable[[int], int] | None:
    """`clone_into(cgroup_fd) -> pid` (clone3 through ctypes, as fork() returns: 0 in the
    child, -1 where the kernel refuses), or None without ctypes. Loaded once: a waiting
    supervisor loads it ahead of its job."""
    try:
        import ctypes

        syscall = ctypes.PyDLL(None, use_errno=True).syscall  # PyDLL: the child is a copy holding the GIL
    except (ImportError, OSError, AttributeError):
        return None

    class CloneArgs(ctypes.Structure):
        _fields_ = [(name, ctypes.c_uint64) for name in (
            "flags", "pidfd", "child_tid", "parent_tid", "exit_signal", "stack", "stack_size", "tls",
            "set_tid", "set_tid_size", "cgroup")]

    def clone_into(fd: int) -> int:
        args = CloneArgs(flags=_CLONE_INTO_CGROUP, exit_signal=signal.SIGCHLD, cgroup=fd)
        return int(syscall(ctypes.c_long(_CLONE3), ctypes.byref(args), ctypes.c_size_t(ctypes.sizeof(args))))

    return clone_into


def fork_into(cg: dict[str, str]) -> tuple[int, bool]:
    """fork() for a run's first process: (the pid, as fork returns it; is the child already in
    the run's v2 cgroup?). Where the kernel can, the child is cloned into that cgroup; else
    (an older kernel, a seccomp filter, no v2 cgroup) this is os.fork() and `enter` moves it.
    The child must exec soon: the interpreter is not told of this fork (it is single-threaded
    here, the supervisor's)."""
    clone_into = load_clone3() if "v2" in cg else None
    if clone_into is not None:
        try:
            fd = os.open(cg["v2"], os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return os.fork(), False
        pid = clone_into(fd)
        if pid != 0:  # the parent, or no child (the child's copy closes at exec)
            os.close(fd)
        if pid >= 0:
            return pid, True
    return os.fork(), False


def enter(cg: dict[str, str], in_v2: bool = False) -> None:
    """Move the calling (single-threaded) process into every cgroup of the run: itself into
    each v1 hierarchy ("0" to `tasks`), and by pid into v2 unless `in_v2` (`fork_into` did)."""
    if "v2" in cg and not in_v2:
        _write(os.path.join(cg["v2"], "cgroup.procs"), str(os.getpid()))
    for key in V1_CONTROLLERS:
        if key in cg:
            _write(os.path.join(cg[key], "tasks"), "0")


def _tracker(cg: dict[str, str]) -> str | None:
    for key in ("v2", *V1_CONTROLLERS):
        if key in cg:
            return cg[key]
    return None


def exists(cg: dict[str, str]) -> bool:
    """Have the run's cgroups been made (and not removed)?"""
    folder = _tracker(cg)
    return folder is not None and os.path.isdir(folder)


def pids(cg: dict[str, str]) -> list[int]:
    """The processes in the run's cgroup (empty when it is gone)."""
    folder = _tracker(cg)
    if folder is None:
        return []
    try:
        with open(os.path.join(folder, "cgroup.procs")) as f:
            return [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        return []


def populated(cg: dict[str, str]) -> bool:
    """Is any process of the run still alive (zombies not yet reaped count)?"""
    if "v2" in cg:
        try:
            with open(os.path.join(cg["v2"], "cgroup.events")) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "populated":
                        return value.strip() == "1"
        except FileNotFoundError:
            return False
        except OSError:
            pass
    return bool(pids(cg))


def signal_all(cg: dict[str, str], sig: int) -> int:
    """Send `sig` to every process of the run; how many got it."""
    sent = 0
    for pid in pids(cg):
        try:
            os.kill(pid, sig)
            sent += 1
        except OSError:
            pass
    return sent


def kill(cg: dict[str, str]) -> None:
    """SIGKILL every process of the run at once, so none can fork away: `cgroup.kill` on v2,
    freeze + kill + thaw on v1."""
    if "v2" in cg:
        try:
            _write(os.path.join(cg["v2"], "cgroup.kill"), "1")
            return
        except FileNotFoundError:
            return
        except OSError:
            pass
    freezer = cg.get("freezer")
    state = os.path.join(freezer, "freezer.state") if freezer else None
    if state:
        try:
            _write(state, "FROZEN")
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline:
                with open(state) as f:
                    if f.read().strip() == "FROZEN":
                        break
                time.sleep(0.005)
        except OSError:
            state = None
    for _ in range(100):
        if not signal_all(cg, signal.SIGKILL):
            break
        if state:
            break  # frozen: nothing could fork in between
    if state:
        try:
            _write(state, "THAWED")  # the killed processes die once thawed
        except OSError:
            pass


def oom_killed(cg: dict[str, str]) -> bool:
    """Did the kernel's OOM killer end a process of the run (its memory limit was reached)?"""
    candidates = []
    if "v2" in cg:
        candidates.append(os.path.join(cg["v2"], "memory.events"))
    if "memory" in cg:
        candidates.append(os.path.join(cg["memory"], "memory.oom_control"))
    for path in candidates:
        try:
            with open(path) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill" and int(value or 0) > 0:
                        return True
        except (OSError, ValueError):
            continue
    return False


def remove(cg: dict[str, str]) -> None:
    """Remove the run's (empty) cgroups."""
    for path in cg.values():
        try:
            os.rmdir(path)
        except OSError:
            pass


def format_bytes(n: int) -> str:
    """32G, 512M, 1.5G: how a person wrote the limit."""
    for unit, size in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= size:
            value = n / size
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.1f}{unit}"
    return f"{n}B"
