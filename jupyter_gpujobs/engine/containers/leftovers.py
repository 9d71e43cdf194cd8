"""What a runtime keeps of a stopped job's container, removed by the job's supervisor (issue 29).

podman's `--rm` removes a container that ends by itself; one stopped with its job (time limit,
cancel, preemption: its podman and conmon are killed with the rest) keeps its record, shown as
"Up", and its writable layer. `remove_container` runs the runtime's cleanup command
(`containers.cleanup`) as the job's owner with the job's /tmp, in cgroups of its own beside the
job's, so nothing the runtime starts for it (podman's pause process) outlives it; it waits at
most 30 s. Not in the job's own cgroups: the kernel kills a process cloned into a v2 cgroup
that was once killed with cgroup.kill. What it says goes to the supervisor's own log (shim.log).

May call: `containers` (`cleanup`), `runners.cgroups`, `runners.spawn`. Standard library only
(the supervisor imports it when a job in an image was stopped).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

from ..runners import cgroups
from ..runners.spawn import SpawnError, spawn
from . import cleanup

#: the longest wait for the runtime's cleanup
WAIT_S = 30.0


def remove_container(container: dict[str, Any], env: dict[str, str],
                     user: tuple[str, int, int, str, str, list[int]] | None, tmp_dir: str | None,
                     tmp_keep: list[str], job_cg: dict[str, str], reap: Callable[[], bool]) -> None:
    """Remove what the runtime keeps of `container` (a run's `ContainerRun.as_spec()`), as
    `user` (None: the supervisor's own) with the runtime's environment `env`. `job_cg`: the
    job's cgroups, beside which the cleanup gets its own; `reap`: the supervisor's reaping of
    its children (it is their subreaper)."""
    argv = cleanup(container)
    if not argv:
        return
    cg = {key: path + "-cleanup" for key, path in job_cg.items()}
    try:
        cgroups.create(cg, readable=True)  # podman rm runs as the owner
    except OSError:
        cgroups.remove(cg)
        cg = {}
    deadline = time.monotonic() + WAIT_S
    try:
        pid = spawn(argv, "/", env, 2, cg, (user[0], user[1], user[2], user[5]) if user else None,
                    tmp_dir, tmp_keep)
        while time.monotonic() < deadline and os.waitpid(pid, os.WNOHANG)[0] != pid:
            time.sleep(0.02)
    except (SpawnError, ChildProcessError) as err:
        print(f"gpujobs: could not remove the job's container: {err}", file=sys.stderr)
    if cg:
        while cgroups.populated(cg) and time.monotonic() < deadline + 5:
            cgroups.kill(cg)
            reap()
            time.sleep(0.02)
        cgroups.remove(cg)
