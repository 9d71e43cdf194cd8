"""Learned reservations: recurring demand in the job history, and the quiet hours.

Pure, no I/O and no clock (every input is a plain value):

- `find_habits`: the same user or group asking for similar GPUs (same count bracket and
  type) on the same weekday and hour in at least `min_weeks` different weeks, still recently
  (its last week is one of the last two). Consecutive such hours are one window; its end is
  the typical end of that demand (median over the weeks of when its last job ended) and its
  size the typical peak of GPUs in use at once. Each `Habit` is proposed as a weekly
  reservation (`proposal_finding`) unless a reservation of that holder covers it already.
  Someone who asks like that in more than `max_share` of the week's hours has no habit but
  steady demand (a quota or guarantee fits it, not a reservation): nothing is proposed.
- `quiet_windows`: the hours of the weekday x hour utilization heatmap that stay below a
  threshold on every day with readings, as off-peak windows to suggest.

Times are in the policy's local time (`clock`: the zone's real offset at each instant, or a fixed
offset in seconds), as off-peak windows and reasons.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from statistics import median
from typing import Any

from ...model import Job, Reservation
from ..scheduler.deferral import LocalClock, as_clock
from ..scheduler.reservations import occurrences_between
from .diagnosis import Finding

WEEK_S = 7 * 86400
WEEKDAY_NAMES = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


@dataclass(frozen=True)
class Habit:
    """Recurring demand of one user or group: `gpus` GPUs of `gpu_type` on `weekday`
    (0 = Monday) from `start_hour` to `end_hour` (local; end <= start + 24), seen in `weeks`
    different weeks of the history."""

    kind: str  # "user" | "group"
    name: str
    gpu_type: str | None
    weekday: int
    start_hour: int
    end_hour: int
    gpus: int
    weeks: int
    next_start: float  # epoch seconds of the next such window after `now`

    @property
    def holder(self) -> str:
        return f"{self.kind} {self.name}"

    @property
    def key(self) -> str:
        return f"habit:{self.kind}:{self.name}:{self.gpu_type or '-'}:{self.weekday}:{self.start_hour}"

    def window_text(self) -> str:
        return f"every {WEEKDAY_NAMES[self.weekday]} {self.start_hour:02d}:00–{self.end_hour % 24:02d}:00"

    def reservation_body(self) -> dict[str, Any]:
        """What `model.validate_reservation` takes to reserve it."""
        body: dict[str, Any] = {"gpus": self.gpus, "start": self.next_start,
                                "duration": (self.end_hour - self.start_hour) * 3600, "repeat": "weekly",
                                "name": f"{self.name}-{WEEKDAY_NAMES[self.weekday][:3].lower()}"}
        if self.gpu_type:
            body["gpu_type"] = self.gpu_type
        body["users" if self.kind == "user" else "groups"] = [self.name]
        return body


def _size_bracket(gpus: int) -> int:
    """Similar jobs: 1, 2, 3-4, 5-8, ... GPUs."""
    return 0 if gpus <= 1 else math.ceil(math.log2(gpus))


def _demand_end(j: Job) -> float:
    """When the demand of a job ends had it started at once: its submission plus its time
    limit (a holder's job starts inside a reservation only when its limit ends in it), or
    plus its runtime when it ran longer or had no limit (then an hour if it did not run)."""
    ran = j.ended_at - j.started_at if j.started_at is not None and j.ended_at is not None else 0.0
    return j.submitted_at + max(ran, float(j.time_limit_s or (0 if ran else 3600)))


def _peak(intervals: list[tuple[float, float, int]]) -> int:
    """The most GPUs in use at once over (start, end, gpus) intervals."""
    events = sorted([(s, g) for s, _, g in intervals] + [(e, -g) for _, e, g in intervals], key=lambda x: (x[0], x[1]))
    peak = cur = 0
    for _, d in events:
        cur += d
        peak = max(peak, cur)
    return peak


def find_habits(jobs: Iterable[Job], now: float, utc_offset_s: LocalClock | int = 0, min_weeks: int = 3,
                lookback_weeks: int = 8, max_share: float = 0.25) -> list[Habit]:
    """Recurring demand in the history of ended (or running) jobs (see the module docstring).
    `utc_offset_s`: the local clock (or a fixed offset in seconds)."""
    clock = as_clock(utc_offset_s)
    since = now - lookback_weeks * WEEK_S
    this_week = int(clock.local(now) // 86400 + 3) // 7
    # (kind, name, type, bracket, weekday, hour) -> week -> jobs
    cells: dict[tuple[str, str, str | None, int, int, int], dict[int, list[Job]]] = {}
    for j in jobs:
        if j.gpus < 1 or not since <= j.submitted_at <= now:
            continue
        local = clock.local(j.submitted_at)
        day = int(local // 86400)
        week, weekday, hour = (day + 3) // 7, (day + 3) % 7, int(local % 86400 // 3600)
        kind, name = ("group", j.group) if j.group else ("user", j.user)
        key = (kind, name, j.gpu_type, _size_bracket(j.gpus), weekday, hour)
        cells.setdefault(key, {}).setdefault(week, []).append(j)
    frequent = {k: v for k, v in cells.items() if len(v) >= min_weeks and max(v) >= this_week - 2}
    hours: dict[tuple[str, str, str | None, int], int] = {}  # how many of the week's hours each asks in
    for key in frequent:
        hours[key[:4]] = hours.get(key[:4], 0) + 1
    frequent = {k: v for k, v in frequent.items() if hours[k[:4]] <= max_share * 168}
    habits: list[Habit] = []
    for key in sorted(frequent, key=lambda k: (k[0], k[1], str(k[2]), k[3], k[4], k[5])):
        kind, name, gtype, bracket, weekday, hour = key
        if (kind, name, gtype, bracket, weekday, hour - 1) in frequent:
            continue  # not the first hour of its window
        run: dict[int, list[Job]] = {}
        h = hour
        while (kind, name, gtype, bracket, weekday, h) in frequent and h < 24:
            for week, js in frequent[(kind, name, gtype, bracket, weekday, h)].items():
                run.setdefault(week, []).extend(js)
            h += 1
        ends, peaks = [], []
        for week, js in run.items():
            day_start = clock.utc((week * 7 + weekday - 3) * 86400.0)  # epoch of that local midnight
            ends.append((max(_demand_end(j) for j in js) - day_start) / 3600)
            peaks.append(_peak([(j.submitted_at, _demand_end(j), j.gpus) for j in js]))
        end_hour = min(hour + 24, max(h, math.ceil(median(ends) - 1e-9)))
        gpus = int(median(sorted(peaks)))
        if gpus < 1:
            continue
        # the next such window after now
        day = int(clock.local(now) // 86400)
        ahead = (weekday - (day + 3) % 7) % 7
        start = clock.utc((day + ahead) * 86400.0 + hour * 3600)
        if start <= now:
            start = clock.utc((day + ahead + 7) * 86400.0 + hour * 3600)
        habits.append(Habit(kind, name, gtype, weekday, hour, end_hour, gpus, len(run), start))
    return habits


def covered(h: Habit, reservations: Sequence[Reservation]) -> bool:
    """Does a reservation of this holder already overlap the habit's next window?"""
    t0, t1 = h.next_start, h.next_start + (h.end_hour - h.start_hour) * 3600
    for r in reservations:
        if r.holds(h.name, None) if h.kind == "user" else h.name in r.groups:
            if occurrences_between(r, t0, t1):
                return True
    return False


def proposal_finding(h: Habit) -> Finding:
    """A `reservation_proposal` finding: "group vision trains on 4 A100 every Friday
    09:00–13:00 (4 of the last weeks); reserve them?" (accepted with one action)."""
    what = f"{h.gpus} {h.gpu_type or 'GPU'}{'s' if h.gpus > 1 and not h.gpu_type else ''}"
    message = (f"{h.holder} runs jobs on {what} {h.window_text()} ({h.weeks} weeks seen); reserve them? "
               f"(jupyter gpujobs reserve --accept <this finding's id>)")
    return Finding("reservation_proposal", h.key, message, "info", user=h.name if h.kind == "user" else None,
                   data={"reservation": h.reservation_body(), "holder": h.holder, "weeks": h.weeks,
                         "group": h.name if h.kind == "group" else None})


def quiet_windows(utilization: Sequence[Sequence[float | None]], threshold: float = 20.0,
                  min_hours: int = 3) -> list[tuple[int, int]]:
    """Hours of the day [start, end) (end may pass 24) whose utilization stays below
    `threshold` percent on every weekday with readings: the off-peak windows to suggest, at
    least `min_hours` long. `utilization`: 7 x 24 (weekday x local hour), None where unread."""
    quiet = []
    for hour in range(24):
        seen = [row[hour] for row in utilization if row[hour] is not None]
        quiet.append(bool(seen) and max(seen) < threshold)  # type: ignore[type-var]
    if all(quiet):
        return [(0, 24)]
    out: list[tuple[int, int]] = []
    start = next(h for h in range(24) if not quiet[h]) + 1  # begin after a busy hour, so windows wrap whole
    h = 0
    while h < 24:
        hh = (start + h) % 24
        if quiet[hh]:
            length = 0
            while length < 24 and quiet[(hh + length) % 24]:
                length += 1
            if length >= min_hours:
                out.append((hh, hh + length))
            h += length
        else:
            h += 1
    return sorted(out)


def offpeak_finding(windows: list[tuple[int, int]], threshold: float) -> Finding | None:
    """An `offpeak_suggestion` finding for the admins, with the config line to use."""
    if not windows:
        return None
    text = ", ".join(f"{s:02d}:00–{e % 24:02d}:00" for s, e in windows)
    config = ", ".join(f'"mon-sun {s:02d}:00-{e % 24:02d}:00"' for s, e in windows)
    message = (f"the GPUs are quiet (under {threshold:.0f} % busy every day) {text}; make these the off-peak "
               f"hours: c.GPUJobs.offpeak_windows = [{config}]")
    return Finding("offpeak_suggestion", "offpeak:" + text, message, "info",
                   data={"windows": [{"start_hour": s, "end_hour": e} for s, e in windows], "threshold": threshold})


__all__ = ["Habit", "covered", "find_habits", "offpeak_finding", "proposal_finding", "quiet_windows"]
