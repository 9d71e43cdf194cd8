"""The machine-wide claim of GPUs: no GPU is ever handed out by two engines on one machine.

An engine holds an exclusive `flock` on one file per GPU UUID in a claim directory
(`c.GPUJobs.claim_dir`, default `/run/lock/jupyter-gpujobs`). The kernel drops the locks when
the process dies, however it dies, so a crashed engine never leaves its GPUs claimed. An
engine that finds any of its GPUs locked holds none of them and allocates nothing; the lock
file says who holds it (pid, user, data dir), which the second engine reports, and it tries
again every scheduling cycle, so it takes over once the first engine is gone.

No other user may take, spoof or block a root engine's claim: a flock needs only an open
file, so the directory is root's (0755, not writable by others) and every lock file root's
and 0600. A directory or file left by an older version or planted by a user (any owner but
root, or open to others) is taken over at start: the directory chowned and chmodded, such
files removed and made anew (an fd someone kept open then locks a file nobody uses).
An engine that is not root cannot make such a directory: it claims in its own user's
directory (`claim_dir` when that is the user's own, else under the user's Jupyter runtime
dir), which keeps this user's engines apart but not other users' (`GPUClaim.scope` says so).

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
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

DEFAULT_CLAIM_DIR = "/run/lock/jupyter-gpujobs"

#: GPUClaim.scope of an engine that is not root
PER_USER_SCOPE = ("this user's engines only: the engine is not root, so it cannot keep another user's "
                  "engine from these GPUs (run the shared engine as root for that)")


def claim_directory(configured: str | Path) -> Path:
    """Where this process claims: `configured` for root; for another user, `configured` when
    it is that user's own folder, else their own folder under the Jupyter runtime dir."""
    path = Path(configured)
    if os.geteuid() == 0:
        return path
    try:
        if path.lstat().st_uid == os.geteuid() and stat.S_ISDIR(path.lstat().st_mode):
            return path
    except OSError:
        pass
    from jupyter_core.paths import jupyter_runtime_dir

    return Path(jupyter_runtime_dir()) / "gpujobs-claims"


class GPUClaim:
    """Exclusive claim of a set of GPUs (by UUID) for this process."""

    def __init__(self, uuids: Iterable[str], directory: str | Path, holder: dict[str, Any]):
        self.uuids = sorted(set(uuids))
        self.directory = claim_directory(directory)
        #: whom the claim keeps from these GPUs, in words
        self.scope = "machine-wide" if os.geteuid() == 0 else PER_USER_SCOPE
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
        """Make the claim directory, or take over one that is not safe (see the module's text)."""
        if os.geteuid() != 0:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            return
        take_over_directory(self.directory)


def take_over_directory(directory: Path) -> None:
    """As root: `directory` a real folder of root's, mode 0755, holding only root's 0600 lock
    files (anything else in it removed: a user could otherwise open, lock or rewrite it)."""
    try:
        st = directory.lstat()
        if not stat.S_ISDIR(st.st_mode):
            directory.unlink()  # a link or file planted where the folder goes
            raise FileNotFoundError(str(directory))
    except FileNotFoundError:
        directory.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        directory.mkdir(mode=0o755)
        st = directory.lstat()
    if st.st_uid != 0 or st.st_gid != 0:
        os.chown(directory, 0, 0, follow_symlinks=False)
    if stat.S_IMODE(st.st_mode) != 0o755:
        os.chmod(directory, 0o755)
    with os.scandir(directory) as entries:
        for entry in entries:
            est = entry.stat(follow_symlinks=False)
            if stat.S_ISREG(est.st_mode) and est.st_uid == 0 and not stat.S_IMODE(est.st_mode) & 0o077:
                continue
            if stat.S_ISDIR(est.st_mode):
                import shutil

                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                os.unlink(entry.path)


def _open_lock(path: Path) -> int:
    """Open (or create, private to this engine's user) a lock file, never through a link."""
    for _ in range(3):
        try:
            return os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            pass
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            continue
    return os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)


def _read_holder(fd: int) -> dict[str, Any] | None:
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"null")
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
