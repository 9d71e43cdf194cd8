"""GPU monitoring of the engine: the `Monitor` the server app starts next to the JobService.

It owns, in submodules: the sampler (periodic GPU readings, downsampled storage, per-job GPU
stats), the pure detectors (diagnosis.py: out of memory, repeated failures, idle hogs, GPUs
with errors, rogue processes), usage reports and the heatmap (usage.py), Prometheus metrics
(metrics.py) and runtime prediction (predict.py); their REST endpoints are engine/api/monitor.py
(`MONITOR_HANDLERS`). The Monitor wires them to the engine: it listens to job state changes
(`service.subscribe`), samples every `sample_interval`, stores each finding once (open
until its condition goes away), logs it, adds a FINDING event to the job concerned, pushes
each opened or closed finding to the engine's listeners (`{"type": "finding", "finding":
{...}}`: the events websocket shows it to the finding's user and admins), drains a
GPU when the admin policy says so (the inventory's `GPU.draining`, read by the scheduler),
stops rogue processes under `rogue_policy = "kill"`, runs the share watcher (shares.py: a job
over its GPU memory share is warned, then stopped through `service.over_share`; it runs even
with monitoring off, whenever a share job runs), and sets `Job.predicted_runtime_s` on
active jobs when a prediction is confident (and `Job.predicted_runtime_range`, the spread of
the runs behind it, whenever they are the owner's own: expected-start ranges).

The Monitor receives the engine it watches (`MonitoredEngine`, engine_view.py: exactly what
it may call) and imports no part of the service. Its own parts: carry.py (going on past a
failure), draining.py (the inventory with drained GPUs marked), settings.py (what it is told).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import time
from typing import TYPE_CHECKING, Any

from ...model import Job, JobState, is_share
from .carry import carry_on
from .diagnosis import (
    Finding,
    ProcessInfo,
    detect_gpu_errors,
    detect_idle_hog,
    detect_oom,
    detect_repeated_failures,
    detect_rogues,
)
from .draining import DrainingBackend
from .engine_view import MonitoredEngine
from .predict import Prediction, RuntimePredictor, job_fields, job_key
from .settings import MonitorSettings

if TYPE_CHECKING:
    from ..store import history
    from ..store import monitoring as mstore
else:

    class _Lazy:
        """A store module's functions, imported on first use: the CLI imports monitor.text,
        and SQLAlchemy would double its start-up time."""

        def __init__(self, module: str):
            self.module = module

        def __getattr__(self, name: str) -> Any:
            return getattr(importlib.import_module(f"jupyter_gpujobs.engine.store.{self.module}"), name)

    mstore, history = _Lazy("monitoring"), _Lazy("history")

log = logging.getLogger("jupyter_gpujobs")


_LOG_TAIL_BYTES = 64 * 1024
_REFRESH_S = 30.0  # how often a standing finding's message and last_seen are rewritten


class Monitor:
    """Sampling, diagnosis, usage, metrics and prediction for one engine."""

    def __init__(self, service: MonitoredEngine, settings: MonitorSettings | None = None,
                 logger: logging.Logger | None = None):
        self.service = service
        self.settings = settings or MonitorSettings()
        self.log = logger or log
        s = self.settings
        self.store = service.store
        backend = service.gpus.inner if isinstance(service.gpus, DrainingBackend) else service.gpus
        self.backend = backend
        self.host = getattr(backend, "host", "localhost")
        # (here, not above: the CLI imports monitor.text, and these load SQLAlchemy and psutil)
        from .metrics import WaitHistogram, make_registry
        from .rogue import ProcessResolver, RogueKiller
        from .sampler import Sampler
        from .shares import ShareWatcher

        self.sampler = Sampler(backend, self.store, host=self.host, raw_keep_s=s.raw_retention_s,
                               minute_keep_s=s.minute_retention_s, hour_keep_s=s.hour_retention_s,
                               idle_threshold=s.idle_hog_threshold)
        self.resolver = ProcessResolver(s.rogue_ignore)
        self.killer = RogueKiller(s.kill_grace_s)
        self.share_watcher = ShareWatcher(service.shares.grace_s)
        self._share_warned: set[tuple[int, int]] = set()  # (job id, GPU) warned of being over its share
        self.predictor = RuntimePredictor()
        self.predictions: dict[int, Prediction] = {}
        self.wait_histogram = WaitHistogram()
        self.drained: set[tuple[str, int]] = set()
        self.registry = make_registry(self)
        self.last_tick_cpu_s = 0.0
        self._open: dict[str, dict[str, float]] = {}  # kind -> open key -> last refresh (monotonic)
        self._ended: list[int] = []
        self._oom_jobs: dict[int, str] = {}
        self._habits_at = -float("inf")  # when the history was last searched for habits
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[Any] | None = None
        self._unsubscribe: Any = None
        self._started = False
        self._loaded = False

    # ================================================================= life cycle

    def install(self) -> None:
        """Put the drained-GPU view in front of the engine's backend (before it starts)."""
        if not isinstance(self.service.gpus, DrainingBackend):
            self.service.gpus = DrainingBackend(self.backend, self.drained)
        if not self._loaded:
            self._loaded = True
            self.load()

    def load(self) -> None:
        """What survives a restart: drained GPUs, open findings, runtime history, wait times."""
        for f in mstore.list_findings(self.store, open_only=True, limit=100_000):
            self._open.setdefault(f["kind"], {})[f["key"]] = 0.0
            if f["kind"] == "gpu_drained" and f["host"] is not None and f["gpu"] is not None:
                self.drained.add((f["host"], int(f["gpu"])))
        for job in history.finished_runtimes(self.store, limit=20_000):
            runtime = _runtime(job)
            if runtime is not None:
                self.predictor.add(job_key(job.user, job.name, job.command, job.gpu_type), runtime)
        for wait in history.wait_times(self.store):
            self.wait_histogram.observe(wait)

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        self.install()
        self._unsubscribe = self.service.subscribe(self._on_message)
        for job in self.service.active_jobs():
            self._predict(job)
        if self.drained:
            self.service.refresh_inventory(force=True)
        if self.settings.enabled:
            with carry_on("recording the GPU inventory", self.log):
                self.sampler.record_inventory(self.backend.inventory(), time.time())
        self._wake = asyncio.Event()  # (monitoring off: the loop runs the share watcher only)
        self._task = asyncio.ensure_future(self._loop())

    async def stop(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
            self._task = None
        self._process_ended()
        self._started = False

    async def _loop(self) -> None:
        assert self._wake is not None
        wake = self._wake
        loop = asyncio.get_running_loop()
        next_tick = 0.0
        while True:
            # a timer rather than wait_for(): before Python 3.12 wait_for() can swallow the
            # cancel of stop() when the event is set at the same moment, and stop() then hangs
            timer = loop.call_later(max(0.0, next_tick - time.monotonic()), wake.set)
            try:
                await wake.wait()
            finally:
                timer.cancel()
            wake.clear()
            if self.settings.enabled:
                with carry_on("diagnosing ended jobs", self.log):
                    self._process_ended()
            if time.monotonic() >= next_tick:
                next_tick = time.monotonic() + self.settings.sample_interval
                with carry_on("GPU monitoring tick", self.log):
                    if self.settings.enabled:
                        self.tick(time.time())
                    else:
                        self.watch_shares(time.time())

    # ================================================================= engine events

    def _on_message(self, message: dict[str, Any]) -> None:
        if message.get("type") != "job":
            return
        view = message.get("job") or {}
        job_id = view.get("id")
        state = view.get("state")
        if job_id is None:
            return
        if state == JobState.RUNNING.value:
            started, submitted = view.get("started_at"), view.get("submitted_at")
            event = message.get("event") or {}
            if started and submitted and event.get("state") == "RUNNING" and event.get("actor") == "scheduler":
                self.wait_histogram.observe(started - submitted)
        if state in (JobState.PENDING.value, JobState.RUNNING.value):
            job = self.service.active_job(job_id)
            if job is not None:
                self._predict(job)
        elif state in {s.value for s in JobState if s.is_final}:
            self._ended.append(job_id)
            if self._wake is not None:
                self._wake.set()

    def _predict(self, job: Job) -> Prediction:
        p = self.predictor.predict(job_key(job.user, job.name, job.command, job.gpu_type))
        self.predictions[job.id] = p
        for name, value in job_fields(p, job.time_limit_s, self.settings.predict_min_confidence).items():
            setattr(job, name, value)
        return p

    # ================================================================= ended jobs

    def _process_ended(self) -> None:
        ended, self._ended = self._ended, []
        for job_id in dict.fromkeys(ended):
            job = self.store.get(job_id)
            if job is None or not job.state.is_final:
                continue
            self.diagnose_ended(job, time.time())

    def diagnose_ended(self, job: Job, now: float) -> list[dict[str, Any]]:
        """Stats become final; OOM and repeated-failure findings; runtime history."""
        out: list[dict[str, Any]] = []
        stats = self.sampler.finish_job(job.id)
        self.predictions.pop(job.id, None)
        self._resolve("idle_hog", f"idle:{job.id}", now)
        oom = detect_oom(job, self._log_tail(job.id),
                         memory_max_fraction=stats.memory_max_fraction if stats else None,
                         memory_max_mb=stats.memory_max_mb if stats else None,
                         memory_total_mb=stats.memory_total_mb if stats else None,
                         limit_fraction=self.settings.oom_memory_fraction)
        if oom is not None:
            self._oom_jobs[job.id] = "out of memory"
            if len(self._oom_jobs) > 1000:
                self._oom_jobs.pop(next(iter(self._oom_jobs)))
            out.append(self.report(oom, now))
        if job.state in (JobState.FAILED, JobState.LOST, JobState.COMPLETED):
            latest = [j for j in history.jobs_like(self.store, job.user, job.name, job.ended_at or now)
                      if job.name or j.command == job.command]
            finding = detect_repeated_failures(latest, self._oom_jobs, self.settings.failure_streak)
            signature = job.name or "\0".join(job.command)
            if finding is not None:
                out.append(self.report(finding, now, always_event=True))
            elif job.state is JobState.COMPLETED:
                self._resolve("repeated_failure", f"failures:{job.user}:{signature}", now)
        runtime = _runtime(job)
        if runtime is not None and job.started_at is not None:
            self.predictor.add(job_key(job.user, job.name, job.command, job.gpu_type), runtime)
        return out

    def _log_tail(self, job_id: int) -> str:
        path = self.store.log_path(job_id)
        if not path:
            return ""
        try:
            with open(path, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                f.seek(max(0, size - _LOG_TAIL_BYTES))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    # ================================================================= the tick

    def tick(self, now: float) -> None:
        """One reading of every GPU and the detectors that run on readings."""
        cpu0 = time.process_time()
        running = [j for j in self.service.active_jobs() if j.state is JobState.RUNNING]
        self.sampler.tick(now, running)
        self._idle_hogs(now, running)
        self._gpu_errors(now)
        infos = self._rogues(now, running)
        self.watch_shares(now, running, infos)
        self._set_aside(now)
        if now - self._habits_at >= self.settings.habits_interval_s:
            self._habits_at = now
            self._habits(now)
        self.last_tick_cpu_s = time.process_time() - cpu0

    def _idle_hogs(self, now: float, running: list[Job]) -> None:
        s = self.settings
        keys = set()
        for job in running:
            finding = detect_idle_hog(job, self.sampler.idle_since.get(job.id), now, s.idle_hog_after_s,
                                      s.idle_hog_threshold)
            if finding is not None:
                keys.add(finding.key)
                self.report(finding, now)
        self._resolve_missing("idle_hog", keys, now)

    def _gpu_errors(self, now: float) -> None:
        if not self.sampler.errors_changed:
            return
        names = {g.uuid: g.name for g in self.service.inventory}
        for sample in self.sampler.latest:
            if sample.uuid not in self.sampler.errors_changed:
                continue
            state = self.sampler.gpu_errors[sample.uuid]
            finding = detect_gpu_errors(self.host, sample.index, sample.uuid, names.get(sample.uuid, "GPU"), state,
                                        self.settings.drain_after_errors, self.settings.gpu_error_repeat)
            if finding is None:
                continue
            drain = bool(finding.data.get("drain"))
            self.report(finding, now, action="drained" if drain else "", force=True)
            if drain and (self.host, sample.index) not in self.drained:
                self.drain(self.host, sample.index, True, "monitor", f"{state.total} errors "
                           f"(drain_after_errors={self.settings.drain_after_errors})")

    def _processes(self) -> list[ProcessInfo] | None:
        """The processes on this host's GPUs, each with the job it belongs to; None when the
        backend cannot list them."""
        try:
            processes = self.backend.processes()
        except Exception:
            self.log.exception("gpujobs: listing GPU processes failed")
            return None
        supervisors: dict[int, tuple[int, float | None]] = {}
        for job_id, handle in self.service.runner_handles().items():
            if handle.get("pid"):
                supervisors[int(handle["pid"])] = (job_id, handle.get("create_time"))
        return self.resolver.resolve(processes, supervisors)

    def _rogues(self, now: float, running: list[Job]) -> list[ProcessInfo] | None:
        infos = self._processes()
        if infos is None:
            return None
        allocated: dict[int, Job] = {}
        holding: dict[int, set[int]] = {}  # GPU -> every job holding it (several share one)
        for job in running:
            if job.host in (None, self.host):
                for index in job.assigned_gpus:
                    allocated.setdefault(index, job)
                    holding.setdefault(index, set()).add(job.id)
        names = {g.index: g.name for g in self.service.inventory if g.host == self.host}
        own = [p for p in infos if not (p.owner_job is not None and p.owner_job in holding.get(p.gpu_index, ()))]
        findings = detect_rogues(self.host, own, allocated, names)
        by_key = {f"rogue:{self.host}:{p.gpu_index}:{p.pid}:{int(p.create_time or 0)}": p for p in infos}
        keys = set()
        for finding in findings:
            keys.add(finding.key)
            action = ""
            if self.settings.rogue_policy == "kill":
                info = by_key.get(finding.key)
                if info is not None:
                    action = self.killer.kill(info, self.resolver._protected)
                    finding.message += f"; {action} (rogue_policy=kill)"
            self.report(finding, now, action=action)
        self.killer.forget_missing({(p.pid, p.create_time or 0.0) for p in infos})
        self._resolve_missing("rogue_process", keys, now)
        return infos

    def watch_shares(self, now: float, running: list[Job] | None = None,
                     infos: list[ProcessInfo] | None = None) -> None:
        """The share watcher's reading: a share job over its GPU memory share is warned once,
        then stopped once over for the grace (`service.over_share`)."""
        shares = self.service.shares
        if running is None:
            running = [j for j in self.service.active_jobs() if j.state is JobState.RUNNING]
        sharing = [j for j in running if j.host in (None, self.host) and is_share(j)]
        if not sharing or not shares.watched:
            self.share_watcher.check(now, [], {}, [])
            shares.used_mb = {}
            self._share_warned.clear()
            return
        if infos is None:
            infos = self._processes()
            if infos is None:
                return
        gpus = {g.index: g for g in self.service.inventory if g.host == self.host}
        overuses = self.share_watcher.check(now, sharing, gpus, infos)
        shares.used_mb = dict(self.share_watcher.used_mb)
        over = set()
        for o in overuses:
            key = (o.job.id, o.gpu_index)
            over.add(key)
            if o.stop:
                self.log.warning("gpujobs: stopping job %s: %s", o.job.id, o.reason)
                self.service.over_share(o.job.id, o.reason, stop=True)
            elif key not in self._share_warned:
                self._share_warned.add(key)
                self.service.over_share(o.job.id, o.reason, stop=False)
        self._share_warned &= over

    def _set_aside(self, now: float) -> None:
        """Jobs the scheduler could not handle and set aside (`JobService.set_aside`): one
        finding each while they wait, for the admins to cancel or correct them."""
        keys = set()
        for job_id, (what, error) in list(self.service.set_aside.items()):
            job = self.service.active_job(job_id)
            user = job.user if job is not None else None
            message = (f"job {job_id} of {user} is set aside: the scheduler could not handle it ({what}; {error}); "
                       "the other jobs are scheduled. Cancel it, or correct its row in the store and restart")
            finding = Finding("job_set_aside", f"set-aside:{job_id}", message, "error", job_id=job_id, user=user,
                              data={"what": what, "error": error})
            keys.add(finding.key)
            self.report(finding, now)
        self._resolve_missing("job_set_aside", keys, now)

    def _habits(self, now: float) -> None:
        """Recurring demand worth a weekly reservation, and quiet hours worth making off-peak
        (habits.py): one finding each, closed when the habit goes (or is reserved)."""
        from ..scheduler.deferral import as_clock
        from .habits import covered, find_habits, offpeak_finding, proposal_finding, quiet_windows
        from .usage import heatmap_report

        s = self.settings
        past = history.jobs_since(self.store, now - s.habits_lookback_weeks * 7 * 86400)
        policy = self.service.current_policy()
        keys = set()
        for habit in find_habits(past, now, as_clock(policy), s.habits_min_weeks, s.habits_lookback_weeks):
            if covered(habit, self.service.reservations):
                continue
            finding = proposal_finding(habit)
            keys.add(finding.key)
            self.report(finding, now)
        self._resolve_missing("reservation_proposal", keys, now)
        cells = heatmap_report(self.store, now - 28 * 86400, now)["utilization"]
        quiet = offpeak_finding(quiet_windows(cells, s.quiet_threshold), s.quiet_threshold)
        if quiet is not None:
            self.report(quiet, now)
        self._resolve_missing("offpeak_suggestion", {quiet.key} if quiet else set(), now)

    # ================================================================= findings

    def report(self, finding: Finding, now: float, action: str = "", always_event: bool = False,
               force: bool = False) -> dict[str, Any]:
        """Store a finding (once per open key; refreshed every 30 s), log it and add a FINDING
        event to its job when it is new."""
        open_keys = self._open.setdefault(finding.kind, {})
        mono = time.monotonic()
        known = finding.key in open_keys
        if known and not force and not always_event and mono - open_keys[finding.key] < _REFRESH_S:
            return {"key": finding.key, "kind": finding.kind, "message": finding.message}
        stored, new = mstore.add_finding(
            self.store, now, kind=finding.kind, key=finding.key, message=finding.message,
            severity=finding.severity, job_id=finding.job_id, user=finding.user, host=finding.host,
            gpu_index=finding.gpu_index, pid=finding.pid, action=action, data=finding.data)
        open_keys[finding.key] = mono
        if new or always_event:
            self._publish(stored)
            level = logging.ERROR if finding.severity == "error" else logging.WARNING
            self.log.log(level, "gpujobs finding: %s", finding.message)
            if finding.job_id is not None:
                try:
                    self.store.add_event(finding.job_id, "FINDING", "monitor", finding.message, now,
                                         data={"finding_id": stored["id"], "kind": finding.kind})
                except Exception:
                    self.log.exception("gpujobs: recording a finding event of job %s failed", finding.job_id)
        return stored

    def _publish(self, finding: dict[str, Any] | None) -> None:
        """Tell the listeners (the events websockets) that a finding opened or closed."""
        if finding is not None:
            self.service.broadcast({"type": "finding", "finding": finding})

    def _resolve(self, kind: str, key: str, now: float) -> None:
        if self._open.get(kind, {}).pop(key, None) is None:
            return
        self._publish(mstore.resolve_finding(self.store, now, key=key))

    def _resolve_missing(self, kind: str, keep: set[str], now: float) -> None:
        for key in [k for k in self._open.get(kind, {}) if k not in keep]:
            self._resolve(kind, key, now)

    def open_finding_counts(self) -> dict[str, int]:
        return {kind: len(keys) for kind, keys in self._open.items()}

    def findings(self, viewer: str, admin: bool, **filters: Any) -> list[dict[str, Any]]:
        """Findings a viewer may see: an admin all, a user those about them or their jobs."""
        limit = int(filters.pop("limit", 200))
        if admin:
            return mstore.list_findings(self.store, limit=limit, **filters)
        # theirs, and rogue processes (on a GPU their job may hold: `may_see`), a page at a time
        # until `limit` of them, so that no number of others' findings hides one of theirs
        mine: list[dict[str, Any]] = []
        before: int | None = None
        while len(mine) < limit:
            rows = mstore.list_findings(self.store, limit=limit * 5, user_or_kind=(viewer, "rogue_process"),
                                        before_id=before, **filters)
            mine += [f for f in rows if may_see(f, viewer, admin)]
            if len(rows) < limit * 5:
                break
            before = rows[-1]["id"]
        return mine[:limit]

    def resolve(self, finding_id: int, actor: str) -> dict[str, Any] | None:
        """An admin closes a finding; closing a `gpu_drained` one undrains the GPU."""
        finding = mstore.get_finding(self.store, finding_id)
        if finding is None or not finding["open"]:
            return finding
        if finding["kind"] == "gpu_drained" and finding["host"] is not None and finding["gpu"] is not None:
            self.drain(finding["host"], int(finding["gpu"]), False, actor, "finding resolved")
            return mstore.get_finding(self.store, finding_id)
        self._open.get(finding["kind"], {}).pop(finding["key"], None)
        closed = mstore.resolve_finding(self.store, time.time(), finding_id=finding_id, action=f"resolved by {actor}")
        self._publish(closed)
        return closed

    # ================================================================= draining

    def drain(self, host: str, index: int, draining: bool, actor: str, reason: str = "") -> None:
        """Mark a GPU draining (no new job starts there; running ones finish) or undrain it."""
        now = time.time()
        key = f"drain:{host}:{index}"
        if draining:
            self.drained.add((host, index))
            message = f"GPU {index} on {host} is draining (by {actor}{': ' + reason if reason else ''}); " \
                      "no new jobs start there"
            self.report(Finding("gpu_drained", key, message, "info", host=host, gpu_index=index,
                                data={"by": actor, "reason": reason}), now, action="drained", force=True)
        else:
            self.drained.discard((host, index))
            self._open.get("gpu_drained", {}).pop(key, None)
            self._publish(mstore.resolve_finding(self.store, now, key=key, action=f"undrained by {actor}"))
        self.service.refresh_inventory(force=True)
        self.service.wake()

    # ================================================================= views

    def job_stats(self, job: Job) -> dict[str, Any]:
        stats = self.sampler.stats_of(job.id)
        out = stats.as_dict() if stats else mstore.JobStats(job_id=job.id).as_dict()
        p = self.predictions.get(job.id)
        if p is None and not job.state.is_final:
            p = self._predict(job)
        out["predicted_runtime_s"] = job.predicted_runtime_s
        out["prediction"] = ({"seconds": p.seconds, "confidence": p.confidence, "level": p.level, "runs": p.runs,
                              "upper_s": p.upper_s} if p else None)
        out["findings"] = mstore.list_findings(self.store, job_id=job.id, limit=50)
        return out

    def metrics(self) -> tuple[bytes, str]:
        from .metrics import render

        return render(self.registry)

    def gpu_samples(self, since: float, until: float, gpu: int | None, resolution: int | None,
                    limit: int | None = None) -> list[dict[str, Any]]:
        return mstore.samples(self.store, since, until, resolution=resolution, gpu_index=gpu, limit=limit)

    def gpu_series(self, since: float, until: float, step: int, gpu: int | None) -> list[dict[str, Any]]:
        return mstore.sample_series(self.store, since, until, step, gpu_index=gpu)


def may_see(finding: dict[str, Any], viewer: str, admin: bool) -> bool:
    """Whether a user sees a finding (`GET findings`, the events websocket): admins all of
    them, others those about them or their jobs, and rogue processes on a GPU their job holds."""
    return admin or finding.get("user") == viewer or (finding.get("data") or {}).get("holder_user") == viewer


def _runtime(job: Job) -> float | None:
    if job.run_seconds and job.run_seconds > 0:
        return float(job.run_seconds)
    if job.started_at is not None and job.ended_at is not None:
        return max(0.0, job.ended_at - job.started_at)
    return None


__all__ = ["DrainingBackend", "Monitor", "MonitorSettings", "MonitoredEngine", "carry_on", "may_see"]
