"""Mirror mode: the engine under a runner that schedules itself (Slurm). The service asks its
runner (`schedules_itself`); when it does, this loop replaces the scheduling cycle and the
supervisor polling. Every `poll_interval` (and right after a burst of submissions) it

- hands each pending job that has no handle yet to the runner (the tasks of an array in one
  submission; dependencies named by the runner's ids; a dependency that can no longer be met
  cancels the job as the engine's own scheduler would);
- reads every handed-over job's state with one runner call and records what changed: the
  start (node, GPU indices), the end (exit code, why), and for pending jobs the runner's
  reason and expected start, which the API shows as the queue's reasons and estimates.

It never decides who runs where: that is the runner's (Slurm's). It may call the runner, the
store and the parts of the engine it is given (`state.EngineState`, `supervision.Supervisors`
for the launch request and the recording of a result, `events.Events`, the cycle's time-limit
watch); it does not import the service.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..model import GPU, Job, JobState, Plan, Reasons
from .runners import Exit, LaunchRequest
from .scheduler.deferral import as_clock, next_offpeak
from .store import accounting

if TYPE_CHECKING:
    from .cycle import Cycle
    from .events import Events
    from .runners.slurm import SlurmRunner, SlurmState
    from .state import EngineState
    from .supervision import Supervisors

log = logging.getLogger("jupyter_gpujobs")


class Mirror:
    def __init__(self, state: EngineState, supervisors: Supervisors, events: Events, cycle: Cycle,
                 runner: SlurmRunner):
        self.state = state
        self.supervisors = supervisors
        self.events = events
        self.cycle = cycle
        self.runner = runner
        events.release_external = self.release  # a kernel's end outside Slurm ends its Slurm job
        self.interval = float(getattr(runner, "poll_interval", 1.0))
        self._reasons: dict[int, str] = {}
        self._expected: dict[int, float | None] = {}
        self.synced_at = 0.0  # wall time of the last state read that was applied

    # ------------------------------------------------------------------ life cycle

    def reconcile(self) -> None:
        """After a restart: the handles of every active job (pending ones too: they may be in
        Slurm's queue already)."""
        s = self.state
        pending, running = s.store.active_jobs()
        s.pending, s.running, s.handles = {}, {}, {}
        for job in pending + running:
            s.keep(job)
            handle = s.store.runner_handle(job.id)
            if handle and handle.get("runner") == self.runner.name:
                s.handles[job.id] = handle
            elif job.state is JobState.RUNNING:  # started by another runner (c.GPUJobs.runner changed)
                self.supervisors.finish(job.id, Exit(job.id, "lost", None, None,
                                                     f"started by the {(handle or {}).get('runner') or 'local'} "
                                                     f"runner; this engine now hands jobs to {self.runner.name}",
                                                     s.clock()))

    async def loop(self) -> None:
        s = self.state
        assert s.wake_event is not None
        while True:
            try:
                await asyncio.wait_for(s.wake_event.wait(), self.interval)
            except asyncio.TimeoutError:
                pass
            s.wake_event.clear()
            try:
                await self.step()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("gpujobs: mirroring Slurm failed")

    async def step(self) -> None:
        """Submit what is new, then read and apply every job's state."""
        await self.submit_new()
        s = self.state
        if not s.handles:
            return
        # warnings before a time limit, and the safety net for a job that overstays it (Slurm
        # rounds limits up to minutes and checks them about every 30 s): as on a local engine
        self.cycle.enforce_limits(list(s.running.values()), s.clock())
        states = await asyncio.to_thread(self.runner.sync, dict(s.handles))
        for job_id, reason in self.apply(states):  # jobs Slurm would keep pending forever
            handle = s.handles.get(job_id)
            if handle is not None:
                await asyncio.to_thread(self.runner.terminate, job_id, handle, reason)

    # ------------------------------------------------------------------ submit

    async def submit_new(self) -> None:
        s = self.state
        new = sorted((j for j in s.pending.values() if j.id not in s.handles), key=lambda j: j.id)
        groups: dict[Any, list[Job]] = {}
        for job in new:
            groups.setdefault(("array", job.array_job_id) if job.array_job_id else job.id, []).append(job)
        for jobs in groups.values():
            jobs = [j for j in jobs if s.pending.get(j.id) is not None and j.id not in s.handles]
            if not jobs:
                continue
            found = self._dependency(jobs[0])
            if found is None:  # a dependency is not in Slurm yet: a later step
                continue
            dependency, cancel = found
            if cancel:
                for job in jobs:
                    self.events.set_state(job.id, JobState.CANCELLED, "scheduler", cancel, expect=(JobState.PENDING,))
                continue
            requests = [self._request(job) for job in jobs]
            try:
                handles = await asyncio.to_thread(self.runner.submit, jobs, requests, dependency,
                                                  self._begin(jobs[0]))
            except Exception as err:
                for job in jobs:
                    self.events.set_state(job.id, JobState.FAILED, "runner", f"Slurm refused the job: {err}",
                                          expect=(JobState.PENDING,))
                continue
            for job, handle in zip(jobs, handles):
                if s.pending.get(job.id) is None:  # cancelled while sbatch ran
                    await asyncio.to_thread(self.runner.terminate, job.id, handle, "cancelled")
                    continue
                s.store.update_job(job.id, runner_handle=handle, log_path=handle["log_path"])
                s.handles[job.id] = handle
                s.store.add_event(job.id, "SUBMITTED", "runner", f"submitted to Slurm as job {handle['slurm_id']}",
                                  s.clock(), data={"slurm_id": handle["slurm_id"]})
                self._reasons[job.id] = f"submitted to Slurm as job {handle['slurm_id']}"

    def _request(self, job: Job) -> LaunchRequest:
        """What to run, as the engine would start it here (Slurm picks the GPUs)."""
        s = self.state
        return self.supervisors.launch_request(job, [], str(s.state_dir / "logs" / f"job-{job.id}.log"))

    def _dependency(self, job: Job) -> tuple[str, str] | None:
        """(sbatch --dependency value, reason to cancel the job instead or ''); None while a
        dependency is active but not handed to Slurm yet."""
        s = self.state
        parts: list[str] = []
        ended = [d.job_id for d in job.depends if d.job_id not in s.handles]
        finished = s.store.final_states(ended) if ended else {}
        for dep in job.depends:
            handle = s.handles.get(dep.job_id)
            if handle is not None:
                parts.append(f"{'afterok' if dep.kind == 'afterok' else 'afterany'}:{handle['slurm_id']}")
                continue
            state = finished.get(dep.job_id)
            if state is None:
                if s.active_job(dep.job_id) is not None:
                    return None
                return "", f"dependency job {dep.job_id} is unknown"
            if dep.kind == "afterok" and JobState(state) is not JobState.COMPLETED:
                return "", f"dependency job {dep.job_id} ended {JobState(state).value}"
        return ",".join(parts), ""

    def _begin(self, job: Job) -> float | None:
        begin = job.begin
        if job.offpeak:
            policy = self.state.policy
            now = self.state.clock()
            window = next_offpeak(now, policy.offpeak_windows, as_clock(policy))
            if window is not None:
                begin = max(begin or 0.0, window)
        return begin

    # ------------------------------------------------------------------ apply

    def apply(self, states: Sequence[SlurmState]) -> list[tuple[int, str]]:
        """Record what Slurm says; returns the jobs to cancel (job id, reason): those whose
        dependency can never be met, which Slurm would keep pending forever."""
        s = self.state
        cancel: list[tuple[int, str]] = []
        # ends first: a GPU that one job gave back may already be another's in the same reading
        for st in sorted(states, key=lambda st: st.state != "ENDED"):
            job = s.active_job(st.job_id)
            if job is None:
                s.handles.pop(st.job_id, None)
                continue
            if st.state == "PENDING":
                self._reasons[job.id] = st.reason
                self._expected[job.id] = st.expected_start
                if st.code == "DependencyNeverSatisfied" and job.id not in s.terminating:
                    s.terminating.add(job.id)
                    deps = ", ".join(f"{d.kind}:{d.job_id}" for d in job.depends)
                    cancel.append((job.id, f"cancelled: its dependency ({deps}) can never be satisfied"))
                if job.state is JobState.RUNNING:  # requeued by Slurm (preempted, node failure)
                    self.events.set_state(job.id, JobState.PENDING, "runner", f"requeued by Slurm: {st.reason}",
                                          started_at=None, host=None, assigned_gpus=(), restarts=job.restarts + 1)
                continue
            if job.state is JobState.PENDING and (st.state == "RUNNING" or st.started_at):
                self._started(job, st)
            if st.state == "ENDED" and st.exit is not None:
                self._reasons.pop(job.id, None)
                self._expected.pop(job.id, None)
                self.supervisors.finish(job.id, st.exit)
        self.synced_at = time.time()
        self._publish_queue()
        return cancel

    def _started(self, job: Job, st: SlurmState) -> None:
        s = self.state
        node = st.node or "?"
        where = f"{node}, GPU {','.join(map(str, st.gpus))}" if st.gpus else node
        if st.per_node:  # a multi-node job: its GPUs per node
            where = "; ".join(f"{n}, GPU {','.join(map(str, g))}" if g else n for n, g in st.per_node)
        reason = f"started by Slurm on {where} (Slurm job {st.slurm_id})"
        at = float(st.started_at or s.clock())
        gpus = [] if st.per_node else [(i, f"slurm:{node}:{i}") for i in st.gpus]
        try:
            started = s.store.start(job.id, node, gpus, at, actor="runner", reason=reason)
        except Exception as err:  # a stale allocation in the store: record the start without GPUs
            log.warning("gpujobs: job %s: %s", job.id, err)
            started = s.store.start(job.id, node, [], at, actor="runner", reason=reason)
        if started is None:
            return
        if st.per_node:  # a multi-node job's GPUs on each node, for accounting and budgets
            try:
                accounting.add_allocations(s.store, job.id, [(n, i, f"slurm:{n}:{i}") for n, g in st.per_node
                                                             for i in g], at)
            except Exception as err:  # a stale allocation in the store: the job runs on, uncounted
                log.warning("gpujobs: job %s: %s", job.id, err)
        s.keep(started)
        self._reasons.pop(job.id, None)
        self._expected.pop(job.id, None)
        self.events.publish(started, {"job_id": job.id, "time": at, "state": "RUNNING", "actor": "runner",
                                      "reason": reason})

    def _publish_queue(self) -> None:
        """The pending jobs' reasons and expected starts as the view and queue read them."""
        s = self.state
        pending = s.pending
        order = sorted(pending, key=lambda i: (self._expected.get(i) or float("inf"), i))
        s.set_queue(Plan(order=order, reasons=Reasons({i: r for i, r in self._reasons.items() if i in pending}),
                         expected_start={i: self._expected.get(i) for i in pending}), order)

    # ------------------------------------------------------------------ commands

    async def cancel(self, job: Job, user: str, wait_s: float) -> Job:
        s = self.state
        reason = f"cancelled by {user}"
        handle = s.handles.get(job.id)
        if handle is not None:
            await asyncio.to_thread(self.runner.terminate, job.id, handle, reason)
        if job.state is JobState.PENDING:
            # Slurm drops a pending job at once; the engine records it now
            return self.events.set_state(job.id, JobState.CANCELLED, user, reason,
                                         expect=(JobState.PENDING,)) or s.get(job.id)
        s.store.add_event(job.id, "STOPPING", "engine", f"stopping: {reason}", s.clock())
        s.wake()
        return await self.events.wait_ended(job.id, wait_s)

    def release(self, job: Job, handle: dict[str, Any] | None, state: JobState, reason: str) -> None:
        """A GPU kernel's job ended outside Slurm (shut down, idle, time limit, server gone):
        scancel its Slurm job, off the event loop, so its GPUs go back to Slurm."""
        if handle is None or self.runner.stopping(handle):
            return  # not in Slurm yet, or already scancelled (a cancel)
        outcome = "timeout" if state is JobState.TIMEOUT else "cancelled"
        args = (job.id, handle, reason, outcome)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.runner.terminate(*args)
            return
        loop.run_in_executor(None, self.runner.terminate, *args)

    # ------------------------------------------------------------------ GPUs

    def gpu_views(self, inventory: list[GPU]) -> list[dict[str, Any]]:
        """Every node's GPUs with who holds each: a job of this engine, or another Slurm job."""
        s = self.state
        ours: dict[str, Job] = {}
        for job_id, handle in s.handles.items():
            job = s.running.get(job_id)
            if job is not None:
                ours[str(handle.get("slurm_id"))] = job
        holders = self.runner.gpu_holders()
        out = []
        for g in sorted(inventory, key=lambda g: (g.host, g.index)):
            held = holders.get((g.host, g.index))
            job = ours.get(held["slurm_id"]) if held else None
            out.append({
                "index": g.index, "uuid": g.uuid, "name": g.name, "host": g.host,
                "memory_total_mb": g.memory_total_mb, "memory_used_mb": g.memory_used_mb,
                "memory_reserved_mb": g.memory_reserved_mb,
                "utilization": g.utilization, "healthy": g.healthy, "draining": g.draining,
                "job_id": job.id if job else None,
                "user": job.user if job else (held or {}).get("user"),
                "slurm_job_id": held["slurm_id"] if held else None,
            })
        return out
