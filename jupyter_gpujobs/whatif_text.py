"""A what-if answer (`POST jobs?dry_run=1`, `Client.what_if`) and a job's right-sizing advice
as a person reads them, for the CLI (`submit --test-only`, `show`) and the magic
(`%%gpujob --test-only`): "1xA100 by 15:40; a 0.5 share now; 1xT4 now". Clock times are the
reader's local time (the engine answers in epoch seconds). Pure; imports only the model.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from .model import format_duration, safe_text


def when(t: float | None, now: float) -> str:
    """`"now"`, `"by 15:40"`, `"by Sat 09:10"`, or `"unknown"` (no estimate). "by": a bound
    from time limits, as the scheduler books (sooner if the jobs ahead end sooner)."""
    if t is None:
        return "unknown"
    if t - now < 1:
        return "now"
    local = time.localtime(t)
    if t - now < 20 * 3600:
        return time.strftime("by %H:%M", local)
    return time.strftime("by %a %H:%M" if t - now < 6 * 86400 else "by %b %d %H:%M", local)


def shape(choice: Mapping[str, Any], show_limit: bool = False) -> str:
    """`{"gpus": 1, "gpu_type": "A100"}` -> `"1xA100"`; a share -> `"a 0.5 share"`."""
    gpus = choice.get("gpus") or 0
    model = str(choice.get("gpu_type") or "").replace("NVIDIA ", "")
    if 0 < gpus < 1:
        text = f"a {gpus:g} share" + (f" of {model}" if model else "")
    else:
        text = f"{int(gpus)}x{model or 'GPU'}"
    if show_limit and choice.get("time_limit_s"):
        text += f" with {format_duration(choice['time_limit_s'])}"
    return safe_text(text)


def summary(answer: Mapping[str, Any], now: float) -> str:
    """One line: the request's start, then each nearby choice that starts sooner."""
    parts = [f"{shape(answer['request'])} {when(answer.get('expected_start'), now)}"]
    for alt in answer.get("alternatives") or []:
        parts.append(f"{shape(alt, alt.get('change') == 'a shorter time limit')} {when(alt.get('expected_start'), now)}")
    return "; ".join(parts)


def format_what_if(answer: Mapping[str, Any], now: float) -> str:
    """The lines `submit --test-only` prints."""
    tasks = answer.get("tasks") or 1
    start = when(answer.get("expected_start"), now)
    lines = [f"would start {start}" + (" at the latest" if start.startswith("by ") else "")
             + (f" (the first of {tasks} array tasks)" if tasks > 1 else "") + " - nothing was submitted",
             summary(answer, now)]
    advice = answer.get("advice")
    if advice:
        lines.append(f"advice: {safe_text(advice['text'])}")
    if answer.get("basis"):
        lines.append(f"(estimated from {safe_text(answer['basis'])})")
    return "\n".join(lines)
