"""The files a run's supervisor and its runner share in the run directory (`spec.json`,
`control.json`, `result.json`): JSON written atomically (`write_json_atomic`) and read back
(`read_json`), and how a run's process ended in the words every runner's reasons use
(`how_it_ended`).

May call: `model` (durations in words, imported only when a time limit ends a run). Standard
library only at import: the supervisor imports it on every job start.
"""

from __future__ import annotations

import json
import os
import signal
from typing import Any


def write_json_atomic(path: str, data: dict[str, Any]) -> None:
    """Write JSON so a reader sees the old file, no file, or the whole new one."""
    tmp = f"{path}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)  # a full disk: leave nothing half-written
        except OSError:
            pass
        raise


def read_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _format_duration(seconds: float) -> str:
    from ...model import format_duration

    return format_duration(seconds)


def how_it_ended(exit_code: int | None, sig: int | None) -> str:
    """How a job's process ended, as its reasons say it: "exit code 3" or "killed by signal
    SIGSEGV" (every runner's words)."""
    if exit_code is not None:
        return f"exit code {exit_code}"
    try:
        name = signal.Signals(sig or 0).name
    except ValueError:
        name = str(sig)
    return f"killed by signal {name}"
