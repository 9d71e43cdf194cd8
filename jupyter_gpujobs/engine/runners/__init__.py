"""Runners carry out the scheduler's plan: start a job's process on its GPUs, stop it, and
report how it ended; they reattach to runs that outlived a server restart. `LocalRunner`
supervises each run with a shim process on this machine (see local.py and shim.py).

This package must stay light: the shim imports it on every job start.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .base import LOST_REASON, OUTCOMES, Exit, LaunchRequest, Outcome, Runner, StopOutcome
    from .local import LocalRunner

_LAZY = {"LocalRunner": "local", "LOST_REASON": "base", "OUTCOMES": "base", "Exit": "base",
         "LaunchRequest": "base", "Outcome": "base", "Runner": "base", "StopOutcome": "base"}


def __getattr__(name: str) -> Any:
    # loaded on first use: `python -m jupyter_gpujobs.engine.runners.shim` imports this package, and
    # every millisecond of its start-up is on the dispatch path
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f"{__name__}.{module}"), name)


__all__ = ["LOST_REASON", "OUTCOMES", "Exit", "LaunchRequest", "LocalRunner", "Outcome", "Runner", "StopOutcome"]
