"""What the store is and how much room it takes, for `GET info` (and so `jupyter gpujobs doctor`).

SQLite: the database file with its write-ahead log; PostgreSQL: `pg_database_size` of the
database. The URL is given without its password.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import text

from . import Store


def store_report(store: Store) -> dict[str, Any]:
    """`{"kind": "sqlite"|"postgresql"|..., "url": URL without password, "size_bytes": int|None}`."""
    url = store.engine.url
    kind = url.get_backend_name()
    size: int | None = None
    try:
        if (file := store.sqlite_file) is not None:
            size = sum(p.stat().st_size for p in (file, file.with_name(file.name + "-wal")) if p.exists())
        elif kind == "postgresql":
            with store.engine.connect() as conn:
                size = int(conn.execute(text("SELECT pg_database_size(current_database())")).scalar_one())
    except Exception:  # a size we cannot read is reported as unknown, never as an error of the API
        size = None
    return {"kind": kind, "url": url.render_as_string(hide_password=True), "size_bytes": size}
