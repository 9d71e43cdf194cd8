"""REST and websocket handlers under `{base_url}gpujobs/api/`.

Handlers authenticate and authorize through jupyter_server (resource "gpujobs"), decode and
bound the request, call the JobService, and turn its errors into JSON 4xx answers
(`{"message": ..., "field": ...}`). They hold no business rules.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import logging
import math
import os
import re
import time
from functools import lru_cache
from pathlib import Path
from typing import Any

from jupyter_core.utils import ensure_async
from jupyter_server.auth.decorator import authorized, ws_authenticated
from jupyter_server.base.handlers import APIHandler, JupyterHandler
from sqlalchemy.exc import SQLAlchemyError
from tornado import web, websocket

from ...model import HELD, JOB_KINDS, MAX_ID, InvalidInput, JobState, check_plain_text, parse_id
from ..errors import Conflict, NotFound, PermissionDenied, StoreUnavailable
from ..monitor import may_see
from ..notify import Notifier
from ..service import JobService
from ..store import store_trouble
from .identity import peer_pid

AUTH_RESOURCE = "gpujobs"
API = "gpujobs/api"
SPEC_PATH = Path(__file__).with_name("openapi.json")
#: How deep arrays and objects may nest in a request body (a submission needs 3 or 4).
MAX_JSON_DEPTH = 32
#: Retry-After (seconds) of a 503 while the store cannot be written (its database down, read-only)
RETRY_AFTER_S = 5


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


class GPUsHandler(GPUJobsHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        out: dict[str, Any] = {"gpus": self.service.gpu_views(), "backend": self.service.gpus.name,
                               "isolation": self.service.isolation,
                               "share_enforcement": self.service.shares.describe(self.service.inventory),
                               "share_mode": self.service.shares.mode()}
        fleet = getattr(self.service.gpus, "fleet", None)
        if fleet and self.service.gpus.name == "fake":  # what a kernel puts in GPUJOBS_FAKE_FLEET
            out["fake_fleet"] = fleet
        notice = engine_notice(self.service)
        if notice:
            out["notice"] = notice
        self.reply(out)


class JobsHandler(GPUJobsHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        states = [s for s in self.get_argument("state", "").upper().split(",") if s]
        for s in states:
            if s not in JobState.__members__ and s != HELD:
                raise ApiError(400, "state", f"unknown state {s!r}; states are {', '.join(JobState.__members__)}, "
                                             f"{HELD}")
        limit = self.int_arg("limit", 100, low=1, high=1000)
        cursor = self.int_arg("cursor", None, low=1)
        user = self.text_arg("user")
        kind = self.text_arg("kind")
        if kind is not None and kind not in JOB_KINDS:
            raise ApiError(400, "kind", f"unknown kind {kind[:40]!r}; kinds are {', '.join(JOB_KINDS)}")
        jobs, nxt = self.service.store.list_jobs(state=states or None, user=user, limit=limit or 100,
                                                 cursor=cursor, kind=kind)
        viewer = self.owner
        self.reply({"jobs": [self.service.view(j, viewer) for j in jobs], "next": nxt})

    @web.authenticated
    @authorized
    async def post(self) -> None:
        body = self.json_object("describing the job")
        jobs = await self.service.submit(self.owner, body)
        out = self.service.view(jobs[0])
        if len(jobs) > 1:
            out["array_tasks"] = [j.id for j in jobs]
        self.set_header("Location", self.request.path.rstrip("/") + f"/{jobs[0].id}")
        self.reply(out, status=201)


class JobHandler(GPUJobsHandler):
    @web.authenticated
    @authorized
    async def get(self, job_id: str) -> None:
        self.reply(self.service.view(self.service.get(self.job_id(job_id)), self.owner))

    @web.authenticated
    @authorized
    async def delete(self, job_id: str) -> None:
        job = await self.service.cancel(self.job_id(job_id), self.owner)
        self.reply(self.service.view(job))

    @web.authenticated
    @authorized
    async def patch(self, job_id: str) -> None:
        """Change a job's time_limit, priority, name or begin (409 saying why when it cannot)."""
        body = self.json_object("with the fields to change")
        self.reply(self.service.view(self.service.update(self.job_id(job_id), self.owner, body)))


class JobHoldHandler(GPUJobsHandler):
    """`POST jobs/{id}/hold`: keep a pending job from starting (it shows as HELD)."""

    @web.authenticated
    @authorized
    async def post(self, job_id: str) -> None:
        self.reply(self.service.view(self.service.hold(self.job_id(job_id), self.owner)))


class JobReleaseHandler(GPUJobsHandler):
    """`POST jobs/{id}/release`: let a held job start again."""

    @web.authenticated
    @authorized
    async def post(self, job_id: str) -> None:
        self.reply(self.service.view(self.service.release(self.job_id(job_id), self.owner)))


class JobsCancelHandler(GPUJobsHandler):
    """`POST jobs/cancel` with one of `{"ids": [...]}`, `{"user": "bob"}`, `{"array": ID}` or
    `{"all": true}`: cancel many jobs at once (of those, the ones the caller may cancel; a
    user's own unless an admin), the pending ones in one store transaction."""

    @web.authenticated
    @authorized
    async def post(self) -> None:
        body = self.json_object("saying which jobs to cancel")
        unknown = sorted(set(body) - {"ids", "user", "array", "all"})
        if unknown:
            raise ApiError(400, unknown[0], f"unknown field {unknown[0]!r}: give ids, user, array or all")
        if len(body) != 1 or body.get("all", True) is not True:
            raise ApiError(400, "body", "give exactly one of ids (a list of job ids), user, array or all: true")
        ids = body.get("ids")
        if ids is not None:
            if not isinstance(ids, list) or not ids or len(ids) > 100_000:
                raise ApiError(400, "ids", "ids must be a list of 1 to 100000 job ids")
            ids = [parse_id(i, "ids") for i in ids]
        user = body.get("user")
        if user is not None and (not isinstance(user, str) or not 0 < len(user) <= 128):
            raise ApiError(400, "user", "user must be a user name")
        array = body.get("array")
        if array is not None:
            array = parse_id(array, "array")
        self.reply(await self.service.cancel_many(self.owner, ids, user, array))


class JobEndHandler(GPUJobsHandler):
    """`POST jobs/{id}/end {"state": "COMPLETED", "reason": "..."}`: the end of a job the engine
    did not launch itself (a kernel, reported by the kernel provisioner)."""

    @web.authenticated
    @authorized
    async def post(self, job_id: str) -> None:
        body = self.json_object()
        job = self.service.finish_external(self.job_id(job_id), self.owner, body.get("state", "COMPLETED"),
                                           body.get("reason"))
        self.reply(self.service.view(job))


class JobAdoptHandler(GPUJobsHandler):
    """`POST jobs/{id}/adopt {"pid": N}`: confine a running GPU kernel's process in its job's
    cgroup, with the device fence (asked by the kernel provisioner after each launch)."""

    @web.authenticated
    @authorized
    async def post(self, job_id: str) -> None:
        body = self.json_object()
        # the kernel must be a child of the caller: the user's Jupyter server on the shared
        # engine's socket, this very server where the engine is embedded (its provisioner)
        launcher = peer_pid(self) or os.getpid()
        self.reply(self.service.adopt(self.job_id(job_id), self.owner, body.get("pid"), launcher))


class JobLogHandler(GPUJobsHandler):
    @web.authenticated
    @authorized
    async def get(self, job_id: str) -> None:
        offset = self.int_arg("offset", 0) or 0
        data, nxt, done = self.service.read_log(self.job_id(job_id), offset, viewer=self.owner)
        self.reply({"offset": nxt, "data": data, "done": done})


class JobEventsHandler(GPUJobsHandler):
    @web.authenticated
    @authorized
    async def get(self, job_id: str) -> None:
        self.reply({"events": self.service.events(self.job_id(job_id), self.owner)})


class QueueHandler(GPUJobsHandler):
    """`GET queue?limit=&offset=&user=`: one page of the pending jobs in scheduling order, and
    how many there are (`total`); `next` is the offset of the next page (null on the last).

    Many clients poll the head of the queue (panels, widgets, `watch jupyter gpujobs queue`):
    a page is built once per state of the queue (the last plan and the pending jobs) and at
    most once a second, and served to every client that asks for it, so that polling leaves
    the event loop to the scheduler."""

    CACHE_S = 1.0

    @web.authenticated
    @authorized
    async def get(self) -> None:
        limit = self.int_arg("limit", 100, low=1, high=1000) or 100
        offset = self.int_arg("offset", 0) or 0
        user = self.text_arg("user")
        service = self.service
        state = service.queue_state()
        cache: dict[tuple[Any, ...], tuple[float, tuple[Any, ...], bytes, str]] = self.settings.setdefault(
            "gpujobs_queue_pages", {})
        viewer = self.owner
        # a page shows others' jobs as queue views when data is private: one page per viewer then
        key = (offset, limit, user, viewer if service.private_data else None)
        now = time.monotonic()
        hit = cache.get(key)
        # the plan by identity: comparing plans would compare their 10k-long orders
        fresh = hit is not None and hit[1][0] is state[0] and hit[1][1:] == state[1:] and now - hit[0] <= self.CACHE_S
        if not fresh:
            page, total = service.queue_page(offset, limit, user)
            nxt = offset + limit if offset + limit < total else None
            body = json.dumps({"jobs": [service.view(j, viewer) for j in page], "total": total, "offset": offset,
                               "next": nxt, "held": service.access.held_count(user)}, allow_nan=False).encode()
            if len(cache) > 256:
                cache.clear()
            # its ETag with it: hashing a 100 KiB page for every poll cost as much as serving it
            hit = cache[key] = (now, state, body, f'"{hashlib.sha1(body).hexdigest()}"')
        self._etag = hit[3]
        self.set_header("Content-Type", "application/json")
        self.finish(hit[2])

    def compute_etag(self) -> str | None:
        return getattr(self, "_etag", None) or super().compute_etag()


class WhoAmIHandler(GPUJobsHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        user = self.owner
        out: dict[str, Any] = {"user": user, "admin": self.service.is_admin(user)}
        notice = engine_notice(self.service)
        if notice:
            out["notice"] = notice
        self.reply(out)


class InfoHandler(GPUJobsHandler):
    """What is in force in this engine, for `jupyter gpujobs doctor`: its version, the GPU
    backend and GPUs, the store (kind and size; its URL for admins), the isolation of jobs,
    and who the caller is."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        from ... import __version__
        from ..connections import open_files_report
        from ..store.report import store_report

        user = self.owner
        admin = self.service.is_admin(user)
        gpus = self.service.gpu_views()
        store = store_report(self.service.store)
        if not admin:
            store.pop("url")
        self.reply({
            "version": __version__,
            "open_files": open_files_report(),
            "user": user,
            "admin": admin,
            "identity": self.settings.get("gpujobs_identity", "unix"),
            "backend": self.service.gpus.name,
            "runner": self.service.runner.name,
            "gpus": len(gpus),
            "gpu_models": sorted({g["name"] for g in gpus}),
            "store": store,
            "isolation": self.service.isolation,
            "share_enforcement": self.service.shares.describe(self.service.inventory),
            "share_mode": self.service.shares.mode(),
            # on fake GPUs: the name a process puts in GPUJOBS_FAKE_FLEET to be on this engine's
            # GPUs only (engine/gpus/fake.py); a demo's hand-made "rogue" uses it
            "fake_fleet": getattr(self.service.gpus, "fleet", None),
        })


class QuotaHandler(GPUJobsHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        from ..quota import quota_report

        user = self.text_arg("user") or self.owner
        if user != self.owner and not self.service.is_admin(self.owner):
            raise ApiError(403, "user", "only admins may see another user's quota")
        self.reply(quota_report(self.service, user))

    @web.authenticated
    @authorized
    async def put(self) -> None:
        """Admin: `{"scope": "users"|"groups", "name": "alice", "quota": {...} | null}`."""
        body = self.json_object()
        unknown = set(body) - {"scope", "name", "quota"}
        if unknown:
            raise ApiError(400, sorted(unknown)[0], "unknown field; expected scope, name, quota")
        scope, name, quota = body.get("scope"), body.get("name"), body.get("quota")
        self.service.set_quota(self.owner, scope, name, quota)
        self.reply({"scope": scope, "name": name, "quota": quota})


class ReservationsHandler(GPUJobsHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        """Every reservation (what is kept for whom is no one's private data)."""
        self.reply({"reservations": self.service.list_reservations()})

    @web.authenticated
    @authorized
    async def post(self) -> None:
        """Admin: reserve GPUs (`model.validate_reservation`), or accept a learned proposal:
        `{"proposal": <finding id>}` (an admin, or a user for themselves within their quota)."""
        body = self.json_body()
        if isinstance(body, dict) and "proposal" in body:
            if set(body) != {"proposal"}:
                raise ApiError(400, sorted(set(body) - {"proposal"})[0], "a proposal is accepted as it is")
            self.reply(self.service.accept_reservation_proposal(self.owner, body["proposal"]), 201)
            return
        self.reply(self.service.create_reservation(self.owner, body), 201)


class ReservationHandler(GPUJobsHandler):
    @web.authenticated
    @authorized
    async def delete(self, reservation_id: str) -> None:
        self.reply({"id": self.service.delete_reservation(self.owner, reservation_id), "deleted": True})


def _notifier(service: JobService) -> Notifier:
    if service.notifier is None:
        raise ApiError(404, None, "this engine sends no notifications")
    return service.notifier


class NotificationsHandler(GPUJobsHandler):
    """`GET/PUT/DELETE notifications`: the caller's own e-mail and webhook notifications."""

    @property
    def notifier(self) -> Notifier:
        return _notifier(self.service)

    @web.authenticated
    @authorized
    async def get(self) -> None:
        self.reply(self.notifier.settings_for(self.owner))

    @web.authenticated
    @authorized
    async def put(self) -> None:
        """`{"email": "...", "webhook": "https://...", "events": ["ended", ...]}` (any of them;
        null clears an address)."""
        body = self.json_object()
        self.reply(self.notifier.set_settings(self.owner, body))

    @web.authenticated
    @authorized
    async def delete(self) -> None:
        self.reply(self.notifier.set_settings(self.owner, {"email": None, "webhook": None}))


class NotificationsTestHandler(GPUJobsHandler):
    """`POST notifications/test`: send a test message to the caller's destinations now."""

    @web.authenticated
    @authorized
    async def post(self) -> None:
        self.reply({"queued": _notifier(self.service).send_test(self.owner)})


class OpenAPIHandler(GPUJobsHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        spec = json.loads(SPEC_PATH.read_text())
        spec["servers"] = [{"url": self.base_url.rstrip("/") + "/" + API}]
        self.reply(spec)


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


class EventsHandler(AuthorizedWebSocket):
    """Websocket of job state changes (`{"type": "job", ...}`), GPU updates (`{"type": "gpus"}`)
    and the monitor's findings as they open and close (`{"type": "finding", "finding": {...}}`),
    the last only to whom `GET findings` shows them: the finding's user and admins."""

    @property
    def service(self) -> JobService:
        return self.settings["gpujobs_service"]

    def open(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        self._viewer = job_owner(self)
        self._admin = self.service.is_admin(self._viewer)
        self._unsubscribe = self.service.subscribe(self._send)
        from tornado.ioloop import PeriodicCallback

        self._gpus_timer = PeriodicCallback(self._send_gpus, 3000)
        self._gpus_timer.start()
        self._send_gpus()

    #: The GPUs' message is made at most this often for all the websockets together.
    GPUS_EVERY_S = 1.0

    def _send(self, message: dict[str, Any]) -> None:
        if message.get("type") == "finding" and not may_see(message["finding"], self._viewer, self._admin):
            return
        try:
            self.write_message(self._text(message))
        except websocket.WebSocketClosedError:
            self.on_close()

    def _text(self, message: dict[str, Any]) -> str:
        """The JSON of a broadcast message as this viewer may see it. A message goes to every
        websocket in turn: it is encoded once for all those who see it whole, and once for
        those who see its job's queue view only, not once per websocket."""
        last: list[Any] = self.settings.setdefault("gpujobs_ws_last", [None, {}])
        if last[0] is not message:
            last[0], last[1] = message, {}
        shown = self.service.job_message_for(message, self._viewer) if message.get("type") == "job" else message
        whole = shown is message
        text = last[1].get(whole)
        if text is None:
            text = last[1][whole] = json.dumps(shown)
        return text

    def _send_gpus(self) -> None:
        cached: list[Any] = self.settings.setdefault("gpujobs_ws_gpus", [-float("inf"), None])
        now = time.monotonic()
        if now - cached[0] >= self.GPUS_EVERY_S:
            cached[0], cached[1] = now, {"type": "gpus", "gpus": self.service.gpu_views()}
        self._send(cached[1])

    def on_message(self, message: str | bytes) -> None:
        pass

    def on_close(self) -> None:
        unsubscribe = getattr(self, "_unsubscribe", None)
        if unsubscribe:
            unsubscribe()
            self._unsubscribe = None
        timer = getattr(self, "_gpus_timer", None)
        if timer:
            timer.stop()


#: A job id in a route (checked by `GPUJobsHandler.job_id`, so a bad one gets a 400 naming it).
JOB_ID = r"(?P<job_id>[^/]+)"

HANDLERS: list[tuple[str, type]] = [
    (rf"/{API}/gpus/?", GPUsHandler),
    (rf"/{API}/jobs/?", JobsHandler),
    (rf"/{API}/jobs/{JOB_ID}/log/?", JobLogHandler),
    (rf"/{API}/jobs/{JOB_ID}/events/?", JobEventsHandler),
    (rf"/{API}/jobs/cancel/?", JobsCancelHandler),
    (rf"/{API}/jobs/{JOB_ID}/end/?", JobEndHandler),
    (rf"/{API}/jobs/{JOB_ID}/adopt/?", JobAdoptHandler),
    (rf"/{API}/jobs/{JOB_ID}/hold/?", JobHoldHandler),
    (rf"/{API}/jobs/{JOB_ID}/release/?", JobReleaseHandler),
    (rf"/{API}/jobs/{JOB_ID}/?", JobHandler),
    (rf"/{API}/queue/?", QueueHandler),
    (rf"/{API}/quota/?", QuotaHandler),
    (rf"/{API}/reservations/?", ReservationsHandler),
    (rf"/{API}/reservations/(?P<reservation_id>[^/]+)/?", ReservationHandler),
    (rf"/{API}/notifications/test/?", NotificationsTestHandler),
    (rf"/{API}/notifications/?", NotificationsHandler),
    (rf"/{API}/whoami/?", WhoAmIHandler),
    (rf"/{API}/info/?", InfoHandler),
    (rf"/{API}/events/?", EventsHandler),
    (rf"/{API}/openapi.json", OpenAPIHandler),
]
