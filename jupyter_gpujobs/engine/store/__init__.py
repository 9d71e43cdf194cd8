"""The store: the one place jobs, events and allocations are kept (SQLAlchemy 2).

SQLite in WAL mode in the Jupyter data dir by default; any SQLAlchemy URL (PostgreSQL) by
config. The schema is created and upgraded by alembic (`migrate()`), from the first table on.
Every state change of a job goes through `transition()`, which writes the job and its event
row in one transaction, so the audit log never disagrees with the jobs table. No scheduling
logic lives here.

This module owns the connection, the schema and the job repository (jobs, state changes,
allocations, events); beside it: `trouble` (its refusals and `_writes`), `rows` (rows to model
objects, bulk inserts), `policy` (usage, reservations, quotas: a mixin of `Store`), `guard`
(the one engine's lock), `monitoring`, `notifications`, `accounting`, `report`. May call:
`model`, `tables` and those modules; nothing above the store.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event, func, or_, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from ...model import HELD, Job, JobState
from .policy import PolicyRecords
from .rows import Event, NewJobs, _columns, _insert_rows, _job_from_values, _row_values, _to_job
from .tables import AllocationRow, Base, EventRow, JobRow
from .trouble import (
    GPUAlreadyAllocated,
    SchemaTooNew,
    StoreUnavailable,
    StoreUnreachable,
    _writes,
    store_trouble,
)

__all__ = ["Store", "Event", "NewJobs", "GPUAlreadyAllocated", "SchemaTooNew", "StoreUnavailable", "StoreUnreachable",
           "store_trouble"]

MIGRATIONS = Path(__file__).parent / "migrations"


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cursor = dbapi_conn.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=10000")
    cursor.close()



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


class Store(PolicyRecords):
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


def now() -> float:
    return time.time()


__all__ += ["Base", "default_url"]
