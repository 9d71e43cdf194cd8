"""Changes to a job after its submission: hold, release and update (issue 27).

Owns
- `hold` / `release`: a pending job kept out of scheduling (`Job.held`: the scheduler does not
  place it; it shows as HELD) until released;
- `update`: a job's time limit, priority, name or begin changed (`PATCH jobs/{id}`): a pending
  job's are re-planned at the next cycle; a running job's time limit may be extended only
  within its user's maximum and only when no reservation's GPUs and no guaranteed job's start
  are pushed back by it (`Conflict` saying which otherwise), and the runner is told.

Each change is stored first (it survives a restart), with an event (HELD, RELEASED, UPDATED)
naming who made it. Owners change their own jobs, admins anyone's (`Access.check_owner`).

It may call the store, `access.Access`, `events.Events` (publication), `rules.Rules` (the
policy in force, reservations), `cycle.Cycle` (its usage, to re-plan) and the pure scheduler.
"""

from __future__ import annotations

from typing import Any

from ..model import Job, JobState, format_duration, validate_update
from .access import Access
from .cycle import Cycle
from .errors import Conflict
from .events import Events
from .rules import Rules
from .scheduler import schedule
from .scheduler.deferral import clock_text
from .scheduler.quotas import Quotas
from .scheduler.reservations import gpus_text, occurrences
from .state import EXTERNAL_KINDS, EngineState
from .userpolicy import check_priority


class Changes:
    def __init__(self, state: EngineState, access: Access, events: Events, rules: Rules, cycle: Cycle):
        self.state = state
        self.access = access
        self.events = events
        self.rules = rules
        self.cycle = cycle

    # ------------------------------------------------------------------ hold, release

    def hold(self, job_id: int, user: str) -> Job:
        """Keep a pending job from starting until it is released (idempotent)."""
        job = self._pending(job_id, user, "held")
        return job if job.held else self._record(job, user, "HELD", f"held by {user}", {"held": True})

    def release(self, job_id: int, user: str) -> Job:
        """Let a held job be scheduled again (idempotent)."""
        job = self._pending(job_id, user, "released")
        return self._record(job, user, "RELEASED", f"released by {user}", {"held": False}) if job.held else job

    def _pending(self, job_id: int, user: str, what: str) -> Job:
        job = self.state.get(job_id)
        self.access.check_owner(job, user)
        if job.state is not JobState.PENDING:
            raise Conflict("state", f"job {job.id} is {job.state.value}; only a pending job may be {what}")
        return job

    # ------------------------------------------------------------------ update

    def update(self, job_id: int, user: str, body: Any) -> Job:
        """Change a job's `time_limit`, `priority`, `name` or `begin` (see the module docstring)."""
        s = self.state
        now = s.clock()
        job = s.get(job_id)
        self.access.check_owner(job, user)
        policy = self.rules.current_policy()
        fields = validate_update(body, policy, now)
        if job.state.is_final:
            raise Conflict("state", f"job {job.id} has ended ({job.state.value}); there is nothing to change")
        if "priority" in fields:  # no class the user may not submit with (c.GPUJobs.priority_tiers)
            check_priority(policy, fields["priority"], job.user, self.access.is_admin(user))
        if "time_limit_s" in fields:
            most, who = Quotas(policy).max_time_limit(job.user, job.group)
            if most is not None and fields["time_limit_s"] > most:
                raise Conflict("time_limit", f"{format_duration(fields['time_limit_s'])} is over the maximum of "
                                             f"{format_duration(most)} for {who}")
        if job.state is JobState.RUNNING:
            if "begin" in fields:
                raise Conflict("begin", f"job {job.id} is already running; begin applies to a pending job")
            if fields.get("time_limit_s") not in (None, job.time_limit_s):
                self._check_new_limit(job, fields["time_limit_s"], now)
        fields = {k: v for k, v in fields.items() if getattr(job, k) != v}
        if not fields:
            return job
        words = ", ".join(f"{_label(k)} {_text(k, getattr(job, k))} -> {_text(k, v)}" for k, v in fields.items())
        return self._record(job, user, "UPDATED", f"updated by {user}: {words}", fields)

    def _check_new_limit(self, job: Job, limit: int, now: float) -> None:
        """Refuse (Conflict naming time_limit) a running job's new limit that it has already
        run past, that would run into a reservation it does not hold, or that would push back
        the start of a guaranteed job; tell the runner (or, for a kernel, the engine's own
        watch) of a limit that passes."""
        s = self.state
        started = job.started_at or now
        if started + limit <= now:
            raise Conflict("time_limit", f"job {job.id} has run {format_duration(now - started)} already; "
                                         "a new limit must be longer than that")
        if job.time_limit_s is not None and limit > job.time_limit_s:
            self._refuse_reservation(job, started + limit, now)
            self._refuse_pushing_back(job, limit, now)
        if job.kind in EXTERNAL_KINDS:
            return  # the engine stops a kernel at its limit itself (Cycle.enforce_limits)
        handle = s.handles.get(job.id)
        if handle is None or not s.runner.set_time_limit(job.id, handle, limit):
            raise Conflict("time_limit", f"the {s.runner.name} runner cannot change the time limit of a running "
                                         "job; cancel and resubmit it, or ask an admin")

    def _refuse_reservation(self, job: Job, new_end: float, now: float) -> None:
        old_end = (job.started_at or now) + (job.time_limit_s or 0)
        gpus = self.cycle.inventory.inventory
        for o in occurrences(self.rules.reservations, gpus, now):
            if o.host != job.host or not set(o.gpus) & set(job.assigned_gpus) or o.holds(job.user, job.group):
                continue
            if o.start < new_end and o.end > old_end:
                raise Conflict("time_limit", f"extending job {job.id} to end at "
                                             f"{clock_text(new_end, now, self.rules.current_policy())} would run "
                                             f"into reservation {o.reservation.label}: {gpus_text(o.gpus)} are "
                                             f"reserved for {o.reservation.holders_text()} from "
                                             f"{clock_text(o.start, now, self.rules.current_policy())}")

    def _refuse_pushing_back(self, job: Job, limit: int, now: float) -> None:
        """Plan the queue as it is and with the longer limit: a pending job whose user or
        group has a guarantee and whose expected start moves later refuses the extension."""
        s = self.state
        policy = self.rules.current_policy()
        guaranteed = Quotas(policy)
        running = list(s.running.values())
        longer = [j.replace(time_limit_s=limit) if j.id == job.id else j for j in running]
        gpus = self.cycle.inventory.inventory

        def starts(jobs: list[Job]) -> dict[int, float | None]:
            return schedule(now, s.pending, jobs, gpus, policy, self.cycle.usage, estimate=True,
                            reservations=self.rules.reservations).expected_start

        before, after = starts(running), starts(longer)
        for jid, t in after.items():
            was = before.get(jid)
            other = s.pending.get(jid)
            if other is None or was is None or (t is not None and t <= was + 1):
                continue
            if any(guaranteed.guarantees(other.user, other.group)):
                raise Conflict("time_limit", f"extending job {job.id} would push back job {jid} of {other.user}, "
                                             f"which is within its guarantee (from "
                                             f"{clock_text(was, now, policy)} to "
                                             f"{'later' if t is None else clock_text(t, now, policy)})")

    # ------------------------------------------------------------------ recording

    def _record(self, job: Job, user: str, what: str, reason: str, fields: dict[str, Any]) -> Job:
        """Store the change with its event, make it the active job, publish it, re-plan."""
        s = self.state
        now = s.clock()
        s.store.update_job(job.id, **fields)
        data = {k: v for k, v in fields.items() if isinstance(v, (str, int, float, bool)) or v is None}
        s.store.add_event(job.id, what, user, reason, now, data=data)
        job = job.replace(**fields)
        if job.id in s.pending or job.id in s.running:
            s.keep(job)
        if "time_limit_s" in fields:
            s.warned.discard(job.id)  # warned again before the new limit
        self.cycle.estimated_at = -float("inf")  # the next cycle recalculates priorities and starts
        self.events.publish(job, {"job_id": job.id, "time": now, "state": what, "actor": user, "reason": reason,
                                  "data": data})
        s.wake()
        return job


def _label(key: str) -> str:
    return {"time_limit_s": "time limit"}.get(key, key)


def _text(key: str, value: Any) -> str:
    if key == "time_limit_s":
        return format_duration(value)
    if key == "begin":
        return "now" if value is None else f"{value:.0f}"
    return repr(value) if isinstance(value, str) else str(value)
