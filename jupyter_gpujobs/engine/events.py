"""Job events: the one writer of a job's state changes, and their publication.

Owns
- `set_state`: every change of a job's state after its submission goes through here (the
  store's transition, then the active jobs in `state.EngineState`, the bookkeeping the job
  carried, the cycle's wake-up and the publication), except the start, which the supervisor
  records with its run (`Supervisors.launch`);
- the listeners (`subscribe`, `publish`, `broadcast`, `job_message_for`): the events
  websockets, the monitor and the notifier;
- the callers waiting for a job to end (`wait_ended`).

It may call the store, the runner (to release a confined kernel's cgroup), `access.Access`
(the view a publication carries) and `release_external`, the mirror's hook that ends a
kernel's Slurm job.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from ..model import Job, JobState
from .access import Access, redact, redact_event
from .state import EXTERNAL_KINDS, EngineState

log = logging.getLogger("jupyter_gpujobs")

Listener = Callable[[dict[str, Any]], None]
#: (job, its runner handle, final state, reason): a kernel under Slurm ended outside Slurm.
ReleaseExternal = Callable[[Job, dict[str, Any] | None, JobState, str], None]


class Events:
    def __init__(self, state: EngineState, access: Access):
        self.state = state
        self.access = access
        self.listeners: set[Listener] = set()
        self.ended_waiters: dict[int, list[asyncio.Future[Job]]] = {}
        self.release_external: ReleaseExternal | None = None  # set by the mirror
        self.outbox: list[dict[str, Any]] = []  # published, not yet handed to the listeners (`broadcast`)

    # ------------------------------------------------------------------ state changes

    def set_state(self, job_id: int, state: JobState, actor: str, reason: str,
                  expect: tuple[JobState, ...] | None = None, data: dict[str, Any] | None = None,
                  released_at: float | None = None, **fields: Any) -> Job | None:
        s = self.state
        now = s.clock()
        if state.is_final:
            fields.setdefault("ended_at", now)
        job = s.store.transition(job_id, state, actor, reason, now, expect=expect, data=data,
                                 released_at=released_at, **fields)
        if job is None:
            return None
        self._changed(job, state, actor, reason, now, data)
        return job

    def set_states(self, reasons: dict[int, str], state: JobState, actor: str,
                   expect: tuple[JobState, ...]) -> list[Job]:
        """`set_state` of many jobs (id -> reason) to a final state in one store transaction
        (`Store.transition_many`): the cancel of a chain, an array or a user's jobs."""
        now = self.state.clock()
        jobs = self.state.store.transition_many(reasons, state, actor, now, expect=expect)
        for job in jobs:
            self._changed(job, state, actor, reasons[job.id], now, None)
        return jobs

    def _changed(self, job: Job, state: JobState, actor: str, reason: str, now: float,
                 data: dict[str, Any] | None) -> None:
        """What follows a stored change of state: the active jobs, the bookkeeping the job
        carried, the waiters, the cycle's wake-up and the publication."""
        s = self.state
        job_id = job.id
        if state.is_final:
            if self.release_external is not None and job.kind in EXTERNAL_KINDS and actor != "runner":
                # a kernel under Slurm ended by its provisioner or the engine: end its Slurm job too
                self.release_external(job, s.handles.get(job_id), state, reason)
            adopted = s.ended(job_id)
            if adopted is not None:
                s.runner.release_adopted(adopted)
            for fut in self.ended_waiters.pop(job_id, []):
                if not fut.done():
                    fut.set_result(job)
        else:
            s.keep(job)
        # the cycle first: tasks run in the order they were woken, and the listeners woken by
        # the publication (the monitor's diagnosis of an ended job, ...) can wait; a freed GPU can't
        s.wake()
        self.publish(job, {"job_id": job_id, "time": now, "state": state.value, "actor": actor,
                           "reason": reason, "data": data or {}})

    async def wait_ended(self, job_id: int, timeout: float) -> Job:
        job = self.state.get(job_id)
        if job.state.is_final:
            return job
        fut: asyncio.Future[Job] = asyncio.get_running_loop().create_future()
        self.ended_waiters.setdefault(job_id, []).append(fut)
        try:
            return await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            return self.state.get(job_id)

    # ------------------------------------------------------------------ listeners

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        self.listeners.add(listener)
        return lambda: self.listeners.discard(listener)

    def publish(self, job: Job, event: dict[str, Any]) -> None:
        if not self.listeners:
            return
        self.broadcast({"type": "job", "job": self.access.view(job), "event": event})

    def job_message_for(self, message: dict[str, Any], viewer: str | None) -> dict[str, Any]:
        """A `{"type": "job"}` broadcast as `viewer` may see it: another's private job as its
        queue view (`redact`), its event without its data."""
        if self.access.may_see(message["job"], viewer):
            return message
        return {**message, "job": redact(message["job"]),
                "event": redact_event(message["event"], message["job"].get("image"))}

    def broadcast(self, message: dict[str, Any]) -> None:
        """Hand a message (`{"type": ...}`) to every listener: the events websockets, which
        decide who may see it, and the monitor. The monitor's findings go out this way.

        Messages are handed out in order, soon after, not inside the change that made them:
        a state change is on the path from one job's end to the next job's start, and writing
        it to 50 websockets there would delay that start by as many socket writes. The cycle
        woken by the change runs first (`set_state` wakes it before it publishes)."""
        self.outbox.append(message)
        if len(self.outbox) > 1:
            return  # a delivery is already due
        try:
            asyncio.get_running_loop().call_soon(self.deliver)
        except RuntimeError:  # no event loop (a command-line tool, a test of a part): at once
            self.deliver()

    def deliver(self) -> None:
        """Hand the messages published since the last delivery to the listeners, in order."""
        messages, self.outbox = self.outbox, []
        for message in messages:
            for listener in list(self.listeners):
                try:
                    listener(message)
                except Exception:
                    log.exception("gpujobs: event listener failed")
