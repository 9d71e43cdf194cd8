"""Rows to model objects and back: a job row to a `Job`, a reservation row to a
`Reservation`, a job's fields to its columns, `NewJobs` (one submission to store), `Event`, and
the bulk insert of many rows in one statement per driver (`_insert_rows`).

May call: `model`, `tables`, SQLAlchemy. It opens no session: the store's methods do."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from operator import itemgetter
from typing import Any

from sqlalchemy import Table, insert
from sqlalchemy.engine import Connection, Dialect

from ...model import Dependency, Job, JobState, Reservation
from .tables import JobRow, ReservationRow


@dataclass(frozen=True)
class NewJobs:
    """One submission to store: its jobs' fields, who submitted it (the event's actor) and when.
    With `array`, the jobs are the tasks of one array job, whose id is its first task's id."""

    specs: Sequence[dict[str, Any]]
    actor: str
    now: float
    array: bool = False


class Event(dict):
    """An event row as a plain dict: id, job_id, time, state, actor, reason, data."""



def _to_job(row: JobRow) -> Job:
    return Job(
        id=row.id,
        user=row.user,
        command=list(row.command or []),
        kind=row.kind,
        name=row.name,
        gpus=row.gpus,
        gpu_type=row.gpu_type,
        time_limit_s=row.time_limit_s,
        priority=row.priority,
        group=row.group,
        preemptible=row.preemptible,
        requeue=row.requeue,
        begin=row.begin,
        offpeak=row.offpeak,
        depends=tuple(Dependency(d["kind"], int(d["job_id"])) for d in (row.depends or [])),
        array_job_id=row.array_job_id,
        array_index=row.array_index,
        array_max_running=row.array_max_running,
        cwd=row.cwd,
        env=dict(row.env or {}),
        payload=dict(row.payload or {}),
        mem_bytes=row.mem_bytes,
        cpus=row.cpus,
        share=row.share,
        gpu_memory=row.gpu_memory,
        nodes=row.nodes or 1,
        image=row.image,
        state=JobState(row.state),
        submitted_at=row.submitted_at,
        started_at=row.started_at,
        ended_at=row.ended_at,
        host=row.host,
        assigned_gpus=tuple(row.assigned_gpus or ()),
        borrowed=row.borrowed,
        exit_code=row.exit_code,
        signal=row.signal,
        reason=row.reason or "",
        run_seconds=row.run_seconds or 0.0,
        restarts=row.restarts or 0,
        warn_signal=row.warn_signal,
        max_requeues=row.max_requeues,
        requeues=row.requeues or 0,
        retries=row.retries or 0,
        retry_backoff_s=row.retry_backoff_s if row.retry_backoff_s is not None else 30,
        retry_oom=bool(row.retry_oom),
        held=bool(row.held),
        retried=row.retried or 0,
    )


_ROW_FIELDS = {
    "user", "name", "kind", "command", "gpus", "gpu_type", "time_limit_s", "priority", "group",
    "preemptible", "requeue", "begin", "offpeak", "array_job_id", "array_index",
    "array_max_running", "cwd", "env", "payload", "mem_bytes", "cpus", "share", "gpu_memory", "nodes", "state", "submitted_at", "started_at", "ended_at",
    "host", "assigned_gpus", "borrowed", "exit_code", "signal", "reason", "run_seconds", "restarts",
    "warn_signal", "max_requeues", "requeues", "image",
    "runner_handle", "log_path", "retries", "retry_backoff_s", "retry_oom", "held", "retried",
}


def _to_reservation(r: ReservationRow) -> Reservation:
    return Reservation(id=r.id, gpus=r.gpus, start=r.start, duration_s=r.duration_s, name=r.name or "",
                       gpu_type=r.gpu_type, host=r.host, repeat=r.repeat, users=tuple(r.users or ()),
                       groups=tuple(r.groups or ()), created_by=r.created_by, created_at=r.created_at)


def _row_values(fields: dict[str, Any]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for key, value in fields.items():
        if key == "depends":
            values["depends"] = [{"kind": d.kind, "job_id": d.job_id} for d in value]
        elif key == "state":
            values["state"] = JobState(value).value
        elif key == "assigned_gpus":
            values["assigned_gpus"] = list(value)
        elif key in _ROW_FIELDS:
            values[key] = value
        else:
            raise KeyError(f"not a stored job field: {key}")
    return values


def _columns(values: dict[str, Any]) -> dict[str, Any]:
    """ORM attribute names -> table column names (only `group` differs)."""
    out = dict(values)
    if "group" in out:
        out["group_name"] = out.pop("group")
    return out


def _job_from_values(v: dict[str, Any]) -> Job:
    from types import SimpleNamespace

    fields = {c: None for c in _ROW_FIELDS}
    fields.update(v)
    return _to_job(SimpleNamespace(**fields))  # type: ignore[arg-type]


@cache
def _driver_insert_plan(table: Table, dialect: Dialect
                        ) -> tuple[str, Callable[[dict[str, Any]], tuple[Any, ...]], list[tuple[int, Callable[[Any], Any]]]]:
    """An INSERT of every column but the id, compiled by SQLAlchemy for this dialect; a getter
    of a row's values in its parameter order; and the bind processors to apply (position,
    processor), as SQLAlchemy would apply them (JSON columns serialise)."""
    compiled = insert(table).compile(dialect=dialect, column_keys=[c.name for c in table.columns if c.name != "id"])
    assert compiled.positiontup is not None  # SQLite's qmark style
    keys = list(compiled.positiontup)
    processors = [(n, table.c[key].type.dialect_impl(dialect).bind_processor(dialect)) for n, key in enumerate(keys)]
    return compiled.string, itemgetter(*keys), [(n, proc) for n, proc in processors if proc is not None]


def _insert_rows(conn: Connection, table: Table, rows: list[dict[str, Any]], ids: bool = False) -> Sequence[int]:
    """Insert rows, each with every column but the id; with `ids`, return their new ids in the
    rows' order. On SQLite (the submit path) with one executemany on the DBAPI cursor, inside
    the connection's transaction, converting values as SQLAlchemy would: `Connection.execute`
    cost more than SQLite's own work, even `exec_driver_sql`'s execution context and result
    added 12-27 % to a batch of 16 to 1 submissions, and SQLite has no RETURNING whose rows
    follow the parameters, so SQLAlchemy would run one INSERT per row. The transaction holds
    the database's only write lock, so the rows take consecutive ids, in order. Other
    databases: Core, with RETURNING in parameter order."""
    if conn.dialect.name != "sqlite":
        if not ids:
            conn.execute(insert(table), rows)
            return ()
        returning = insert(table).returning(table.c.id, sort_by_parameter_order=True)
        return conn.execute(returning, rows).scalars().all()
    sql, values_of, processors = _driver_insert_plan(table, conn.dialect)
    params = []
    for row in rows:
        values = list(values_of(row))
        for n, process in processors:
            values[n] = process(values[n])
        params.append(tuple(values))
    cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        cursor.executemany(sql, params)
        if not ids:
            return ()
        last = cursor.execute("SELECT last_insert_rowid()").fetchone()[0]
    finally:
        cursor.close()
    return range(last - len(rows) + 1, last + 1)
