"""Checks that a database written at an older schema revision keeps its jobs when a newer
jupyter-gpujobs opens it (shared by the SQLite and PostgreSQL store tests)."""

from __future__ import annotations

import pytest
from sqlalchemy import MetaData, insert, update

from jupyter_gpujobs.engine.store import SchemaTooNew, Store
from jupyter_gpujobs.model import JobState

FIRST = "0001"


def write_at_first_schema(url: str) -> tuple[int, int]:
    """A database at the first revision with two jobs written through its own tables (a
    finished one with its events and GPU, a pending one); returns their ids."""
    old = Store(url)
    old.migrate(FIRST)
    assert old.revision() == FIRST
    meta = MetaData()
    meta.reflect(old.engine)
    jobs, events, allocations = meta.tables["jobs"], meta.tables["events"], meta.tables["allocations"]
    base = {"user": "alice", "kind": "script", "gpus": 1, "gpu_type": "A100", "time_limit_s": 3600,
            "priority": "high", "group_name": "vision", "preemptible": False, "requeue": True, "offpeak": False,
            "depends": [], "env": {"SEED": "1"}, "payload": {}, "assigned_gpus": [], "borrowed": False,
            "reason": "", "run_seconds": 0.0, "restarts": 0, "runner_handle": {}}
    with old.engine.begin() as conn:
        done = conn.execute(insert(jobs).values({
            **base, "name": "train", "command": ["python", "train.py", "--lr", "0.1"], "state": "COMPLETED",
            "submitted_at": 1000.0, "started_at": 1010.0, "ended_at": 1100.0, "host": "node1",
            "assigned_gpus": [0], "exit_code": 0, "reason": "completed", "run_seconds": 90.0})).inserted_primary_key[0]
        waiting = conn.execute(insert(jobs).values({
            **base, "name": "eval", "command": ["python", "eval.py"], "state": "PENDING", "submitted_at": 1200.0,
            "depends": [{"kind": "afterok", "job_id": done}]})).inserted_primary_key[0]
        conn.execute(insert(events), [
            {"job_id": done, "time": 1000.0, "state": "PENDING", "actor": "alice", "reason": "submitted", "data": {}},
            {"job_id": done, "time": 1010.0, "state": "RUNNING", "actor": "scheduler", "reason": "started on GPU 0",
             "data": {}},
            {"job_id": done, "time": 1100.0, "state": "COMPLETED", "actor": "runner", "reason": "completed",
             "data": {"exit_code": 0}},
            {"job_id": waiting, "time": 1200.0, "state": "PENDING", "actor": "alice", "reason": "submitted",
             "data": {}},
        ])
        conn.execute(insert(allocations).values(job_id=done, host="node1", gpu_index=0, gpu_uuid="GPU-0",
                                                started_at=1010.0, released_at=1100.0))
    old.close()
    return done, waiting


def write_pending_job_at(url: str, revision: str) -> int:
    """A database at `revision` with one pending job of alice's written through that revision's
    own tables (today's ORM has columns an older schema lacks); returns its id."""
    old = Store(url)
    old.migrate(revision)
    meta = MetaData()
    meta.reflect(old.engine)
    with old.engine.begin() as conn:
        job_id = conn.execute(insert(meta.tables["jobs"]).values(
            user="alice", kind="script", command=["true"], gpus=1, priority="normal", preemptible=False,
            requeue=True, offpeak=False, depends=[], env={}, payload={}, state="PENDING", submitted_at=1.0,
            assigned_gpus=[], borrowed=False, reason="submitted", run_seconds=0.0, restarts=0,
            runner_handle={})).inserted_primary_key[0]
    old.close()
    return int(job_id)


def check_upgrade_keeps_jobs(url: str) -> None:
    """Open the old database as the server does (`migrate()` to the newest revision): every
    job, event and field written at the first revision reads back, and the newer tables work."""
    done, waiting = write_at_first_schema(url)
    store = Store(url)
    try:
        store.migrate()
        assert store.revision() != FIRST
        a, b = store.get(done), store.get(waiting)
        assert a is not None and b is not None
        assert (a.state, a.name, a.command, a.exit_code, a.assigned_gpus, a.group, a.env) == (
            JobState.COMPLETED, "train", ["python", "train.py", "--lr", "0.1"], 0, (0,), "vision", {"SEED": "1"})
        assert (b.state, b.priority, b.gpu_type, b.time_limit_s) == (JobState.PENDING, "high", "A100", 3600)
        assert [(d.kind, d.job_id) for d in b.depends] == [("afterok", done)]
        assert [e["state"] for e in store.events(job_id=done)] == ["PENDING", "RUNNING", "COMPLETED"]
        # the upgraded database takes new work: a new job gets the next id, the monitor's tables exist
        new = store.add_jobs([{"user": "bob", "command": ["true"], "gpus": 1}], actor="bob", now=2000.0)[0]
        assert new.id > waiting
        from jupyter_gpujobs.engine.store.tables import Base

        meta = MetaData()
        meta.reflect(store.engine)
        assert set(Base.metadata.tables) <= set(meta.tables), "a table of the newest schema is missing"
    finally:
        store.close()


def check_newer_schema_is_refused(url: str) -> None:
    """A database from a newer version: a clear error naming what to do, and nothing changed."""
    store = Store(url)
    try:
        store.migrate()
        job = store.add_jobs([{"user": "alice", "command": ["true"], "gpus": 1}], actor="alice", now=1.0)[0]
        meta = MetaData()
        meta.reflect(store.engine)
        with store.engine.begin() as conn:
            conn.execute(update(meta.tables["alembic_version"]).values(version_num="9999_from_the_future"))
        with pytest.raises(SchemaTooNew, match=r"revision 9999_from_the_future.*newer version\. Upgrade "
                                               r"jupyter-gpujobs, or point c\.GPUJobs\.db_url at another database"):
            store.migrate()
        assert store.revision() == "9999_from_the_future"
        assert store.get(job.id) == job
    finally:
        store.close()
