"""The engine's shared state: the one place the parts of the engine read and write together.

Owns
- the engine's settings (the store, GPU backend, runner, policy and the `c.GPUJobs` values
  the service was built with), read by every part; the facade (`service.JobService`) writes
  them when a caller changes one;
- the active jobs: the pending and the running ones by id, kept in memory as well as in the
  store because the engine is their only writer (a cycle over 10,000 queued jobs must not
  reload them all), with the runner handles of the running ones and the bookkeeping each
  running job carries until it ends (stopping, cancel asked, warned, a confined kernel's
  watch): `keep` / `forget` / `ended` keep them;
- the queue as the last plan left it (order, reasons, expected starts), which the cycle
  (or the mirror) writes and the views read;
- the wake-ups of the loops (`wake`, `freed`) and the trouble of a full or read-only store.

It calls only the store (to read a job that is not active) and the model. Parts receive this
object; none keeps a copy of what lives here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..model import Job, JobState, Plan, Policy
from .containers import Containers
from .errors import NotFound
from .runners import Exit
from .store import StoreUnavailable

if TYPE_CHECKING:
    from .claim import GPUClaim
    from .gpus import GPUBackend
    from .runners import Runner
    from .shares import Shares
    from .store import Store

log = logging.getLogger("jupyter_gpujobs")

#: Kinds whose process the engine does not start: it only allocates GPUs (a kernel is
#: launched by the kernel provisioner once its job runs).
EXTERNAL_KINDS = ("kernel",)
#: How the front end of such a job may say it ended (`finish_external`).
END_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")


class EngineState:
    def __init__(
        self,
        store: Store,
        gpus: GPUBackend,
        runner: Runner,
        policy: Policy,
        *,
        state_dir: Path,
        root_dir: Path,
        job_env: dict[str, str] | None,
        admin_users: Iterable[str],
        group_members: dict[str, list[str]] | None,
        kill_grace_s: int,
        time_limit_warning_s: int,
        poll_interval: float,
        tick_interval: float,
        estimate_interval: float,
        job_retention_s: int,
        cleanup_interval: float,
        run_as_owner: str,
        job_python: str,
        foreign_memory_threshold_mb: int | None,
        clock: Callable[[], float],
        admin_group: str | None,
        private_data: bool,
        gpu_claim: GPUClaim | None,
        shares: Shares,
    ):
        # ---- settings
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
        # GPUs that no job holds but whose memory is in use beyond this (MiB) are busy for the
        # scheduler (`GPU.foreign`); None: never
        self.foreign_memory_threshold_mb = foreign_memory_threshold_mb
        self.clock = clock
        self.admin_group = admin_group  # members of this Unix group are admins (shared engine)
        self.private_data = private_data  # others' jobs show only their queue view (PrivateData=jobs)
        self.gpu_claim = gpu_claim  # the machine-wide claim of the GPUs (claim.py); None: not claimed
        # how GPU shares are enforced (shares.py); the monitor's share watcher reports to `over_share`
        self.shares = shares
        # the site's container settings (c.GPUJobs.default_image, allowed_images, container_runtime)
        self.containers = Containers()
        # a runner that schedules itself (Slurm): the engine mirrors it instead of scheduling
        self.mirrored = runner.schedules_itself

        # ---- the active jobs (`keep` and `forget` keep them): a cycle hands `pending` to the
        # scheduler as it is, without a pass over 10k jobs
        self.pending: dict[int, Job] = {}
        self.pending_of: dict[str, int] = {}  # user -> how many of `pending` are theirs (admission's caps)
        # pending jobs waiting for their image (containers/pull.py): held in the cycle's snapshot
        self.pulling: set[int] = set()
        self.running: dict[int, Job] = {}
        self.handles: dict[int, dict[str, Any]] = {}  # running job id -> its supervisor's handle
        # what running jobs carry until they end (`ended` drops it)
        self.terminating: set[int] = set()  # being stopped
        self.cancel_requested: dict[int, str] = {}  # job id -> why; a cancel wins over a preemption
        self.warned: set[int] = set()  # told that their time limit is near
        # GPU kernels whose processes the engine confines (`Kernels.adopt`): job id -> runner
        # handle; the ends asked for them and waiting for their last process (job id -> state,
        # actor, reason); since when an adopted kernel has had no process left (job id -> clock);
        # an orphaned kernel's idle watch (job id -> (checked, idle since))
        self.adopted: dict[int, dict[str, Any]] = {}
        self.ending: dict[int, tuple[JobState, str, str]] = {}
        self.empty_since: dict[int, float] = {}
        self.orphan_idle: dict[int, tuple[float, float | None]] = {}

        # ---- the queue as the last plan (or the mirror) left it, for the views
        self.plan = Plan()
        self.waiting: list[int] = []  # pending job ids in queue order, after the last plan's starts
        self.positions: dict[int, int] | None = {}  # id -> 1-based position in `waiting` (built on demand)
        # the last estimating cycle's expected start of every pending job, and which of them
        # are predictions (the rest are bounds)
        self.estimates: dict[int, float | None] = {}
        self.estimates_predicted: set[int] = set()
        # ... their ranges (earliest, latest); the start each job was last told, and why it
        # moved from the one told before (scheduler/estimates.py)
        self.estimate_ranges: dict[int, tuple[float, float]] = {}
        self.estimate_refs: dict[int, float] = {}
        self.estimate_notes: dict[int, str] = {}

        # ---- wake-ups
        self.wake_event: asyncio.Event | None = None  # set once the loops run
        self.freed = asyncio.Event()  # a running job ended: its GPUs are free (ends a cycle's rest)
        self.ended_since_cycle = False  # ... since the last cycle (which then only decides)

        # ---- the disk under the store is full or read-only: results that could not be
        # recorded yet (job id -> how it ended), recorded once it is writable again; the
        # trouble is logged once a minute, not per request
        self.store_trouble: StoreUnavailable | None = None
        self.unrecorded: dict[int, Exit] = {}
        self.trouble_logged_at = -float("inf")
        self.unrecorded_tried_at = 0.0

    # ------------------------------------------------------------------ the active jobs

    def keep(self, job: Job) -> None:
        """A pending or running job as it now is."""
        if job.state is JobState.PENDING:
            if job.id not in self.pending:
                self.pending_of[job.user] = self.pending_of.get(job.user, 0) + 1
            self.pending[job.id] = job
            self.running.pop(job.id, None)
        else:
            self.running[job.id] = job
            self._unpend(job.id)

    def forget(self, job_id: int) -> None:
        """A job that ended."""
        self._unpend(job_id)
        self.running.pop(job_id, None)

    def _unpend(self, job_id: int) -> None:
        job = self.pending.pop(job_id, None)
        if job is not None:
            left = self.pending_of.get(job.user, 1) - 1
            if left > 0:
                self.pending_of[job.user] = left
            else:
                self.pending_of.pop(job.user, None)

    def ended(self, job_id: int) -> dict[str, Any] | None:
        """A job reached a final state: drop it and all it carried; returns the handle of a
        confined kernel (to release), if it was one."""
        self.forget(job_id)
        self.pulling.discard(job_id)
        self.handles.pop(job_id, None)
        self.terminating.discard(job_id)
        self.warned.discard(job_id)
        self.cancel_requested.pop(job_id, None)
        self.unrecorded.pop(job_id, None)
        self.ending.pop(job_id, None)
        self.empty_since.pop(job_id, None)
        self.orphan_idle.pop(job_id, None)
        return self.adopted.pop(job_id, None)

    def active_job(self, job_id: int) -> Job | None:
        return self.pending.get(job_id) or self.running.get(job_id)

    def active_jobs(self) -> list[Job]:
        """Pending and running jobs as the engine knows them now."""
        return [*self.pending.values(), *self.running.values()]

    def get(self, job_id: int) -> Job:
        job = self.active_job(job_id) or self.store.get(job_id)
        if job is None:
            raise NotFound(f"no job {job_id}")
        return job

    def set_queue(self, plan: Plan, waiting: list[int]) -> None:
        """The queue as a plan (the cycle's, or the mirror's reading of Slurm) leaves it."""
        self.plan = plan
        self.waiting = waiting
        self.positions = None

    def limit_times(self, job: Job) -> tuple[float, float] | tuple[None, None]:
        """(when a started job reaches its time limit, when it is warned of it: at
        `time_limit_warning_s` before, or a fifth of a shorter limit); (None, None) for a job
        not started or without a limit."""
        if not job.started_at or not job.time_limit_s:
            return None, None
        end = job.started_at + job.time_limit_s
        return end, end - min(self.time_limit_warning_s, job.time_limit_s // 5)

    # ------------------------------------------------------------------ wake-ups

    def wake(self) -> None:
        """Run a scheduling cycle as soon as the loop may (something ended, changed, ...)."""
        if self.wake_event is not None:
            self.wake_event.set()

    # ------------------------------------------------------------------ a full or read-only store

    def note_store_trouble(self, err: StoreUnavailable) -> None:
        """Nothing can be written now: say so once a minute (not per request or poll)."""
        self.store_trouble = err
        now = time.monotonic()
        if now - self.trouble_logged_at >= 60:
            self.trouble_logged_at = now
            log.error("gpujobs: %s; new jobs are refused and %d ended job(s) wait to be recorded "
                      "(this is logged once a minute while it lasts)", err, len(self.unrecorded))

    def store_ok(self) -> None:
        if self.store_trouble is not None:
            log.warning("gpujobs: %s is writable again", self.store_trouble.where)
            self.store_trouble = None
            self.trouble_logged_at = -float("inf")
            self.wake()
