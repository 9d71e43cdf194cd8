"""Right-sizing advice: what a user's own finished jobs of the same name (a notebook job is
named after its notebook) really used - peak GPU memory and mean GPU utilization from the
monitor's per-job statistics, and run time - against what a request asks for, and the smaller
request that would have been enough ("used <= 18 GB and ran <= 40m of 4h: a 0.25 share with 1h
would start now"). Advice never changes a request: it is shown at a what-if (`POST
jobs?dry_run=1`) and to a job's owner in `GET jobs/<id>`.

Privacy: only the asking user's own jobs are read (`jobs_like` filters by user); the caller
shows a job's advice to its owner only.

`history` reads the store (the jobs and their statistics, in one query); `advise` is pure. May
call the store and its tables, and the model; the start of the suggestion is the caller's
(`whatif`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select

from ..model import JobState, format_duration
from .store import Store
from .store.tables import JobRow, JobStatsRow

#: How many of the latest finished runs of the same name are read.
RUNS = 20
#: Room kept above what the runs used: memory x 1.25, run time x 1.5.
MEMORY_ROOM = 1.25
TIME_ROOM = 1.5
#: The shares advice may suggest for a job of one whole GPU, smallest first.
SHARES = (0.25, 0.5)


@dataclass(frozen=True)
class Run:
    """One finished run of the name: how long it ran (all its runs), and the monitor's
    statistics (None where it took no sample)."""

    job_id: int
    seconds: float
    memory_max_mb: float | None
    utilization_mean: float | None


def history(store: Store, user: str, name: str, before: float) -> list[Run]:
    """`user`'s own latest jobs named `name` that completed by `before`, with their GPU use.
    One indexed query (user, name, end) joined with the statistics: it runs at every what-if,
    and the ORM's job objects cost five times as much as these few columns."""
    if not name:
        return []
    q = (select(JobRow.id, JobRow.started_at, JobRow.ended_at, JobRow.run_seconds, JobStatsRow.memory_max_mb,
                JobStatsRow.utilization_mean)
         .outerjoin(JobStatsRow, JobStatsRow.job_id == JobRow.id)
         .where(JobRow.user == user, JobRow.name == name, JobRow.ended_at <= before,
                JobRow.state == JobState.COMPLETED.value, JobRow.started_at.is_not(None))
         .order_by(JobRow.ended_at.desc(), JobRow.id.desc()).limit(RUNS))
    with store.session() as s:
        rows = s.execute(q).all()
    return [Run(r.id, (r.run_seconds or 0.0) + max(0.0, r.ended_at - r.started_at), r.memory_max_mb,
                r.utilization_mean) for r in rows]


def advise(gpus: int, share: float | None, gpu_memory: int | None, time_limit_s: int, runs: Sequence[Run],
           card_mb: int | None) -> dict[str, Any] | None:
    """What the runs used against the request (`gpus`, `share`, `gpu_memory`, `time_limit_s`
    on cards of `card_mb`), and a smaller request that would have held each of them (None
    when there is no run). `suggest` holds only the fields that change."""
    if not runs:
        return None
    longest = max(r.seconds for r in runs)
    peaks = [r.memory_max_mb for r in runs if r.memory_max_mb is not None]
    utils = [r.utilization_mean for r in runs if r.utilization_mean is not None]
    peak_mb = max(peaks) if peaks else None
    util = sum(utils) / len(utils) if utils else None
    suggest: dict[str, Any] = {}
    limit = nice_limit(longest * TIME_ROOM)
    if limit * 2 <= time_limit_s:
        suggest["time_limit_s"] = limit
    whole_one = gpus == 1 and share is None and gpu_memory is None
    if whole_one and card_mb and peak_mb is not None and util is not None:
        fit = next((f for f in SHARES if peak_mb * MEMORY_ROOM <= f * card_mb and util <= f * 100 + 10), None)
        if fit is not None:
            suggest["gpus"] = fit
    used = []
    if peak_mb is not None:
        used.append(f"used <= {_gb(peak_mb)}")
    used.append(f"ran <= {format_duration(longest)} of {format_duration(time_limit_s)}")
    if util is not None:
        used.append(f"mean GPU use {util:.0f}%")
    return {
        "runs": len(runs), "job_ids": [r.job_id for r in runs][:5], "peak_gpu_memory_mb": peak_mb,
        "mean_utilization": None if util is None else round(util, 1), "longest_run_s": round(longest, 1),
        "suggest": suggest or None, "used": ", ".join(used), "text": advice_text(len(runs), ", ".join(used), suggest),
    }


def advice_text(runs: int, used: str, suggest: Mapping[str, Any] | None, when: str | None = None) -> str:
    """"3 earlier runs: used <= 18 GB, ran <= 40m of 4h: a 0.25 share with 1h would start now"."""
    head = f"{runs} earlier run{'s' if runs > 1 else ''}: {used}"
    if not suggest:
        return f"{head}: the request fits what they used"
    return f"{head}: {suggestion_text(suggest)} would {'start ' + when if when else 'do'}"


def suggestion_text(suggest: Mapping[str, Any]) -> str:
    """`{"gpus": 0.25, "time_limit_s": 3600}` -> `"a 0.25 share with 1h"`."""
    parts = []
    if "gpus" in suggest:
        parts.append(f"a {suggest['gpus']:g} share")
    if "time_limit_s" in suggest:
        parts.append(f"{'with ' if parts else 'a time limit of '}{format_duration(suggest['time_limit_s'])}")
    return " ".join(parts)


def nice_limit(seconds: float) -> int:
    """A time limit a person would write, at least `seconds`: 10-minute steps up to an hour,
    half hours up to 4 hours, then hours."""
    step = 600 if seconds <= 3600 else 1800 if seconds <= 4 * 3600 else 3600
    return max(600, int(math.ceil(seconds / step)) * step)


def _gb(mb: float) -> str:
    gb = mb / 1024
    return f"{gb:.1f} GB" if gb < 10 else f"{gb:.0f} GB"
