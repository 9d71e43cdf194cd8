"""Runners carry out the scheduler's plan: start a job's process on its GPUs, stop it, and
report how it ended; they reattach to runs that outlived a server restart. `LocalRunner`
supervises each run with a shim process on this machine (see local.py and shim.py);
`SlurmRunner` hands jobs to a Slurm cluster (slurm.py).

Runners are chosen by name (`c.GPUJobs.runner`) from the entry point group
`jupyter_gpujobs.runners`, so a site can add its own: each entry point is a factory
`make(state_dir: Path, parent: Configurable | None) -> Runner`, where parent is the
`c.GPUJobs` settings (a runner's own settings class reads its section of the same config). `make_runner(name, ...)` loads
one; "local" and "slurm" are known even where the package's metadata is not installed.

This package must stay light: the shim imports it on every job start.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .base import (
        LOST_REASON,
        NOT_STARTED_REASON,
        OUTCOMES,
        Exit,
        LaunchRequest,
        Outcome,
        Runner,
        StopOutcome,
    )
    from .local import LocalRunner

_LAZY = {"LocalRunner": "local", "LOST_REASON": "base", "NOT_STARTED_REASON": "base", "OUTCOMES": "base",
         "Exit": "base",
         "LaunchRequest": "base", "Outcome": "base", "Runner": "base", "StopOutcome": "base"}


#: The entry point group of runner factories.
ENTRY_POINT_GROUP = "jupyter_gpujobs.runners"
_BUILTIN = {"local": "jupyter_gpujobs.engine.runners:make_local_runner",
            "slurm": "jupyter_gpujobs.engine.runners.slurm:make_slurm_runner"}


def runner_names() -> list[str]:
    """The runners that can be chosen: the entry points and the built-in ones."""
    from importlib.metadata import entry_points

    return sorted({*_BUILTIN, *(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))})


def make_runner(name: str, state_dir: Path, parent: Any = None) -> Any:
    """The runner named `name` (`c.GPUJobs.runner`), made by its entry point's factory.
    Raises ValueError naming the runners there are."""
    from importlib import import_module
    from importlib.metadata import entry_points

    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    if found:
        factory = found[0].load()
    elif name in _BUILTIN:
        module, _, attr = _BUILTIN[name].partition(":")
        factory = getattr(import_module(module), attr)
    else:
        raise ValueError(f"c.GPUJobs.runner: no runner named {name!r}; there are {', '.join(runner_names())}")
    return factory(Path(state_dir), parent)


def make_local_runner(state_dir: Path, parent: Any = None) -> Any:
    """The `local` entry point: jobs run on this machine under a supervisor each (in a cgroup
    per `c.GPUJobs.cgroups` when `parent` is the GPUJobs settings)."""
    from .local import LocalRunner

    return LocalRunner(state_dir, cgroups_mode=getattr(parent, "cgroups", "auto"),
                       private_tmp=getattr(parent, "private_tmp", "auto"),
                       log_max_bytes=getattr(parent, "log_max_bytes", 1 << 30))


def __getattr__(name: str) -> Any:
    # loaded on first use: `python -m jupyter_gpujobs.engine.runners.shim` imports this package, and
    # every millisecond of its start-up is on the dispatch path
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f"{__name__}.{module}"), name)


__all__ = ["ENTRY_POINT_GROUP", "make_local_runner", "make_runner", "runner_names", "LOST_REASON",
           "NOT_STARTED_REASON", "OUTCOMES", "Exit", "LaunchRequest", "LocalRunner", "Outcome", "Runner",
           "StopOutcome"]
