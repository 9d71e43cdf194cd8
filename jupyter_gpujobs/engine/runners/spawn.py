"""Starting a job's process, for its supervisor (`shim.py`): fork and exec by hand into the
run's cgroups, its private /tmp, its user and its folder, with its output into the log
(`spawn`), and the stage a start failed at (`SpawnError`).

May call: `cgroups`, `jobtmp` (the private mounts).
Standard library only (and `cgroups`): the supervisor imports it on every job start.
"""

from __future__ import annotations

import os
import signal
from typing import TYPE_CHECKING

from . import cgroups

if TYPE_CHECKING:
    from collections.abc import Sequence

from .jobtmp import private_mounts


class SpawnError(OSError):
    """The child could not become the job: `stage` says where ("cgroup", "user", "cwd", "exec")."""

    def __init__(self, stage: str, err: int):
        super().__init__(err, os.strerror(err))
        self.stage = stage


def spawn(command: list[str], cwd: str | None, env: dict[str, str], log_fd: int,
          cg: dict[str, str] | None = None, user: tuple[str, int, int, list[int]] | None = None,
          tmp_dir: str | None = None, tmp_keep: Sequence[str] = ()) -> int:
    """fork + exec `command` in a new process group with stdin from /dev/null and stdout and
    stderr into `log_fd`. The child starts in, or enters, the run's cgroups `cg`
    (`cgroups.fork_into`, `cgroups.enter`) before exec, gets `tmp_dir` as its private /tmp
    (and a /dev/shm of its own, `private_mounts`) when given, drops to `user` (name, uid, gid, groups:
    setgid, setgroups, setuid, umask 077; no lookup happens in the child) and then enters `cwd` with that user's rights. A failure in
    the child is raised here as SpawnError with its stage and errno.

    Done by hand rather than with `subprocess`, whose import alone costs the dispatch path
    several milliseconds."""
    err_r, err_w = os.pipe()  # close-on-exec: EOF on success, "stage:errno" on failure
    devnull = os.open(os.devnull, os.O_RDONLY)
    pid, in_v2 = cgroups.fork_into(cg or {})
    if pid == 0:  # the child: only async-signal-safe-ish calls until exec
        stage = "exec"
        try:
            os.setpgid(0, 0)
            for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGTERM, signal.SIGINT,
                        signal.SIGHUP, signal.SIGCHLD):
                signal.signal(sig, signal.SIG_DFL)
            signal.set_wakeup_fd(-1)
            stage = "cgroup"
            cgroups.enter(cg or {}, in_v2)
            if tmp_dir is not None:
                stage = "tmp"
                private_mounts(tmp_dir, tmp_keep)
            if user is not None:
                stage = "user"
                _name, uid, gid, gids = user
                os.setgid(gid)
                os.setgroups(gids)
                os.setuid(uid)
                os.umask(0o077)
            stage = "cwd"
            if cwd:
                os.chdir(cwd)
            stage = "exec"
            os.dup2(devnull, 0)
            os.dup2(log_fd, 1)
            os.dup2(log_fd, 2)
            os.execvpe(command[0], command, env)
        except OSError as err:
            os.write(err_w, f"{stage}:{err.errno or 0}".encode())
        except BaseException:
            os.write(err_w, f"{stage}:0".encode())
        os._exit(127)
    os.close(err_w)
    os.close(devnull)
    try:
        data = b""
        while True:
            try:
                chunk = os.read(err_r, 64)
            except InterruptedError:
                continue
            if not chunk:
                break
            data += chunk
    finally:
        os.close(err_r)
    if data:
        while True:
            try:
                os.waitpid(pid, 0)
                break
            except InterruptedError:
                continue
            except ChildProcessError:
                break
        stage, _, errno = data.decode().partition(":")
        raise SpawnError(stage, int(errno or 0))
    return pid
