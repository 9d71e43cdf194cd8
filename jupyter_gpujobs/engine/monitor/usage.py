"""Usage reports: GPU-hours by user, group or GPU model over a time range (from the
allocations and jobs tables), a utilization heatmap by weekday x hour of local time
(from the stored GPU samples), and the queue's length and wait times over time. Their text forms for `jupyter gpujobs usage` are in text.py.

GPU-hours count every allocated GPU from its allocation to its release (or to `until` /
now for one still held), clipped to the range. A heatmap cell is the mean utilization of
every GPU reading whose bucket starts in that weekday and local hour, weighted by the number
of raw readings behind it; an empty cell is None.
"""

from __future__ import annotations

import math
import re
import time
from bisect import bisect_right
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ...model import InvalidInput, parse_duration

if TYPE_CHECKING:
    from ..store import Store

BY = ("user", "group", "model")
WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


def parse_time(value: str | float | None, now: float, field: str, default: float) -> float:
    """Epoch seconds from `1767225600`, an ISO date or time (`2026-03-01`, `2026-03-01T12:00`,
    local time unless it says its zone), `now`, or a duration before now (`7d`, `12h`).
    The time must lie between 1970 and the year 3000 (NaN, Infinity and the like are refused)."""
    if value is None or value == "":
        return default
    when = _read_time(value, now, field)
    if not 0 <= when <= _YEAR_3000:  # also False for NaN
        raise InvalidInput(field, f"{str(value)[:40]!r} is not a time between 1970 and 3000")
    return when


_YEAR_3000 = 32503680000.0


def _read_time(value: str | float, now: float, field: str) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip()[:100]
    if text == "now":
        return now
    if re.fullmatch(r"-?[0-9]+(\.[0-9]+)?", text):
        return float(text)
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except (ValueError, OverflowError, OSError):
        pass
    try:
        return now - parse_duration(text.lstrip("-"), field)
    except InvalidInput:
        raise InvalidInput(field, f"cannot read {text[:40]!r}; use epoch seconds, a date such as 2026-03-01, "
                                  "or a duration before now such as 7d") from None


def time_range(since: str | float | None, until: str | float | None, now: float,
               default_span_s: float = 7 * 86400) -> tuple[float, float]:
    end = parse_time(until, now, "until", now)
    start = parse_time(since, now, "since", end - default_span_s)
    if start >= end:
        raise InvalidInput("since", "must be before until")
    return start, end


def usage_report(store: Store, since: float, until: float, by: str, now: float) -> dict[str, Any]:
    """`{"since", "until", "by", "rows": [{"key", "gpu_hours", "jobs"}], "total_gpu_hours"}`,
    biggest first."""
    from ..store import history
    from ..store import monitoring as mstore

    if by not in BY:
        raise InvalidInput("by", f"expected one of {', '.join(BY)}, got {by!r}")
    models = mstore.gpu_models(store) if by == "model" else {}
    hours: dict[str, float] = {}
    jobs: dict[str, set[int]] = {}
    end_now = min(until, now)
    for a in history.allocations_between(store, since, until):
        start = max(since, a["started_at"])
        end = min(until, a["released_at"] if a["released_at"] is not None else end_now)
        if end <= start:
            continue
        if by == "user":
            key = a["user"]
        elif by == "group":
            key = a["group"] or "(none)"
        else:
            key = models.get(a["gpu_uuid"], "unknown")
        # a share counts by its part of the card, as budgets and accounting count it
        hours[key] = hours.get(key, 0.0) + (end - start) * a["share"] / 3600.0
        jobs.setdefault(key, set()).add(a["job_id"])
    rows = [{"key": k, "gpu_hours": round(v, 4), "jobs": len(jobs[k])}
            for k, v in sorted(hours.items(), key=lambda kv: (-kv[1], kv[0]))]
    return {"since": since, "until": until, "by": by, "rows": rows,
            "total_gpu_hours": round(sum(hours.values()), 4)}


def heatmap_report(store: Store, since: float, until: float) -> dict[str, Any]:
    """`{"since", "until", "timezone", "weekdays", "hours", "utilization": 7x24 (None where no
    reading), "samples": 7x24 counts}` in the server's local time."""
    from ..store import monitoring as mstore

    total = [[0.0] * 24 for _ in range(7)]
    count = [[0] * 24 for _ in range(7)]
    for _, _, t, _, util, n in mstore.utilization_buckets(store, since, until):
        local = time.localtime(t)
        total[local.tm_wday][local.tm_hour] += util * n
        count[local.tm_wday][local.tm_hour] += n
    cells = [[round(total[d][h] / count[d][h], 2) if count[d][h] else None for h in range(24)] for d in range(7)]
    return {"since": since, "until": until, "timezone": time.strftime("%Z") or "local",
            "weekdays": list(WEEKDAYS), "hours": list(range(24)), "utilization": cells, "samples": count}


MAX_POINTS = 2000


def check_step(step: int, since: float, until: float) -> None:
    """A time series of at most MAX_POINTS buckets of `step` seconds over [since, until)."""
    if step < 1:
        raise InvalidInput("step", "must be at least 1 second")
    if (until - since) / step > MAX_POINTS:
        raise InvalidInput("step", f"{step}s buckets over {until - since:.0f}s would make more than {MAX_POINTS} "
                                   f"points; use a step of at least {math.ceil((until - since) / MAX_POINTS)}s")


def queue_report(store: Store, since: float, until: float, step: int, now: float) -> dict[str, Any]:
    """`{"since", "until", "step", "points": [{"time", "queue_length", "started", "wait_mean_s",
    "wait_p90_s"}]}`: per bucket of `step` seconds from `since` (up to now), the jobs waiting
    at its end (or now), and the jobs that started in it with their mean and 90th-percentile
    wait (None when none started)."""
    from ..store import history

    check_step(step, since, until)
    spans = history.queue_spans(store, since, until)
    subs = sorted(a for a, _, _ in spans)
    leaves = sorted(max(a, b if b is not None else (c if c is not None else math.inf)) for a, b, c in spans)
    waits: dict[int, list[float]] = {}
    for submitted, started, _ in spans:
        if started is not None and since <= started < until:
            waits.setdefault(int((started - since) // step), []).append(max(0.0, started - submitted))
    points = []
    k = 0
    while since + k * step < min(until, now):
        at = min(since + (k + 1) * step, until, now)
        w = sorted(waits.get(k, []))
        points.append({"time": since + k * step,
                       "queue_length": bisect_right(subs, at) - bisect_right(leaves, at),
                       "started": len(w),
                       "wait_mean_s": round(sum(w) / len(w), 1) if w else None,
                       "wait_p90_s": round(w[min(len(w) - 1, math.ceil(0.9 * len(w)) - 1)], 1) if w else None})
        k += 1
    return {"since": since, "until": until, "step": step, "points": points}


__all__ = ["BY", "WEEKDAYS", "check_step", "heatmap_report", "parse_time", "queue_report", "time_range",
           "usage_report"]
