"""Schema migrations on SQLite (the default store): an older database keeps every job when a
newer jupyter-gpujobs opens it, and a database from a newer version is refused unchanged.
The same checks run on PostgreSQL in test_store_postgres.py."""

from __future__ import annotations

from pathlib import Path

from schema_upgrade import check_newer_schema_is_refused, check_upgrade_keeps_jobs, write_pending_job_at

from jupyter_gpujobs.model import JobState


def test_upgrade_from_the_first_schema_keeps_jobs_and_events(tmp_path: Path) -> None:
    check_upgrade_keeps_jobs(f"sqlite:///{tmp_path / 'gpujobs.sqlite'}")


def test_a_database_of_a_newer_version_is_refused_and_left_unchanged(tmp_path: Path) -> None:
    check_newer_schema_is_refused(f"sqlite:///{tmp_path / 'gpujobs.sqlite'}")


def test_upgrade_to_stored_quotas_keeps_jobs_and_keeps_quotas_across_reopening(tmp_path: Path) -> None:
    from jupyter_gpujobs.engine.store import Store

    url = f"sqlite:///{tmp_path / 'gpujobs.sqlite'}"
    job_id = write_pending_job_at(url, "0003")  # the schema before quotas were stored
    store = Store(url)
    store.migrate()
    assert store.revision() != "0003"
    job = store.get(job_id)
    assert job is not None and (job.user, job.command, job.gpus, job.state) == ("alice", ["true"], 1, JobState.PENDING)
    store.set_quota("users", "alice", {"max_gpus": 1}, "admin", 10.0)
    store.set_quota("users", "alice", {"max_gpus": 2}, "root", 20.0)
    store.set_quota("groups", "vision", {"guaranteed_gpus": 2}, "admin", 30.0)
    store.set_quota("groups", "vision", None, "admin", 40.0)
    store.close()
    again = Store(url)
    try:
        assert again.load_quotas() == {"users": {"alice": {"quota": {"max_gpus": 2}, "set_by": "root", "set_at": 20.0}},
                                       "groups": {}}
        assert [(c["time"], c["actor"], c["scope"], c["name"], c["before"], c["after"])
                for c in again.quota_changes()] == [
            (40.0, "admin", "groups", "vision", {"guaranteed_gpus": 2}, None),
            (30.0, "admin", "groups", "vision", None, {"guaranteed_gpus": 2}),
            (20.0, "root", "users", "alice", {"max_gpus": 1}, {"max_gpus": 2}),
            (10.0, "admin", "users", "alice", None, {"max_gpus": 1}),
        ]
    finally:
        again.close()
