"""A job's private /tmp and /dev/shm, for its supervisor (`shim.py`): the folder that is the
job's /tmp in its run directory (`make_job_tmp`, `remove_job_tmp`), the mount namespace the
job's child process enters before exec (`private_mounts`), the removal of a folder tree however
deep (`remove_tree`, the retention's too), the runner's probe of whether this
host allows it (`probe_private_mounts`), and the C library handle these calls use (`_libc`,
loaded once; the supervisor's subreaper call uses it too).

May call: nothing of the package.
Standard library only: the supervisor imports it on every job start.
"""

from __future__ import annotations

import errno as errno_
import os
import stat
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence



_LIBC: Any = None


def _libc() -> Any:
    """The C library through ctypes (loaded once: its import costs a start tens of ms)."""
    global _LIBC
    if _LIBC is None and sys.platform.startswith("linux"):
        try:
            import ctypes

            _LIBC = ctypes.CDLL(None, use_errno=True)
        except Exception:
            _LIBC = False
    return _LIBC or None



_CLONE_NEWNS = 0x00020000
_MS_NOSUID, _MS_NODEV, _MS_BIND, _MS_REC, _MS_PRIVATE = 2, 4, 4096, 16384, 1 << 18


def private_mounts(tmp_dir: str | None, keep: Sequence[str] = ()) -> None:
    """In a mount namespace of this process's own: `tmp_dir` on /tmp and a fresh tmpfs on
    /dev/shm (None: a tmpfs on /tmp too, as the probe does); each folder of `keep` (under
    /tmp: the engine's socket folder, never a path a user named) stays where it was, bound
    into `tmp_dir` (`make_job_tmp` made its mount point). OSError when the host refuses."""
    import ctypes

    libc = _libc()
    if libc is None:
        raise OSError(errno_.ENOSYS, "no C library to call unshare and mount")

    def check(rc: int) -> None:
        if rc != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))

    check(libc.unshare(_CLONE_NEWNS))
    check(libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None))
    if tmp_dir is None:
        check(libc.mount(b"tmpfs", b"/tmp", b"tmpfs", _MS_NOSUID | _MS_NODEV, b"mode=1777,size=1m"))
    else:
        for folder in keep:
            inside = os.path.join(tmp_dir, os.path.relpath(folder, "/tmp"))
            check(libc.mount(folder.encode(), inside.encode(), None, _MS_BIND | _MS_REC, None))
        check(libc.mount(tmp_dir.encode(), b"/tmp", None, _MS_BIND | _MS_REC, None))
    check(libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", _MS_NOSUID | _MS_NODEV, b"mode=1777"))


def probe_private_mounts() -> str:
    """"" when a job can get a private /tmp and /dev/shm here, else why not (run in a process
    of its own: its mounts vanish with it)."""
    try:
        private_mounts(None)
    except OSError as err:
        return f"no mount namespace for jobs ({err.strerror or err})"
    return ""


def make_job_tmp(job_dir: str, keep: Sequence[str] = ()) -> str:
    """The folder that is the job's /tmp: `JOB_DIR/tmp`, mode 1777 as /tmp (only the job
    reaches it: the run directory is root's 0700), with a mount point (root's 0755) for each
    folder of `keep` at its place under /tmp."""
    path = os.path.join(job_dir, "tmp")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    os.chmod(path, 0o1777)
    for folder in keep:
        point = path
        for part in os.path.relpath(folder, "/tmp").split(os.sep):
            point = os.path.join(point, part)
            try:
                os.mkdir(point, 0o755)
            except FileExistsError:
                pass
            os.chmod(point, 0o755)
    return path


def remove_job_tmp(path: str) -> None:
    """Remove a job's /tmp once nothing of the job runs (never following a link in it,
    however deep the job made it: `remove_tree`)."""
    try:
        remove_tree(path)
    except OSError:
        pass


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def remove_tree(path: str) -> int:
    """Remove `path` and everything under it, never following a symbolic link; the bytes its
    files held (lstat's sizes). OSError at the first entry that cannot be removed.

    A loop, not shutil.rmtree or os.walk: before Python 3.12 those recurse once per level, and
    a job makes its /tmp deeper than the recursion limit with a shell loop (RecursionError:
    the supervisor's result lost, the run directory left, every retention pass failing on
    it). It holds one folder open at a time: going up is `..` of the folder it emptied,
    checked to be the folder it came down from."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return 0
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
        return st.st_size
    freed = 0
    fd = os.open(path, _DIR_FLAGS)
    # from `path` down to the open folder: each folder's (st_dev, st_ino) and the subfolders
    # in it left to remove (None: not read yet)
    frames: list[tuple[tuple[int, int], list[str] | None]] = [((st.st_dev, st.st_ino), None)]
    try:
        while True:
            ids, left = frames[-1]
            if left is None:
                left = []
                with os.scandir(fd) as it:
                    entries = list(it)
                for entry in entries:
                    est = entry.stat(follow_symlinks=False)
                    if stat.S_ISDIR(est.st_mode):
                        left.append(entry.name)
                    else:
                        os.unlink(entry.name, dir_fd=fd)
                        freed += est.st_size
                frames[-1] = (ids, left)
            if left:  # down into the next one
                below = os.open(left[-1], _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = below
                bst = os.fstat(fd)
                frames.append(((bst.st_dev, bst.st_ino), None))
                continue
            frames.pop()  # this folder is empty now
            if not frames:
                break
            up = os.open("..", _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = up
            ust = os.fstat(fd)
            ids, left = frames[-1]
            if (ust.st_dev, ust.st_ino) != ids or not left:
                raise OSError(errno_.ESTALE, f"a folder under {path} was moved while it was being removed")
            os.rmdir(left.pop(), dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(path)
    return freed
