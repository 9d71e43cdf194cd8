"""One store, one engine; and a damaged store is never taken for a new one (issue 32).

- `EngineLock`: while an engine runs on a store, no second engine starts on it. Two engines on
  one SQLite file both accepted jobs and only one ran them. SQLite: an exclusive `flock` on
  `<database>.engine-lock` beside the file (0600, in the engine's private state dir), holding
  the first engine's pid, host, user and start time, which the second names when refused;
  the kernel drops it when the process dies, however it dies. PostgreSQL: a session advisory
  lock on a connection the engine keeps, the holder named by that connection's
  application_name (pg_stat_activity).
- `refuse_empty_file`: a SQLite file that exists but is empty (0 bytes) is refused, not made a
  new store: it was a store, and its data is gone or elsewhere (a failed copy, a full disk).
- `damaged`: the error a store that cannot be read raises at start (not a database, malformed)
  as `StoreDamaged`, naming the file and how to restore it.

The Jupyter extension answers 503 with these messages on every gpujobs/api/ route, and
`jupyter gpujobs doctor` shows them. May call: the store (its SQLAlchemy engine) only.
"""

from __future__ import annotations

import errno
import fcntl
import getpass
import json
import os
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import text

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from . import Store

#: the advisory lock key of "the engine of this database" on PostgreSQL
PG_LOCK_KEY = 0x6770756A6F6273  # "gpujobs"
#: how a PostgreSQL engine names itself in pg_stat_activity (application_name, 63 bytes at most)
PG_APP_PREFIX = "jupyter-gpujobs engine"
DAMAGED_WORDS = ("file is not a database", "database disk image is malformed", "malformed database schema",
                 "unsupported file format")


class StoreInUse(RuntimeError):
    """Another engine runs on this store; the message names it and how to stop it."""


class StoreDamaged(RuntimeError):
    """The store exists but cannot be used as it is; the message names the file and the fix."""


def _holder() -> dict[str, Any]:
    return {"pid": os.getpid(), "host": socket.gethostname(), "user": getpass.getuser(), "since": time.time()}


def _in_use_text(where: str, who: dict[str, Any]) -> str:
    pid, host = who.get("pid"), who.get("host")
    since = who.get("since")
    started = time.strftime(" since %Y-%m-%d %H:%M:%S", time.localtime(since)) if isinstance(since, (int, float)) else ""
    here = host == socket.gethostname()
    stop = (f"stop it (its Jupyter server or `jupyter gpujobs engine`; kill {pid}"
            + ("" if here else f" on {host}") + ")")
    return (f"another engine already runs on the store {where}: pid {pid} on host {host}, user {who.get('user')}"
            f"{started}. One store has one engine: use that one, {stop}, or give this server its own "
            "store (c.GPUJobs.state_dir or c.GPUJobs.db_url)")


class EngineLock:
    """This process's hold on being the one engine of `store` (see the module docstring)."""

    def __init__(self, store: Store):
        self.store = store
        self._fd: int | None = None
        self._conn: Connection | None = None

    @property
    def path(self) -> Path | None:
        file = self.store.sqlite_file
        return None if file is None else file.with_name(file.name + ".engine-lock")

    def acquire(self) -> None:
        """Hold the store for this engine, or raise StoreInUse naming the engine that does."""
        path = self.path
        if path is not None:
            self._acquire_file(path)
        elif self.store.engine.url.get_backend_name() == "postgresql":
            self._acquire_postgres()

    def _acquire_file(self, path: Path) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            try:
                raw = os.pread(fd, 4096, 0)
            finally:
                os.close(fd)
            if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            try:
                who = json.loads(raw.decode() or "{}")
            except ValueError:
                who = {}
            raise StoreInUse(_in_use_text(str(self.store.sqlite_file), who)) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(_holder()).encode(), 0)
        self._fd = fd

    def _acquire_postgres(self) -> None:
        me = _holder()
        conn = self.store.engine.connect()
        try:
            name = f"{PG_APP_PREFIX} pid {me['pid']} on {me['host']}"[:63]
            conn.execute(text("SELECT set_config('application_name', :n, false)"), {"n": name})
            if conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": PG_LOCK_KEY}).scalar_one():
                conn.commit()
                self._conn = conn
                return
            holder = conn.execute(text(
                "SELECT a.application_name, a.client_addr FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                "WHERE l.locktype = 'advisory' AND l.granted AND l.objid = :lo AND l.classid = :hi "
                "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"),
                {"lo": PG_LOCK_KEY & 0xFFFFFFFF, "hi": PG_LOCK_KEY >> 32}).first()
        finally:
            if self._conn is None:
                conn.close()
        who: dict[str, Any] = {"pid": "?", "host": "?", "user": "?"}
        if holder is not None and str(holder[0]).startswith(PG_APP_PREFIX):
            words = str(holder[0]).split()
            who = {"pid": words[-3], "host": words[-1], "user": "?"}
        elif holder is not None:
            who["host"] = str(holder[1] or "?")
        raise StoreInUse(_in_use_text(self.store.location, who))

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None
        if self._conn is not None:
            try:
                self._conn.close()  # ends the session: its advisory lock goes with it
            except Exception:  # a database already gone took the lock with it
                pass
            self._conn = None


def refuse_empty_file(file: Path) -> None:
    """Raise StoreDamaged when the SQLite file `file` exists but is empty (see the docstring)."""
    try:
        size = os.stat(file).st_size
    except FileNotFoundError:
        return
    if size == 0:
        raise StoreDamaged(
            f"the store {file} exists but is empty (0 bytes): its data is not there, and jupyter-gpujobs does not "
            f"start an empty store over it. Restore it from a backup (stop the server, copy the backup to {file}, "
            f"start it again), or, to start a new empty store and lose what was in it, remove {file}")


def damaged(err: BaseException, store: Store) -> StoreDamaged | None:
    """`err` (raised opening or upgrading the store) as StoreDamaged when it says the database
    cannot be read; None for anything else."""
    cause: BaseException | None = err
    for _ in range(5):
        if cause is None:
            break
        if any(w in str(cause).lower() for w in DAMAGED_WORDS):
            where = store.sqlite_file or store.location
            backup = (f"copy the backup to {where}" if store.sqlite_file else "restore the database from its backup")
            return StoreDamaged(
                f"the store {where} is damaged ({str(cause).splitlines()[0]}); jupyter-gpujobs will not start over "
                f"it. Stop the server, move it aside (keep it: `sqlite3 {where} .recover` may save its rows) and "
                f"{backup}, then start the server again; `jupyter gpujobs doctor` shows this" if store.sqlite_file
                else f"the store {where} is damaged ({str(cause).splitlines()[0]}): {backup}, then restart")
        cause = getattr(cause, "orig", None) or cause.__cause__
    return None


__all__ = ["EngineLock", "StoreDamaged", "StoreInUse", "damaged", "refuse_empty_file"]
