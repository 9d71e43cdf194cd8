"""The time-limit notice inside a GPU kernel: an IPython extension the provisioner loads.

A GPU kernel is shut down at its time limit. JupyterLab's panel warns of that, but a person
working in the notebook (or in another front end) may not look there, so the kernel says it
too: once the job passes its warning time (`GPUJOBS_WARN_AT`, from the engine's rule), every
cell that runs ends with one line on stderr saying when the kernel will be shut down. Nothing
is printed before that time, and the extension does nothing in a kernel without those
variables. It reads only its environment and the clock: no request per cell.

The provisioner starts IPython kernels with `--IPKernelApp.extra_extensions=` this module
(see `GPUKernelProvisioner.notice_in_kernel`).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from ..model import format_duration


def notice(now: float, ends_at: float, limit_s: float | None) -> str:
    """The line a cell ends with once the warning time has passed."""
    left = ends_at - now
    limit = f" of {format_duration(limit_s)}" if limit_s else ""
    at = time.strftime("%H:%M:%S", time.localtime(ends_at))
    if left <= 0:
        return f"[gpujobs] this GPU kernel reached its time limit{limit}: it is being shut down."
    return (f"[gpujobs] this GPU kernel reaches its time limit{limit} in {format_duration(left)} "
            f"(at {at}); it will be shut down then and its GPU given back: save your work.")


def _floats(*names: str) -> list[float | None]:
    out: list[float | None] = []
    for name in names:
        try:
            out.append(float(os.environ[name]))
        except (KeyError, ValueError):
            out.append(None)
    return out


def load_ipython_extension(ip: Any) -> None:
    warn_at, ends_at, limit_s = _floats("GPUJOBS_WARN_AT", "GPUJOBS_ENDS_AT", "GPUJOBS_TIME_LIMIT")
    if warn_at is None or ends_at is None:
        return

    def after_cell(result: Any = None) -> None:
        now = time.time()
        if now >= warn_at:
            print(notice(now, ends_at, limit_s), file=sys.stderr, flush=True)

    ip.events.register("post_run_cell", after_cell)
