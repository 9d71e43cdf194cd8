"""The engine: a facade over the parts that carry a job through its life.

A job flows one way through them: request -> store -> plan -> runner -> events -> store -> views.

- `admission.Admission`: a submission checked, committed with the others of its event-loop
  turn (group commit), and made an active job;
- `cycle.Cycle`: the scheduling cycle (snapshot -> the pure `schedule()` -> the plan carried
  out), preemption bookkeeping, time limits, GPU shares overrun, fair-share usage;
- `supervision.Supervisors`: the runs the engine starts (crash-safe start, reattachment after
  a restart, stop, results); `kernels.Kernels`: GPU kernels, which the engine does not start
  but may confine; `mirror.Mirror` replaces the cycle and the supervisors under a runner that
  schedules itself (Slurm);
- `events.Events`: every state change of a job (`set_state`) and its publication to the
  listeners (the websocket, the monitor, the notifier);
- `access.Access`: who may do and see what, and the views of jobs and of the queue;
- `inventory.Inventory`: the GPUs, their use outside the queue, the device fence;
- `rules.Rules`: quotas set at run time and advance reservations; `files.JobFiles`: logs and
  the retention of ended jobs' files; `whatif.WhatIf`: when a request would start, nearby
  choices, right-sizing advice (nothing stored).

Their shared state (settings, active jobs, the queue as the last plan left it) lives in one
`state.EngineState`. This module builds the parts, runs their loops (`start`, `stop`) and keeps
the methods and attributes the server's handlers, the monitor, the notifier and the CLI call:
each delegates to the part that owns it. It never speaks HTTP: the handlers turn
`InvalidInput` / `PermissionDenied` / `NotFound` / `Conflict` (errors.py) into 4xx answers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ..model import GPU, Job, Plan, Policy, Reservation
from .access import Access
from .admission import Admission
from .changes import Changes
from .claim import GPUClaim
from .cycle import Cycle
from .errors import Conflict, LogRemoved, NotFound, PermissionDenied, StoreUnavailable
from .events import Events, Listener
from .files import JobFiles
from .gpus import GPUBackend
from .inventory import Inventory
from .kernels import Kernels
from .rules import Rules
from .runners import Runner
from .shares import Shares
from .state import EXTERNAL_KINDS, EngineState
from .store import Store
from .supervision import Supervisors
from .whatif import Shape, WhatIf

if TYPE_CHECKING:
    from .notify import Notifier

T = TypeVar("T")


class _Of(Generic[T]):
    """An attribute of the service that is a part's: read from it, written to it (so that a
    caller that changes a setting, as the monitor does with `gpus`, changes it for every part)."""

    def __init__(self, part: str, name: str | None = None):
        self.part = part
        self.name = name or ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = self.name or name

    def __get__(self, obj: Any, objtype: type | None = None) -> T:
        if obj is None:
            return self  # type: ignore[return-value]
        return getattr(getattr(obj, self.part), self.name)  # type: ignore[no-any-return]

    def __set__(self, obj: Any, value: T) -> None:
        setattr(getattr(obj, self.part), self.name, value)


class JobService:
    # ---- settings and state, kept by the parts (see their modules)
    store: _Of[Store] = _Of("state")
    gpus: _Of[GPUBackend] = _Of("state")
    runner: _Of[Runner] = _Of("state")
    policy: _Of[Policy] = _Of("state")
    state_dir: _Of[Path] = _Of("state")
    root_dir: _Of[Path] = _Of("state")
    job_env: _Of[dict[str, str]] = _Of("state")
    admin_users: _Of[set[str]] = _Of("state")
    admin_group: _Of[str | None] = _Of("state")
    group_members: _Of[dict[str, list[str]]] = _Of("state")
    private_data: _Of[bool] = _Of("state")
    run_as_owner: _Of[str] = _Of("state")
    job_python: _Of[str] = _Of("state")
    kill_grace_s: _Of[int] = _Of("state")
    time_limit_warning_s: _Of[int] = _Of("state")
    poll_interval: _Of[float] = _Of("state")
    tick_interval: _Of[float] = _Of("state")
    estimate_interval: _Of[float] = _Of("state")
    job_retention_s: _Of[int] = _Of("state")
    cleanup_interval: _Of[float] = _Of("state")
    foreign_memory_threshold_mb: _Of[int | None] = _Of("state")
    clock: _Of[Callable[[], float]] = _Of("state")
    gpu_claim: _Of[GPUClaim | None] = _Of("state")
    shares: _Of[Shares] = _Of("state")
    store_trouble: _Of[StoreUnavailable | None] = _Of("state")
    foreign_ignored: _Of[dict[tuple[str, int], str]] = _Of("gpu_inventory")
    quotas_set: _Of[dict[tuple[str, str], dict[str, Any]]] = _Of("rules")
    reservations: _Of[list[Reservation]] = _Of("rules")
    reservation_source: _Of[dict[int, str]] = _Of("rules")
    set_aside: _Of[dict[int, tuple[str, str]]] = _Of("scheduling")
    cycle_seconds: _Of[list[float]] = _Of("scheduling")
    schedule_seconds: _Of[float] = _Of("scheduling")

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
        self.state = state = EngineState(
            store, gpus, runner, policy, state_dir=state_dir, root_dir=root_dir, job_env=job_env,
            admin_users=admin_users, group_members=group_members, kill_grace_s=kill_grace_s,
            time_limit_warning_s=time_limit_warning_s, poll_interval=poll_interval,
            tick_interval=tick_interval, estimate_interval=estimate_interval, job_retention_s=job_retention_s,
            cleanup_interval=cleanup_interval, run_as_owner=run_as_owner, job_python=job_python,
            foreign_memory_threshold_mb=foreign_memory_threshold_mb, clock=clock, admin_group=admin_group,
            private_data=private_data, gpu_claim=gpu_claim,
            shares=shares or Shares(backend=gpus.name, runner_schedules_itself=runner.schedules_itself),
        )
        # the parts, each given only the parts it may call (their modules say which)
        self.access = Access(state)
        self.job_events = Events(state, self.access)
        self.gpu_inventory = Inventory(state)
        self.rules = Rules(state, self.access, self.gpu_inventory, self.job_events)
        self.admission = Admission(state, self.access, self.gpu_inventory, self.rules, self.job_events)
        self.kernels = Kernels(state, self.gpu_inventory, self.access, self.job_events)
        self.supervisors = Supervisors(state, self.gpu_inventory, self.access, self.kernels, self.job_events)
        self.scheduling = Cycle(state, self.gpu_inventory, self.rules, self.admission, self.supervisors,
                                self.kernels, self.job_events)
        self.files = JobFiles(state, self.access)
        self.changes = Changes(state, self.access, self.job_events, self.rules, self.scheduling)
        self.what_ifs = WhatIf(state, self.admission, self.gpu_inventory, self.rules)
        self._tasks: list[asyncio.Task[Any]] = []
        (state.state_dir / "logs").mkdir(parents=True, exist_ok=True)
        # jobs' logs are private, and no job may plant a file (a link) where the next log goes
        state.state_dir.joinpath("logs").chmod(0o700)
        # a runner that schedules itself (Slurm): the engine mirrors it instead of scheduling
        self.mirror: Any = None
        # e-mail and webhook notifications of job events (notify.py; set by app.build_engine)
        self.notifier: Notifier | None = None
        if runner.schedules_itself:
            from .mirror import Mirror

            self.mirror = Mirror(state, self.supervisors, self.job_events, self.scheduling, runner)  # type: ignore[arg-type]

    # ================================================================= life cycle

    async def start(self) -> None:
        """Reattach to what survived a restart, then run the engine loops (once)."""
        if self._tasks:
            return
        state = self.state
        self.refresh_inventory(force=True)
        if self.mirror is not None:
            self.mirror.reconcile()
            state.wake_event = asyncio.Event()
            self._tasks = [asyncio.ensure_future(self.mirror.loop())]
            if state.job_retention_s > 0:
                self._tasks.append(asyncio.ensure_future(self.files.retention_loop()))
            self.wake()
            return
        self.scheduling.load_usage()
        self.rules.load_quotas()
        self.rules.load_reservations()
        self.rules.load_budgets()
        self.reconcile()
        self.admission.pulls.resume()  # (a pull under way when the engine stopped runs again)
        state.wake_event = asyncio.Event()
        state.freed = asyncio.Event()
        self._tasks = [
            asyncio.ensure_future(self.scheduling.loop()),
            asyncio.ensure_future(self.supervisors.poll_loop()),
        ]
        if state.job_retention_s > 0:
            self._tasks.append(asyncio.ensure_future(self.files.retention_loop()))
        self.wake()

    async def stop(self) -> None:
        self.admission.store_submissions()  # what was accepted is committed before the engine stops
        self.admission.seen_by_cycle()  # (no cycle after the last burst)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        self._tasks = []
        await self.admission.pulls.stop()
        self.scheduling.save_usage(self.clock())
        self.runner.close()

    def wake(self) -> None:
        """Run a scheduling cycle as soon as the loop may (something ended, changed, ...)."""
        self.state.wake()

    def reconcile(self) -> None:
        """Find the run of every active job after a restart (`Supervisors.reconcile`)."""
        self.supervisors.reconcile()

    def poll(self) -> None:
        """Record jobs whose process ended (`Supervisors.poll`)."""
        self.supervisors.poll()

    def cycle(self) -> Plan:
        """One scheduling cycle (`Cycle.cycle`)."""
        return self.scheduling.cycle()

    # ================================================================= commands

    async def submit(self, user: str, body: dict[str, Any]) -> list[Job]:
        """Validate and store a submission; the new job(s) once committed (`Admission.submit`)."""
        return await self.admission.submit(user, body)

    async def what_if(self, user: str, body: dict[str, Any]) -> dict[str, Any]:
        """When a submission would start, the nearby choices and the advice; stores nothing
        (`WhatIf.answer`; the same InvalidInput as `submit`)."""
        return await self.what_ifs.answer(user, body)

    def advice(self, job: Job) -> dict[str, Any] | None:
        """Right-sizing advice for a job from its owner's other finished jobs of its name
        (`WhatIf.advice`); the caller shows it to the owner only."""
        shape = Shape(job.gpus, job.gpu_type, job.time_limit_s or self.policy.default_time_limit_s, job.share,
                      job.gpu_memory)
        floor = max(self.clock(), job.begin or 0.0) if job.state.value == "PENDING" and not job.held else None
        return self.what_ifs.advice(job.user, job.name, shape, exclude=job.id, floor=floor)

    async def cancel(self, job_id: int, user: str, wait_s: float = 3.0) -> Job:
        """Cancel a pending job now, or stop a running one (SIGTERM, grace, SIGKILL) and wait
        up to `wait_s` for it to end. Returns the job as it then is. An admin's cancel of
        another's job is audited."""
        job = self.get(job_id)
        self.check_owner(job, user)
        if job.state.is_final:
            return job
        if self.mirror is not None:
            out = await self.mirror.cancel(job, user, wait_s)
        else:
            out = await self.supervisors.cancel(job, user, wait_s)
        if job.user != user:
            self.rules.audit(user, "cancel", f"job:{job.id}", {"user": job.user, "state": job.state.value},
                             {"state": out.state.value})
        return out

    async def cancel_many(self, user: str, ids: list[int] | None = None, of_user: str | None = None,
                          array: int | None = None) -> dict[str, Any]:
        """Cancel these jobs, or all active ones `user` may cancel (of `of_user`, of an
        array): the pending ones in one store transaction (`Supervisors.cancel_many`)."""
        others = {j.id: j.user for j in self.state.pending.values() if j.user != user}
        out = await self.supervisors.cancel_many(user, ids, of_user, array, self.cancel)
        for job_id in out["cancelled"]:  # (the running ones are audited by `cancel`)
            if job_id in others:
                self.rules.audit(user, "cancel", f"job:{job_id}", {"user": others[job_id], "state": "PENDING"},
                                 {"state": "CANCELLED"})
        return out

    def hold(self, job_id: int, user: str) -> Job:
        """Keep a pending job from starting until released (`Changes.hold`)."""
        self._changeable()
        return self.changes.hold(job_id, user)

    def release(self, job_id: int, user: str) -> Job:
        """Let a held job be scheduled again (`Changes.release`)."""
        self._changeable()
        return self.changes.release(job_id, user)

    def update(self, job_id: int, user: str, body: Any) -> Job:
        """Change a job's time limit, priority, name or begin (`Changes.update`)."""
        self._changeable()
        return self.changes.update(job_id, user, body)

    def _changeable(self) -> None:
        if self.mirror is not None:
            raise Conflict(None, f"jobs under the {self.runner.name} runner are scheduled by it; hold, release "
                                 "and update them there")

    async def wait_ended(self, job_id: int, timeout: float) -> Job:
        return await self.job_events.wait_ended(job_id, timeout)

    def finish_external(self, job_id: int, user: str, state: Any = "COMPLETED", reason: Any = None) -> Job:
        """The end of a job the engine did not launch (`Kernels.finish_external`)."""
        return self.kernels.finish_external(job_id, user, state, reason)

    def adopt(self, job_id: int, user: str, pid: Any, launcher: int) -> dict[str, Any]:
        """Confine a running GPU kernel's processes (`Kernels.adopt`)."""
        return self.kernels.adopt(job_id, user, pid, launcher)

    def over_share(self, job_id: int, reason: str, stop: bool) -> None:
        """A running job uses more GPU memory than its share (`Cycle.over_share`)."""
        self.scheduling.over_share(job_id, reason, stop)

    def ignore_foreign(self, host: str, index: int, ignore: bool, actor: str, reason: str = "") -> None:
        """An admin overrides a GPU's use outside the queue (`Inventory.ignore_foreign`)."""
        self.gpu_inventory.ignore_foreign(host, index, ignore, actor, reason)

    def set_quota(self, actor: str, scope: Any, name: Any, quota: Any) -> None:
        """An admin sets or clears a user's or group's quota (`Rules.set_quota`)."""
        self.rules.set_quota(actor, scope, name, quota)

    def create_reservation(self, actor: str, body: Any, source: str = "") -> dict[str, Any]:
        return self.rules.create_reservation(actor, body, source)

    def accept_reservation_proposal(self, actor: str, finding_id: Any) -> dict[str, Any]:
        return self.rules.accept_reservation_proposal(actor, finding_id)

    def delete_reservation(self, actor: str, reservation_id: Any) -> int:
        return self.rules.delete_reservation(actor, reservation_id)

    async def remove_expired_files(self) -> Any:
        """One removal pass of the retention (`JobFiles.remove_expired_files`)."""
        return await self.files.remove_expired_files()

    # ================================================================= queries

    def get(self, job_id: int) -> Job:
        return self.state.get(job_id)

    def active_job(self, job_id: int) -> Job | None:
        return self.state.active_job(job_id)

    def active_jobs(self) -> list[Job]:
        """Pending and running jobs as the engine knows them now."""
        return self.state.active_jobs()

    def running(self) -> list[Job]:
        return list(self.state.running.values())

    def runner_handles(self) -> dict[int, dict[str, Any]]:
        """Running jobs' supervisor handles (job id -> handle)."""
        return dict(self.state.handles)

    def view(self, job: Job, viewer: str | None = None) -> dict[str, Any]:
        return self.access.view(job, viewer)

    def may_see(self, job: Job | dict[str, Any], viewer: str | None) -> bool:
        return self.access.may_see(job, viewer)

    def get_private(self, job_id: int, viewer: str | None) -> Job:
        return self.access.get_private(job_id, viewer)

    def events(self, job_id: int, viewer: str | None = None) -> list[dict[str, Any]]:
        """A job's events, oldest first, to a `viewer` who may see them."""
        return self.access.events(job_id, viewer)

    def read_log(self, job_id: int, offset: int = 0, max_bytes: int = 256 * 1024,
                 viewer: str | None = None) -> tuple[str, int, bool]:
        return self.files.read_log(job_id, offset, max_bytes, viewer)

    def check_owner(self, job: Job, user: str) -> None:
        self.access.check_owner(job, user)

    def is_admin(self, user: str) -> bool:
        return self.access.is_admin(user)

    def root_for(self, user: str) -> Path:
        return self.access.root_for(user)

    def queue(self) -> list[Job]:
        return self.access.queue()

    def queue_state(self) -> tuple[Any, ...]:
        return self.access.queue_state()

    def queue_page(self, offset: int, limit: int, user: str | None = None) -> tuple[list[Job], int]:
        return self.access.queue_page(offset, limit, user)

    def current_policy(self) -> Policy:
        return self.rules.current_policy()

    def list_reservations(self) -> list[dict[str, Any]]:
        return self.rules.list_reservations()

    def reservation_view(self, r: Reservation) -> dict[str, Any]:
        return self.rules.reservation_view(r)

    # ================================================================= GPUs

    def refresh_inventory(self, force: bool = False) -> list[GPU]:
        return self.gpu_inventory.refresh(force)

    @property
    def inventory(self) -> list[GPU]:
        return self.gpu_inventory.inventory

    @property
    def isolation(self) -> str:
        return self.gpu_inventory.isolation

    def limits_enforceable(self) -> tuple[bool, bool]:
        return self.gpu_inventory.limits_enforceable()

    def gpu_views(self) -> list[dict[str, Any]]:
        if self.mirror is not None:
            return self.mirror.gpu_views(self.inventory)
        return self.gpu_inventory.gpu_views()

    # ================================================================= listeners

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        return self.job_events.subscribe(listener)

    def broadcast(self, message: dict[str, Any]) -> None:
        self.job_events.broadcast(message)

    def job_message_for(self, message: dict[str, Any], viewer: str | None) -> dict[str, Any]:
        return self.job_events.job_message_for(message, viewer)


__all__ = ["Conflict", "JobService", "LogRemoved", "NotFound", "PermissionDenied", "StoreUnavailable", "EXTERNAL_KINDS"]
