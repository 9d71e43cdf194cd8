"""Deferral: when a job may start at the earliest, apart from GPUs and limits.

`begin` (not before), off-peak windows (in the policy's local time: `LocalClock`, the zone's
real offset at each instant, so daylight saving moves nothing by an hour) and dependencies (`after`: the target ended in any state; `afterok`: it COMPLETED; a target that
ended otherwise cancels the job; a target nobody knows cancels it too).
"""

from __future__ import annotations

import time as _time
from collections.abc import Container, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import lru_cache
from zoneinfo import ZoneInfo

from ...model import Job, JobState, OffpeakWindow, Policy


@dataclass(frozen=True)
class LocalClock:
    """The policy's local time: an IANA zone (`zone`, e.g. "America/New_York"), whose offset
    from UTC is looked up at each instant (winter and summer differ), or, without one, a fixed
    `fixed_offset_s`. "Local" instants are seconds since the epoch shifted by that offset
    (wall-clock time read as if it were UTC), as `next_window_start` takes them."""

    zone: str = ""
    fixed_offset_s: int = 0

    def offset(self, t: float) -> int:
        """UTC offset in seconds at the instant `t` (epoch seconds)."""
        if not self.zone:
            return self.fixed_offset_s
        tz = ZoneInfo(self.zone)
        delta = datetime.fromtimestamp(t, tz).utcoffset()
        return int(delta.total_seconds()) if delta is not None else 0

    def local(self, t: float) -> float:
        """The local wall-clock time of the instant `t`."""
        return t + self.offset(t)

    def utc(self, local: float) -> float:
        """The instant whose local wall-clock time is `local` (a time skipped by a change to
        summer time is read with the offset before it; a repeated one is its first occurrence)."""
        if not self.zone:
            return local - self.fixed_offset_s
        wall = datetime.fromtimestamp(local, timezone.utc).replace(tzinfo=ZoneInfo(self.zone))
        return wall.timestamp()


def as_clock(clock: LocalClock | Policy | int) -> LocalClock:
    """A LocalClock from a policy (its `time_zone`, else its fixed `utc_offset_s`), a clock,
    or a fixed offset in seconds."""
    if isinstance(clock, LocalClock):
        return clock
    if isinstance(clock, Policy):
        return _policy_clock(clock.time_zone, clock.utc_offset_s)
    return _policy_clock("", int(clock))


@lru_cache(maxsize=64)
def _policy_clock(zone: str, fixed_offset_s: int) -> LocalClock:
    return LocalClock(zone, fixed_offset_s)


def next_offpeak(t: float, windows: tuple[OffpeakWindow, ...], clock: LocalClock) -> float | None:
    """The first instant >= `t` inside an off-peak window of the clock's local time (None if
    there are none): `t` itself when a window is open."""
    local = clock.local(t)
    nxt = next_window_start(local, windows)
    if nxt is None:
        return None
    if nxt == local:
        return t
    return max(t, clock.utc(nxt))


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


def clock_text(t: float, now: float, clock: LocalClock | Policy | int) -> str:
    """"22:00" today/tomorrow, else "Thu 03 Dec 22:00", in the policy's local time at `t`."""
    return _minute_text(int(as_clock(clock).local(t) // 60), t - now < 86400)


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
