"""Runners carry out the scheduler's plan: start a job's process on its GPUs, stop it, and
report how it ended; they reattach to runs that outlived a server restart. `LocalRunner`
supervises each run with a shim process on this machine (see local.py and shim.py).

This package must stay light: the shim imports it on every job start.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import LOST_REASON, OUTCOMES, Exit, LaunchRequest, Outcome, Runner, StopOutcome

if TYPE_CHECKING:
    from .local import LocalRunner


def __getattr__(name: str) -> Any:
    # LocalRunner imports psutil; load it only when asked so the shim starts fast
    if name == "LocalRunner":
        from .local import LocalRunner

        return LocalRunner
    raise AttributeError(name)


__all__ = ["LOST_REASON", "OUTCOMES", "Exit", "LaunchRequest", "LocalRunner", "Outcome", "Runner", "StopOutcome"]
