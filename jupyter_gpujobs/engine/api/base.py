"""What every REST handler under `{base_url}gpujobs/api/` shares: the routes' prefix, the
bounded JSON body parser, the caller's identity, `GPUJobsHandler` (authentication through
jupyter_server, argument checks, and the JobService's errors turned into JSON 4xx answers
`{"message": ..., "field": ...}`), `ApiError`, and the authorized websocket.

May call: jupyter_server and tornado, `model` (input checks), `errors`, the store's
`store_trouble`; `report` runs a handler's read of history in a thread pool of its own. The handler modules of this package build on it; it imports none
of them."""

from __future__ import annotations

import asyncio
import getpass
import json
import logging
import math
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache, partial
from pathlib import Path
from typing import Any, TypeVar

from jupyter_core.utils import ensure_async
from jupyter_server.auth.decorator import ws_authenticated
from jupyter_server.base.handlers import APIHandler, JupyterHandler
from sqlalchemy.exc import SQLAlchemyError
from tornado import web, websocket

from ...model import MAX_ID, InvalidInput, check_plain_text, parse_id
from ..errors import Conflict, NotFound, PermissionDenied, StoreUnavailable, TooSoon
from ..service import JobService
from ..store import store_trouble

AUTH_RESOURCE = "gpujobs"
API = "gpujobs/api"
SPEC_PATH = Path(__file__).with_name("openapi.json")
#: How deep arrays and objects may nest in a request body (a submission needs 3 or 4).
MAX_JSON_DEPTH = 32
#: Retry-After (seconds) of a 503 while the store cannot be written (its database down, read-only)
RETRY_AFTER_S = 5


T = TypeVar("T")

#: Where reports over a range of the store's history run (usage, the heatmap, the queue's
#: history, GPU readings, accounting records), two at a time, off the engine's loop: over a
#: year of history one took 1 to 3 s, and on the loop every user's request and the scheduler
#: waited for it. Those who ask for many wait for each other here.
_REPORTS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="gpujobs-report")


async def report(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)` (a read of the store, which is safe in a thread) off the loop."""
    return await asyncio.get_running_loop().run_in_executor(_REPORTS, partial(fn, *args, **kwargs))


def _non_finite(value: Any) -> str | None:
    """The path (`begin`, `env.X`, `depends[2]`) of the first NaN or infinite number in a
    parsed JSON value, or None. JSON has no such numbers, but Python's parser reads `NaN`,
    `Infinity` and `1e400` (as inf)."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return path or "body"
        if isinstance(item, dict):
            stack.extend((f"{path}.{k}" if path else str(k), v) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((f"{path}[{i}]", v) for i, v in enumerate(item))
    return None


_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_INNERMOST = re.compile(rb"[\[{][\]}]")


def _too_deep(text: bytes, limit: int) -> bool:
    """Do the arrays and objects of a JSON text nest deeper than `limit`? Counted on the bytes
    before parsing (Python's parser recurses, and so do checks of what it returns): the
    brackets outside strings, less one level of innermost pairs per pass."""
    if text.count(b"[") + text.count(b"{") <= limit:
        return False
    brackets = _JSON_STRING.sub(b"", text).translate(None, _NOT_BRACKETS)
    for _ in range(limit):
        brackets, pairs = _INNERMOST.subn(b"", brackets)
        if not brackets:
            return False
        if not pairs:  # unbalanced: no valid JSON either
            break
    return True


def parse_json_body(body: bytes, limit: int) -> Any:
    """A request body as JSON, refused (ApiError 413/400 naming "body") when it is over `limit`
    bytes, nests deeper than MAX_JSON_DEPTH, or holds NaN, Infinity or a number too large for a
    float: no stored value or computation may meet a non-finite number."""
    if len(body) > limit:
        raise ApiError(413, "body", f"request body of {len(body)} bytes is over the limit of {limit}")
    if not body:
        return {}
    if _too_deep(body, MAX_JSON_DEPTH):
        raise ApiError(400, "body", f"request body nests arrays and objects deeper than {MAX_JSON_DEPTH} levels")
    non_finite: list[float] = []

    def number(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            non_finite.append(value)
        return value

    try:
        value = json.loads(body, parse_constant=number, parse_float=number)
    except (ValueError, UnicodeDecodeError, RecursionError) as err:
        raise ApiError(400, "body", f"request body is not valid JSON: {err}") from None
    bad = _non_finite(value) if non_finite else None
    if bad:
        raise ApiError(400, bad, "expected a finite number; NaN, Infinity and numbers too large for a double "
                                 "are not allowed")
    return value


def job_owner(handler: JupyterHandler) -> str:
    """The user a request acts as, and whose jobs it owns (see c.GPUJobs.user_identity)."""
    mode = handler.settings.get("gpujobs_identity", "unix")
    if mode == "unix":
        return handler.settings.get("gpujobs_unix_user") or getpass.getuser()
    user = handler.current_user
    return getattr(user, "username", None) or str(user)


def engine_notice(service: JobService) -> str | None:
    """Why this engine allocates no GPU (another engine owns them), for the panel; else None."""
    claim = service.gpu_claim
    if claim is None or claim.held or claim.other is None:
        return None
    return claim.refusal()


@lru_cache(maxsize=4)
def _printing_level(log: logging.Logger) -> logging.Logger:
    """A child of the server's log whose level is the lowest its handlers print. traitlets
    leaves the server's logger at DEBUG and filters in its handlers, so jupyter_server's
    request log (a debug line for every success) built a record for each API call only for
    the handler to drop it."""
    child = log.getChild("gpujobs")
    if log.handlers:
        child.setLevel(min(h.level for h in log.handlers))
    return child


class GPUJobsHandler(APIHandler):
    """Common parts: the service, the job owner, JSON bodies and error replies."""

    auth_resource = AUTH_RESOURCE

    @property
    def log(self) -> logging.Logger:
        return _printing_level(super().log)

    @property
    def service(self) -> JobService:
        return self.settings["gpujobs_service"]

    @property
    def owner(self) -> str:
        """The user a job belongs to (see c.GPUJobs.user_identity)."""
        return job_owner(self)

    def require_admin(self) -> None:
        if not self.service.is_admin(self.owner):
            raise ApiError(403, None, "only admins may do this")

    def json_body(self) -> Any:
        return parse_json_body(self.request.body, self.settings.get("gpujobs_max_body", 1 << 20))

    def json_object(self, what: str = "") -> dict[str, Any]:
        """The request body, which must be a JSON object (400 naming the body otherwise)."""
        body = self.json_body()
        if not isinstance(body, dict):
            raise ApiError(400, "body", f"expected a JSON object{' ' + what if what else ''}")
        return body

    def reply(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(data, allow_nan=False))

    def job_id(self, text: str) -> int:
        return parse_id(text, "id")

    def int_arg(self, name: str, default: int | None, low: int = 0, high: int = MAX_ID) -> int | None:
        """A whole-number query argument between `low` and `high` (ASCII digits only)."""
        raw = self.get_argument(name, None)
        if raw is None or raw == "":
            return default
        text = raw.strip()
        if not re.fullmatch(r"-?[0-9]{1,19}", text):
            raise ApiError(400, name, f"expected a whole number, got {raw[:40]!r}")
        value = int(text)
        if value < low or value > high:
            raise ApiError(400, name, f"must be between {low} and {high}, got {value}")
        return value

    def text_arg(self, name: str, limit: int = 200) -> str | None:
        """A text query argument (None when absent or empty), refused when it is longer than
        `limit` characters or holds control characters."""
        raw = self.get_argument(name, None)
        if not raw:
            return None
        if len(raw) > limit:
            raise ApiError(400, name, f"longer than {limit} characters")
        try:
            check_plain_text(raw, name)
        except InvalidInput as err:
            raise ApiError(400, name, err.message) from None
        return raw

    def _log(self) -> None:
        if self.get_status() in (503, 507) and self.service.store_trouble is not None:
            return  # the engine logs a full or read-only store once a minute, not every request
        super()._log()

    def _store_trouble(self, e: BaseException) -> StoreUnavailable | None:
        """`e` as the store's trouble (full, read-only, its database server down), noted by
        the engine (logged once a minute, not per request); None for any other error."""
        if isinstance(e, StoreUnavailable):
            return e
        if not isinstance(e, SQLAlchemyError):
            return None
        trouble = store_trouble(e, self.service.store.location)
        if trouble is not None:
            self.service.state.note_store_trouble(trouble)
        return trouble

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, ApiError):
            if exc.retry_after is not None:  # (send_error cleared the headers set before)
                self.set_header("Retry-After", str(exc.retry_after))
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps({"message": exc.message, "field": exc.field}))
            return
        super().write_error(status_code, **kwargs)

    def _handle_request_exception(self, e: BaseException) -> None:
        if isinstance(e, InvalidInput):
            e = ApiError(400, e.field, e.message)
        elif isinstance(e, NotFound):
            e = ApiError(404, None, str(e))
        elif isinstance(e, PermissionDenied):  # (a refused priority class names the field: userpolicy.py)
            e = ApiError(403, getattr(e, "field", None), str(e))
        elif isinstance(e, Conflict):
            e = ApiError(409, e.field, e.message)
        elif isinstance(e, TooSoon):
            retry_after = e.retry_after
            e = ApiError(429, None, e.message)
            e.retry_after = retry_after
        elif (trouble := self._store_trouble(e)) is not None:  # 507 Insufficient Storage; read-only, down: 503
            e = ApiError(503 if trouble.read_only else 507, None, str(trouble))
            e.retry_after = RETRY_AFTER_S if trouble.read_only else 60
        if isinstance(e, ApiError):
            if self._finished:
                return
            self.send_error(e.status_code, exc_info=(type(e), e, e.__traceback__))
            return
        super()._handle_request_exception(e)


class ApiError(web.HTTPError):
    def __init__(self, status: int, field: str | None, message: str):
        super().__init__(status, log_message=message.replace("%", "%%"))
        self.field = field
        self.message = message
        self.retry_after: int | None = None  # seconds, sent as Retry-After


class AuthorizedWebSocket(JupyterHandler, websocket.WebSocketHandler):
    """A websocket that only a user the server authenticates and authorizes to read the
    "gpujobs" resource may open (the engine's events, and a user server's forward of them)."""

    auth_resource = AUTH_RESOURCE

    async def pre_get(self) -> None:
        ok = await ensure_async(self.authorizer.is_authorized(self, self.current_user, "read", AUTH_RESOURCE))
        if not ok:
            raise web.HTTPError(403)

    @ws_authenticated
    async def get(self, *args: Any, **kwargs: Any) -> None:
        await ensure_async(self.pre_get())
        res = super().get(*args, **kwargs)
        if res is not None:
            await res


#: A job id in a route (checked by `GPUJobsHandler.job_id`, so a bad one gets a 400 naming it).
JOB_ID = r"(?P<job_id>[^/]+)"
