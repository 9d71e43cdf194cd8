"""The scheduling cycle: snapshot -> the pure `schedule()` -> the plan carried out (plan -> runner).

Owns
- the loop that runs a cycle when woken (a job's exit, a tick, a burst of submissions once
  it pauses) and rests after it in proportion to its cost (`loop`);
- one cycle (`cycle`): the GPU claim of this machine, the snapshot, when to recalculate the
  priorities and estimates, the plan's cancels, preemptions and starts;
- the bookkeeping of preemptions (`claims`: the GPUs being freed for a preemptor), the
  pending jobs the scheduler could not handle (`set_aside`), time limits (warnings, the
  safety net) and GPU shares overrun (`over_share`, from the monitor);
- fair-share usage (decayed GPU-seconds, loaded at start and saved once a minute).

It may call the pure scheduler, the store (dependencies' final states, usage, events),
`inventory.Inventory`, `rules.Rules` (the policy in force, reservations),
`admission.Admission` (a cycle sees every stored submission), `supervision.Supervisors`
(start, stop), `kernels.Kernels` (end a kernel job) and `events.Events`. It writes the queue
the views read into `state.EngineState` (`set_queue`).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable
from typing import Any

from ..model import GPU, Claim, Job, JobState, Plan, Reasons, format_duration, preempt_grace
from .admission import Admission
from .events import Events
from .inventory import Inventory
from .kernels import Kernels
from .rules import Rules
from .scheduler import schedule
from .scheduler.estimates import moved_notes, overdue_jobs
from .scheduler.fairshare import Usage, decay_and_add
from .scheduler.shares import gpu_bytes
from .state import EXTERNAL_KINDS, EngineState
from .store import StoreUnavailable
from .supervision import Supervisors

log = logging.getLogger("jupyter_gpujobs")


class Cycle:
    #: A claim whose victims outlive their grace by this much (a process that does not die) is
    #: dropped: its preemptor is then scheduled as any job, and may preempt others.
    CLAIM_OVERDUE_S = 60.0

    def __init__(self, state: EngineState, inventory: Inventory, rules: Rules, admission: Admission,
                 supervisors: Supervisors, kernels: Kernels, events: Events):
        self.state = state
        self.inventory = inventory
        self.rules = rules
        self.admission = admission
        self.supervisors = supervisors
        self.kernels = kernels
        self.events = events
        # when the last estimating cycle ran, and the newest pending job id then (the cycles in
        # between keep its priority order and decide only)
        self.estimated_at = -float("inf")
        self.estimated_newest = 0
        self.estimate_deferred = False  # an estimate due was put off for a start
        # preemptor -> (its victims, when their grace ends, seen by a cycle with none running):
        # the scheduler keeps the GPUs being freed for it (`model.Claim`)
        self.claims: dict[int, tuple[set[int], float, bool]] = {}
        # pending jobs the scheduler could not handle: id -> (what was wrong, the error). They
        # wait with that reason, outside the cycle, until an admin cancels them (or a restart)
        self.set_aside: dict[int, tuple[str, str]] = {}
        self.refusing = False  # another engine owns the GPUs (said once in the log)
        self.usage = Usage()
        self.usage_at = 0.0
        self.usage_saved_at = 0.0
        self.cycle_seconds: list[float] = []  # recent cycle times, for metrics
        self.schedule_seconds = 0.0  # time of the last schedule() call alone

    # ------------------------------------------------------------------ the loop

    async def loop(self) -> None:
        s = self.state
        assert s.wake_event is not None
        wake = s.wake_event
        loop = asyncio.get_running_loop()
        while True:
            # (a tick timer rather than wait_for(): before Python 3.12 wait_for() can swallow
            # the cancel of stop() when the event is set at the same moment)
            tick = loop.call_later(s.tick_interval, s.wake)
            try:
                await wake.wait()
            finally:
                tick.cancel()
            wake.clear()
            try:
                self.cycle()
            except StoreUnavailable as err:
                s.note_store_trouble(err)
            except Exception:
                log.exception("gpujobs: scheduling cycle failed")
            # Under load cycles over a long queue would run back to back and starve the
            # handlers: rest three times as long as the scheduling itself took.
            # (Only the decision counts: starting processes is not what grows with the queue.)
            # A GPU that frees meanwhile ends the rest: there are only as many of those as
            # GPUs, and a freed GPU should not idle for the requests of polling clients.
            rest = loop.call_later(max(0.005, 3 * self.schedule_seconds), s.freed.set)
            try:
                await s.freed.wait()
            finally:
                rest.cancel()
            s.freed.clear()

    # ------------------------------------------------------------------ one cycle

    def cycle(self) -> Plan:
        """One scheduling cycle: snapshot -> schedule() -> carry out the plan."""
        s = self.state
        t0 = time.perf_counter()
        self.admission.seen_by_cycle()
        now = s.clock()
        if s.gpu_claim is not None and not s.gpu_claim.acquire():
            return self._refuse_all(now)
        if self.refusing:
            log.warning("gpujobs: the other engine is gone; this engine now owns the GPUs")
            self.refusing = False
        gpus = [g for g in self.inventory.inventory]
        pending = s.pending  # handed to schedule() as it is: it neither keeps nor changes it
        if self.set_aside:
            for job_id in [i for i in self.set_aside if i not in pending]:
                del self.set_aside[job_id]
            pending = {i: j for i, j in pending.items() if i not in self.set_aside}
        if s.pulling:  # jobs waiting for their image (containers/pull.py) are not eligible: held, as
            # a user's hold (their dependents wait for them); the view shows the pull as their reason
            pending = {**pending, **{i: pending[i].replace(held=True) for i in s.pulling if i in pending}}
        running = list(s.running.values())
        self.enforce_limits(running, now)
        self._account_usage(running, now)
        dep_ids = {d.job_id for j in pending.values() for d in j.depends}
        finished = s.store.final_states(i for i in dep_ids if s.active_job(i) is None)
        # Every cycle decides. Every estimate_interval (and within a second of new jobs that
        # have none) a cycle also recalculates the priorities and estimates every job's start:
        # on a deep queue that is most of a cycle's cost, and seconds of lag are harmless.
        newest = max(pending, default=0)
        since = now - self.estimated_at
        estimate = since >= s.estimate_interval or (newest > self.estimated_newest and since >= 1.0)
        if estimate and s.ended_since_cycle and not self.estimate_deferred and self.estimated_at > -float("inf"):
            # a job just ended: its GPUs go to the next jobs now, the estimate comes a cycle
            # later (once: with jobs ending all the time it would never come)
            estimate = False
            self.estimate_deferred = True
            s.wake()
        elif estimate:
            self.estimate_deferred = False
        s.ended_since_cycle = False
        order = None if estimate else s.plan.queue_order
        claims, orphans = self._current_claims(now)
        t_plan = time.perf_counter()
        gc.disable()  # a cycle makes only acyclic garbage; a collection now would scan the heap
        try:
            plan = self._schedule(now, pending, running, gpus, finished, estimate, order, claims)
        finally:
            gc.enable()
        self.schedule_seconds = time.perf_counter() - t_plan
        if estimate:
            s.estimate_refs, s.estimate_notes = moved_notes(s.estimate_refs, s.estimate_notes, plan.expected_start,
                                                            now, overdue_jobs(running, now))
            s.estimates, self.estimated_at, self.estimated_newest = plan.expected_start, now, newest
            s.estimates_predicted, s.estimate_ranges = plan.predicted, plan.expected_range
        started = {st.job_id for st in plan.starts}
        s.set_queue(plan, [jid for jid in plan.order if jid not in started] if started else plan.order)
        if plan.cancels:  # (a whole chain in one transaction)
            self.events.set_states(dict(plan.cancels), JobState.CANCELLED, "scheduler", expect=(JobState.PENDING,))
        for p in plan.preemptions:
            victim = s.running.get(p.job_id)
            if victim is None:  # no longer running
                continue
            grace, short = preempt_grace(victim, s.policy)  # at least its signal's time, where the policy allows
            victims, until, _ = self.claims.get(p.by_job_id, (set(), 0.0, False))
            self.claims[p.by_job_id] = ({*victims, victim.id}, max(until, now + grace), False)
            if victim.kind in EXTERNAL_KINDS:
                self.kernels.end_external(victim, JobState.CANCELLED, "scheduler", p.reason)
            else:
                if short and victim.id not in s.terminating:
                    s.store.add_event(victim.id, "WARNING", "scheduler", f"preempted with a shorter grace: {short}",
                                      now, data={"grace_s": grace})
                self.supervisors.terminate(victim, p.reason, "preempted", grace)
        if orphans:  # victims that no preemptor needs any more (chosen again, they keep stopping)
            self._withdraw(orphans, {p.job_id for p in plan.preemptions})
        by_host = {(g.host, g.index): g for g in gpus}
        for start in plan.starts:
            job = s.pending.get(start.job_id)
            if job is None:  # no longer pending
                continue
            self.supervisors.launch(job, start.host, [by_host[(start.host, i)] for i in start.gpus],
                                    start.borrowed, start.share)
        self.cycle_seconds.append(time.perf_counter() - t0)
        del self.cycle_seconds[:-200]
        return plan

    def _current_claims(self, now: float) -> tuple[list[Claim], dict[int, int]]:
        """The claims of preemptors still pending, with their victims still running. A claim
        whose victims have all stopped is handed to one cycle (which places its preemptor
        first), then dropped. Also the orphans: victim -> its preemptor, for victims still in
        their grace whose preemptor left the queue (cancelled): this cycle may choose them
        again for another, else their stop is withdrawn."""
        s = self.state
        out: list[Claim] = []
        orphans: dict[int, int] = {}
        for job_id, (victims, until, seen) in list(self.claims.items()):
            left = tuple(v for v in victims if v in s.running)
            if job_id not in s.pending or seen or (left and now > until + self.CLAIM_OVERDUE_S):
                del self.claims[job_id]
                if job_id not in s.pending and not seen and now <= until:
                    orphans.update((v, job_id) for v in left)
                continue
            if not left:
                self.claims[job_id] = (victims, until, True)
            out.append(Claim(job_id, left, until))
        return out, orphans

    def _withdraw(self, orphans: dict[int, int], chosen: set[int]) -> None:
        """Withdraw the preemption of victims whose preemptor is gone, unless this cycle's plan
        preempts them again for another job (then they keep stopping, for it)."""
        s = self.state
        for victim_id, by in orphans.items():
            victim = s.running.get(victim_id)
            if victim is None or victim_id in chosen:
                continue
            if self.supervisors.withdraw(victim, f"preemption withdrawn: job {by} that preempted it left the queue"):
                log.info("gpujobs: job %s runs on: job %s that preempted it left the queue", victim_id, by)

    def _schedule(self, now: float, pending: dict[int, Job], running: list[Job], gpus: list[GPU],
                  finished: dict[int, JobState], estimate: bool, order: Any, claims: list[Claim]) -> Plan:
        """`schedule()`; when it raises, the pending job whose data it cannot handle is found,
        set aside (`set_aside`, with a reason and a line in the log; the monitor tells the
        admins) and the cycle plans without it, so one bad row never stops the queue."""
        policy = self.rules.current_policy()
        budgets = self.rules.budget_states(now, pending.values())  # GPU-hour budgets, as data

        def plan(jobs: dict[int, Job] | list[Job]) -> Plan:
            return schedule(now, jobs, running, gpus, policy, self.usage, finished, estimate=estimate,
                            order=order, claims=claims, reservations=self.rules.reservations, budgets=budgets)

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
        s = self.state
        what = _out_of_range(job) or f"{type(err).__name__}: {err}"[:200]
        reason = f"set aside: the scheduler could not handle this job ({what}); an admin was told"
        self.set_aside[job.id] = (what, f"{type(err).__name__}: {err}"[:500])
        log.error("gpujobs: job %s of %s is set aside: the scheduler could not handle it (%s)", job.id, job.user,
                  what, exc_info=err)
        s.pending[job.id] = job = job.replace(reason=reason)
        try:  # shown after a restart too, until a cycle tries it again
            s.store.update_job(job.id, reason=reason)
        except Exception:
            log.exception("gpujobs: recording why job %s is set aside failed", job.id)
        self.events.publish(job, {"job_id": job.id, "time": s.clock(), "state": "PENDING", "actor": "scheduler",
                                  "reason": reason})

    def _refuse_all(self, now: float) -> Plan:
        """A cycle of an engine whose GPUs another engine owns: nothing starts, and every
        pending job says why."""
        s = self.state
        assert s.gpu_claim is not None
        reason = s.gpu_claim.refusal()
        if not self.refusing:
            log.error("gpujobs: %s", reason)
            self.refusing = True
        order = sorted(s.pending)
        s.set_queue(Plan(order=order, reasons=Reasons({jid: reason for jid in order})), order)
        return s.plan

    # ------------------------------------------------------------------ limits

    def enforce_limits(self, running: list[Job], now: float) -> None:
        """Warn before a time limit; stop external (kernel) jobs at it. Script jobs are
        stopped by their supervisor; this is the safety net if one overstays."""
        s = self.state
        for job in running:
            end, warn_at = s.limit_times(job)
            if end is None or warn_at is None:
                continue
            if job.id not in s.warned and now >= warn_at and now < end:
                s.warned.add(job.id)
                left = format_duration(end - now)
                s.store.add_event(job.id, "WARNING", "engine", f"time limit in {left}", now,
                                  data={"time_limit_at": end})
                self.events.publish(job, {"job_id": job.id, "time": now, "state": "WARNING", "actor": "engine",
                                          "reason": f"time limit in {left}", "data": {"time_limit_at": end}})
            if now >= end:
                reason = f"time limit of {format_duration(job.time_limit_s)} reached"
                if job.kind in EXTERNAL_KINDS:
                    if job.id not in s.ending:
                        self.kernels.end_external(job, JobState.TIMEOUT, "engine", reason)
                elif now >= end + s.kill_grace_s + 5:
                    self.supervisors.terminate(job, reason, "timeout", s.kill_grace_s)

    def over_share(self, job_id: int, reason: str, stop: bool) -> None:
        """A running job uses more GPU memory than its share (the monitor's share watcher says
        so, with `reason`): a WARNING event when first seen over, and once over for the whole
        grace it is stopped and ends FAILED with the reason."""
        s = self.state
        job = s.running.get(job_id)
        if job is None:
            return
        now = s.clock()
        if not stop:
            text = (f"over its GPU share: {reason}; stopped in {format_duration(s.shares.grace_s)} "
                    "unless it gives the memory back")
            s.store.add_event(job.id, "WARNING", "engine", text, now, data={"over_share": reason})
            self.events.publish(job, {"job_id": job.id, "time": now, "state": "WARNING", "actor": "engine",
                                      "reason": text, "data": {"over_share": reason}})
        elif job.kind in EXTERNAL_KINDS:
            self.events.set_state(job.id, JobState.FAILED, "engine", reason, expect=(JobState.RUNNING,))
        else:
            self.supervisors.terminate(job, reason, "failed", s.kill_grace_s)

    # ------------------------------------------------------------------ fair-share usage

    def load_usage(self) -> None:
        """Decayed GPU-seconds from the store, decayed further for the time the server was down."""
        s = self.state
        now = s.clock()
        users: dict[str, float] = {}
        groups: dict[str, float] = {}
        half_life = s.policy.fairshare_half_life_s
        for key, (value, updated_at) in s.store.load_usage().items():
            scope, _, name = key.partition(":")
            decayed = value * 0.5 ** (max(0.0, now - updated_at) / half_life) if half_life > 0 else value
            (users if scope == "user" else groups)[name] = decayed
        self.usage = Usage(users, groups)
        self.usage_at = now

    def save_usage(self, now: float) -> None:
        values = {f"user:{u}": v for u, v in self.usage.users.items()}
        values.update({f"group:{g}": v for g, v in self.usage.groups.items()})
        if values:
            self.state.store.save_usage(values, now)
        self.usage_saved_at = now

    def _account_usage(self, running: list[Job], now: float) -> None:
        dt = now - self.usage_at if self.usage_at else 0.0
        self.usage = decay_and_add(self.usage, running, dt, self.state.policy.fairshare_half_life_s,
                                   gpu_bytes(self.inventory.inventory))
        self.usage_at = now
        if now - self.usage_saved_at > 60:
            self.save_usage(now)


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
