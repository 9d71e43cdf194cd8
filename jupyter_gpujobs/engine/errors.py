"""The engine's refusals, as its parts raise them and the API's handlers turn them into 4xx.

Owns only these exception classes (and names `StoreUnavailable`, the store's, beside them);
it imports nothing of the engine but the store's exception, so that every part, the mirror
and the handlers can import it without a circle.
"""

from __future__ import annotations

from .store import StoreUnavailable


class NotFound(LookupError):
    pass


class PermissionDenied(PermissionError):
    pass


class Conflict(RuntimeError):
    """A command that does not fit the state things are in now (HTTP 409); `field` names what."""

    def __init__(self, field: str | None, message: str):
        super().__init__(message)
        self.field = field
        self.message = message


class TooSoon(RuntimeError):
    """A command one user may give only so often, given again too soon (HTTP 429, with
    Retry-After `retry_after` seconds)."""

    def __init__(self, message: str, retry_after: int):
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


class LogRemoved(NotFound):
    """The log of a job was removed after the retention (`c.GPUJobs.job_retention`)."""


__all__ = ["Conflict", "LogRemoved", "NotFound", "PermissionDenied", "StoreUnavailable", "TooSoon"]
