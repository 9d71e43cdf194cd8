"""Deferral: when a job may start at the earliest, apart from GPUs and limits.

`begin` (not before), off-peak windows (local time = UTC + policy.utc_offset_s) and
dependencies (`after`: the target ended in any state; `afterok`: it COMPLETED; a target that
ended otherwise cancels the job; a target nobody knows cancels it too).
"""

from __future__ import annotations

import time as _time
from collections.abc import Container, Mapping
from functools import lru_cache

from ...model import Job, JobState, OffpeakWindow


def in_window(local: float, windows: tuple[OffpeakWindow, ...]) -> bool:
    return next_window_start(local, windows) == local


def next_window_start(local: float, windows: tuple[OffpeakWindow, ...]) -> float | None:
    """The first local instant >= `local` inside one of `windows` (None if there are none).

    `local` is seconds since the epoch shifted to local time; the epoch was a Thursday.
    """
    if not windows:
        return None
    day0 = local - local % 86400.0
    weekday0 = (int(day0 // 86400) + 3) % 7  # 1970-01-01 was a Thursday (3)
    best: float | None = None
    for back in range(-1, 8):  # a window that began yesterday may still be open (wraps past 24)
        day = day0 + back * 86400.0
        weekday = (weekday0 + back) % 7
        for w in windows:
            if weekday not in w.days:
                continue
            start = day + w.start_hour * 3600.0
            end = day + (w.end_hour if w.end_hour > w.start_hour else w.end_hour + 24) * 3600.0
            if end <= local:
                continue
            t = max(start, local)
            if best is None or t < best:
                best = t
        if best is not None and best <= day + 86400.0:
            break
    return best


def clock_text(t: float, now: float, utc_offset_s: int) -> str:
    """"22:00" today/tomorrow, else "Thu 03 Dec 22:00", in the policy's local time."""
    return _minute_text(int((t + utc_offset_s) // 60), t - now < 86400)


@lru_cache(maxsize=4096)
def _minute_text(minute: int, within_a_day: bool) -> str:
    """The text of a local minute (a cycle of deferred jobs asks for many of the same)."""
    tm = _time.gmtime(minute * 60)
    return _time.strftime("%H:%M" if within_a_day else "%a %d %b %H:%M", tm)


#: dependency outcome: ("ok", None) met; ("wait", target) not yet; ("cancel", reason)
def dependency_status(job: Job, finished: Mapping[int, JobState], active: Container[int]
                      ) -> tuple[str, int | str | None]:
    waiting: int | None = None
    for dep in job.depends:
        if dep.job_id in active:
            waiting = dep.job_id if waiting is None else waiting
            continue
        state = finished.get(dep.job_id)
        if state is None:
            return "cancel", f"dependency job {dep.job_id} is unknown"
        state = JobState(state)
        if dep.kind == "afterok" and state is not JobState.COMPLETED:
            return "cancel", f"dependency job {dep.job_id} ended {state.value}"
    if waiting is not None:
        return "wait", waiting
    return "ok", None
