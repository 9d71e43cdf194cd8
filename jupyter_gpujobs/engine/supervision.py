"""The supervisor registry: the runs of the jobs the engine starts itself, from start to result.

Owns the life of a run: its crash-safe start (`launch`: the run is stored with the RUNNING
transition before its supervisor starts), the reattachment after a restart (`reconcile`),
the stop (`terminate`, `cancel`), the watch of supervisors for their results (`poll`, run
by `poll_loop` and at once on a supervisor's exit) and the recording of a result
(`finish`), kept until a full or read-only store is writable again. The supervisor handles
and what a running job carries live in `state.EngineState`.

It may call the runner, the store, `inventory.Inventory` (the device fence), `access.Access`
(whose job, where its paths start), `kernels.Kernels` (kernel jobs are ended, not stopped)
and `events.Events` (every state change but the start, and the start's publication).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ..checkpoint import checkpoint_dir
from ..model import (
    GPU,
    Job,
    JobState,
    format_duration,
    preempt_grace,
    requeue_reason,
    retry_reason,
    retry_wait_s,
)
from .access import Access
from .errors import PermissionDenied
from .events import Events
from .inventory import Inventory
from .kernels import Kernels
from .runners import NOT_STARTED_REASON, Exit, LaunchRequest
from .runners.users import NotAUnixUser, run_as
from .state import EXTERNAL_KINDS, EngineState
from .store import GPUAlreadyAllocated, StoreUnavailable, store_trouble

log = logging.getLogger("jupyter_gpujobs")

#: Runner outcome -> final job state.
_OUTCOME_STATE = {
    "completed": JobState.COMPLETED,
    "failed": JobState.FAILED,
    "oom": JobState.FAILED,
    "timeout": JobState.TIMEOUT,
    "cancelled": JobState.CANCELLED,
    "lost": JobState.LOST,
}


class Supervisors:
    def __init__(self, state: EngineState, inventory: Inventory, access: Access, kernels: Kernels,
                 events: Events):
        self.state = state
        self.inventory = inventory
        self.access = access
        self.kernels = kernels
        self.events = events

    # ------------------------------------------------------------------ after a restart

    def reconcile(self) -> None:
        """Load active jobs and find the run of every running one: reattach to its supervisor,
        record the result it left, or, for a run recorded but never started (the engine
        stopped in between), put the job back in the queue. A job is LOST only when its run
        started and its supervisor vanished without a result; nothing is double-allocated."""
        s = self.state
        pending, running = s.store.active_jobs()
        s.pending, s.running = {}, {}
        for job in pending + running:
            s.keep(job)
        s.handles = {}
        for job in running:
            events = s.store.events(job_id=job.id)
            if any(e["state"] == "WARNING" for e in events):
                s.warned.add(job.id)
            for e in events:  # a cancel asked before the restart still wins
                if e["state"] == "STOPPING" and (e.get("data") or {}).get("outcome") == "cancelled":
                    s.cancel_requested[job.id] = (e.get("data") or {}).get("reason") or e["reason"]
            if job.kind in EXTERNAL_KINDS:
                handle = s.store.runner_handle(job.id)
                if handle and handle.get("adopted"):
                    s.adopted[job.id] = handle  # a kernel the engine confines: watched again
                continue
            handle = s.store.runner_handle(job.id)
            if not handle:
                self.finish(job.id, Exit(job.id, "lost", None, None,
                                         "no supervisor was recorded for this job", s.clock()))
                continue
            if not handle.get("pid"):  # recorded, but its start was not confirmed
                found = s.runner.reattach(job.id, handle)
                if found is None:
                    self.events.set_state(job.id, JobState.PENDING, "engine", NOT_STARTED_REASON,
                                          expect=(JobState.RUNNING,), started_at=None, host=None,
                                          assigned_gpus=(), borrowed=False, runner_handle={})
                    continue
                if isinstance(found, Exit):
                    self.finish(job.id, found)
                    continue
                handle = found
                s.store.update_job(job.id, runner_handle=handle)
            s.handles[job.id] = handle
        # results written while the server was down, and supervisors that vanished
        for exit_ in s.runner.poll(dict(s.handles)):
            self.finish(exit_.job_id, exit_)
        if s.handles:
            log.info("gpujobs: reattached to %d running job(s): %s", len(s.handles),
                     ", ".join(str(i) for i in sorted(s.handles)))

    # ------------------------------------------------------------------ watching supervisors

    async def poll_loop(self) -> None:
        runner = self.state.runner
        runner.on_exit = self.poll_now  # a supervisor's exit is noticed at once
        try:
            while True:
                await asyncio.sleep(self.state.poll_interval)
                self.poll_now()
        finally:
            runner.on_exit = None

    def poll_now(self) -> None:
        try:
            self.poll()
        except StoreUnavailable as err:
            self.state.note_store_trouble(err)
        except Exception:
            log.exception("gpujobs: polling job supervisors failed")

    def poll(self) -> None:
        """Record jobs whose process ended. A result that cannot be stored now (full or
        read-only disk) is kept and recorded once the store is writable again."""
        s = self.state
        if s.unrecorded and time.monotonic() - s.unrecorded_tried_at >= 1.0:
            s.unrecorded_tried_at = time.monotonic()
            for job_id, exit_ in list(s.unrecorded.items()):
                self.finish(job_id, exit_)  # raises StoreUnavailable while it lasts
                s.unrecorded.pop(job_id, None)
            s.store_ok()
        if s.adopted:
            self.kernels.watch_adopted()
        if not s.handles:
            return
        for exit_ in s.runner.poll(dict(s.handles)):
            try:
                self.finish(exit_.job_id, exit_)
            except StoreUnavailable as err:
                s.unrecorded[exit_.job_id] = exit_
                s.handles.pop(exit_.job_id, None)  # ended: nothing more to watch
                s.note_store_trouble(err)

    def finish(self, job_id: int, exit_: Exit) -> None:
        """Record how a run ended: the job's final state, or back to the queue when it was
        preempted and may be requeued (or never started)."""
        s = self.state
        job = s.active_job(job_id) or s.store.get(job_id)
        if job is None or job.state.is_final:
            s.handles.pop(job_id, None)
            return
        ran = (exit_.ended_at - job.started_at) if job.started_at else 0.0
        fields = {"exit_code": exit_.exit_code, "signal": exit_.signal,
                  "run_seconds": job.run_seconds + max(0.0, ran)}
        data = {"outcome": exit_.outcome, "exit_code": exit_.exit_code, "signal": exit_.signal}
        cancelled = s.cancel_requested.get(job_id)
        if cancelled and exit_.outcome in ("preempted", "cancelled"):  # a cancel wins over a requeue
            self.events.set_state(job_id, JobState.CANCELLED, "runner", cancelled, data=data,
                                  ended_at=exit_.ended_at, **fields)
            return
        if exit_.outcome in ("timeout", "lost") and self._requeue(job, exit_, fields, data):
            return
        if exit_.outcome == "preempted":
            if job.requeue or not exit_.started:
                self.events.set_state(job_id, JobState.PENDING, "scheduler", exit_.reason, data=data,
                                      started_at=None, host=None, assigned_gpus=(), borrowed=False,
                                      runner_handle={}, restarts=job.restarts + (1 if exit_.started else 0),
                                      released_at=exit_.ended_at, **fields)
                s.handles.pop(job_id, None)
                s.terminating.discard(job_id)
                return
            state = JobState.CANCELLED
        else:
            state = _OUTCOME_STATE.get(exit_.outcome, JobState.FAILED)
            if state is JobState.FAILED and self._retry(job, exit_, fields, data):
                return
        s.freed.set()  # (before the end is published: see Events.set_state)
        self.events.set_state(job_id, state, "runner", exit_.reason, data=data, ended_at=exit_.ended_at, **fields)
        s.ended_since_cycle = True

    def _retry(self, job: Job, exit_: Exit, fields: dict[str, Any], data: dict[str, Any]) -> bool:
        """A failed run of a job with retries left (`retries`; out of memory only with
        `retry_oom`; never one it was asked to stop) goes back to the queue, to start again
        after its backoff (`model.retry_wait_s`); the event says which run failed and when the
        next one may start. False when it does not."""
        s = self.state
        if (job.retried >= job.retries or not exit_.started or job.id in s.cancel_requested
                or exit_.outcome not in ("failed", "oom") or (exit_.outcome == "oom" and not job.retry_oom)):
            return False
        wait = retry_wait_s(job)
        run, at = job.retried + 1, exit_.ended_at + wait
        reason = retry_reason(run, job.retries + 1, exit_.reason, format_duration(wait))
        self.events.set_state(job.id, JobState.PENDING, "engine", reason,
                              data={**data, "attempt": run, "retry": run, "retries": job.retries, "retry_at": at},
                              started_at=None, host=None, assigned_gpus=(), borrowed=False, runner_handle={},
                              retried=run, begin=at, released_at=exit_.ended_at, **fields)
        s.handles.pop(job.id, None)
        s.terminating.discard(job.id)
        s.freed.set()
        return True

    # ------------------------------------------------------------------ stopping

    async def cancel(self, job: Job, user: str, wait_s: float) -> Job:
        """Cancel a pending job now, or stop a running one (SIGTERM, grace, SIGKILL) and wait
        up to `wait_s` for it to end (a job of this engine's own runner)."""
        s = self.state
        reason = f"cancelled by {user}"
        if job.state is JobState.RUNNING and job.kind in EXTERNAL_KINDS:
            return self.kernels.end_external(job, JobState.CANCELLED, user, reason)
        if job.state is JobState.PENDING:
            return self.events.set_state(job.id, JobState.CANCELLED, user, reason,
                                         expect=(JobState.PENDING, JobState.RUNNING)) or s.get(job.id)
        if job.id in s.terminating:  # already stopping (preempted): it ends CANCELLED, not requeued
            s.store.add_event(job.id, "STOPPING", user, f"stopping: {reason} (already stopping)", s.clock(),
                              data={"outcome": "cancelled", "reason": reason})
            s.cancel_requested[job.id] = reason
        else:
            self.terminate(job, reason, "cancelled", s.kill_grace_s, actor=user)
        return await self.events.wait_ended(job.id, wait_s)

    async def cancel_many(self, user: str, ids: list[int] | None, of_user: str | None, array: int | None,
                          stop: Callable[[int, str, float], Awaitable[Job]], wait_s: float = 3.0) -> dict[str, Any]:
        """Cancel many jobs at once: these `ids`, or every active job (of `of_user`, of the
        array whose first task is `array`) that `user` may cancel. The pending ones end in one
        store transaction (`Events.set_states`); the running ones are told to stop (`stop`), and
        waited for up to `wait_s` together. Returns the ids cancelled and still stopping, and
        why others were not."""
        s = self.state
        errors: dict[str, str] = {}
        targets: list[Job] = []
        if ids is not None:
            owned, errors = self.access.changeable(ids, user)
            targets = [job for job in owned if not job.state.is_final]
        else:
            if of_user is not None and of_user != user and not self.access.is_admin(user):
                raise PermissionDenied(f"only {of_user} or an admin may cancel the jobs of {of_user}")
            mine = None if self.access.is_admin(user) else user
            targets = [j for j in [*s.pending.values(), *s.running.values()]
                       if (mine is None or j.user == mine) and (of_user is None or j.user == of_user)
                       and (array is None or j.id == array or j.array_job_id == array)]
        reason = f"cancelled by {user}"
        pending = {j.id: reason for j in targets if j.state is JobState.PENDING}
        cancelled = [j.id for j in self.events.set_states(pending, JobState.CANCELLED, user, expect=(JobState.PENDING,))]
        running = [j.id for j in targets if j.state is JobState.RUNNING]
        for job_id in running:
            await stop(job_id, user, 0.0)
        ended = await asyncio.gather(*(self.events.wait_ended(i, wait_s) for i in running))
        cancelled += [j.id for j in ended if j.state is JobState.CANCELLED]
        stopping = [j.id for j in ended if not j.state.is_final]
        return {"cancelled": cancelled, "stopping": stopping, "errors": errors}

    def _requeue(self, job: Job, exit_: Exit, fields: dict[str, Any], data: dict[str, Any]) -> bool:
        """A job submitted with `requeue: true` that reached its time limit, or whose run was
        lost (node, GPU or supervisor gone), goes back to the queue with its checkpoint folder,
        up to its `max_requeues`; the event says which requeue it is. False when it does not."""
        s = self.state
        if job.max_requeues is None or not exit_.started or job.id in s.cancel_requested:
            return False
        if job.requeues >= job.max_requeues:
            s.store.add_event(job.id, "WARNING", "engine", f"not requeued: it was requeued {job.requeues} time(s), "
                              f"its maximum (max_requeues)", s.clock())
            return False
        reason = requeue_reason(exit_.reason, job.requeues + 1, job.max_requeues)
        s.freed.set()
        self.events.set_state(job.id, JobState.PENDING, "engine", reason, data={**data, "requeue": job.requeues + 1},
                              started_at=None, host=None, assigned_gpus=(), borrowed=False, runner_handle={},
                              restarts=job.restarts + 1, requeues=job.requeues + 1,
                              released_at=exit_.ended_at, **fields)
        s.handles.pop(job.id, None)
        s.terminating.discard(job.id)
        s.warned.discard(job.id)  # its next run is warned before its limit again
        s.ended_since_cycle = True
        return True

    def withdraw(self, job: Job, reason: str) -> bool:
        """Take back the stop of a job preempted for a preemptor that is gone (cancelled, ...),
        in its grace: the runner does not kill it, and it runs on (`Runner.withdraw_stop`)."""
        s = self.state
        handle = s.handles.get(job.id)
        if job.id not in s.terminating or job.id in s.cancel_requested or handle is None:
            return False
        if not s.runner.withdraw_stop(job.id, handle):
            return False
        s.terminating.discard(job.id)
        now = s.clock()
        s.store.add_event(job.id, "RESUMED", "scheduler", reason, now)
        self.events.publish(job, {"job_id": job.id, "time": now, "state": "RESUMED", "actor": "scheduler",
                                  "reason": reason})
        return True

    def terminate(self, job: Job, reason: str, outcome: str, grace_s: int, actor: str = "engine") -> None:
        s = self.state
        if job.id in s.terminating:
            return
        handle = s.handles.get(job.id)
        if handle is None:
            return
        s.store.add_event(job.id, "STOPPING", actor, f"stopping: {reason}", s.clock(),
                          data={"outcome": outcome, "reason": reason})
        s.terminating.add(job.id)
        if outcome == "cancelled":
            s.cancel_requested[job.id] = reason
        s.runner.terminate(job.id, handle, reason, outcome, grace_s)

    # ------------------------------------------------------------------ starting

    def launch(self, job: Job, host: str, gpus: list[GPU], borrowed: bool, share: float | None = None) -> None:
        """Start a job, crash-safe: where its run will live is stored with its RUNNING
        transition, before its supervisor starts, so a restart at any point finds the run
        (see `reconcile`) rather than calling the job lost while it runs."""
        s = self.state
        now = s.clock()
        reason = "started on GPU " + ",".join(str(g.index) for g in gpus) if gpus else "started (no GPU)"
        if share is not None and gpus:
            reason = f"started on a {share:g} share of GPU {gpus[0].index}"
        if borrowed:
            reason += " (borrowed: may be reclaimed)"
        request: LaunchRequest | None = None
        handle: dict[str, Any] = {}
        log_path: str | None = None
        if job.kind not in EXTERNAL_KINDS:
            log_path = str(s.state_dir / "logs" / f"job-{job.id}.log")
            request = self.launch_request(job, gpus, log_path)
            try:
                handle = s.runner.prepare(request)
            except OSError as err:
                trouble = store_trouble(err, str(getattr(s.runner, "state_dir", s.state_dir)))
                if trouble is not None:
                    raise trouble from err
                log.exception("gpujobs: could not prepare the run of job %s", job.id)
                return
        try:
            started = s.store.start(job.id, host, [(g.index, g.uuid) for g in gpus], now,
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
        s.keep(started)
        if request is not None:
            try:
                handle = s.runner.start(request, handle)
            except Exception as err:
                log.exception("gpujobs: could not start job %s", job.id)
                self.events.set_state(job.id, JobState.FAILED, "runner", f"could not start: {err}",
                                      expect=(JobState.RUNNING,))
                return
            s.handles[job.id] = handle
            try:
                s.store.update_job(job.id, runner_handle=handle)
            except StoreUnavailable as err:  # the run directory is stored: a restart finds it by that
                s.note_store_trouble(err)
        self.events.publish(started, {"job_id": job.id, "time": now, "state": "RUNNING", "actor": "scheduler",
                                      "reason": reason})

    def launch_request(self, job: Job, gpus: list[GPU], log_path: str) -> LaunchRequest:
        s = self.state
        hints, facts = s.shares.environment(job, gpus)  # a share of a GPU: framework hints, MPS
        env = {**s.job_env, **hints, **job.env, **facts, "GPUJOBS_USER": job.user}
        env["GPUJOBS_CHECKPOINT_DIR"] = checkpoint_dir(str(self.access.root_for(job.user)), job.id)
        env["GPUJOBS_RESTARTS"] = str(job.restarts)
        if job.array_index is not None:
            env["GPUJOBS_ARRAY_INDEX"] = str(job.array_index)
            env["GPUJOBS_ARRAY_JOB_ID"] = str(job.array_job_id)
        try:
            owner = run_as(job.user, s.run_as_owner)
        except NotAUnixUser:
            owner = job.user  # the runner fails the job with the reason
        cwd = job.cwd or str(self.access.root_for(job.user))
        return LaunchRequest(
            job_id=job.id,
            command=list(job.command),
            cwd=cwd,
            env=env,
            gpu_indices=[g.index for g in gpus],
            gpu_uuids=[g.uuid for g in gpus],
            time_limit_s=job.time_limit_s,
            grace_s=s.kill_grace_s,
            preempt_grace_s=preempt_grace(job, s.policy)[0],
            log_path=log_path,
            fake=s.gpus.name == "fake",
            run_as=owner,
            mem_bytes=job.mem_bytes,
            cpus=job.cpus,
            deny_devices=self.inventory.deny_devices(gpus),
            warn_signal=job.warn_signal,
            container=s.containers.launch(job.id, job.image, cwd, self.inventory.job_devices(gpus), owner)
            if job.image else None,
        )

    def _discard(self, handle: dict[str, Any]) -> None:
        if handle:
            self.state.runner.discard(handle)
