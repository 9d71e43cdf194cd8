"""Budgets, the audit trail and accounting records in the store (issue 30).

Functions over a `Store` (as store/monitoring.py): the GPU-hour budgets (`budgets` table),
the audit trail of admin actions and policy changes (`audit`), GPU-seconds charged to users
and groups over a period, counting a share of a card by its fraction (from `allocations`),
and per-job accounting records for a period (as `sacct` gives). No engine logic: the rules
(engine/rules.py) decide, this module reads and writes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import or_, select

from . import _writes
from .tables import AllocationRow, AuditRow, BudgetRow, GPUInfoRow, JobRow, JobStatsRow

if TYPE_CHECKING:
    from . import Store

BUDGET_FIELDS = ("gpu_hours", "period", "start", "end", "mode")


# ----------------------------------------------------------------------------- budgets


def load_budgets(store: Store) -> list[dict[str, Any]]:
    """Every stored budget as a dict of its columns."""
    with store.session() as s:
        return [_budget(r) for r in s.scalars(select(BudgetRow)).all()]


def _budget(r: BudgetRow) -> dict[str, Any]:
    return {"scope": r.scope, "name": r.name, "gpu_hours": r.gpu_hours, "period": r.period, "start": r.start,
            "end": r.end, "mode": r.mode, "set_by": r.set_by, "set_at": r.set_at,
            "warned_period": r.warned_period, "warned_level": r.warned_level}


@_writes
def set_budget(store: Store, scope: str, name: str, budget: dict[str, Any] | None, actor: str, now: float
               ) -> dict[str, Any] | None:
    """Store (or with None, remove) a budget, with its audit row, in one transaction; returns
    the budget before (its BUDGET_FIELDS) or None."""
    with store._session.begin() as s:
        row = s.get(BudgetRow, (scope, name))
        before = {k: getattr(row, k) for k in BUDGET_FIELDS} if row is not None else None
        if budget is None:
            if row is not None:
                s.delete(row)
        else:
            if row is None:
                row = BudgetRow(scope=scope, name=name, warned_level=0)
                s.add(row)
            for k in BUDGET_FIELDS:
                setattr(row, k, budget.get(k))
            row.set_by, row.set_at = actor, now
            if before != {k: budget.get(k) for k in BUDGET_FIELDS}:
                row.warned_period, row.warned_level = None, 0  # a new budget warns anew
        s.add(AuditRow(time=now, actor=actor, action="budget", target=f"{scope[:-1]}:{name}", before=before,
                       after=None if budget is None else {k: budget.get(k) for k in BUDGET_FIELDS}))
    return before


@_writes
def set_budget_warned(store: Store, scope: str, name: str, period_start: float, level: int) -> None:
    with store._session.begin() as s:
        row = s.get(BudgetRow, (scope, name))
        if row is not None:
            row.warned_period, row.warned_level = period_start, level


def charged_spans(store: Store, since: float, until: float, now: float
                  ) -> list[tuple[str, str | None, float, float, float]]:
    """(user, group, from, to, fraction of a card) of every allocation overlapping
    [since, until), clipped to it (one still held lasts to `now`); `fraction` is 1 for a whole
    GPU and a share's part of its card otherwise."""
    q = (select(AllocationRow.started_at, AllocationRow.released_at, AllocationRow.share, JobRow.user,
                JobRow.group)
         .join(JobRow, JobRow.id == AllocationRow.job_id)
         .where(AllocationRow.started_at < until,
                or_(AllocationRow.released_at.is_(None), AllocationRow.released_at > since)))
    out = []
    end_now = min(until, now)
    with store.session() as s:
        for started, released, share, user, group in s.execute(q).all():
            a, b = max(since, started), min(until, released if released is not None else end_now)
            if b > a:
                out.append((user, group, a, b, share if share is not None else 1.0))
    return out


@_writes
def add_allocations(store: Store, job_id: int, gpus: list[tuple[str, int, str]], now: float) -> None:
    """Allocations of a job on several hosts (a multi-node job under Slurm: (node, GPU index,
    uuid) each), as `Store.start` records one host's; released with the job's end."""
    with store._session.begin() as s:
        for host, index, uuid in gpus:
            s.add(AllocationRow(job_id=job_id, host=host, gpu_index=index, gpu_uuid=uuid, started_at=now))


# ----------------------------------------------------------------------------- audit


@_writes
def add_audit(store: Store, now: float, actor: str, action: str, target: str,
              before: dict[str, Any] | None, after: dict[str, Any] | None) -> None:
    with store._session.begin() as s:
        s.add(AuditRow(time=now, actor=actor, action=action, target=target[:300], before=before, after=after))


def list_audit(store: Store, since: float, until: float, action: str | None = None, actor: str | None = None,
               limit: int = 1000) -> list[dict[str, Any]]:
    """Audit rows in [since, until), newest first."""
    q = select(AuditRow).where(AuditRow.time >= since, AuditRow.time < until)
    if action:
        q = q.where(AuditRow.action == action)
    if actor:
        q = q.where(AuditRow.actor == actor)
    q = q.order_by(AuditRow.id.desc()).limit(limit)
    with store.session() as s:
        return [{"id": r.id, "time": r.time, "actor": r.actor, "action": r.action, "target": r.target,
                 "before": r.before, "after": r.after} for r in s.scalars(q).all()]


# ----------------------------------------------------------------------------- accounting records

RECORD_FIELDS = ("job_id", "user", "group", "name", "state", "nodes", "gpus", "gpu_type", "gpu_models", "share",
                 "gpu_hours", "memory_max_mb", "wait_s", "submitted_at", "started_at", "ended_at", "host")


def job_records(store: Store, since: float, until: float, now: float,
                user: str | None = None) -> list[dict[str, Any]]:
    """One record per job (of `user`, or everyone's) that held GPUs in [since, until) or was
    submitted in it, oldest first: who, what it asked, the GPU models it got, its GPU-hours in
    the range (every allocation clipped to it, one still held to `now`; a share by its
    fraction), its peak GPU memory, its wait (submission to its last start) and state."""
    alloc_q = (select(AllocationRow.job_id, AllocationRow.gpu_uuid, AllocationRow.started_at,
                      AllocationRow.released_at, AllocationRow.share)
               .where(AllocationRow.started_at < until,
                      or_(AllocationRow.released_at.is_(None), AllocationRow.released_at > since)))
    submitted_q = select(JobRow.id).where(JobRow.submitted_at >= since, JobRow.submitted_at < until)
    if user is not None:  # (a user's export reads only their own rows)
        alloc_q = alloc_q.join(JobRow, JobRow.id == AllocationRow.job_id).where(JobRow.user == user)
        submitted_q = submitted_q.where(JobRow.user == user)
    seconds: dict[int, float] = {}
    uuids: dict[int, set[str]] = {}
    end_now = min(until, now)
    with store.session() as s:
        for job_id, uuid, started, released, share in s.execute(alloc_q).all():
            span = min(until, released if released is not None else end_now) - max(since, started)
            seconds[job_id] = seconds.get(job_id, 0.0) + max(0.0, span) * (share if share is not None else 1.0)
            uuids.setdefault(job_id, set()).add(uuid)
        ids = set(seconds) | set(s.scalars(submitted_q).all())
        models = {u: n for u, n in s.execute(select(GPUInfoRow.uuid, GPUInfoRow.name)).all()}
        rows = []
        id_list = sorted(ids)
        for i in range(0, len(id_list), 500):
            chunk = id_list[i:i + 500]
            q = (select(JobRow, JobStatsRow.memory_max_mb).outerjoin(JobStatsRow, JobStatsRow.job_id == JobRow.id)
                 .where(JobRow.id.in_(chunk)))
            rows.extend(s.execute(q).all())
    out = []
    for job, memory_max in sorted(rows, key=lambda r: r[0].id):
        out.append({
            "job_id": job.id, "user": job.user, "group": job.group, "name": job.name, "state": job.state,
            "nodes": job.nodes or 1, "gpus": job.gpus, "gpu_type": job.gpu_type,
            "gpu_models": sorted({models.get(u, "unknown") for u in uuids.get(job.id, ())}),
            "share": job.share, "gpu_hours": round(seconds.get(job.id, 0.0) / 3600.0, 6),
            "memory_max_mb": memory_max,
            "wait_s": round(max(0.0, job.started_at - job.submitted_at), 3) if job.started_at is not None else None,
            "submitted_at": job.submitted_at, "started_at": job.started_at, "ended_at": job.ended_at,
            "host": job.host,
        })
    return out


def records_csv(records: list[dict[str, Any]]) -> str:
    """The records as CSV with a header (GPU models joined by "+"). A text that a spreadsheet
    would take for a formula (=, +, -, @, a tab or CR first: a job's name is its user's) gets
    a ' before it: an admin who opened the export ran what the user had named the job."""
    import csv
    import io

    def cell(value: Any) -> Any:
        if value is None:
            return ""
        if isinstance(value, str) and value[:1] in _FORMULA_FIRST:
            return "'" + value
        return value

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(RECORD_FIELDS)
    for r in records:
        w.writerow([cell("+".join(r[k])) if k == "gpu_models" else cell(r[k]) for k in RECORD_FIELDS])
    return buf.getvalue()


#: What a spreadsheet reads as the start of a formula (OWASP's "CSV injection")
_FORMULA_FIRST = frozenset("=+-@\t\r")


__all__ = ["BUDGET_FIELDS", "RECORD_FIELDS", "add_allocations", "add_audit", "charged_spans", "job_records", "list_audit",
           "load_budgets", "records_csv", "set_budget", "set_budget_warned"]
