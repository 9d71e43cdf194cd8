"""Read-only queries over the jobs and allocations tables that usage reports, runtime
prediction, habits and advice need: who held which GPUs when, a user's runs of a job alike,
finished runtimes, the queue's waits and spans. Each takes a `Store`; nothing here writes.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import or_, select

from . import Store
from .tables import AllocationRow, JobRow

__all__ = ["allocations_between", "jobs_like", "finished_runtimes", "jobs_since", "wait_times", "queue_spans"]


def allocations_between(store: Store, since: float, until: float) -> list[dict[str, Any]]:
    """GPU allocations overlapping [since, until) with their job's user and group, and the part
    of the card each held (`share`: 1.0 for a whole GPU)."""
    q = (select(AllocationRow.job_id, AllocationRow.host, AllocationRow.gpu_index, AllocationRow.gpu_uuid,
                AllocationRow.started_at, AllocationRow.released_at, JobRow.user, JobRow.group,
                AllocationRow.share)
         .join(JobRow, JobRow.id == AllocationRow.job_id)
         .where(AllocationRow.started_at < until,
                or_(AllocationRow.released_at.is_(None), AllocationRow.released_at > since)))
    with store.session() as s:
        return [{"job_id": j, "host": h, "gpu_index": i, "gpu_uuid": u, "started_at": a, "released_at": r,
                 "user": user, "group": group, "share": share if share is not None else 1.0}
                for j, h, i, u, a, r, user, group, share in s.execute(q).all()]


def jobs_like(store: Store, user: str, name: str, ended_by: float, limit: int = 50) -> list[Any]:
    """The user's jobs with this name that ended by `ended_by` (epoch s), the latest end first,
    as `model.Job`s. By end, not by id: jobs submitted together end in any order, and "failed
    N times in a row" is about the runs as they ended."""
    from . import _to_job

    finals = ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "LOST"]
    # every ended job has its end time (a NULL one never matches <=), so the latest come straight
    # off the index on (user, name, ended_at): the monitor asks this at every job's end, and
    # sorting all of a user's same-named jobs took 16 ms with 5,000 of them (bench_dispatch and
    # chaos_load run arrays of one name)
    q = (select(JobRow).where(JobRow.user == user, JobRow.name == name, JobRow.ended_at <= ended_by,
                              JobRow.state.in_(finals))
         .order_by(JobRow.ended_at.desc(), JobRow.id.desc()).limit(limit))
    with store.session() as s:
        return [_to_job(r) for r in s.scalars(q).all()]


def finished_runtimes(store: Store, limit: int = 50_000) -> list[Any]:
    """The most recent ended jobs that ran, oldest first, as `model.Job`s (runtime history)."""
    from . import _to_job

    q = (select(JobRow).where(JobRow.started_at.is_not(None) | (JobRow.run_seconds > 0),
                              JobRow.state.in_(["COMPLETED", "FAILED", "TIMEOUT", "CANCELLED"]),
                              JobRow.ended_at.is_not(None))
         .order_by(JobRow.ended_at.desc()).limit(limit))
    with store.session() as s:
        rows = s.scalars(q).all()
    return [_to_job(r) for r in reversed(rows)]


def jobs_since(store: Store, since: float, limit: int = 200_000) -> list[Any]:
    """The jobs submitted since then that asked for GPUs, as `model.Job`s (demand history)."""
    from . import _to_job

    q = (select(JobRow).where(JobRow.submitted_at >= since, JobRow.gpus > 0)
         .order_by(JobRow.id.desc()).limit(limit))
    with store.session() as s:
        return [_to_job(r) for r in s.scalars(q).all()]


def wait_times(store: Store, limit: int = 100_000) -> list[float]:
    """Seconds from submission to (last) start of the jobs that started."""
    q = (select(JobRow.submitted_at, JobRow.started_at).where(JobRow.started_at.is_not(None))
         .order_by(JobRow.id.desc()).limit(limit))
    with store.session() as s:
        return [max(0.0, b - a) for a, b in s.execute(q).all()]


def queue_spans(store: Store, since: float, until: float, limit: int = 200_000) -> list[tuple[float, float | None, float | None]]:
    """(submitted_at, started_at, ended_at) of the jobs that may have waited in [since, until):
    submitted before `until`, and neither started nor ended before `since`. `started_at` is a
    job's last start (a requeued job counts as waiting from its submission to then)."""
    q = (select(JobRow.submitted_at, JobRow.started_at, JobRow.ended_at)
         .where(JobRow.submitted_at < until,
                or_(JobRow.started_at.is_(None), JobRow.started_at >= since),
                or_(JobRow.ended_at.is_(None), JobRow.ended_at >= since))
         .order_by(JobRow.id.desc()).limit(limit))
    with store.session() as s:
        return [(a, b, c) for a, b, c in s.execute(q).all()]
