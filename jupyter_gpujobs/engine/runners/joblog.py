"""A job's log, as its supervisor (`shim.py`) writes it: opening it without following a link
(`open_log`), the cap on its size (`CappedLog`: the head and the newest tail kept, a line saying
how much was cut), the pipe a capped run writes into (`OutputPipe`), and the out-of-memory
patterns looked for in its tail (`OOM_PATTERNS`, `find_oom`; the monitor's diagnosis reads the
same list).

May call: nothing of the package.
Standard library only: the supervisor imports it on every job start.
"""

from __future__ import annotations

import errno as errno_
import fcntl
import os
import stat as stat_
import sys

#: Log lines that mean the job ran out of GPU memory (searched in the log tail on a failure).
OOM_PATTERNS = (
    "CUDA out of memory",
    "torch.OutOfMemoryError",
    "torch.cuda.OutOfMemoryError",
    "CUDA_ERROR_OUT_OF_MEMORY",
    "cudaErrorMemoryAllocation",
    "RESOURCE_EXHAUSTED: Out of memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "out of memory on device",
)
_LOG_TAIL_BYTES = 64 * 1024


def find_oom(log_path: str, start_offset: int = 0) -> str | None:
    """The first OOM pattern in the last 64 KiB of the log written by this run, if any."""
    try:
        with open(log_path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(start_offset, size - _LOG_TAIL_BYTES))
            tail = f.read().decode(errors="replace").lower()
    except OSError:
        return None
    for pattern in OOM_PATTERNS:
        if pattern.lower() in tail:
            return pattern
    return None


class CappedLog:
    """A run's output into its log file, never more than `cap` bytes (0: no cap) however
    much the job writes: the first half of the cap is kept, then the newest output; when the
    file would pass the cap, what lies between the head and the newest quarter of the cap
    is cut and one line there says how many bytes were cut. (Each cut copies a quarter of the
    cap for every quarter written: the cost of keeping the tail on disk, where a follower of
    the log reads it while the job runs.) The log fd is opened for appending; a cut turns
    that off while it moves the tail."""

    def __init__(self, fd: int, cap: int):
        self.fd = fd
        self.cap = cap
        self.head = cap // 2
        self.keep = cap // 4
        self.cut_bytes = 0  # of this run's output
        self.line_len = 0  # the cut line's length in the file (0: none yet)

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            size = os.fstat(self.fd).st_size
            room = self.cap - size if self.cap else len(view)
            if room <= 0:
                self.cut(size)
                continue
            n = os.write(self.fd, view[:room])
            view = view[n:]

    def cut(self, size: int) -> None:
        """Cut the file of `size` bytes down to its head, the cut line and its newest `keep` bytes."""
        src = size - self.keep
        head = min(self.head, src)
        self.cut_bytes += max(0, src - head - self.line_len)
        line = (f"\n[gpujobs: {self.cut_bytes} bytes of output cut here: the log is capped at {self.cap} bytes "
                f"(c.GPUJobs.log_max_bytes); it keeps the first {self.head} and the newest]\n").encode()
        flags = fcntl.fcntl(self.fd, fcntl.F_GETFL)
        fcntl.fcntl(self.fd, fcntl.F_SETFL, flags & ~os.O_APPEND)
        try:
            os.pwrite(self.fd, line, head)
            dst = head + len(line)
            moved = 0
            while moved < self.keep:  # the tail moves towards the start: copy front to back
                chunk = os.pread(self.fd, min(1 << 20, self.keep - moved), src + moved)
                if not chunk:
                    break
                os.pwrite(self.fd, chunk, dst + moved)
                moved += len(chunk)
            os.ftruncate(self.fd, dst + moved)
        finally:
            fcntl.fcntl(self.fd, fcntl.F_SETFL, flags)
        self.line_len = len(line)


class OutputPipe:
    """The pipe a capped run writes its output into, and the `CappedLog` it is copied to."""

    def __init__(self, log_fd: int, cap: int):
        self.read_fd, self.write_fd = os.pipe()
        try:
            fcntl.fcntl(self.read_fd, 1031, 1 << 20)  # F_SETPIPE_SZ: fewer wake-ups for a chatty job
        except OSError:
            pass
        os.set_blocking(self.read_fd, False)
        self.log = CappedLog(log_fd, cap)
        self.open = True

    def drain(self, budget: int = 16 << 20) -> None:
        """Copy what is in the pipe (up to `budget` bytes) to the log; at EOF, close it."""
        while self.open and budget > 0:
            try:
                data = os.read(self.read_fd, 1 << 20)
            except BlockingIOError:
                return
            except InterruptedError:
                continue
            if not data:
                os.close(self.read_fd)
                self.open = False
                return
            budget -= len(data)
            try:
                self.log.write(data)
            except OSError as err:  # a full disk: the output is lost, the job goes on
                try:
                    print(f"gpujobs: could not write the job's output to its log: {err}", file=sys.stderr)
                except OSError:
                    pass

    def close(self) -> None:
        """The job's processes are gone: copy what is left and close the pipe (the log stays open)."""
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1
        self.drain(budget=1 << 62)
        if self.open:
            os.close(self.read_fd)
            self.open = False


def open_log(path: str, owner: tuple[int, int] | None = None) -> int:
    """Open the job's log for appending without following a symbolic link: one planted at
    the log's name (by an earlier job that could write the folder) is removed and a new
    file made in its place, so output never goes anywhere but the log. The log is private
    (0600) and, for a job run as another user, theirs."""
    flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK  # read: CappedLog moves the tail
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as err:
        if err.errno != errno_.ELOOP:
            raise
        os.unlink(path)
        fd = os.open(path, flags | os.O_EXCL, 0o600)
    try:
        st = os.fstat(fd)
        if not stat_.S_ISREG(st.st_mode):
            raise OSError(errno_.EINVAL, "not a regular file")
        os.set_blocking(fd, True)
        if owner is not None and (st.st_uid, st.st_gid) != owner:
            os.fchown(fd, *owner)
        if stat_.S_IMODE(st.st_mode) & 0o077:
            os.fchmod(fd, 0o600)
    except OSError:
        os.close(fd)
        raise
    return fd
