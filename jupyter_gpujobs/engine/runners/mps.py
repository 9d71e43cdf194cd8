"""NVIDIA MPS for shared GPUs, when an admin turns it on (`c.GPUJobs.mps = True`): one MPS
control daemon per shared GPU and the limits each share's job gets from the driver.

- `MPSControl.ensure(uuid)` starts `nvidia-cuda-mps-control -d` for one GPU (or MIG instance)
  with CUDA_VISIBLE_DEVICES=<its UUID> and a pipe and a log directory of its own
  (`<pipe_dir>/<uuid>`, `<log_dir>/<uuid>`), once: a daemon whose control pipe is there already
  (started before an engine restart) is used as it is. The log folder is open to all (each
  user's MPS server logs there); the daemon's own `control.log` in it is made the engine's
  first (`own_control_log`), so the root daemon never writes through a user's link. Daemons stay up when the engine stops,
  because the jobs on them outlive it.
- `MPSControl.job_env(...)`: what a job holding a share of that GPU gets: the daemon's
  CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT (its memory
  share: the driver refuses allocations beyond it) and CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (its
  share of the SMs).

Where the binary is missing, `problem` says so in one line (shown by `jupyter gpujobs gpus`
and `doctor`), and shares are enforced by the engine's watcher alone. MPS serves one Unix user
at a time per GPU: a second user's share job on the same GPU waits inside CUDA until the
first user's MPS clients end (NVIDIA's MPS documentation, "multi-user"). The engine never
changes the GPU's compute mode.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import subprocess
from pathlib import Path

log = logging.getLogger("jupyter_gpujobs")

BINARY = "nvidia-cuda-mps-control"


class MPSControl:
    """The MPS control daemons of this engine, one per shared GPU."""

    def __init__(self, pipe_dir: str | Path, log_dir: str | Path, binary: str = BINARY):
        self.pipe_dir = Path(pipe_dir)
        self.log_dir = Path(log_dir)
        self.binary = binary
        self.path = shutil.which(binary)
        self.failed: dict[str, str] = {}  # GPU UUID -> why its daemon could not start

    @property
    def problem(self) -> str | None:
        """Why MPS cannot be used here, in one line; None when it can."""
        if self.path is None:
            return f"{self.binary} is not found on the engine's PATH"
        return None

    def dirs(self, uuid: str) -> tuple[Path, Path]:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in uuid)
        return self.pipe_dir / safe, self.log_dir / safe

    def running(self, uuid: str) -> bool:
        return (self.dirs(uuid)[0] / "control").exists()

    def ensure(self, uuid: str) -> tuple[Path, Path] | None:
        """The (pipe, log) directories of a running daemon for this GPU, started if need be;
        None when MPS is unavailable or the daemon does not start (logged once per GPU)."""
        if self.path is None:
            return None
        pipe, logs = self.dirs(uuid)
        if self.running(uuid):
            return pipe, logs
        try:
            pipe.mkdir(parents=True, exist_ok=True)
            logs.mkdir(parents=True, exist_ok=True)
            for folder in (pipe.parent, pipe, logs.parent):
                os.chmod(folder, 0o755)  # every job's user reaches the daemon (the engine's umask is 077)
            own_control_log(logs)
            os.chmod(logs, 0o1777)  # the MPS server runs as its clients' user and writes its log here
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": uuid, "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
                   "CUDA_MPS_LOG_DIRECTORY": str(logs)}
            done = subprocess.run([self.path, "-d"], env=env, capture_output=True, text=True, timeout=15)
            if done.returncode != 0:
                raise OSError((done.stderr or done.stdout).strip() or f"exit code {done.returncode}")
        except (OSError, subprocess.SubprocessError) as err:
            if uuid not in self.failed:
                log.warning("gpujobs: could not start the MPS control daemon for GPU %s (%s); its shares are "
                            "enforced by the engine's watcher only", uuid, err)
            self.failed[uuid] = str(err)
            return None
        self.failed.pop(uuid, None)
        log.info("gpujobs: started the MPS control daemon for GPU %s (pipe %s)", uuid, pipe)
        return pipe, logs

    def stop(self, uuid: str) -> None:
        """Ask a GPU's daemon to quit (`echo quit | nvidia-cuda-mps-control`)."""
        if self.path is None or not self.running(uuid):
            return
        pipe, logs = self.dirs(uuid)
        env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(logs)}
        try:
            subprocess.run([self.path], input="quit\n", env=env, capture_output=True, text=True, timeout=15)
        except (OSError, subprocess.SubprocessError) as err:
            log.warning("gpujobs: could not stop the MPS control daemon of GPU %s: %s", uuid, err)


def own_control_log(logs: Path) -> None:
    """Make `logs/control.log`, which the root daemon appends to, the engine's own regular file
    before the daemon starts. The folder is open to every user (1777: each user's MPS server
    writes its server.log there), so a link a user put at that name would have the daemon
    write, as root, into any file the user named (where fs.protected_symlinks is off), and a
    file of theirs there would get the daemon's log. Anything but the engine's own file there
    is removed; the sticky bit keeps the new one the engine's. OSError when a user puts
    something there again between the removal and the making (the daemon is then not started)."""
    path = logs / "control.log"
    try:
        st = os.lstat(path)
        if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and st.st_nlink == 1:
            return
        os.unlink(path)
    except FileNotFoundError:
        pass
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))


def mps_job_env(pipe: Path, logs: Path, memory_bytes: int, fraction: float) -> dict[str, str]:
    """The environment of a job holding `memory_bytes` and `fraction` of one MPS-shared GPU (the
    job sees it as device 0)."""
    return {
        "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
        "CUDA_MPS_LOG_DIRECTORY": str(logs),
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={max(1, memory_bytes >> 20)}M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(max(1, min(100, round(fraction * 100)))),
    }
