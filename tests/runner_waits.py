"""Waiting in tests of the local runner: for a run to end, for a file its job writes, and for
the pids a job records."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from jupyter_gpujobs.engine.runners import Exit, LocalRunner


def wait_exit(runner: LocalRunner, job_id: int, handle: dict[str, Any], timeout: float = 20.0) -> Exit:
    """Poll `runner` until the run of `job_id` ends; its Exit, the only one reported."""
    deadline = time.monotonic() + timeout
    while True:
        exits = runner.poll({job_id: handle})
        if exits:
            assert [e.job_id for e in exits] == [job_id]
            return exits[0]
        assert time.monotonic() < deadline, f"job {job_id} did not end"
        time.sleep(0.02)


def wait_file(path: Path, timeout: float = 20.0) -> str:
    """The text of `path` once a job has written something to it."""
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text().strip()):
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.02)
    time.sleep(0.1)  # the rest of what it writes at once
    return path.read_text()


def wait_pids(path: Path, count: int, timeout: float = 10.0) -> list[int]:
    """The pids a job appends to `path`, once there are `count` of them."""
    deadline = time.monotonic() + timeout
    while len(path.read_text().split() if path.exists() else []) < count:
        assert time.monotonic() < deadline, f"{path} has fewer than {count} pids"
        time.sleep(0.05)
    return [int(p) for p in path.read_text().split()]
