"""The store: the one place jobs, events and allocations are kept (SQLAlchemy 2).

SQLite in WAL mode in the Jupyter data dir by default; any SQLAlchemy URL (PostgreSQL) by
config. The schema is created and upgraded by alembic (`migrate()`), from the first table on.
Every state change of a job goes through `transition()`, which writes the job and its event
row in one transaction, so the audit log never disagrees with the jobs table. No scheduling
logic lives here.
"""

from __future__ import annotations

import errno
import functools
import os
import stat
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from operator import itemgetter
from pathlib import Path
from typing import Any

from sqlalchemy import Table, and_, create_engine, event, func, insert, or_, select, update
from sqlalchemy.engine import Connection, Dialect, Engine
from sqlalchemy.orm import Session, sessionmaker

from ...model import HELD, Dependency, Job, JobState, Reservation
from .tables import AllocationRow, Base, EventRow, JobRow, QuotaChangeRow, QuotaRow, ReservationRow, UsageRow

__all__ = ["Store", "Event", "NewJobs", "GPUAlreadyAllocated", "SchemaTooNew", "StoreUnavailable", "StoreUnreachable",
           "store_trouble"]

MIGRATIONS = Path(__file__).parent / "migrations"


class SchemaTooNew(RuntimeError):
    """The database was written by a newer jupyter-gpujobs: its schema revision is unknown here."""


class GPUAlreadyAllocated(RuntimeError):
    """Refused: the GPU is held by another job (the unique index said no)."""


class StoreUnavailable(RuntimeError):
    """Nothing can be written: the disk under the store (or a job's run directory) is full, or
    it is read-only. `where` names it; the message says what to do. Reads still work."""

    def __init__(self, where: str, read_only: bool):
        self.where = where
        self.read_only = read_only
        super().__init__(f"read-only file system or database at {where}: nothing can be stored until it is "
                         "writable again" if read_only else
                         f"disk full on {where}: nothing can be stored until space is freed there")


class StoreUnreachable(StoreUnavailable):
    """The database server does not answer (down, restarting, the network): nothing can be
    stored until it does; answered 503 with Retry-After. Reads of what the engine keeps in
    memory still work."""

    def __init__(self, where: str, cause: str):
        RuntimeError.__init__(self, f"the store {where} cannot be reached ({cause}): nothing can be stored until it "
                                    "answers again; retry in a few seconds")
        self.where = where
        self.read_only = True


_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
_READ_ONLY_ERRNOS = {errno.EROFS}
# SQLite's and PostgreSQL's words for the same conditions (sqlite3 gives no error code before 3.11)
_FULL_WORDS = ("database or disk is full", "no space left on device", "could not extend file", "diskfull")
_READ_ONLY_WORDS = ("readonly database", "read-only file system", "read-only transaction")
# a database server that does not answer (libpq's and the server's words: down, restarting)
_UNREACHABLE_WORDS = ("connection refused", "could not connect", "server closed the connection",
                      "terminating connection", "the database system is shutting down",
                      "the database system is starting up", "the database system is in recovery mode",
                      "no connection to the server", "connection timed out", "consuming input failed",
                      "connection is closed", "connection is lost")


def store_trouble(err: BaseException, where: str) -> StoreUnavailable | None:
    """`err` as a StoreUnavailable if it says the disk is full or read-only (a database error
    or an OSError such as ENOSPC from writing a run directory); None for anything else.
    `where`: what to name when the error itself names no file (the database's location)."""
    if isinstance(err, StoreUnavailable):
        return err
    cause: BaseException | None = err
    seen = 0
    while cause is not None and seen < 5:  # the DBAPI error behind SQLAlchemy's, its own cause
        if isinstance(cause, OSError) and cause.errno in _FULL_ERRNOS | _READ_ONLY_ERRNOS:
            return StoreUnavailable(str(cause.filename or where), cause.errno in _READ_ONLY_ERRNOS)
        text = f"{type(cause).__name__} {cause}".lower()
        if any(w in text for w in _READ_ONLY_WORDS):
            return StoreUnavailable(where, True)
        if any(w in text for w in _FULL_WORDS):
            return StoreUnavailable(where, False)
        if not isinstance(cause, OSError) and any(w in text for w in _UNREACHABLE_WORDS):
            return StoreUnreachable(where, str(cause).strip().splitlines()[0][:200] if str(cause).strip() else
                                    type(cause).__name__)
        cause = getattr(cause, "orig", None) or cause.__cause__
        seen += 1
    return None


def _writes(method: Callable[..., Any]) -> Callable[..., Any]:
    """A write of the store: a full or read-only disk raises StoreUnavailable naming it."""

    @functools.wraps(method)
    def write(self: Store, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except (GPUAlreadyAllocated, StoreUnavailable):
            raise
        except Exception as err:
            trouble = store_trouble(err, self.location)
            if trouble is None:
                raise
            raise trouble from err

    return write


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


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cursor = dbapi_conn.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=10000")
    cursor.close()


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
    "warn_signal", "max_requeues", "requeues",
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


def default_url(data_dir: str | Path) -> str:
    path = Path(data_dir) / "gpujobs.sqlite"
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    return f"sqlite:///{path}"


#: what SQLite keeps next to a database file (they take the database file's mode when made)
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")


def private_sqlite_files(database: Path) -> list[str]:
    """Make a SQLite database file and its side files readable by their owner alone (0600):
    the file is created so when it does not exist yet (SQLite then gives its -wal and -shm
    the same mode), and existing ones with any group or other bits are repaired. Returns the
    files repaired ("path (was 0644)"), for the engine's log."""
    repaired = []
    try:
        os.close(os.open(database, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
    except OSError:
        pass  # a read-only or missing folder: SQLite says so when it opens it
    for path in (database, *(Path(f"{database}{side}") for side in SQLITE_SIDE_FILES)):
        try:
            st = os.lstat(path)
        except OSError:
            continue
        mode = stat.S_IMODE(st.st_mode)
        if stat.S_ISREG(st.st_mode) and mode & 0o077:
            try:
                os.chmod(path, 0o600)
            except OSError:
                continue
            repaired.append(f"{path} (was {mode:04o})")
    return repaired


class Store:
    """Repository over the tables. Thread-safe as SQLAlchemy sessions are: one per call."""

    def __init__(self, url: str, echo: bool = False):
        self.url = url
        kwargs: dict[str, Any] = {"echo": echo, "future": True}
        if url.startswith("sqlite"):
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": 10}
        else:
            kwargs["pool_pre_ping"] = True
        self.engine: Engine = create_engine(url, **kwargs)
        if url.startswith("sqlite"):
            event.listen(self.engine, "connect", _sqlite_pragmas)
        self._session = sessionmaker(self.engine, expire_on_commit=False)
        #: this process's hold on being the store's one engine (guard.py), released by close()
        self.engine_lock: Any = None

    @property
    def sqlite_file(self) -> Path | None:
        """The database file of a SQLite store; None in memory or on another database."""
        database = self.engine.url.database
        if self.engine.url.get_backend_name() == "sqlite" and database and database != ":memory:":
            return Path(database.removeprefix("file:"))
        return None

    @property
    def location(self) -> str:
        """Where the data is: the directory of a SQLite file, else the URL without password."""
        file = self.sqlite_file
        return str(file.resolve().parent) if file else self.engine.url.render_as_string(hide_password=True)

    # ----------------------------------------------------------------- schema

    def migrate(self, revision: str = "head") -> None:
        """Create or upgrade the schema to `revision` (the newest by default). A database whose
        schema this version does not know (written by a newer jupyter-gpujobs) is refused
        with `SchemaTooNew`, and left as it is."""
        from alembic import command
        from alembic.config import Config
        from alembic.runtime.migration import MigrationContext
        from alembic.script import ScriptDirectory

        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS))
        known = [s.revision for s in ScriptDirectory.from_config(cfg).walk_revisions()]
        with self.engine.begin() as conn:
            current = MigrationContext.configure(conn).get_current_heads()
            unknown = [r for r in current if r not in known]
            if unknown:
                raise SchemaTooNew(
                    f"the database {self.engine.url.render_as_string(hide_password=True)} has schema "
                    f"revision {unknown[0]}, which this jupyter-gpujobs does not know (it knows up to "
                    f"{known[0]}): it was written by a newer version. Upgrade jupyter-gpujobs, or point "
                    "c.GPUJobs.db_url at another database; nothing in this one was changed.")
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)

    def revision(self) -> str | None:
        from alembic.runtime.migration import MigrationContext

        with self.engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()

    def close(self) -> None:
        if self.engine_lock is not None:
            self.engine_lock.release()
            self.engine_lock = None
        self.engine.dispose()

    def session(self) -> Session:
        return self._session()

    # ----------------------------------------------------------------- jobs

    _NEW_JOB_DEFAULTS: dict[str, Any] = {
        "command": [], "depends": [], "env": {}, "payload": {}, "assigned_gpus": [], "runner_handle": {},
        "reason": "", "run_seconds": 0.0, "restarts": 0, "borrowed": False, "preemptible": False,
        "requeue": True, "offpeak": False, "name": "", "kind": "script", "gpus": 1, "priority": "normal",
        "requeues": 0, "retries": 0, "retry_backoff_s": 30, "retry_oom": False, "held": False, "retried": 0,
        "nodes": 1,
    }

    _JOB_COLUMNS = [c.name for c in JobRow.__table__.columns if c.name != "id"]

    def add_jobs(self, specs: Sequence[dict[str, Any]], actor: str, now: float) -> list[Job]:
        """Insert new PENDING jobs with their "submitted" events, in one transaction."""
        return self.add_submissions([NewJobs(specs, actor, now)])[0]

    @_writes
    def add_submissions(self, submissions: Sequence[NewJobs]) -> list[list[Job]]:
        """Insert several submissions' jobs and "submitted" events in one transaction (one
        commit for the lot: the engine's group commit); returns each submission's jobs, ids
        in submission order. All or nothing: on an error nothing of the batch is stored.

        Core executemany inserts rather than ORM objects: this is the submit path, and the
        ORM's unit of work cost more than the SQLite commit itself.
        """
        jobs_table = JobRow.__table__
        columns = self._JOB_COLUMNS
        groups: list[list[dict[str, Any]]] = []
        for sub in submissions:
            rows = []
            for spec in sub.specs:
                values = {**self._NEW_JOB_DEFAULTS, **_row_values({**spec, "state": JobState.PENDING,
                                                                    "submitted_at": sub.now})}
                rows.append({k: v for k, v in values.items() if v is not None or k not in self._NEW_JOB_DEFAULTS})
            groups.append(rows)
        all_rows = [values for rows in groups for values in rows]
        if not all_rows:
            return [[] for _ in submissions]
        with self.engine.begin() as conn:
            params = [{c: p.get(c) for c in columns} for p in map(_columns, all_rows)]
            ids = _insert_rows(conn, jobs_table, params, ids=True)
            for values, job_id in zip(all_rows, ids):
                values["id"] = job_id
            for sub, rows in zip(submissions, groups):
                if sub.array and rows:
                    array_id = rows[0]["id"]
                    conn.execute(update(jobs_table).where(jobs_table.c.id.in_([v["id"] for v in rows]))
                                 .values(array_job_id=array_id))
                    for values in rows:
                        values["array_job_id"] = array_id
            events = [{"job_id": values["id"], "time": sub.now, "state": "PENDING", "actor": sub.actor,
                       "reason": "submitted", "data": {}}
                      for sub, rows in zip(submissions, groups) for values in rows]
            _insert_rows(conn, EventRow.__table__, events)
        return [[_job_from_values(v) for v in rows] for rows in groups]

    @_writes
    def update_job(self, job_id: int, **fields: Any) -> None:
        """Change stored fields without a state change (no event)."""
        with self._session.begin() as s:
            s.execute(update(JobRow).where(JobRow.id == job_id).values(**_row_values(fields)))

    def get(self, job_id: int) -> Job | None:
        with self._session() as s:
            row = s.get(JobRow, job_id)
            return _to_job(row) if row else None

    def get_many(self, ids: Iterable[int]) -> dict[int, Job]:
        ids = list(ids)
        if not ids:
            return {}
        with self._session() as s:
            rows = s.scalars(select(JobRow).where(JobRow.id.in_(ids))).all()
            return {r.id: _to_job(r) for r in rows}

    def runner_handle(self, job_id: int) -> dict[str, Any]:
        with self._session() as s:
            row = s.get(JobRow, job_id)
            return dict(row.runner_handle or {}) if row else {}

    def log_path(self, job_id: int) -> str | None:
        with self._session() as s:
            row = s.get(JobRow, job_id)
            return row.log_path if row else None

    def list_jobs(
        self,
        state: Sequence[str] | None = None,
        user: str | None = None,
        limit: int = 100,
        cursor: int | None = None,
        kind: str | None = None,
    ) -> tuple[list[Job], int | None]:
        """Newest first. `cursor` is the id to continue below; returns (jobs, next cursor).
        `state` may name HELD: the pending jobs that are held (PENDING: all pending jobs)."""
        q = select(JobRow).order_by(JobRow.id.desc()).limit(limit + 1)
        if state:
            plain = [JobState(s).value for s in state if s != HELD]
            held = (JobRow.state == JobState.PENDING.value) & JobRow.held.is_(True)
            q = q.where(or_(JobRow.state.in_(plain), held) if HELD in state else JobRow.state.in_(plain))
        if user:
            q = q.where(JobRow.user == user)
        if kind:
            q = q.where(JobRow.kind == kind)
        if cursor is not None:
            q = q.where(JobRow.id < cursor)
        with self._session() as s:
            rows = s.scalars(q).all()
        jobs = [_to_job(r) for r in rows[:limit]]
        nxt = jobs[-1].id if len(rows) > limit and jobs else None
        return jobs, nxt

    def active_jobs(self) -> tuple[list[Job], list[Job]]:
        """(pending, running), each in id order."""
        with self._session() as s:
            rows = s.scalars(
                select(JobRow).where(JobRow.state.in_(["PENDING", "RUNNING"])).order_by(JobRow.id)
            ).all()
        pending = [_to_job(r) for r in rows if r.state == "PENDING"]
        running = [_to_job(r) for r in rows if r.state == "RUNNING"]
        return pending, running

    def final_states(self, ids: Iterable[int]) -> dict[int, JobState]:
        ids = list(set(ids))
        if not ids:
            return {}
        with self._session() as s:
            rows = s.execute(select(JobRow.id, JobRow.state).where(JobRow.id.in_(ids))).all()
        return {i: JobState(st) for i, st in rows if JobState(st).is_final}

    def count_by_state(self) -> dict[str, int]:
        with self._session() as s:
            rows = s.execute(select(JobRow.state, func.count()).group_by(JobRow.state)).all()
        return {st: n for st, n in rows}

    # ----------------------------------------------------------------- state changes

    @_writes
    def transition(
        self,
        job_id: int,
        state: JobState,
        actor: str,
        reason: str,
        now: float,
        expect: Sequence[JobState] | None = None,
        data: dict[str, Any] | None = None,
        released_at: float | None = None,
        **fields: Any,
    ) -> Job | None:
        """Move a job to `state`, with its event, in one transaction.

        With `expect`, the change only happens if the job is in one of those states (returns
        None otherwise), so two actors racing (a cancel and an exit) cannot both win. Leaving
        RUNNING releases the job's GPUs at `released_at`, else at its `ended_at`, else `now`:
        a run that ended while the engine was down is accounted to its real end, not to the
        engine's restart.
        """
        released = min(now, released_at if released_at is not None else fields.get("ended_at") or now)
        with self._session.begin() as s:
            row = s.get(JobRow, job_id, with_for_update=True)
            if row is None:
                return None
            if expect is not None and JobState(row.state) not in expect:
                return None
            for key, value in _row_values({**fields, "state": state, "reason": reason}).items():
                setattr(row, key, value)
            s.add(EventRow(job_id=job_id, time=now, state=JobState(state).value, actor=actor,
                           reason=reason, data=data or {}))
            if JobState(state) is not JobState.RUNNING:
                s.execute(
                    update(AllocationRow)
                    .where(AllocationRow.job_id == job_id, AllocationRow.released_at.is_(None))
                    .values(released_at=released)
                )
            s.flush()
            return _to_job(row)

    @_writes
    def transition_many(self, reasons: dict[int, str], state: JobState, actor: str, now: float,
                        expect: Sequence[JobState]) -> list[Job]:
        """`transition` of many jobs (id -> reason) to a final `state`, each with its event, in
        one transaction: a cancel of a chain, an array or a user's jobs takes one commit, not
        one per job. Jobs not in one of the `expect` states are left as they are."""
        if not reasons:
            return []
        assert JobState(state).is_final
        expected = {JobState(e).value for e in expect}
        moved: list[Job] = []
        ids = sorted(reasons)
        with self._session.begin() as s:
            for at in range(0, len(ids), 500):  # (bound parameters per statement)
                part = ids[at:at + 500]
                rows = s.scalars(select(JobRow).where(JobRow.id.in_(part)).with_for_update()).all()
                done = [r for r in rows if r.state in expected]
                for row in done:
                    row.state, row.reason, row.ended_at = JobState(state).value, reasons[row.id], now
                    s.add(EventRow(job_id=row.id, time=now, state=row.state, actor=actor,
                                   reason=row.reason, data={}))
                if done:
                    s.execute(update(AllocationRow)
                              .where(AllocationRow.job_id.in_([r.id for r in done]),
                                     AllocationRow.released_at.is_(None))
                              .values(released_at=now))
                s.flush()
                moved += [_to_job(r) for r in done]
        return moved

    @_writes
    def start(
        self,
        job_id: int,
        host: str,
        gpus: Sequence[tuple[int, str]],
        now: float,
        borrowed: bool = False,
        actor: str = "scheduler",
        reason: str = "started",
        runner_handle: dict[str, Any] | None = None,
        log_path: str | None = None,
        share: float | None = None,
    ) -> Job | None:
        """PENDING -> RUNNING with its GPU allocation, atomically; with the run's handle and
        log as far as they are known before it starts (where the run will live), so a
        restart finds a run whose start it did not see confirmed. With `share`, the job holds
        that part of its one GPU, beside other shares.

        Raises GPUAlreadyAllocated when any of the GPUs is held by a running job (for a
        share: by a whole-GPU job, or by shares that leave less than `share` of it).
        Returns None when the job is no longer pending (cancelled meanwhile).
        """
        from sqlalchemy.exc import IntegrityError

        try:
            with self._session.begin() as s:
                row = s.get(JobRow, job_id, with_for_update=True)
                if row is None or row.state != "PENDING":
                    return None
                held = s.execute(
                    select(AllocationRow.gpu_index, AllocationRow.share)
                    .where(AllocationRow.host == host, AllocationRow.released_at.is_(None),
                           AllocationRow.gpu_index.in_([i for i, _ in gpus]))
                ).all()
                if share is not None:
                    if any(h.share is None for h in held) or sum(h.share for h in held) + share > 1 + 1e-9:
                        raise GPUAlreadyAllocated(f"GPU {gpus[0][0]} on {host} has no room for a share of {share:g}")
                elif any(h.share is not None for h in held):
                    raise GPUAlreadyAllocated(f"a GPU of {list(gpus)} on {host} holds shares of other jobs")
                for index, uuid in gpus:
                    s.add(AllocationRow(job_id=job_id, host=host, gpu_index=index, gpu_uuid=uuid, started_at=now,
                                        share=share))
                s.flush()
                row.state = "RUNNING"
                row.started_at = now
                row.host = host
                row.assigned_gpus = [i for i, _ in gpus]
                row.borrowed = borrowed
                row.reason = reason
                if runner_handle is not None:
                    row.runner_handle = dict(runner_handle)
                if log_path is not None:
                    row.log_path = log_path
                s.add(EventRow(job_id=job_id, time=now, state="RUNNING", actor=actor, reason=reason,
                               data={"host": host, "gpus": [i for i, _ in gpus], "borrowed": borrowed}))
                s.flush()
                return _to_job(row)
        except IntegrityError as err:
            raise GPUAlreadyAllocated(f"a GPU of {list(gpus)} on {host} is already allocated") from err

    def active_allocations(self) -> list[dict[str, Any]]:
        with self._session() as s:
            rows = s.scalars(select(AllocationRow).where(AllocationRow.released_at.is_(None))).all()
            return [
                {"job_id": r.job_id, "host": r.host, "gpu_index": r.gpu_index, "gpu_uuid": r.gpu_uuid,
                 "started_at": r.started_at, "share": r.share}
                for r in rows
            ]

    # ----------------------------------------------------------------- events

    @_writes
    def add_event(self, job_id: int, state: str, actor: str, reason: str, now: float,
                  data: dict[str, Any] | None = None) -> None:
        """An event without a state change (a warning, a finding)."""
        with self._session.begin() as s:
            s.add(EventRow(job_id=job_id, time=now, state=state, actor=actor, reason=reason, data=data or {}))

    def events(self, job_id: int | None = None, since_id: int = 0, limit: int = 1000) -> list[Event]:
        q = select(EventRow).where(EventRow.id > since_id).order_by(EventRow.id).limit(limit)
        if job_id is not None:
            q = q.where(EventRow.job_id == job_id)
        with self._session() as s:
            rows = s.scalars(q).all()
        return [
            Event(id=r.id, job_id=r.job_id, time=r.time, state=r.state, actor=r.actor, reason=r.reason,
                  data=r.data or {})
            for r in rows
        ]

    # ----------------------------------------------------------------- fair-share usage

    def load_usage(self) -> dict[str, tuple[float, float]]:
        with self._session() as s:
            return {r.key: (r.gpu_seconds, r.updated_at) for r in s.scalars(select(UsageRow)).all()}

    @_writes
    def save_usage(self, usage: dict[str, float], now: float) -> None:
        with self._session.begin() as s:
            for key, value in usage.items():
                row = s.get(UsageRow, key)
                if row is None:
                    s.add(UsageRow(key=key, gpu_seconds=value, updated_at=now))
                else:
                    row.gpu_seconds = value
                    row.updated_at = now


    # ----------------------------------------------------------------- advance reservations

    def load_reservations(self) -> list[tuple[Reservation, str]]:
        """Every reservation, by id, with its source ("" or "finding:<id>")."""
        with self._session() as s:
            return [(_to_reservation(r), r.source) for r in s.scalars(select(ReservationRow).order_by(ReservationRow.id))]

    @_writes
    def add_reservation(self, fields: dict[str, Any], actor: str, now: float, source: str = "") -> Reservation:
        """Store a reservation (`model.validate_reservation`'s fields); returns it with its id."""
        with self._session.begin() as s:
            row = ReservationRow(name=fields["name"], gpus=fields["gpus"], gpu_type=fields["gpu_type"],
                                 host=fields["host"], start=fields["start"], duration_s=fields["duration_s"],
                                 repeat=fields["repeat"], users=list(fields["users"]), groups=list(fields["groups"]),
                                 created_by=actor, created_at=now, source=source)
            s.add(row)
            s.flush()
            return _to_reservation(row)

    @_writes
    def delete_reservation(self, reservation_id: int) -> bool:
        """Remove a reservation; False when there is none of that id."""
        with self._session.begin() as s:
            row = s.get(ReservationRow, reservation_id)
            if row is None:
                return False
            s.delete(row)
            return True

    # ----------------------------------------------------------------- quotas set through the API

    def load_quotas(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Stored quotas: {"users"|"groups": {name: {"quota", "set_by", "set_at"}}}."""
        out: dict[str, dict[str, dict[str, Any]]] = {"users": {}, "groups": {}}
        with self._session() as s:
            for r in s.scalars(select(QuotaRow)).all():
                out.setdefault(r.scope, {})[r.name] = {"quota": dict(r.quota or {}), "set_by": r.set_by,
                                                       "set_at": r.set_at}
        return out

    @_writes
    def set_quota(self, scope: str, name: str, quota: dict[str, Any] | None, actor: str, now: float) -> None:
        """Store (or with None, remove) a quota, with its audit row (who, when, before, after),
        in one transaction."""
        with self._session.begin() as s:
            row = s.get(QuotaRow, (scope, name))
            before = dict(row.quota or {}) if row is not None else None
            if quota is None:
                if row is not None:
                    s.delete(row)
            elif row is None:
                s.add(QuotaRow(scope=scope, name=name, quota=dict(quota), set_by=actor, set_at=now))
            else:
                row.quota, row.set_by, row.set_at = dict(quota), actor, now
            s.add(QuotaChangeRow(time=now, actor=actor, scope=scope, name=name, before=before,
                                 after=None if quota is None else dict(quota)))

    def quota_changes(self, names: Iterable[tuple[str, str]] | None = None, limit: int = 20) -> list[dict[str, Any]]:
        """The newest quota changes first, of the given (scope, name) pairs or of all."""
        q = select(QuotaChangeRow).order_by(QuotaChangeRow.id.desc()).limit(limit)
        if names is not None:
            pairs = list(names)
            if not pairs:
                return []
            q = q.where(or_(*(and_(QuotaChangeRow.scope == sc, QuotaChangeRow.name == n) for sc, n in pairs)))
        with self._session() as s:
            return [{"time": r.time, "actor": r.actor, "scope": r.scope, "name": r.name, "before": r.before,
                     "after": r.after} for r in s.scalars(q).all()]


def now() -> float:
    return time.time()


__all__ += ["Base", "default_url"]
