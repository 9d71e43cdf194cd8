"""The store's refusals and how a database error becomes one: `StoreUnavailable` (full or
read-only), `StoreUnreachable` (the database server gone), `SchemaTooNew`,
`GPUAlreadyAllocated`, `store_trouble` (the error a driver raised, named for a person), and
`_writes`, the decorator that turns a failed write of the store into `StoreUnavailable`.

May call: nothing of the engine (the standard library; it reads SQLAlchemy's errors by their
text and causes)."""

from __future__ import annotations

import errno
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from . import Store


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
