"""REST and websocket routes under `{base_url}gpujobs/api/`: the table (`HANDLERS`) that both
the shared engine and an embedded one mount, of the handlers that live by area beside it:

- `base`: what every handler shares (JSON body parsing, identity, `GPUJobsHandler`, `ApiError`,
  the authorized websocket, the routes' prefix);
- `jobs`: jobs and the queue; `quotas`: quotas and reservations; `notifications`: a user's
  notifications; `engine_info`: GPUs, whoami, info, the OpenAPI spec; `events`: the websocket.

Handlers authenticate and authorize through jupyter_server (resource "gpujobs"), decode and
bound the request, call the JobService, and turn its errors into JSON 4xx answers. They hold no
business rules. This module only names routes; it may import the handler modules, never the
reverse. The names other modules import from here (`API`, `JOB_ID`, `ApiError`, ...) stay here.
"""

from __future__ import annotations

from .base import (
    API,
    AUTH_RESOURCE,
    JOB_ID,
    MAX_JSON_DEPTH,
    RETRY_AFTER_S,
    SPEC_PATH,
    ApiError,
    AuthorizedWebSocket,
    GPUJobsHandler,
    engine_notice,
    job_owner,
    parse_json_body,
)
from .engine_info import GPUsHandler, InfoHandler, OpenAPIHandler, WhoAmIHandler
from .events import EventsHandler
from .jobs import (
    JobAdoptHandler,
    JobEndHandler,
    JobEventsHandler,
    JobHandler,
    JobHoldHandler,
    JobLogHandler,
    JobReleaseHandler,
    JobsCancelHandler,
    JobsHandler,
    QueueHandler,
)
from .notifications import NotificationsHandler, NotificationsTestHandler
from .quotas import QuotaHandler, ReservationHandler, ReservationsHandler

__all__ = [
    "API", "AUTH_RESOURCE", "HANDLERS", "JOB_ID", "MAX_JSON_DEPTH", "RETRY_AFTER_S", "SPEC_PATH", "ApiError",
    "AuthorizedWebSocket", "EventsHandler", "GPUJobsHandler", "GPUsHandler", "InfoHandler", "JobAdoptHandler",
    "JobEndHandler", "JobEventsHandler", "JobHandler", "JobHoldHandler", "JobLogHandler", "JobReleaseHandler",
    "JobsCancelHandler", "JobsHandler", "NotificationsHandler", "NotificationsTestHandler", "OpenAPIHandler",
    "QueueHandler", "QuotaHandler", "ReservationHandler", "ReservationsHandler", "WhoAmIHandler",
    "engine_notice", "job_owner", "parse_json_body",
]

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
