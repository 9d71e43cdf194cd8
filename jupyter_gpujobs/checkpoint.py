"""Checkpoint helpers for a program that runs as a gpujobs job: how long it has left, a save
function called on the signal it asked for before its end (`--signal USR1@5m`), and a folder
of its own that survives a requeue.

    from jupyter_gpujobs import checkpoint

    checkpoint.on_signal(lambda: save(checkpoint.folder() / "last.pt"))
    if (checkpoint.folder() / "last.pt").exists():
        load(checkpoint.folder() / "last.pt")          # a requeued run goes on from there

What a job is told comes from its environment, set by the job's supervisor:
GPUJOBS_ENDS_AT (when its time limit ends it, epoch seconds), GPUJOBS_SIGNAL and
GPUJOBS_SIGNAL_BEFORE (the signal it asked for and how many seconds before the end),
GPUJOBS_CHECKPOINT_DIR (its folder: the same for every run of the job, under the user's
own folder, made here with the user's rights, removed when the job's files are) and
GPUJOBS_RESTARTS (how many runs came before this one). Outside a job the helpers still
work: no time limit, no signal, and the folder `.checkpoints` in the working directory.

This module runs inside a user's job: it imports only the standard library, nothing of the
engine (whose supervisor, `engine.supervision`, imports `checkpoint_dir` from here, so the
folder's place is written once).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: Where a job's folder lies under the user's own folder (`checkpoint_dir`).
CHECKPOINTS = os.path.join(".gpujobs", "checkpoints")

_handlers: list[Callable[[], Any]] = []
_installed: int | None = None  # the signal number our handler is on
_signalled_at: float | None = None


def checkpoint_dir(root: str, job_id: int) -> str:
    """The checkpoint folder of job `job_id` of the user whose own folder is `root`."""
    return os.path.join(root, CHECKPOINTS, f"job-{int(job_id)}")


def in_job() -> bool:
    """Whether this process runs as a gpujobs job."""
    return bool(os.environ.get("GPUJOBS_JOB_ID"))


def job_id() -> int | None:
    value = os.environ.get("GPUJOBS_JOB_ID", "")
    return int(value) if value.isdigit() else None


def restarts() -> int:
    """How many runs of this job came before this one (requeued at a time limit, after a
    preemption or a lost run): 0 for the first."""
    value = os.environ.get("GPUJOBS_RESTARTS", "")
    return int(value) if value.isdigit() else 0


def signal_name() -> str | None:
    """The signal this job asked for before its end ("USR1"), None when it asked for none."""
    return os.environ.get("GPUJOBS_SIGNAL") or None


def signal_before() -> float | None:
    """How many seconds before the end the signal comes."""
    value = os.environ.get("GPUJOBS_SIGNAL_BEFORE", "")
    try:
        return float(value) if value else None
    except ValueError:
        return None


def ends_at() -> float | None:
    """When this run ends (epoch seconds): at its time limit, or sooner once the signal came
    (a preemption sends it at once and stops the job the asked time later). None: no limit."""
    try:
        end: float | None = float(os.environ["GPUJOBS_ENDS_AT"])
    except (KeyError, ValueError):
        end = None
    before = signal_before()
    if _signalled_at is not None and before is not None:
        soon = _signalled_at + before
        end = soon if end is None else min(end, soon)
    return end


def time_left() -> float | None:
    """Seconds until this run ends (never below 0), None when it has no time limit."""
    end = ends_at()
    return None if end is None else max(0.0, end - time.time())


def signalled() -> bool:
    """Whether the signal before the end came (once `on_signal` was called)."""
    return _signalled_at is not None


def on_signal(save: Callable[[], Any] | None = None, sig: int | str | None = None) -> None:
    """Call `save` when the job's signal before the end comes (`sig`: another signal than the
    one asked for, a number or a name such as "USR1"). Several functions may be registered;
    each is called once per signal, in order. Without `save`, only `signalled()` and
    `time_left()` learn of it, which suits a training loop that saves at a step's end:

        checkpoint.on_signal()
        for step in ...:
            ...
            if checkpoint.signalled():
                save(); break

    Python runs a handler in the main thread between two bytecodes, so `save` runs in the
    middle of whatever the program did then. In a job that asked for no signal (and no `sig`)
    it raises ValueError; outside a job it registers `save` and returns."""
    global _installed
    number = _signal_number(sig if sig is not None else signal_name())
    if save is not None:
        _handlers.append(save)
    if number is None:
        if not in_job():
            return  # (a laptop: no end comes, so no signal either)
        raise ValueError("this job asked for no signal before its end (submit it with --signal USR1@5m)")
    if _installed != number:
        signal.signal(number, _on_signal)
        _installed = number


def _signal_number(sig: int | str | None) -> int | None:
    if sig is None or sig == "":
        return None
    if isinstance(sig, int):
        return sig
    name = sig.upper()
    return int(getattr(signal, name if name.startswith("SIG") else "SIG" + name))


def _on_signal(signum: int, frame: Any) -> None:
    global _signalled_at
    _signalled_at = time.time()
    for save in list(_handlers):
        save()


def wait_for_end() -> None:
    """Sleep until this run is stopped (SIGTERM at its time limit, or at the end of a
    preemption's grace): after the last save, so that the job ends stopped, and is requeued,
    rather than COMPLETED. Outside a job, or without a time limit, it returns at once."""
    if not in_job() or ends_at() is None:
        return
    while True:
        time.sleep(60)


def folder(create: bool = True) -> Path:
    """This job's checkpoint folder: the same for every run of the job (a requeued run finds
    what the last one saved), private to its user (0700), removed with the job's other files
    after the server's job retention. Outside a job: `.checkpoints` in the working directory."""
    path = Path(os.environ.get("GPUJOBS_CHECKPOINT_DIR") or os.path.join(os.getcwd(), ".checkpoints"))
    if create:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def write_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` to `path` so a reader (the next run) finds the old file or the whole new
    one, never half of it, even when the job is killed while it writes."""
    target = os.fspath(path)
    tmp = f"{target}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, target)
