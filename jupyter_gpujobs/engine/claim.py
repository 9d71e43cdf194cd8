"""The machine-wide claim of GPUs: no GPU is ever handed out by two engines on one machine.

An engine holds an exclusive `flock` on one file per GPU UUID in a machine-wide directory
(`c.GPUJobs.claim_dir`, default `/run/lock/jupyter-gpujobs`). The kernel drops the locks when
the process dies, however it dies, so a crashed engine never leaves its GPUs claimed. An
engine that finds any of its GPUs locked holds none of them and allocates nothing; the lock
file says who holds it (pid, user, data dir), which the second engine reports, and it tries
again every scheduling cycle, so it takes over once the first engine is gone.

Fake GPUs have UUIDs derived from their fleet name (the engine's data dir), so two engines on
the same fake GPUs collide exactly as two engines on the same real ones do.
"""

from __future__ import annotations

import errno
import fcntl
import getpass
import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

DEFAULT_CLAIM_DIR = "/run/lock/jupyter-gpujobs"


class GPUClaim:
    """Exclusive claim of a set of GPUs (by UUID) for this process."""

    def __init__(self, uuids: Iterable[str], directory: str | Path, holder: dict[str, Any]):
        self.uuids = sorted(set(uuids))
        self.directory = Path(directory)
        self.holder = {"pid": os.getpid(), "user": getpass.getuser(), **holder}
        self._fds: list[int] = []
        self.other: dict[str, Any] | None = None  # who holds the GPUs when we do not

    @property
    def held(self) -> bool:
        return bool(self._fds) or not self.uuids

    def acquire(self) -> bool:
        """Claim every GPU or none; True when this engine holds them all."""
        if self.held:
            return True
        self._make_directory()
        fds: list[int] = []
        for uuid in self.uuids:
            fd = _open_lock(self.directory / (hashlib.sha1(uuid.encode()).hexdigest()[:20] + ".lock"))
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise
                self.other = _read_holder(fd) or {"pid": None, "user": None, "data_dir": None}
                os.close(fd)
                for held in fds:
                    os.close(held)  # closing drops the lock
                return False
            fds.append(fd)
        text = json.dumps(self.holder).encode()
        for fd in fds:
            os.ftruncate(fd, 0)
            os.pwrite(fd, text, 0)
        self._fds = fds
        self.other = None
        return True

    def refusal(self) -> str:
        """Why this engine allocates nothing, in words for logs, the panel and job reasons."""
        o = self.other or {}
        return (f"another engine (pid {o.get('pid')}, user {o.get('user')}, data dir {o.get('data_dir')}) "
                f"owns the GPUs of this machine; this engine allocates none until it stops "
                f"(use that engine, or the shared engine: jupyter gpujobs engine)")

    def release(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds = []

    def _make_directory(self) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            if self.directory.stat().st_uid == os.geteuid():
                os.chmod(self.directory, 0o1777)  # every user's engine claims here; none removes another's
        except PermissionError:
            pass  # made by another user: the files in it are what counts


def _open_lock(path: Path) -> int:
    """Open (or create, world-writable so any user's engine can record itself as the holder) a
    lock file. An existing file is opened without O_CREAT: in a sticky directory the kernel
    refuses O_CREAT on another user's file (fs.protected_regular)."""
    for _ in range(3):
        try:
            return os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            pass
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        except FileExistsError:
            continue
        os.fchmod(fd, 0o666)
        return fd
    return os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)


def _read_holder(fd: int) -> dict[str, Any] | None:
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"null")
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
