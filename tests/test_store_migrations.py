"""Schema migrations on SQLite (the default store): an older database keeps every job when a
newer jupyter-gpujobs opens it, and a database from a newer version is refused unchanged.
The same checks run on PostgreSQL in test_store_postgres.py."""

from __future__ import annotations

from pathlib import Path

from schema_upgrade import check_newer_schema_is_refused, check_upgrade_keeps_jobs


def test_upgrade_from_the_first_schema_keeps_jobs_and_events(tmp_path: Path) -> None:
    check_upgrade_keeps_jobs(f"sqlite:///{tmp_path / 'gpujobs.sqlite'}")


def test_a_database_of_a_newer_version_is_refused_and_left_unchanged(tmp_path: Path) -> None:
    check_newer_schema_is_refused(f"sqlite:///{tmp_path / 'gpujobs.sqlite'}")
