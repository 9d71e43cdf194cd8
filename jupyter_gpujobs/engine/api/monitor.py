"""REST endpoints of the monitor under `{base_url}gpujobs/api/` (`MONITOR_HANDLERS`, mounted
next to handlers.py `HANDLERS` by the Jupyter extension and the shared engine):

- `GET findings?kind=&job=&open=1&since=&limit=`: findings (admins: all; others: theirs)
- `POST findings/resolve {"id": N}`: admins close a finding (a drained GPU is undrained)
- `POST gpus/drain {"gpu": 3, "host": "localhost", "draining": true, "reason": "..."}`: admins
- `POST gpus/foreign {"gpu": 2, "host": "localhost", "override": true, "reason": "..."}`: admins
  let the queue hand out a GPU that a process outside the queue uses (until it is seen
  unused), or take that back with `"override": false`
- `GET gpus/samples?gpu=&since=&until=&resolution=0|60|3600`: stored GPU readings (at most
  MAX_SAMPLES: 400 over it); with `step=N`, per GPU in buckets of N seconds (for charts)
- `GET jobs/{id}/stats`: a job's GPU utilization and memory (mean, peak), its runtime
  prediction and its findings
- `GET usage?since=&until=&by=user|group|model`: GPU-hours
- `GET usage/heatmap?since=&until=`: utilization by weekday x local hour
- `GET usage/queue?since=&until=&step=`: queue length and wait times over time
- `GET metrics`: Prometheus text exposition

Handlers only decode, check roles and call the Monitor; they hold no rules of their own. What
reads a range of history runs off the engine's loop (`base.report`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from jupyter_server.auth.decorator import authorized
from tornado import web

from ...model import MAX_ID, InvalidInput, parse_id, parse_reason
from ..monitor.diagnosis import KINDS
from ..monitor.usage import check_step, heatmap_report, queue_report, time_range, usage_report
from .base import report
from .handlers import API, JOB_ID, ApiError, GPUJobsHandler

if TYPE_CHECKING:
    from ..monitor import Monitor


class MonitorHandler(GPUJobsHandler):
    @property
    def monitor(self) -> Monitor:
        monitor = self.settings.get("gpujobs_monitor")
        if monitor is None:
            raise ApiError(404, None, "monitoring is not enabled on this server")
        return monitor

    def range_args(self) -> tuple[float, float]:
        return time_range(self.get_argument("since", None), self.get_argument("until", None), time.time())


class FindingsHandler(MonitorHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        kind = self.text_arg("kind")
        if kind is not None and kind not in KINDS:
            raise ApiError(400, "kind", f"unknown kind {kind!r}; kinds are {', '.join(KINDS)}")
        job = self.int_arg("job", None, low=1)
        limit = self.int_arg("limit", 200, low=1, high=10_000) or 200
        open_arg = (self.get_argument("open", "") or "").lower()
        if open_arg not in ("", "0", "1", "true", "false"):
            raise ApiError(400, "open", f"expected 1 or 0, got {open_arg!r}")
        since = None
        if self.get_argument("since", None):
            since, _ = self.range_args()
        user = self.owner
        findings = await report(self.monitor.findings, user, self.service.is_admin(user), kind=kind, job_id=job,
                                open_only=open_arg in ("1", "true"), since=since, limit=limit)
        self.reply({"findings": findings})


class FindingResolveHandler(MonitorHandler):
    @web.authenticated
    @authorized
    async def post(self) -> None:
        self.require_admin()
        body = self.json_body()
        if not isinstance(body, dict):
            raise ApiError(400, "body", "expected {\"id\": <finding id>}")
        try:
            parse_id(body.get("id"), "id")
        except InvalidInput:
            raise ApiError(400, "id", "expected {\"id\": <finding id>}, a whole number from 1 to 2^63-1") from None
        finding = self.monitor.resolve(body["id"], self.owner)
        if finding is None:
            raise ApiError(404, "id", f"no finding {body['id']}")
        self.reply(finding)


def gpu_action(handler: GPUJobsHandler, flag: str, default_host: str) -> tuple[str, int, bool, str]:
    """An admin's action on one GPU, `{"gpu": N, "host": ..., FLAG: true|false, "reason": ...}`:
    checked and returned as (host, gpu, flag, reason); the GPU must exist (404 otherwise)."""
    handler.require_admin()
    body = handler.json_object()
    unknown = set(body) - {"gpu", "host", flag, "reason"}
    if unknown:
        raise ApiError(400, sorted(unknown)[0], f"unknown field; expected gpu, host, {flag}, reason")
    gpu = body.get("gpu")
    if not isinstance(gpu, int) or isinstance(gpu, bool) or not 0 <= gpu <= MAX_ID:
        raise ApiError(400, "gpu", "expected the GPU index")
    host = body.get("host") or default_host
    if not isinstance(host, str):
        raise ApiError(400, "host", "expected a host name")
    value = body.get(flag, True)
    if not isinstance(value, bool):
        raise ApiError(400, flag, "expected true or false")
    reason = parse_reason(body.get("reason"))
    if not any(g["host"] == host and g["index"] == gpu for g in handler.service.gpu_views()):
        raise ApiError(404, "gpu", f"no GPU {gpu} on {host}")
    return host, gpu, value, reason


class DrainHandler(MonitorHandler):
    @web.authenticated
    @authorized
    async def post(self) -> None:
        host, gpu, draining, reason = gpu_action(self, "draining", self.monitor.host)
        before = (host, gpu) in self.monitor.drained
        self.monitor.drain(host, gpu, draining, self.owner, reason)
        self.service.rules.audit(self.owner, "drain", f"gpu:{host}:{gpu}", {"draining": before},
                                 {"draining": draining, "reason": reason})
        self.reply({"gpus": self.service.access.gpu_views_for(self.service.gpu_views(), self.owner)})


class ForeignOverrideHandler(GPUJobsHandler):
    """Not the monitor's: the engine itself sees GPUs in use outside the queue."""

    @web.authenticated
    @authorized
    async def post(self) -> None:
        views = self.service.gpu_views()
        host, gpu, override, reason = gpu_action(self, "override", views[0]["host"] if views else "localhost")
        self.service.ignore_foreign(host, gpu, override, self.owner, reason)
        self.service.rules.audit(self.owner, "foreign", f"gpu:{host}:{gpu}", None,
                                 {"override": override, "reason": reason})
        self.reply({"gpus": self.service.access.gpu_views_for(self.service.gpu_views(), self.owner)})


#: The most readings one `GET gpus/samples` (without `step`) answers with: all of a year's
#: readings of 8 GPUs (about 270,000) held the engine's loop, every user's request, for 10 s.
MAX_SAMPLES = 20_000


class GPUSamplesHandler(MonitorHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        since, until = time_range(self.get_argument("since", None), self.get_argument("until", None), time.time(),
                                  default_span_s=3600)
        gpu = self.int_arg("gpu", None)
        resolution = self.int_arg("resolution", None)
        if resolution not in (None, 0, 60, 3600):
            raise ApiError(400, "resolution", "expected 0 (raw), 60 or 3600")
        step = self.int_arg("step", None, low=1, high=366 * 86400)
        if step is None:
            samples = await report(self.monitor.gpu_samples, since, until, gpu, resolution, limit=MAX_SAMPLES + 1)
            if len(samples) > MAX_SAMPLES:
                raise ApiError(400, "since", f"more than {MAX_SAMPLES} readings from since to until; ask for a "
                                             "shorter range, one gpu, a resolution (60 or 3600), or buckets (step)")
            self.reply({"samples": samples})
            return
        if resolution is not None:
            raise ApiError(400, "step", "give either step or resolution")
        check_step(step, since, until)
        self.reply({"samples": await report(self.monitor.gpu_series, since, until, step, gpu), "step": step})


class JobStatsHandler(MonitorHandler):
    @web.authenticated
    @authorized
    async def get(self, job_id: str) -> None:
        self.reply(self.monitor.job_stats(self.service.get_private(self.job_id(job_id), self.owner)))


class UsageHandler(MonitorHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        since, until = self.range_args()
        by = self.text_arg("by") or "user"
        self.reply(await report(usage_report, self.service.store, since, until, by, time.time()))


class HeatmapHandler(MonitorHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        since, until = self.range_args()
        self.reply(await report(heatmap_report, self.service.store, since, until))


class QueueHistoryHandler(MonitorHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        since, until = time_range(self.get_argument("since", None), self.get_argument("until", None), time.time(),
                                  default_span_s=86400)
        step = self.int_arg("step", None, low=1, high=366 * 86400) or max(60, int((until - since) // 96) or 1)
        self.reply(await report(queue_report, self.service.store, since, until, step, time.time()))


class MetricsHandler(MonitorHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        body, content_type = self.monitor.metrics()
        self.finish(body, set_content_type=content_type)  # APIHandler would say JSON otherwise


MONITOR_HANDLERS: list[tuple[str, type]] = [
    (rf"/{API}/findings/?", FindingsHandler),
    (rf"/{API}/findings/resolve/?", FindingResolveHandler),
    (rf"/{API}/gpus/drain/?", DrainHandler),
    (rf"/{API}/gpus/foreign/?", ForeignOverrideHandler),
    (rf"/{API}/gpus/samples/?", GPUSamplesHandler),
    (rf"/{API}/jobs/{JOB_ID}/stats/?", JobStatsHandler),
    (rf"/{API}/usage/?", UsageHandler),
    (rf"/{API}/usage/heatmap/?", HeatmapHandler),
    (rf"/{API}/usage/queue/?", QueueHistoryHandler),
    (rf"/{API}/metrics/?", MetricsHandler),
]

__all__ = ["MONITOR_HANDLERS"]
