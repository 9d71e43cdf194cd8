"""The engine: owns the job life cycle between the store, the scheduler and the runner.

It wakes on a job's exit, a tick, or a burst of submissions once it pauses; takes a snapshot
(active jobs, GPUs, usage); calls the pure `schedule()`; carries the plan out through the
runner; and publishes every state change to listeners (the websocket). It never speaks HTTP:
the server's handlers call its methods and turn `InvalidInput` / `PermissionDenied` /
`NotFound` into 4xx answers. Submissions of one event-loop turn are committed together
(group commit), each answered with its own jobs or its own error.

The service keeps the active (pending and running) jobs in memory as well as in the store,
because it is their only writer: a cycle over 10,000 queued jobs must not reload them all.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from ..model import (
    GPU,
    MAX_ID,
    Claim,
    InvalidInput,
    Job,
    JobState,
    Plan,
    Policy,
    Reasons,
    Reservation,
    check_plain_text,
    format_bytes,
    format_duration,
    parse_id,
    parse_reason,
    validate_reservation,
    validate_submission,
)
from .claim import GPUClaim
from .gpus import GPUBackend
from .runners import NOT_STARTED_REASON, Exit, LaunchRequest, Runner
from .runners.cgroups import FENCE_OFF
from .runners.cgroups import PARENT as CGROUP_PARENT
from .runners.users import NotAUnixUser, can_enter, in_group, lookup, run_as
from .scheduler import schedule
from .scheduler.fairshare import Usage, decay_and_add
from .scheduler.quotas import Quotas
from .scheduler.reservations import gpus_text, occurrence_at, occurrences, occurrences_between
from .scheduler.shares import gpu_bytes
from .shares import Shares
from .store import GPUAlreadyAllocated, NewJobs, Store, StoreUnavailable, store_trouble

if TYPE_CHECKING:
    from .notify import Notifier

log = logging.getLogger("jupyter_gpujobs")


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


class LogRemoved(NotFound):
    """The log of a job was removed after the retention (`c.GPUJobs.job_retention`)."""


#: Runner outcome -> final job state.
_OUTCOME_STATE = {
    "completed": JobState.COMPLETED,
    "failed": JobState.FAILED,
    "oom": JobState.FAILED,
    "timeout": JobState.TIMEOUT,
    "cancelled": JobState.CANCELLED,
    "lost": JobState.LOST,
}

#: Kinds whose process the engine does not start: it only allocates GPUs (a kernel is
#: launched by the kernel provisioner once its job runs).
EXTERNAL_KINDS = ("kernel",)
#: How the front end of such a job may say it ended (`finish_external`).
END_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")

Listener = Callable[[dict[str, Any]], None]


class JobService:
    #: A burst of submissions gets one scheduling cycle once it pauses this long (seconds) ...
    SUBMIT_SETTLE_S = 0.02
    #: ... or this long after its first submission, whichever comes first.
    SUBMIT_MAX_DELAY_S = 0.5

    def __init__(
        self,
        store: Store,
        gpus: GPUBackend,
        runner: Runner,
        policy: Policy,
        *,
        state_dir: Path,
        root_dir: Path,
        job_env: dict[str, str] | None = None,
        admin_users: Iterable[str] = (),
        group_members: dict[str, list[str]] | None = None,
        kill_grace_s: int = 10,
        time_limit_warning_s: int = 300,
        poll_interval: float = 0.05,
        tick_interval: float = 5.0,
        estimate_interval: float = 10.0,
        job_retention_s: int = 0,
        cleanup_interval: float = 300.0,
        run_as_owner: str = "auto",
        job_python: str = "",
        foreign_memory_threshold_mb: int | None = 300,
        clock: Callable[[], float] = time.time,
        admin_group: str | None = None,
        private_data: bool = False,
        gpu_claim: GPUClaim | None = None,
        shares: Shares | None = None,
    ):
        self.store = store
        self.gpus = gpus
        self.runner = runner
        self.policy = policy
        self.state_dir = Path(state_dir)
        self.root_dir = Path(root_dir)
        self.job_env = dict(job_env or {})
        self.admin_users = set(admin_users)
        self.group_members = dict(group_members or {})
        self.kill_grace_s = kill_grace_s
        self.time_limit_warning_s = time_limit_warning_s
        self.poll_interval = poll_interval
        self.tick_interval = tick_interval
        self.estimate_interval = estimate_interval
        self.job_retention_s = job_retention_s  # 0: the files of ended jobs are kept forever
        self.cleanup_interval = cleanup_interval
        self.run_as_owner = run_as_owner  # users.run_as: run each job as its owner's Unix user
        self.job_python = job_python  # the Python of notebook jobs ("": the engine's)
        self.clock = clock
        self.admin_group = admin_group  # members of this Unix group are admins (shared engine)
        self.private_data = private_data  # others' jobs show only their queue view (PrivateData=jobs)
        self.gpu_claim = gpu_claim  # the machine-wide claim of the GPUs (claim.py); None: not claimed
        # how GPU shares are enforced (shares.py); the monitor's share watcher reports to `over_share`
        self.shares = shares or Shares(backend=gpus.name, runner_schedules_itself=runner.schedules_itself)
        # quotas an admin set through the API or CLI (stored; they win over the configured ones):
        # (scope, name) -> {"quota": its dict form, "by": who, "at": when}; `_policy` applies them
        self.quotas_set: dict[tuple[str, str], dict[str, Any]] = {}
        self._policy = policy
        # advance reservations (stored; an admin makes them, or a user accepts a learned one)
        self.reservations: list[Reservation] = []
        self.reservation_source: dict[int, str] = {}  # id -> "" or "finding:<id>"

        # the pending and the running jobs by id (`_keep` and `_forget` keep them): a cycle hands
        # `_pending` to the scheduler as it is, without a pass over 10k jobs
        self._pending: dict[int, Job] = {}
        self._running: dict[int, Job] = {}
        self._handles: dict[int, dict[str, Any]] = {}
        # GPU kernels whose processes the engine confines (`adopt`): job id -> runner handle;
        # the ends asked for them and waiting for their last process (job id -> state, actor,
        # reason); since when an adopted kernel has had no process left (job id -> clock)
        self._adopted: dict[int, dict[str, Any]] = {}
        self._ending: dict[int, tuple[JobState, str, str]] = {}
        self._empty_since: dict[int, float] = {}
        self._orphan_idle: dict[int, tuple[float, float | None]] = {}  # job id -> (checked, idle since)
        self._plan = Plan()
        self._plan_at = 0.0
        self._waiting: list[int] = []  # pending job ids in queue order, after the last plan's starts
        self._positions: dict[int, int] | None = {}  # id -> 1-based position in _waiting (built on demand)
        # the last estimating cycle: every pending job's expected start, and the priority order
        # it calculated (the cycles in between keep that order and decide only)
        self._estimates: dict[int, float | None] = {}
        self._estimates_predicted: set[int] = set()  # of those, the predictions (the rest are bounds)
        self._estimated_at = -float("inf")
        self._estimated_newest = 0  # the newest pending job id then
        self._inventory: list[GPU] = []
        self._inventory_at = 0.0
        # GPUs that no job holds but whose memory is in use beyond this (MiB) are busy for the
        # scheduler (`GPU.foreign`); None: never. An admin may override one (`ignore_foreign`)
        self.foreign_memory_threshold_mb = foreign_memory_threshold_mb
        self._foreign: dict[tuple[str, int], str] = {}  # (host, index) -> what uses it
        self.foreign_ignored: dict[tuple[str, int], str] = {}  # (host, index) -> who overrode it
        self._terminating: set[int] = set()
        # preemptor -> (its victims, when their grace ends, seen by a cycle with none running):
        # the scheduler keeps the GPUs being freed for it (`model.Claim`)
        self._claims: dict[int, tuple[set[int], float, bool]] = {}
        # pending jobs the scheduler could not handle: id -> (what was wrong, the error). They
        # wait with that reason, outside the cycle, until an admin cancels them (or a restart)
        self.set_aside: dict[int, tuple[str, str]] = {}
        self._refusing = False  # another engine owns the GPUs (said once in the log)
        self._cancel_requested: dict[int, str] = {}  # running job id -> why; a cancel wins over a preemption
        # the disk under the store is full or read-only: results that could not be recorded yet
        # (job id -> how it ended), recorded once it is writable again; the trouble is logged
        # once a minute, not per request
        self.store_trouble: StoreUnavailable | None = None
        self._unrecorded: dict[int, Exit] = {}
        self._trouble_logged_at = -float("inf")
        self._unrecorded_tried_at = 0.0
        self._warned: set[int] = set()
        self._listeners: set[Listener] = set()
        self._ended_waiters: dict[int, list[asyncio.Future[Job]]] = {}
        self._wake: asyncio.Event | None = None
        self._freed = asyncio.Event()  # a running job ended: its GPUs are free (ends a cycle's rest)
        self._ended_since_cycle = False  # ... since the last cycle (which then only decides)
        self._estimate_deferred = False  # an estimate due was put off for a start
        self._submissions: list[tuple[NewJobs, asyncio.Future[list[Job]]]] = []  # to commit this turn
        self._burst_timer: asyncio.TimerHandle | None = None  # the cycle after a burst of submissions
        self._burst_started_at = 0.0  # loop time of the first submission no cycle has seen yet
        self._last_submit_at = 0.0
        self._tasks: list[asyncio.Task[Any]] = []
        self._usage = Usage()
        self._usage_at = 0.0
        self._usage_saved_at = 0.0
        self.cycle_seconds: list[float] = []  # recent cycle times, for metrics
        self.schedule_seconds = 0.0  # time of the last schedule() call alone
        (self.state_dir / "logs").mkdir(parents=True, exist_ok=True)
        # jobs' logs are private, and no job may plant a file (a link) where the next log goes
        os.chmod(self.state_dir / "logs", 0o700)
        # a runner that schedules itself (Slurm): the engine mirrors it instead of scheduling
        self.mirror: Any = None
        # e-mail and webhook notifications of job events (notify.py; set by app.build_engine)
        self.notifier: Notifier | None = None
        if runner.schedules_itself:
            from .mirror import Mirror

            self.mirror = Mirror(self, runner)  # type: ignore[arg-type]

    # ================================================================= life cycle

    async def start(self) -> None:
        """Reattach to what survived a restart, then run the engine loops (once)."""
        if self._tasks:
            return
        self.refresh_inventory(force=True)
        if self.mirror is not None:
            self.mirror.reconcile()
            self._wake = asyncio.Event()
            self._tasks = [asyncio.ensure_future(self.mirror.loop())]
            if self.job_retention_s > 0:
                self._tasks.append(asyncio.ensure_future(self._retention_loop()))
            self.wake()
            return
        self._load_usage()
        self._load_quotas()
        self._load_reservations()
        self.reconcile()
        self._wake = asyncio.Event()
        self._freed = asyncio.Event()
        self._tasks = [
            asyncio.ensure_future(self._schedule_loop()),
            asyncio.ensure_future(self._poll_loop()),
        ]
        if self.job_retention_s > 0:
            self._tasks.append(asyncio.ensure_future(self._retention_loop()))
        self.wake()

    async def stop(self) -> None:
        self._store_submissions()  # what was accepted is committed before the engine stops
        if self._burst_timer is not None:
            self._burst_timer.cancel()
            self._burst_timer = None
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        self._tasks = []
        self._save_usage(self.clock())
        self.runner.close()

    # ================================================================= fair-share usage

    def _load_usage(self) -> None:
        """Decayed GPU-seconds from the store, decayed further for the time the server was down."""
        now = self.clock()
        users: dict[str, float] = {}
        groups: dict[str, float] = {}
        half_life = self.policy.fairshare_half_life_s
        for key, (value, updated_at) in self.store.load_usage().items():
            scope, _, name = key.partition(":")
            decayed = value * 0.5 ** (max(0.0, now - updated_at) / half_life) if half_life > 0 else value
            (users if scope == "user" else groups)[name] = decayed
        self._usage = Usage(users, groups)
        self._usage_at = now

    def _save_usage(self, now: float) -> None:
        values = {f"user:{u}": v for u, v in self._usage.users.items()}
        values.update({f"group:{g}": v for g, v in self._usage.groups.items()})
        if values:
            self.store.save_usage(values, now)
        self._usage_saved_at = now

    def _account_usage(self, running: list[Job], now: float) -> None:
        dt = now - self._usage_at if self._usage_at else 0.0
        self._usage = decay_and_add(self._usage, running, dt, self.policy.fairshare_half_life_s,
                                    gpu_bytes(self.inventory))
        self._usage_at = now
        if now - self._usage_saved_at > 60:
            self._save_usage(now)

    def reconcile(self) -> None:
        """Load active jobs and find the run of every running one: reattach to its supervisor,
        record the result it left, or, for a run recorded but never started (the engine
        stopped in between), put the job back in the queue. A job is LOST only when its run
        started and its supervisor vanished without a result; nothing is double-allocated."""
        pending, running = self.store.active_jobs()
        self._pending, self._running = {}, {}
        for job in pending + running:
            self._keep(job)
        self._handles = {}
        for job in running:
            events = self.store.events(job_id=job.id)
            if any(e["state"] == "WARNING" for e in events):
                self._warned.add(job.id)
            for e in events:  # a cancel asked before the restart still wins
                if e["state"] == "STOPPING" and (e.get("data") or {}).get("outcome") == "cancelled":
                    self._cancel_requested[job.id] = (e.get("data") or {}).get("reason") or e["reason"]
            if job.kind in EXTERNAL_KINDS:
                handle = self.store.runner_handle(job.id)
                if handle and handle.get("adopted"):
                    self._adopted[job.id] = handle  # a kernel the engine confines: watched again
                continue
            handle = self.store.runner_handle(job.id)
            if not handle:
                self._finish(job.id, Exit(job.id, "lost", None, None,
                                          "no supervisor was recorded for this job", self.clock()))
                continue
            if not handle.get("pid"):  # recorded, but its start was not confirmed
                found = self.runner.reattach(job.id, handle)
                if found is None:
                    self._set_state(job.id, JobState.PENDING, "engine", NOT_STARTED_REASON, expect=(JobState.RUNNING,),
                                    started_at=None, host=None, assigned_gpus=(), borrowed=False, runner_handle={})
                    continue
                if isinstance(found, Exit):
                    self._finish(job.id, found)
                    continue
                handle = found
                self.store.update_job(job.id, runner_handle=handle)
            self._handles[job.id] = handle
        # results written while the server was down, and supervisors that vanished
        for exit_ in self.runner.poll(dict(self._handles)):
            self._finish(exit_.job_id, exit_)
        if self._handles:
            log.info("gpujobs: reattached to %d running job(s): %s", len(self._handles),
                     ", ".join(str(i) for i in sorted(self._handles)))

    def wake(self) -> None:
        """Run a scheduling cycle as soon as the loop may (something ended, changed, ...)."""
        if self._wake is not None:
            self._wake.set()

    def _wake_after_burst(self) -> None:
        """Submissions were stored: one cycle after their burst, not one per submission. The
        cycle waits until no submission came for SUBMIT_SETTLE_S, or at most SUBMIT_MAX_DELAY_S
        after the first submission that no cycle has seen yet."""
        loop = asyncio.get_running_loop()
        self._last_submit_at = loop.time()
        if self._burst_timer is None:
            self._burst_started_at = self._last_submit_at
            self._burst_timer = loop.call_later(self.SUBMIT_SETTLE_S, self._burst_check)

    def _burst_check(self) -> None:
        loop = asyncio.get_running_loop()
        due = min(self._last_submit_at + self.SUBMIT_SETTLE_S, self._burst_started_at + self.SUBMIT_MAX_DELAY_S)
        if loop.time() < due:
            self._burst_timer = loop.call_at(due, self._burst_check)
            return
        self._burst_timer = None
        self.wake()

    async def _schedule_loop(self) -> None:
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        while True:
            # (a tick timer rather than wait_for(): before Python 3.12 wait_for() can swallow
            # the cancel of stop() when the event is set at the same moment)
            tick = loop.call_later(self.tick_interval, self.wake)
            try:
                await self._wake.wait()
            finally:
                tick.cancel()
            self._wake.clear()
            try:
                self.cycle()
            except StoreUnavailable as err:
                self._note_store_trouble(err)
            except Exception:
                log.exception("gpujobs: scheduling cycle failed")
            # Under load cycles over a long queue would run back to back and starve the
            # handlers: rest three times as long as the scheduling itself took.
            # (Only the decision counts: starting processes is not what grows with the queue.)
            # A GPU that frees meanwhile ends the rest: there are only as many of those as
            # GPUs, and a freed GPU should not idle for the requests of polling clients.
            rest = loop.call_later(max(0.005, 3 * self.schedule_seconds), self._freed.set)
            try:
                await self._freed.wait()
            finally:
                rest.cancel()
            self._freed.clear()

    async def _poll_loop(self) -> None:
        self.runner.on_exit = self._poll_now  # a supervisor's exit is noticed at once
        try:
            while True:
                await asyncio.sleep(self.poll_interval)
                self._poll_now()
        finally:
            self.runner.on_exit = None

    def _poll_now(self) -> None:
        try:
            self.poll()
        except StoreUnavailable as err:
            self._note_store_trouble(err)
        except Exception:
            log.exception("gpujobs: polling job supervisors failed")

    # ================================================================= retention of job files

    #: The first removal pass runs this long after start (or after cleanup_interval if shorter).
    RETENTION_FIRST_PASS_S = 30.0

    async def _retention_loop(self) -> None:
        """Remove the files of jobs ended longer than job_retention ago, every cleanup_interval
        (off the scheduling cycle; the file system work runs in a thread)."""
        await asyncio.sleep(min(self.cleanup_interval, self.RETENTION_FIRST_PASS_S))
        while True:
            try:
                await self.remove_expired_files()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("gpujobs: removing the files of old jobs failed")
            await asyncio.sleep(self.cleanup_interval)

    async def remove_expired_files(self) -> Any:
        """One removal pass: the run directories and logs of jobs that reached a final state
        more than job_retention ago. Files of active jobs (pending, running, or with a
        supervisor handle), of jobs the store does not know, and of runs whose processes may
        still be alive stay; so do the jobs' rows and events. Returns a `retention.Removed`."""
        from . import retention

        if self.job_retention_s <= 0:
            return retention.Removed()
        run_root = getattr(self.runner, "state_dir", None)  # the runner's run directories
        run_root = Path(run_root) if run_root is not None else None
        logs_root = self.state_dir / "logs"
        found = await asyncio.to_thread(retention.scan, run_root, logs_root)
        # decided on the loop (the store and the active jobs live here); a job that is final
        # for longer than the retention never becomes active again
        cutoff = self.clock() - self.job_retention_s
        ids = [i for i in found if self.active_job(i) is None and i not in self._handles]
        expired: dict[int, retention.JobFiles] = {}
        for k in range(0, len(ids), 500):
            for job_id, job in self.store.get_many(ids[k:k + 500]).items():
                if (job.state.is_final and job.ended_at is not None and job.ended_at <= cutoff
                        and self.active_job(job_id) is None and job_id not in self._handles):
                    expired[job_id] = found[job_id]
        if not expired:
            return retention.Removed()
        removed = await asyncio.to_thread(retention.remove, expired, run_root, logs_root)
        if removed.jobs:
            log.info("gpujobs: removed the files of %d job(s) ended more than %s ago "
                     "(c.GPUJobs.job_retention): %d run dir(s), %d log(s), %s freed",
                     len(removed.jobs), format_duration(self.job_retention_s), removed.run_dirs,
                     removed.log_files, format_bytes(removed.bytes_freed))
        if removed.kept_alive:
            log.warning("gpujobs: kept %d run dir(s) of ended jobs whose processes may still be alive: %s",
                        len(removed.kept_alive), ", ".join(str(p) for p in removed.kept_alive[:5]))
        return removed

    def _log_removed(self, job: Job, path: str | None) -> bool:
        """Was this job's log removed after the retention (recorded, final long enough, gone)?"""
        return bool(
            path and self.job_retention_s > 0 and job.state.is_final and job.ended_at is not None
            and job.ended_at + self.job_retention_s <= self.clock() and not Path(path).exists()
        )

    # ================================================================= inventory

    def refresh_inventory(self, force: bool = False) -> list[GPU]:
        now = self.clock()
        if force or now - self._inventory_at > 2.0:
            try:
                self._inventory = self._mark_foreign(self.gpus.inventory())
            except Exception:
                log.exception("gpujobs: reading the GPU inventory failed")
            self._inventory_at = now
        return self._inventory

    def _mark_foreign(self, gpus: list[GPU]) -> list[GPU]:
        """Mark the GPUs no job holds whose memory is in use beyond the threshold: a process
        outside the queue uses them (`GPU.foreign`, with what and whose), unless an admin
        overrode it; an override ends when the GPU is seen unused."""
        threshold = self.foreign_memory_threshold_mb
        if threshold is None:
            return gpus
        held = {(j.host, i) for j in self._running.values() if j.host for i in j.assigned_gpus}
        used = [g for g in gpus if (g.host, g.index) not in held and g.memory_used_mb > threshold]
        for key in [k for k in self.foreign_ignored if k not in held and k not in {(g.host, g.index) for g in used}]:
            del self.foreign_ignored[key]
            log.info("gpujobs: GPU %s on %s is no longer used outside the queue; the override ends", key[1], key[0])
        if not used:
            self._foreign = {}
            return gpus
        try:
            processes = self.gpus.processes()
        except Exception:
            processes = {}
        self._foreign = {(g.host, g.index): _foreign_text(g, processes.get(g.index, [])) for g in used}
        return [replace(g, foreign=self._foreign[(g.host, g.index)])
                if (g.host, g.index) in self._foreign and (g.host, g.index) not in self.foreign_ignored else g
                for g in gpus]

    def ignore_foreign(self, host: str, index: int, ignore: bool, actor: str, reason: str = "") -> None:
        """An admin lets the queue hand out a GPU in use outside the queue (`ignore`), until it
        is seen unused, or takes that back. Conflict when nothing uses the GPU outside the queue."""
        key = (host, index)
        if ignore and key not in self.foreign_ignored and key not in self._foreign:
            raise Conflict("gpu", f"GPU {index} on {host} is not in use outside the queue; nothing to override")
        if ignore:
            self.foreign_ignored[(host, index)] = f"{actor}{': ' + reason if reason else ''}"
        else:
            self.foreign_ignored.pop((host, index), None)
        log.warning("gpujobs: %s %s the use of GPU %s on %s outside the queue%s", actor,
                    "overrode" if ignore else "no longer overrides", index, host, f" ({reason})" if reason else "")
        self.refresh_inventory(force=True)
        self.wake()

    @property
    def inventory(self) -> list[GPU]:
        return self.refresh_inventory()

    @property
    def isolation(self) -> str:
        """What confines the jobs here, in one line ("GPU fence: device cgroup; ...")."""
        iso = getattr(self.runner, "isolation", None)
        return iso.describe() if iso is not None else FENCE_OFF

    def limits_enforceable(self) -> tuple[bool, bool]:
        """Can this engine's jobs be given (a host memory limit, a CPU limit)?"""
        iso = getattr(self.runner, "isolation", None)
        return iso.limits() if iso is not None and iso.enabled else (False, False)

    def gpu_views(self) -> list[dict[str, Any]]:
        if self.mirror is not None:
            return self.mirror.gpu_views(self.inventory)
        holding: dict[tuple[str, int], list[Job]] = {}
        for job in self._running.values():
            if job.host:
                for index in job.assigned_gpus:
                    holding.setdefault((job.host, index), []).append(job)
        out = []
        for g in self.inventory:
            jobs = holding.get((g.host, g.index), [])
            holder = jobs[0] if jobs else None
            out.append({
                "index": g.index, "uuid": g.uuid, "name": g.name, "host": g.host,
                "memory_total_mb": g.memory_total_mb, "memory_used_mb": g.memory_used_mb,
                "utilization": g.utilization, "healthy": g.healthy, "draining": g.draining,
                "job_id": holder.id if holder else None, "user": holder.user if holder else None,
                # in use outside the queue: busy, unless an admin overrode it ("foreign_override": who)
                "foreign": None if holder else self._foreign.get((g.host, g.index)),
                "foreign_override": None if holder else self.foreign_ignored.get((g.host, g.index)),
                # who holds how much of it: each job with its share (None: the whole card), its
                # memory limit and use (MB); a MIG instance is a GPU of its own ("mig")
                "holders": self.shares.holders(jobs, g),
                "mig": g.uuid.startswith("MIG-"),
            })
        return out

    # ================================================================= queries

    def may_see(self, job: Job | dict[str, Any], viewer: str | None) -> bool:
        """Whether `viewer` may see a job's private data (command, cwd, environment, payload,
        log, events detail, stats): its owner and admins always, others only when the engine
        does not keep jobs private (`c.GPUJobs.private_data`). None: the engine itself."""
        owner = job["user"] if isinstance(job, dict) else job.user
        return viewer is None or not self.private_data or viewer == owner or self.is_admin(viewer)

    def view(self, job: Job, viewer: str | None = None) -> dict[str, Any]:
        """A job as the API shows it (with its queue position, reason and expected start).
        A stored copy of an active job is shown as the engine knows it now. To a `viewer` who
        may not see its private data, only its queue view (`redact`)."""
        out = self._view(job)
        return out if self.may_see(job, viewer) else redact(out)

    def _view(self, job: Job) -> dict[str, Any]:
        job = self.active_job(job.id) or job
        reason = job.reason
        position = None
        expected = None
        kind = None
        if job.state is JobState.PENDING:
            if self._positions is None:
                self._positions = {jid: i + 1 for i, jid in enumerate(self._waiting)}
            position = self._positions.get(job.id)
            reason = self._plan.reasons.get(job.id) or reason or "waiting for the next scheduling cycle"
            plan = self._plan
            if job.id in plan.expected_start:
                expected, predicted = plan.expected_start[job.id], job.id in plan.predicted
            else:
                expected, predicted = self._estimates.get(job.id), job.id in self._estimates_predicted
            if expected is not None:  # a prediction from runtimes, or a bound from time limits
                kind = "prediction" if predicted else "bound"
        ends_at, warn_at = self._limit_times(job) if job.state is JobState.RUNNING else (None, None)
        out = {
            "id": job.id, "name": job.name, "user": job.user, "kind": job.kind, "state": job.state.value,
            "gpus": job.gpus, "gpu_type": job.gpu_type, "assigned_gpus": list(job.assigned_gpus),
            "host": job.host, "submitted_at": job.submitted_at, "started_at": job.started_at,
            "ended_at": job.ended_at, "time_limit_s": job.time_limit_s, "exit_code": job.exit_code,
            "signal": job.signal, "reason": reason, "position": position, "expected_start": expected,
            "expected_start_kind": kind,
            "priority": job.priority, "group": job.group, "preemptible": job.preemptible,
            "borrowed": job.borrowed, "command": job.command, "cwd": job.cwd, "payload": job.payload,
            "depends": [f"{d.kind}:{d.job_id}" for d in job.depends], "begin": job.begin,
            "offpeak": job.offpeak, "array_job_id": job.array_job_id, "array_index": job.array_index,
            "restarts": job.restarts, "output_notebook": job.payload.get("output"),
            "ends_at": ends_at, "warn_at": warn_at, "mem_bytes": job.mem_bytes, "cpus": job.cpus,
            "share": job.share, "gpu_memory": job.gpu_memory,
        }
        return out

    def get(self, job_id: int) -> Job:
        job = self.active_job(job_id) or self.store.get(job_id)
        if job is None:
            raise NotFound(f"no job {job_id}")
        return job

    def get_private(self, job_id: int, viewer: str | None) -> Job:
        """A job whose private data (log, events, stats) `viewer` may see; PermissionDenied
        when it is another's and private (see `may_see`)."""
        job = self.get(job_id)
        if not self.may_see(job, viewer):
            raise PermissionDenied(f"job {job.id} belongs to {job.user}; its details are private "
                                   "(only its owner and admins see them)")
        return job

    def events(self, job_id: int, viewer: str | None = None) -> list[dict[str, Any]]:
        """A job's events, oldest first, to a `viewer` who may see them."""
        self.get_private(job_id, viewer)
        return self.store.events(job_id=job_id)

    def _in_queue_order(self) -> Iterator[Job]:
        """Pending jobs in scheduling order, the jobs no cycle has placed yet last (by id).
        Lazy: a page of the head of a 10k-job queue, polled by many clients, reads a page."""
        pending = self._pending
        placed = 0
        for jid in self._plan.order:
            job = pending.get(jid)
            if job is not None:
                placed += 1
                yield job
        if placed < len(pending):
            ordered = set(self._plan.order)
            for jid in sorted(jid for jid in pending if jid not in ordered):
                yield pending[jid]

    def queue(self) -> list[Job]:
        """Pending jobs in scheduling order (jobs not yet seen by a cycle last)."""
        return list(self._in_queue_order())

    def queue_state(self) -> tuple[Any, ...]:
        """What the pages of the queue depend on, cheap to compare: the last plan (compare it by
        identity), how many jobs wait and the newest of them, how many run. While it is the
        same, so is every `queue_page`."""
        return self._plan, len(self._pending), next(reversed(self._pending), None), len(self._running)

    def queue_page(self, offset: int, limit: int, user: str | None = None) -> tuple[list[Job], int]:
        """Jobs `offset` to `offset + limit` of `queue()` (of `user`'s jobs only, when given)
        and how many there are in all."""
        if user is None:
            total = len(self._pending)
            if offset >= total:  # (also keeps islice's bounds within sys.maxsize for any offset)
                return [], total
            return list(islice(self._in_queue_order(), offset, min(offset + limit, total))), total
        mine = [job for job in self._in_queue_order() if job.user == user]
        return mine[offset:offset + limit], len(mine)

    def active_jobs(self) -> list[Job]:
        """Pending and running jobs as the engine knows them now."""
        return [*self._pending.values(), *self._running.values()]

    def active_job(self, job_id: int) -> Job | None:
        return self._pending.get(job_id) or self._running.get(job_id)

    def runner_handles(self) -> dict[int, dict[str, Any]]:
        """Running jobs' supervisor handles (job id -> handle)."""
        return dict(self._handles)

    def running(self) -> list[Job]:
        return list(self._running.values())

    def _keep(self, job: Job) -> None:
        """A pending or running job as it now is."""
        if job.state is JobState.PENDING:
            self._pending[job.id] = job
            self._running.pop(job.id, None)
        else:
            self._running[job.id] = job
            self._pending.pop(job.id, None)

    def _forget(self, job_id: int) -> None:
        """A job that ended."""
        self._pending.pop(job_id, None)
        self._running.pop(job_id, None)

    def root_for(self, user: str) -> Path:
        """Where a user's relative paths start: the server's root dir, or on an engine that runs
        jobs as their owners, the owner's home."""
        try:
            unix_user = run_as(user, self.run_as_owner)
        except NotAUnixUser:
            return self.root_dir
        if unix_user is not None:
            import pwd

            return Path(pwd.getpwnam(unix_user).pw_dir)
        return self.root_dir

    def is_admin(self, user: str) -> bool:
        if user in self.admin_users:
            return True
        if self.admin_group is None:
            return False
        return user == "root" or in_group(user, self.admin_group)

    # ================================================================= commands

    async def submit(self, user: str, body: dict[str, Any]) -> list[Job]:
        """Validate and store a submission; returns the new job(s) (several for an array)
        once they are committed.

        Submissions that arrive in the same event-loop turn are committed together (group
        commit): validated one by one here, so a bad one fails alone with its InvalidInput,
        then inserted in one transaction by `_store_submissions`.
        """
        new = self._validated(user, body)
        future: asyncio.Future[list[Job]] = asyncio.get_running_loop().create_future()
        if not self._submissions:
            asyncio.get_running_loop().call_soon(self._store_submissions)
        self._submissions.append((new, future))
        return await future

    def _validated(self, user: str, body: dict[str, Any]) -> NewJobs:
        """A submission checked and turned into the rows to store; raises InvalidInput."""
        now = self.clock()
        fields = validate_submission(body, self.inventory, self.policy, now)
        if self.mirror is not None and fields["kind"] in EXTERNAL_KINDS and not fields["command"]:
            raise InvalidInput("command", "a GPU kernel under the Slurm runner runs as a Slurm job and needs "
                                          "its launch command (the GPU kernel provisioner gives it)")
        group = fields["group"]
        if group and self.group_members and user not in self.group_members.get(group, []):
            raise InvalidInput("group", f"user {user} is not a member of group {group!r}")
        never = Quotas(self.current_policy()).never_starts(
            user, group, fields["gpus"], fields["time_limit_s"], fields["priority"] == "urgent", len(self.inventory))
        if never is not None:
            raise InvalidInput(*never)
        for dep in fields["depends"]:
            if self.active_job(dep.job_id) is None and self.store.get(dep.job_id) is None:
                raise InvalidInput("depends", f"no job {dep.job_id} to depend on")
        root = self.root_for(user)
        fields["cwd"] = _resolve_cwd(fields["cwd"], str(root))
        try:
            unix_user = run_as(user, self.run_as_owner)
        except NotAUnixUser as err:
            raise InvalidInput("user", str(err)) from None
        if unix_user is not None and not self.runner.runs_as_owner:
            raise InvalidInput("user", f"this engine runs as {_engine_user()} and its {self.runner.name} runner "
                                       f"would run the job as {_engine_user()}, not as {unix_user}: run the engine "
                                       "as the account that submits to the cluster (docs/slurm.md)")
        if unix_user is not None and not can_enter(fields["cwd"], unix_user):
            raise InvalidInput("cwd", f"cwd {fields['cwd']} is not accessible to {unix_user}")
        if not os.path.isdir(fields["cwd"]):
            raise InvalidInput("cwd", f"no such directory: {fields['cwd']}")
        memory_ok, cpu_ok = self.limits_enforceable()
        for key, ok, what in (("mem_bytes", memory_ok, "mem"), ("cpus", cpu_ok, "cpus")):
            if fields.get(key) is not None and not ok:
                raise InvalidInput(what, f"this machine cannot enforce a --{what} limit ({self.isolation})")
        if fields["kind"] == "notebook":
            from ..notebook.notebooks import check_notebook_payload

            fields["payload"] = check_notebook_payload(fields["payload"], root)
        array = fields.pop("array")
        limit = fields.pop("array_max_running")
        base = {**fields, "user": user}
        if not array:
            return NewJobs([base], actor=user, now=now)
        return NewJobs([{**base, "array_index": i, "array_max_running": limit} for i in array],
                       actor=user, now=now, array=True)

    def _store_submissions(self) -> None:
        """Commit the submissions that arrived since the last call (one event-loop turn) in
        one transaction, then answer each with its own jobs or its own error."""
        batch, self._submissions = self._submissions, []
        if not batch:
            return
        for (new, future), outcome in zip(batch, self._insert([new for new, _ in batch])):
            if not isinstance(outcome, Exception):
                try:
                    outcome = self._accepted(outcome, new)
                except Exception as err:
                    outcome = err
            if future.done():  # its request went away; its jobs are stored all the same
                continue
            if isinstance(outcome, Exception):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)
        self._wake_after_burst()

    def _insert(self, batch: list[NewJobs]) -> list[list[Job] | Exception]:
        """All in one transaction; if that fails, each on its own, so that one bad submission
        costs only itself."""
        try:
            outcomes: list[list[Job] | Exception] = list(self.store.add_submissions(batch))
            self._store_ok()
            return outcomes
        except StoreUnavailable as err:  # each alone would fail the same way
            self._note_store_trouble(err)
            return [err for _ in batch]
        except Exception as err:
            if len(batch) == 1:
                return [err]
            log.warning("gpujobs: storing %d submissions together failed (%s); storing them one by one",
                        len(batch), err)
        outcomes = []
        for new in batch:
            try:
                outcomes.append(self.store.add_submissions([new])[0])
            except Exception as err:
                outcomes.append(err)
        return outcomes

    def _accepted(self, jobs: list[Job], new: NewJobs) -> list[Job]:
        """Stored jobs join the engine's active set and are announced."""
        if jobs and jobs[0].kind == "notebook":
            from ..notebook.notebooks import notebook_command

            for i, job in enumerate(jobs):
                command, payload = notebook_command(job, self.root_for(job.user), self.job_python or None)
                self.store.update_job(job.id, command=command, payload=payload)
                jobs[i] = replace(job, command=command, payload=payload)
        for job in jobs:
            self._keep(job)
            self._publish(job, {"job_id": job.id, "time": new.now, "state": "PENDING", "actor": new.actor,
                                "reason": "submitted"})
        return jobs

    def check_owner(self, job: Job, user: str) -> None:
        if job.user != user and not self.is_admin(user):
            raise PermissionDenied(f"job {job.id} belongs to {job.user}; only they or an admin may change it")

    async def cancel(self, job_id: int, user: str, wait_s: float = 3.0) -> Job:
        """Cancel a pending job now, or stop a running one (SIGTERM, grace, SIGKILL) and wait
        up to `wait_s` for it to end. Returns the job as it then is."""
        job = self.get(job_id)
        self.check_owner(job, user)
        if job.state.is_final:
            return job
        if self.mirror is not None:
            return await self.mirror.cancel(job, user, wait_s)
        reason = f"cancelled by {user}"
        if job.state is JobState.RUNNING and job.kind in EXTERNAL_KINDS:
            return self._end_external(job, JobState.CANCELLED, user, reason)
        if job.state is JobState.PENDING:
            return self._set_state(job.id, JobState.CANCELLED, user, reason,
                                   expect=(JobState.PENDING, JobState.RUNNING)) or self.get(job_id)
        if job.id in self._terminating:  # already stopping (preempted): it ends CANCELLED, not requeued
            self.store.add_event(job.id, "STOPPING", user, f"stopping: {reason} (already stopping)", self.clock(),
                                 data={"outcome": "cancelled", "reason": reason})
            self._cancel_requested[job.id] = reason
        else:
            self._terminate(job, reason, "cancelled", self.kill_grace_s, actor=user)
        return await self.wait_ended(job_id, wait_s)

    async def wait_ended(self, job_id: int, timeout: float) -> Job:
        job = self.get(job_id)
        if job.state.is_final:
            return job
        fut: asyncio.Future[Job] = asyncio.get_running_loop().create_future()
        self._ended_waiters.setdefault(job_id, []).append(fut)
        try:
            return await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            return self.get(job_id)

    def finish_external(self, job_id: int, user: str, state: Any = "COMPLETED", reason: Any = None) -> Job:
        """The end of a job the engine did not launch (a kernel): shut down, crashed, idle.
        `state`: COMPLETED, FAILED, CANCELLED or TIMEOUT; `reason` defaults to the state."""
        if not isinstance(state, str) or state.upper() not in END_STATES:
            raise InvalidInput("state", f"cannot end a job as {str(state)[:40]!r}; expected {', '.join(END_STATES)}")
        end = JobState(state.upper())
        reason = parse_reason(reason) or end.value.lower()
        job = self.get(job_id)
        self.check_owner(job, user)
        if job.kind not in EXTERNAL_KINDS:
            raise InvalidInput("kind", f"job {job_id} is a {job.kind} job; cancel it instead")
        if job.state.is_final:
            return job
        if job.state is JobState.RUNNING:
            return self._end_external(job, end, user, reason)
        return self._set_state(job_id, end, user, reason, expect=(JobState.PENDING, JobState.RUNNING)) or job

    # ---- GPU kernels: processes the engine did not start, confined once their provisioner asks

    def adopt(self, job_id: int, user: str, pid: Any, launcher: int) -> dict[str, Any]:
        """Put a running GPU kernel's process (and its children) under the engine's watch: its
        own cgroup with the device fence and limits a job of its own would get, so that its
        time limit, cancel and GPU release hold even when the Jupyter server that launched it
        is gone. Called by the kernel provisioner right after the launch (and each restart).

        The process must belong to the job's owner (its real uid), descend from `launcher`
        (the caller's process: the Jupyter server that started the kernel) and be in no other
        job's cgroup: nobody confines a stranger's process, nor takes one out of its own job.
        Returns {"confined": bool, "isolation": what is in force}."""
        if isinstance(pid, bool) or not isinstance(pid, int) or not 1 < pid < 1 << 31:
            raise InvalidInput("pid", f"expected a process id, got {str(pid)[:40]!r}")
        job = self.get(job_id)
        self.check_owner(job, user)
        if job.kind not in EXTERNAL_KINDS:
            raise InvalidInput("kind", f"job {job_id} is a {job.kind} job; the engine already supervises it")
        if job.state is not JobState.RUNNING or job.id in self._ending:
            raise Conflict("state", f"job {job_id} is {job.state.value}, not running: nothing to confine")
        if self.mirror is not None:
            return {"confined": False, "isolation": "the kernel is a Slurm job; Slurm confines it"}
        procs = _process_tree(pid, _owner_uid(job.user, self.run_as_owner), launcher)
        handle = self._adopted.get(job.id)
        own = self.runner.adopted_run(handle)
        for proc_pid, run in procs:
            if run and run != own:
                raise PermissionDenied(f"process {proc_pid} belongs to another GPU job ({run}); "
                                       "it cannot join this one")
        gpus = [g for g in self.inventory if g.index in job.assigned_gpus and g.host in (None, job.host)]
        req = LaunchRequest(job_id=job.id, command=[], cwd="", mem_bytes=job.mem_bytes, cpus=job.cpus,
                            deny_devices=self._deny_devices(gpus))
        try:
            new = self.runner.adopt(req, [p for p, _ in procs], handle)
        except OSError as err:
            log.warning("gpujobs: could not confine kernel job %s (pid %s): %s", job.id, pid, err)
            return {"confined": False, "isolation": f"not confined: {err.strerror or err}"}
        if new is None:
            return {"confined": False, "isolation": self.isolation}
        new["launcher"] = _process_key(launcher)  # whose death leaves the kernel to the engine
        if handle != new:
            self.store.update_job(job.id, runner_handle=new)
            self._adopted[job.id] = new
        self._empty_since.pop(job.id, None)
        return {"confined": True, "isolation": self.isolation}

    def _end_external(self, job: Job, state: JobState, actor: str, reason: str) -> Job:
        """End a running kernel job. A confined one keeps its GPUs until its last process is
        gone: everything left in its cgroup is killed and the end is recorded once it is empty
        (`_watch_adopted`), so no process of it runs on a GPU given to another job."""
        if job.id in self._ending:  # the first end asked wins (a time limit over the death it causes)
            state, actor, reason = self._ending[job.id]
        handle = self._adopted.get(job.id)
        if handle is not None and not self.runner.stop_adopted(handle):
            self._ending[job.id] = (state, actor, reason)
            return job
        return self._set_state(job.id, state, actor, reason, expect=(JobState.RUNNING,)) or self.get(job.id)

    #: Utilization (percent) under which the GPUs of an orphaned kernel count as unused.
    IDLE_GPU_THRESHOLD = 5.0

    def _reclaim_orphan(self, job_id: int, handle: dict[str, Any], now: float) -> None:
        """Idle reclaim for a confined kernel whose Jupyter server is gone (nobody else can):
        its `idle_timeout` (from the provisioner) counts while its GPUs are unused. Checked
        once a second; the GPUs' utilization is the inventory's."""
        job = self._running.get(job_id)
        idle_timeout = (job.payload or {}).get("idle_timeout") if job is not None else None
        if job is None or not isinstance(idle_timeout, (int, float)) or idle_timeout <= 0:
            return
        checked, idle_since = self._orphan_idle.get(job_id, (0.0, None))
        if now - checked < 1.0:
            return
        if _process_alive(handle.get("launcher")):
            self._orphan_idle.pop(job_id, None)
            return
        used = max((g.utilization for g in self.inventory
                    if g.index in job.assigned_gpus and g.host in (None, job.host)), default=0.0)
        if used >= self.IDLE_GPU_THRESHOLD:
            idle_since = None
        elif idle_since is None:
            idle_since = now
        self._orphan_idle[job_id] = (now, idle_since)
        if idle_since is not None and now - idle_since >= idle_timeout:
            self._end_external(job, JobState.CANCELLED, "engine",
                               f"idle for {format_duration(idle_timeout)} after its Jupyter server was gone")

    #: An adopted kernel with no process left for this long has ended (its Jupyter server is
    #: gone, or it would have said so); a restart of the kernel takes far less.
    KERNEL_GONE_S = 30.0

    def _watch_adopted(self) -> None:
        now = self.clock()
        for job_id, handle in list(self._adopted.items()):
            ending = self._ending.get(job_id)
            if ending is not None:
                if self.runner.stop_adopted(handle):
                    self._set_state(job_id, *ending, expect=(JobState.RUNNING,))
                continue
            if self.runner.adopted_alive(handle):
                self._empty_since.pop(job_id, None)
                self._reclaim_orphan(job_id, handle, now)
                continue
            since = self._empty_since.setdefault(job_id, now)
            if now - since >= self.KERNEL_GONE_S:
                self._set_state(job_id, JobState.FAILED, "engine",
                                "kernel gone: none of its processes is left (was its Jupyter server stopped?)",
                                expect=(JobState.RUNNING,))

    def read_log(self, job_id: int, offset: int = 0, max_bytes: int = 256 * 1024,
                 viewer: str | None = None) -> tuple[str, int, bool]:
        """(text, next offset, job ended) from a job's log file, to a `viewer` who may see it."""
        job = self.get_private(job_id, viewer)
        path = self.store.log_path(job_id)
        if self._log_removed(job, path):
            raise LogRemoved(f"the log of job {job_id} was removed after the {format_duration(self.job_retention_s)} "
                             "retention (c.GPUJobs.job_retention); the job's record and events are kept")
        if not path or not Path(path).exists():
            return "", offset, job.state.is_final
        with open(path, "rb") as f:
            f.seek(max(0, offset))
            data = f.read(max_bytes)
        # do not split a UTF-8 character
        cut = len(data)
        while cut > 0 and cut > len(data) - 4 and (data[cut - 1] & 0xC0) == 0x80:
            cut -= 1
        if cut > 0 and data[cut - 1] >= 0xC0:
            cut -= 1
        if cut <= 0 and data:
            cut = len(data)
        done = job.state.is_final and len(data) < max_bytes
        return data[:cut].decode("utf-8", errors="replace"), offset + cut, done

    def set_quota(self, actor: str, scope: Any, name: Any, quota: Any) -> None:
        """An admin sets (a dict as in c.GPUJobs.user_quotas) or clears (None) the quota of a user
        (`scope` "users") or group ("groups"); stored, so it outlives restarts."""
        if not self.is_admin(actor):
            raise PermissionDenied("only admins may change quotas")
        if scope not in ("users", "groups"):
            raise InvalidInput("scope", "expected 'users' or 'groups'")
        if not isinstance(name, str) or not name or len(name) > 200:
            raise InvalidInput("name", "expected the user or group name")
        check_plain_text(name, "name")
        if quota is not None:
            from traitlets import TraitError

            from ..config import _quota

            try:
                _quota("quota", quota)
            except TraitError as err:
                raise InvalidInput("quota", str(err)) from None
        now = self.clock()
        self.store.set_quota(scope, name, quota, actor, now)  # stored first: it survives restarts
        if quota is None:
            self.quotas_set.pop((scope, name), None)
        else:
            self.quotas_set[(scope, name)] = {"quota": quota, "by": actor, "at": now}
        self._policy = self._with_quotas_set()
        log.info("gpujobs: %s %s the quota of %s %s%s", actor, "cleared" if quota is None else "set",
                 scope[:-1], name, "" if quota is None else f" to {quota}")
        self.wake()

    # ================================================================= advance reservations

    def create_reservation(self, actor: str, body: Any, source: str = "") -> dict[str, Any]:
        """An admin reserves GPUs for users or groups (`model.validate_reservation`); stored, so
        it outlives restarts, and in force from the next cycle."""
        if not self.is_admin(actor):
            raise PermissionDenied("only admins may reserve GPUs")
        return self._add_reservation(actor, body, source)

    def _add_reservation(self, actor: str, body: Any, source: str) -> dict[str, Any]:
        if self.mirror is not None:
            raise Conflict("reservation", "this server hands its jobs to Slurm; make reservations there "
                                          "(scontrol create reservation)")
        now = self.clock()
        inventory = self.refresh_inventory()
        fields = validate_reservation(body, now, inventory)
        self._check_room(Reservation(id=MAX_ID, **fields), inventory, now)
        r = self.store.add_reservation(fields, actor, now, source)
        self.reservations.append(r)
        self.reservation_source[r.id] = source
        log.info("gpujobs: %s reserved %d %s for %s (reservation %d)", actor, r.gpus, r.gpu_type or "GPUs",
                 r.holders_text(), r.id)
        self.wake()
        return self.reservation_view(r)

    def accept_reservation_proposal(self, actor: str, finding_id: Any) -> dict[str, Any]:
        """Reserve what a `reservation_proposal` finding proposes (monitor/habits.py) and close
        it. An admin may accept any; a user one for themselves, or for a group they are in,
        when its GPUs are within their (or that group's) GPU limit."""
        from .store import monitoring as mstore

        fid = parse_id(finding_id, "proposal")
        finding = mstore.get_finding(self.store, fid)
        if finding is None or finding["kind"] != "reservation_proposal":
            raise NotFound(f"no reservation proposal {fid}")
        if not finding["open"]:
            raise Conflict("proposal", f"proposal {fid} is closed ({finding['action'] or 'no longer seen'})")
        body = dict(finding["data"].get("reservation") or {})
        if not self.is_admin(actor):
            self._may_accept(actor, body)
        view = self._add_reservation(actor, body, f"finding:{fid}")
        closed = mstore.resolve_finding(self.store, self.clock(), finding_id=fid,
                                        action=f"accepted by {actor}: reservation {view['id']}")
        if closed is not None:
            self.broadcast({"type": "finding", "finding": closed})
        return view

    def _may_accept(self, actor: str, body: dict[str, Any]) -> None:
        """A user accepts a proposal for themselves (or a group of theirs) within their quota."""
        quotas = Quotas(self.current_policy())
        n = int(body.get("gpus") or 0)
        if body.get("users") == [actor]:
            cap, who = quotas.user_caps(actor)[1], "your"
        elif len(body.get("groups") or []) == 1 and self._member(actor, body["groups"][0]):
            group = body["groups"][0]
            cap, who = quotas.group_caps(group)[1], f"group {group}'s"
        else:
            raise PermissionDenied("only admins may accept a proposal for someone else")
        if cap is None or n > cap:
            limit = "no GPU limit is set" if cap is None else f"the limit is {cap} GPUs"
            raise PermissionDenied(f"reserving {n} GPUs is beyond {who} quota ({limit}); ask an admin")

    def _member(self, user: str, group: str) -> bool:
        if user in self.group_members.get(group, ()):
            return True
        return in_group(user, group)

    def _check_room(self, new: Reservation, inventory: list[GPU], now: float) -> None:
        """Refuse (409) a reservation that would get no GPUs at one of its occurrences in the
        next 8 weeks, because earlier reservations hold them then."""
        for start, _ in occurrences_between(new, now, now + 8 * 7 * 86400)[:60]:
            if not any(o.reservation is new for o in occurrences([*self.reservations, new], inventory, start)):
                what = f"{new.gpus} {new.gpu_type or 'GPU'}{'s' if new.gpus > 1 and not new.gpu_type else ''}"
                raise Conflict("gpus", f"{what} on one host are not free of other reservations on "
                                       f"{time.strftime('%a %d %b %H:%M', time.localtime(start))}; see GET reservations")

    def delete_reservation(self, actor: str, reservation_id: Any) -> int:
        """An admin (or whoever made it) removes a reservation; returns its id."""
        rid = parse_id(reservation_id, "id")
        r = next((r for r in self.reservations if r.id == rid), None)
        if r is None:
            raise NotFound(f"no reservation {rid}")
        if not self.is_admin(actor) and actor != r.created_by:
            raise PermissionDenied(f"reservation {rid} was made by {r.created_by}; only they or an admin may remove it")
        self.store.delete_reservation(rid)
        self.reservations = [x for x in self.reservations if x.id != rid]
        self.reservation_source.pop(rid, None)
        log.info("gpujobs: %s removed reservation %d", actor, rid)
        self.wake()
        return rid

    def list_reservations(self) -> list[dict[str, Any]]:
        """Every reservation with its active or next occurrence and the GPUs it has then."""
        return [self.reservation_view(r) for r in self.reservations]

    def reservation_view(self, r: Reservation) -> dict[str, Any]:
        now = self.clock()
        when = occurrence_at(r, now)
        occ = occurrences([x for x in self.reservations if x.id < r.id] + [r], self.refresh_inventory(), now)
        mine = next((o for o in occ if o.reservation.id == r.id), None)
        return {
            "id": r.id, "name": r.name, "label": r.label, "gpus": r.gpus, "gpu_type": r.gpu_type, "host": r.host,
            "start": r.start, "duration_s": r.duration_s, "repeat": r.repeat, "users": list(r.users),
            "groups": list(r.groups), "holders": r.holders_text(), "created_by": r.created_by,
            "created_at": r.created_at, "source": self.reservation_source.get(r.id, ""),
            "next_start": when[0] if when else None, "next_end": when[1] if when else None,
            "active": bool(when and when[0] <= now),
            "assigned": None if mine is None else {"host": mine.host, "gpus": list(mine.gpus),
                                                    "text": gpus_text(mine.gpus)},
        }

    def _load_reservations(self) -> None:
        """Reservations made before this start."""
        self.reservations, self.reservation_source = [], {}
        for r, source in self.store.load_reservations():
            self.reservations.append(r)
            self.reservation_source[r.id] = source

    def _load_quotas(self) -> None:
        """Quotas set through the API before this start."""
        for scope, entries in self.store.load_quotas().items():
            for name, entry in entries.items():
                self.quotas_set[(scope, name)] = {"quota": entry["quota"], "by": entry["set_by"],
                                                  "at": entry["set_at"]}
        self._policy = self._with_quotas_set()

    # ================================================================= a full or read-only store

    def _note_store_trouble(self, err: StoreUnavailable) -> None:
        """Nothing can be written now: say so once a minute (not per request or poll)."""
        self.store_trouble = err
        now = time.monotonic()
        if now - self._trouble_logged_at >= 60:
            self._trouble_logged_at = now
            log.error("gpujobs: %s; new jobs are refused and %d ended job(s) wait to be recorded "
                      "(this is logged once a minute while it lasts)", err, len(self._unrecorded))

    def _store_ok(self) -> None:
        if self.store_trouble is not None:
            log.warning("gpujobs: %s is writable again", self.store_trouble.where)
            self.store_trouble = None
            self._trouble_logged_at = -float("inf")
            self.wake()

    # ================================================================= listeners

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        self._listeners.add(listener)
        return lambda: self._listeners.discard(listener)

    def _publish(self, job: Job, event: dict[str, Any]) -> None:
        if not self._listeners:
            return
        self.broadcast({"type": "job", "job": self.view(job), "event": event})

    def job_message_for(self, message: dict[str, Any], viewer: str | None) -> dict[str, Any]:
        """A `{"type": "job"}` broadcast as `viewer` may see it: another's private job as its
        queue view (`redact`), its event without its data."""
        if self.may_see(message["job"], viewer):
            return message
        event = {k: message["event"].get(k) for k in ("job_id", "time", "state", "actor", "reason")}
        return {**message, "job": redact(message["job"]), "event": {**event, "data": {}}}

    def broadcast(self, message: dict[str, Any]) -> None:
        """Hand a message (`{"type": ...}`) to every listener: the events websockets, which
        decide who may see it, and the monitor. The monitor's findings go out this way."""
        for listener in list(self._listeners):
            try:
                listener(message)
            except Exception:
                log.exception("gpujobs: event listener failed")

    # ================================================================= state changes

    def _set_state(self, job_id: int, state: JobState, actor: str, reason: str,
                   expect: tuple[JobState, ...] | None = None, data: dict[str, Any] | None = None,
                   **fields: Any) -> Job | None:
        now = self.clock()
        if state.is_final:
            fields.setdefault("ended_at", now)
        job = self.store.transition(job_id, state, actor, reason, now, expect=expect, data=data, **fields)
        if job is None:
            return None
        if state.is_final:
            if self.mirror is not None and job.kind in EXTERNAL_KINDS and actor != "runner":
                # a kernel under Slurm ended by its provisioner or the engine: end its Slurm job too
                self.mirror.release(job, self._handles.get(job_id), state, reason)
            self._forget(job_id)
            self._handles.pop(job_id, None)
            self._terminating.discard(job_id)
            self._warned.discard(job_id)
            self._cancel_requested.pop(job_id, None)
            self._unrecorded.pop(job_id, None)
            self._ending.pop(job_id, None)
            self._empty_since.pop(job_id, None)
            self._orphan_idle.pop(job_id, None)
            adopted = self._adopted.pop(job_id, None)
            if adopted is not None:
                self.runner.release_adopted(adopted)
            for fut in self._ended_waiters.pop(job_id, []):
                if not fut.done():
                    fut.set_result(job)
        else:
            self._keep(job)
        # the cycle first: tasks run in the order they were woken, and the listeners woken by
        # the publication (the monitor's diagnosis of an ended job, ...) can wait; a freed GPU can't
        self.wake()
        self._publish(job, {"job_id": job_id, "time": now, "state": state.value, "actor": actor,
                            "reason": reason, "data": data or {}})
        return job

    def _terminate(self, job: Job, reason: str, outcome: str, grace_s: int, actor: str = "engine") -> None:
        if job.id in self._terminating:
            return
        handle = self._handles.get(job.id)
        if handle is None:
            return
        self.store.add_event(job.id, "STOPPING", actor, f"stopping: {reason}", self.clock(),
                             data={"outcome": outcome, "reason": reason})
        self._terminating.add(job.id)
        if outcome == "cancelled":
            self._cancel_requested[job.id] = reason
        self.runner.terminate(job.id, handle, reason, outcome, grace_s)

    def poll(self) -> None:
        """Record jobs whose process ended. A result that cannot be stored now (full or
        read-only disk) is kept and recorded once the store is writable again."""
        if self._unrecorded and time.monotonic() - self._unrecorded_tried_at >= 1.0:
            self._unrecorded_tried_at = time.monotonic()
            for job_id, exit_ in list(self._unrecorded.items()):
                self._finish(job_id, exit_)  # raises StoreUnavailable while it lasts
                self._unrecorded.pop(job_id, None)
            self._store_ok()
        if self._adopted:
            self._watch_adopted()
        if not self._handles:
            return
        for exit_ in self.runner.poll(dict(self._handles)):
            try:
                self._finish(exit_.job_id, exit_)
            except StoreUnavailable as err:
                self._unrecorded[exit_.job_id] = exit_
                self._handles.pop(exit_.job_id, None)  # ended: nothing more to watch
                self._note_store_trouble(err)

    def _finish(self, job_id: int, exit_: Exit) -> None:
        job = self.active_job(job_id) or self.store.get(job_id)
        if job is None or job.state.is_final:
            self._handles.pop(job_id, None)
            return
        ran = (exit_.ended_at - job.started_at) if job.started_at else 0.0
        fields = {"exit_code": exit_.exit_code, "signal": exit_.signal,
                  "run_seconds": job.run_seconds + max(0.0, ran)}
        data = {"outcome": exit_.outcome, "exit_code": exit_.exit_code, "signal": exit_.signal}
        cancelled = self._cancel_requested.get(job_id)
        if cancelled and exit_.outcome in ("preempted", "cancelled"):  # a cancel wins over a requeue
            self._set_state(job_id, JobState.CANCELLED, "runner", cancelled, data=data, ended_at=exit_.ended_at,
                            **fields)
            return
        if exit_.outcome == "preempted":
            if job.requeue or not exit_.started:
                self._set_state(job_id, JobState.PENDING, "scheduler", exit_.reason, data=data,
                                started_at=None, host=None, assigned_gpus=(), borrowed=False, runner_handle={},
                                restarts=job.restarts + (1 if exit_.started else 0), **fields)
                self._handles.pop(job_id, None)
                self._terminating.discard(job_id)
                return
            state = JobState.CANCELLED
        else:
            state = _OUTCOME_STATE.get(exit_.outcome, JobState.FAILED)
        self._freed.set()  # (before the end is published: see _set_state)
        self._set_state(job_id, state, "runner", exit_.reason, data=data, ended_at=exit_.ended_at, **fields)
        self._ended_since_cycle = True

    # ================================================================= the cycle

    def cycle(self) -> Plan:
        """One scheduling cycle: snapshot -> schedule() -> carry out the plan."""
        t0 = time.perf_counter()
        if self._burst_timer is not None:  # this cycle sees every submission stored so far
            self._burst_timer.cancel()
            self._burst_timer = None
        now = self.clock()
        if self.gpu_claim is not None and not self.gpu_claim.acquire():
            return self._refuse_all(now)
        if self._refusing:
            log.warning("gpujobs: the other engine is gone; this engine now owns the GPUs")
            self._refusing = False
        gpus = [g for g in self.inventory]
        pending = self._pending  # handed to schedule() as it is: it neither keeps nor changes it
        if self.set_aside:
            for job_id in [i for i in self.set_aside if i not in pending]:
                del self.set_aside[job_id]
            pending = {i: j for i, j in pending.items() if i not in self.set_aside}
        running = list(self._running.values())
        self._enforce_limits(running, now)
        self._account_usage(running, now)
        dep_ids = {d.job_id for j in pending.values() for d in j.depends}
        finished = self.store.final_states(i for i in dep_ids if self.active_job(i) is None)
        # Every cycle decides. Every estimate_interval (and within a second of new jobs that
        # have none) a cycle also recalculates the priorities and estimates every job's start:
        # on a deep queue that is most of a cycle's cost, and seconds of lag are harmless.
        newest = max(pending, default=0)
        since = now - self._estimated_at
        estimate = since >= self.estimate_interval or (newest > self._estimated_newest and since >= 1.0)
        if estimate and self._ended_since_cycle and not self._estimate_deferred and self._estimated_at > -float("inf"):
            # a job just ended: its GPUs go to the next jobs now, the estimate comes a cycle
            # later (once: with jobs ending all the time it would never come)
            estimate = False
            self._estimate_deferred = True
            self.wake()
        elif estimate:
            self._estimate_deferred = False
        self._ended_since_cycle = False
        order = None if estimate else self._plan.queue_order
        claims = self._current_claims(now)
        t_plan = time.perf_counter()
        gc.disable()  # a cycle makes only acyclic garbage; a collection now would scan the heap
        try:
            plan = self._schedule(now, pending, running, gpus, finished, estimate, order, claims)
        finally:
            gc.enable()
        self.schedule_seconds = time.perf_counter() - t_plan
        if estimate:
            self._estimates, self._estimated_at, self._estimated_newest = plan.expected_start, now, newest
            self._estimates_predicted = plan.predicted
        self._plan = plan
        self._plan_at = now
        started = {st.job_id for st in plan.starts}
        self._waiting = [jid for jid in plan.order if jid not in started] if started else plan.order
        self._positions = None
        for job_id, reason in plan.cancels:
            self._set_state(job_id, JobState.CANCELLED, "scheduler", reason, expect=(JobState.PENDING,))
        for p in plan.preemptions:
            victim = self._running.get(p.job_id)
            if victim is None:  # no longer running
                continue
            victims, until, _ = self._claims.get(p.by_job_id, (set(), 0.0, False))
            self._claims[p.by_job_id] = ({*victims, victim.id}, max(until, now + self.policy.preempt_grace_s), False)
            if victim.kind in EXTERNAL_KINDS:
                self._end_external(victim, JobState.CANCELLED, "scheduler", p.reason)
            else:
                self._terminate(victim, p.reason, "preempted", self.policy.preempt_grace_s)
        by_host = {(g.host, g.index): g for g in gpus}
        for start in plan.starts:
            job = self._pending.get(start.job_id)
            if job is None:  # no longer pending
                continue
            self._launch(job, start.host, [by_host[(start.host, i)] for i in start.gpus], start.borrowed,
                         start.share)
        self.cycle_seconds.append(time.perf_counter() - t0)
        del self.cycle_seconds[:-200]
        return plan

    #: A claim whose victims outlive their grace by this much (a process that does not die) is
    #: dropped: its preemptor is then scheduled as any job, and may preempt others.
    CLAIM_OVERDUE_S = 60.0

    def _current_claims(self, now: float) -> list[Claim]:
        """The claims of preemptors still pending, with their victims still running. A claim
        whose victims have all stopped is handed to one cycle (which places its preemptor
        first), then dropped."""
        out: list[Claim] = []
        for job_id, (victims, until, seen) in list(self._claims.items()):
            left = tuple(v for v in victims if v in self._running)
            if job_id not in self._pending or seen or (left and now > until + self.CLAIM_OVERDUE_S):
                del self._claims[job_id]
                continue
            if not left:
                self._claims[job_id] = (victims, until, True)
            out.append(Claim(job_id, left, until))
        return out

    def _schedule(self, now: float, pending: dict[int, Job], running: list[Job], gpus: list[GPU],
                  finished: dict[int, JobState], estimate: bool, order: Any, claims: list[Claim]) -> Plan:
        """`schedule()`; when it raises, the pending job whose data it cannot handle is found,
        set aside (`set_aside`, with a reason and a line in the log; the monitor tells the
        admins) and the cycle plans without it, so one bad row never stops the queue."""
        policy = self.current_policy()

        def plan(jobs: dict[int, Job] | list[Job]) -> Plan:
            return schedule(now, jobs, running, gpus, policy, self._usage, finished, estimate=estimate,
                            order=order, claims=claims, reservations=self.reservations)

        for _ in range(len(pending) + 1):
            try:
                return plan(pending)
            except Exception as err:
                bad = _culprit(list(pending.values()), plan)
                if bad is None:  # not one pending job's doing (nothing to set aside)
                    raise
                self._set_aside(bad, err)
                pending = {i: j for i, j in pending.items() if i != bad.id}
        return plan(pending)

    def _set_aside(self, job: Job, err: Exception) -> None:
        what = _out_of_range(job) or f"{type(err).__name__}: {err}"[:200]
        reason = f"set aside: the scheduler could not handle this job ({what}); an admin was told"
        self.set_aside[job.id] = (what, f"{type(err).__name__}: {err}"[:500])
        log.error("gpujobs: job %s of %s is set aside: the scheduler could not handle it (%s)", job.id, job.user,
                  what, exc_info=err)
        self._pending[job.id] = job = job.replace(reason=reason)
        try:  # shown after a restart too, until a cycle tries it again
            self.store.update_job(job.id, reason=reason)
        except Exception:
            log.exception("gpujobs: recording why job %s is set aside failed", job.id)
        self._publish(job, {"job_id": job.id, "time": self.clock(), "state": "PENDING", "actor": "scheduler",
                            "reason": reason})

    def _refuse_all(self, now: float) -> Plan:
        """A cycle of an engine whose GPUs another engine owns: nothing starts, and every
        pending job says why."""
        assert self.gpu_claim is not None
        reason = self.gpu_claim.refusal()
        if not self._refusing:
            log.error("gpujobs: %s", reason)
            self._refusing = True
        order = sorted(self._pending)
        self._plan = Plan(order=order, reasons=Reasons({jid: reason for jid in order}))
        self._plan_at = now
        self._waiting = order
        self._positions = None
        return self._plan

    def current_policy(self) -> Policy:
        """The configured policy with the quotas set through the API or CLI in force."""
        return self._policy

    def _with_quotas_set(self) -> Policy:
        """Built when a quota is set or loaded, not in every cycle."""
        if not self.quotas_set:
            return self.policy
        from ..config import _quota

        quotas = {"users": dict(self.policy.user_quotas), "groups": dict(self.policy.group_quotas)}
        for (scope, name), entry in self.quotas_set.items():
            quotas[scope][name] = _quota(name, entry["quota"])
        return replace(self.policy, user_quotas=quotas["users"], group_quotas=quotas["groups"])

    def _limit_times(self, job: Job) -> tuple[float, float] | tuple[None, None]:
        """(when a started job reaches its time limit, when it is warned of it: at
        `time_limit_warning_s` before, or a fifth of a shorter limit); (None, None) for a job
        not started or without a limit."""
        if not job.started_at or not job.time_limit_s:
            return None, None
        end = job.started_at + job.time_limit_s
        return end, end - min(self.time_limit_warning_s, job.time_limit_s // 5)

    def _enforce_limits(self, running: list[Job], now: float) -> None:
        """Warn before a time limit; stop external (kernel) jobs at it. Script jobs are
        stopped by their supervisor; this is the safety net if one overstays."""
        for job in running:
            end, warn_at = self._limit_times(job)
            if end is None or warn_at is None:
                continue
            if job.id not in self._warned and now >= warn_at and now < end:
                self._warned.add(job.id)
                left = format_duration(end - now)
                self.store.add_event(job.id, "WARNING", "engine", f"time limit in {left}", now,
                                     data={"time_limit_at": end})
                self._publish(job, {"job_id": job.id, "time": now, "state": "WARNING", "actor": "engine",
                                    "reason": f"time limit in {left}", "data": {"time_limit_at": end}})
            if now >= end:
                reason = f"time limit of {format_duration(job.time_limit_s)} reached"
                if job.kind in EXTERNAL_KINDS:
                    if job.id not in self._ending:
                        self._end_external(job, JobState.TIMEOUT, "engine", reason)
                elif now >= end + self.kill_grace_s + 5:
                    self._terminate(job, reason, "timeout", self.kill_grace_s)

    def over_share(self, job_id: int, reason: str, stop: bool) -> None:
        """A running job uses more GPU memory than its share (the monitor's share watcher says
        so, with `reason`): a WARNING event when first seen over, and once over for the whole
        grace it is stopped and ends FAILED with the reason."""
        job = self._running.get(job_id)
        if job is None:
            return
        now = self.clock()
        if not stop:
            text = (f"over its GPU share: {reason}; stopped in {format_duration(self.shares.grace_s)} "
                    "unless it gives the memory back")
            self.store.add_event(job.id, "WARNING", "engine", text, now, data={"over_share": reason})
            self._publish(job, {"job_id": job.id, "time": now, "state": "WARNING", "actor": "engine",
                                "reason": text, "data": {"over_share": reason}})
        elif job.kind in EXTERNAL_KINDS:
            self._set_state(job.id, JobState.FAILED, "engine", reason, expect=(JobState.RUNNING,))
        else:
            self._terminate(job, reason, "failed", self.kill_grace_s)

    def _launch(self, job: Job, host: str, gpus: list[GPU], borrowed: bool, share: float | None = None) -> None:
        """Start a job, crash-safe: where its run will live is stored with its RUNNING
        transition, before its supervisor starts, so a restart at any point finds the run
        (see `reconcile`) rather than calling the job lost while it runs."""
        now = self.clock()
        reason = "started on GPU " + ",".join(str(g.index) for g in gpus) if gpus else "started (no GPU)"
        if share is not None and gpus:
            reason = f"started on a {share:g} share of GPU {gpus[0].index}"
        if borrowed:
            reason += " (borrowed: may be reclaimed)"
        request: LaunchRequest | None = None
        handle: dict[str, Any] = {}
        log_path: str | None = None
        if job.kind not in EXTERNAL_KINDS:
            log_path = str(self.state_dir / "logs" / f"job-{job.id}.log")
            request = self._launch_request(job, gpus, log_path)
            try:
                handle = self.runner.prepare(request)
            except OSError as err:
                trouble = store_trouble(err, str(getattr(self.runner, "state_dir", self.state_dir)))
                if trouble is not None:
                    raise trouble from err
                log.exception("gpujobs: could not prepare the run of job %s", job.id)
                return
        try:
            started = self.store.start(job.id, host, [(g.index, g.uuid) for g in gpus], now,
                                       borrowed=borrowed, reason=reason, runner_handle=handle, log_path=log_path,
                                       share=share)
        except GPUAlreadyAllocated as err:
            self._discard(handle)
            log.error("gpujobs: refused to start job %s: %s", job.id, err)
            return
        except Exception:
            self._discard(handle)
            raise
        if started is None:
            self._discard(handle)
            return
        self._keep(started)
        if request is not None:
            try:
                handle = self.runner.start(request, handle)
            except Exception as err:
                log.exception("gpujobs: could not start job %s", job.id)
                self._set_state(job.id, JobState.FAILED, "runner", f"could not start: {err}",
                                expect=(JobState.RUNNING,))
                return
            self._handles[job.id] = handle
            try:
                self.store.update_job(job.id, runner_handle=handle)
            except StoreUnavailable as err:  # the run directory is stored: a restart finds it by that
                self._note_store_trouble(err)
        self._publish(started, {"job_id": job.id, "time": now, "state": "RUNNING", "actor": "scheduler",
                                "reason": reason})

    def _launch_request(self, job: Job, gpus: list[GPU], log_path: str) -> LaunchRequest:
        hints, facts = self.shares.environment(job, gpus)  # a share of a GPU: framework hints, MPS
        env = {**self.job_env, **hints, **job.env, **facts, "GPUJOBS_USER": job.user}
        if job.array_index is not None:
            env["GPUJOBS_ARRAY_INDEX"] = str(job.array_index)
            env["GPUJOBS_ARRAY_JOB_ID"] = str(job.array_job_id)
        try:
            owner = run_as(job.user, self.run_as_owner)
        except NotAUnixUser:
            owner = job.user  # the runner fails the job with the reason
        return LaunchRequest(
            job_id=job.id,
            command=list(job.command),
            cwd=job.cwd or str(self.root_for(job.user)),
            env=env,
            gpu_indices=[g.index for g in gpus],
            gpu_uuids=[g.uuid for g in gpus],
            time_limit_s=job.time_limit_s,
            grace_s=self.kill_grace_s,
            preempt_grace_s=self.policy.preempt_grace_s,
            log_path=log_path,
            fake=self.gpus.name == "fake",
            run_as=owner,
            mem_bytes=job.mem_bytes,
            cpus=job.cpus,
            deny_devices=self._deny_devices(gpus),
        )

    def _deny_devices(self, gpus: list[GPU]) -> list[str]:
        """The device nodes of this machine's GPUs other than `gpus` (a job's device fence)."""
        nodes = self.gpus.device_nodes()
        given = {nodes[g.index] for g in gpus if g.index in nodes}  # MIG instances share their card's node
        return sorted({path for path in nodes.values() if path not in given})

    def _discard(self, handle: dict[str, Any]) -> None:
        if handle:
            self.runner.discard(handle)


def _owner_uid(user: str, mode: str) -> int:
    """The Unix uid a job of `user` runs as (the engine's own where jobs run as the engine)."""
    name = run_as(user, mode)
    entry = lookup(name) if name else None
    return entry.pw_uid if entry is not None else os.geteuid()


def _process_key(pid: int) -> list[float]:
    """[pid, start time]: names a process so that a recycled pid is not taken for it."""
    try:
        return [pid, psutil.Process(pid).create_time()]
    except psutil.Error:
        return [pid, 0.0]


def _process_alive(key: Any) -> bool:
    """Is the process `_process_key` named still running (True when unknown)?"""
    if not isinstance(key, list) or len(key) != 2:
        return True
    try:
        proc = psutil.Process(int(key[0]))
        return abs(proc.create_time() - float(key[1])) < 0.5 and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _process_tree(pid: int, uid: int, launcher: int) -> list[tuple[int, str]]:
    """`pid` and its descendants, each with the name of the GPU job run whose cgroup holds it
    ("" for none). Refuses a process that does not exist, whose real uid is not `uid`, or that
    `launcher` did not start (directly or not)."""
    try:
        top = psutil.Process(pid)
        procs = [top, *top.children(recursive=True)]
        if top.uids().real != uid:
            raise PermissionDenied(f"process {pid} is not yours: only your own processes can join your job")
        if launcher not in {p.pid for p in top.parents()}:
            raise PermissionDenied(f"process {pid} was not started by the caller (process {launcher}); "
                                   "only the Jupyter server that launched a kernel can have it confined")
    except psutil.NoSuchProcess:
        raise InvalidInput("pid", f"no process {pid} is running") from None
    except psutil.AccessDenied:
        raise PermissionDenied(f"process {pid} is not yours") from None
    out = []
    for proc in procs:
        run = ""
        try:
            with open(f"/proc/{proc.pid}/cgroup") as f:
                for line in f:
                    _, _, path = line.rstrip("\n").partition(":")[2].partition(":")
                    if f"/{CGROUP_PARENT}/" in f"{path}/":
                        run = path.split(f"/{CGROUP_PARENT}/", 1)[1].split("/", 1)[0]
                        break
        except OSError:
            continue  # exited meanwhile
        out.append((proc.pid, run))
    return out


def _resolve_cwd(value: str | None, root_dir: str) -> str:
    """The working directory of a job as an absolute, normalised path.

    No cwd: the server's root. A relative cwd is taken from the root and must stay inside it
    (after `..` and symbolic links are followed), as the Jupyter file browser does. An absolute
    cwd is the user saying where they are (the CLI sends the shell's directory): it is accepted,
    normalised, because the job runs as its owner, who may enter it or not (the service checks
    that, and that it exists)."""
    root = os.path.abspath(root_dir)
    if value is None or value == "":
        return root
    if os.path.isabs(value):
        path = os.path.normpath(value)
    else:
        path = os.path.normpath(os.path.join(root, value))
        real_root = os.path.realpath(root)
        real = os.path.realpath(path)
        if os.path.commonpath([real_root, real]) != real_root:
            raise InvalidInput("cwd", f"{repr(value[:200])} leads outside the server's root directory; give a path "
                                      "inside it, or an absolute path")
    return path


def _engine_user() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return f"uid {os.geteuid()}"


def _foreign_text(gpu: GPU, processes: list[Any]) -> str:
    """"in use by a process outside the queue (7.6 GB, pid 1234, user bob)"."""
    size = f"{gpu.memory_used_mb / 1024:.1f} GB"
    if not processes:
        return f"in use outside the queue ({size}, by a process the engine cannot see)"
    top = max(processes, key=lambda p: p.used_memory_mb or 0)
    try:
        import psutil

        user = f", user {psutil.Process(top.pid).username()}"
    except Exception:  # gone, or not ours to see
        user = ""
    more = f" and {len(processes) - 1} more" if len(processes) > 1 else ""
    return (f"in use by {'a process' if len(processes) == 1 else f'{len(processes)} processes'} outside the queue "
            f"({size}, pid {top.pid}{user}{more})")


def _culprit(jobs: list[Job], plan: Callable[[list[Job]], Plan]) -> Job | None:
    """The one job of `jobs` without which `plan` (which raised with all of them) does not
    raise, found by halving; None when `plan` raises without any of them."""
    def fails(part: list[Job]) -> bool:
        try:
            plan(part)
        except Exception:
            return True
        return False

    if fails([]):
        return None
    while len(jobs) > 1:
        half = len(jobs) // 2
        if fails(jobs[:half]):
            jobs = jobs[:half]
        elif fails(jobs[half:]):
            jobs = jobs[half:]
        else:  # only together (rare): the first that fails alone
            return next((j for j in jobs if fails([j])), None)
    return jobs[0] if jobs and fails(jobs) else None


def _out_of_range(job: Job) -> str | None:
    """What in a job is out of the range the scheduler handles (as stored by an older
    version, or written to the store by other means), if that is what is wrong with it."""
    def bad_time(t: float | None) -> bool:
        return t is not None and not (-1e11 < t < 1e11)  # about year -1200 to 5100, and not NaN

    if bad_time(job.begin):
        return "begin time out of range"
    if bad_time(job.submitted_at):
        return "submit time out of range"
    if job.time_limit_s is not None and not (0 < job.time_limit_s < 1e9):
        return "time limit out of range"
    if not isinstance(job.gpus, int) or job.gpus < 0:
        return "GPU count out of range"
    if job.share is not None and not (0 < job.share < 1):
        return "GPU share out of range"
    if job.gpu_memory is not None and not (0 < job.gpu_memory < 1 << 60):
        return "GPU memory out of range"
    return None


#: What anyone may see of any job: the queue view (Slurm's PrivateData=jobs).
PUBLIC_FIELDS = frozenset({
    "id", "user", "kind", "state", "gpus", "gpu_type", "assigned_gpus", "host", "submitted_at",
    "started_at", "ended_at", "time_limit_s", "reason", "position", "expected_start", "expected_start_kind", "priority",
    "group", "preemptible", "borrowed", "begin", "offpeak", "array_job_id", "array_index",
    "ends_at", "warn_at", "share", "gpu_memory",
})


def redact(view: dict[str, Any]) -> dict[str, Any]:
    """A job view without its private data: the other fields are None, and `private` is true."""
    out: dict[str, Any] = {k: (v if k in PUBLIC_FIELDS else None) for k, v in view.items()}
    out["depends"] = []
    out["private"] = True
    return out


__all__ = ["Conflict", "JobService", "LogRemoved", "NotFound", "PermissionDenied", "StoreUnavailable", "EXTERNAL_KINDS"]
