"""Who may do and see what, and the views of jobs and of the queue the API shows.

Owns the rules of access (admins, owners, `c.GPUJobs.private_data` with `may_see`,
`check_owner`, `get_private`, `redact`), where a user's relative paths start (`root_for`),
and the read side of the queue: a job's view with its position, reason and expected start,
and the pages of the queue in scheduling order. It holds no state of its own: it reads the
active jobs and the last plan from `state.EngineState`, and may call the store (read only)
and the Unix user database.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import Any

from ..model import Job, JobState, format_duration, public_reason, view_state
from .errors import PermissionDenied
from .runners.users import NotAUnixUser, in_group, run_as
from .state import EngineState


class Access:
    #: How long whether a user is in the admin group (the system's group database) is kept: it
    #: is asked for each job a user sees (views, pages, every job change on every websocket),
    #: and one answer costs 0.1 ms here, more over LDAP: a page of 1000 others' jobs took
    #: 150 ms more, and 1000 changes seen on 50 websockets held the loop 6 s.
    ADMIN_GROUP_TTL_S = 5.0

    def __init__(self, state: EngineState):
        self.state = state
        self._in_admin_group: dict[str, tuple[float, bool]] = {}  # user -> (asked at, answer)

    # ------------------------------------------------------------------ who

    def is_admin(self, user: str) -> bool:
        s = self.state
        if user in s.admin_users:
            return True
        if s.admin_group is None:
            return False
        if user == "root":
            return True
        now = time.monotonic()
        known = self._in_admin_group.get(user)
        if known is not None and now - known[0] < self.ADMIN_GROUP_TTL_S:
            return known[1]
        admin = in_group(user, s.admin_group)
        if len(self._in_admin_group) > 10_000:  # (users, not requests: a bound all the same)
            self._in_admin_group.clear()
        self._in_admin_group[user] = (now, admin)
        return admin

    def records_of(self, viewer: str, asked: str | None, what: str) -> str | None:
        """Whose records (budgets, accounting) `viewer` may read when asking for `asked`'s: an
        admin anyone's (None: everyone's), another user only their own; PermissionDenied
        naming the `user` field otherwise."""
        if self.is_admin(viewer):
            return asked
        if asked is not None and asked != viewer:
            err = PermissionDenied(f"only admins may see another user's {what}")
            err.field = "user"  # type: ignore[attr-defined]
            raise err
        return viewer

    def gpu_views_for(self, views: list[dict[str, Any]], viewer: str) -> list[dict[str, Any]]:
        """The GPU views as `viewer` may see them: an admin sees whose process uses a GPU
        outside the queue (pid, name, user); anyone else how much it holds and what to do."""
        return gpu_views_for(views, self.is_admin(viewer))

    def require_admin(self, viewer: str, what: str) -> None:
        if not self.is_admin(viewer):
            raise PermissionDenied(f"only admins may {what}")

    def member(self, user: str, group: str) -> bool:
        if user in self.state.group_members.get(group, ()):
            return True
        return in_group(user, group)

    def may_see(self, job: Job | dict[str, Any], viewer: str | None) -> bool:
        """Whether `viewer` may see a job's private data (command, cwd, environment, payload,
        log, events detail, stats): its owner and admins always, others only when the engine
        does not keep jobs private (`c.GPUJobs.private_data`). None: the engine itself."""
        owner = job["user"] if isinstance(job, dict) else job.user
        return viewer is None or not self.state.private_data or viewer == owner or self.is_admin(viewer)

    def check_owner(self, job: Job, user: str) -> None:
        if job.user != user and not self.is_admin(user):
            raise PermissionDenied(_not_theirs(job))

    #: How many ids one read of the store looks up (SQLite takes 32766 variables in one
    #: statement, PostgreSQL 65535)
    LOOKUP_CHUNK = 5000

    def changeable(self, ids: list[int], user: str) -> tuple[list[Job], dict[str, str]]:
        """Of `ids`, the jobs `user` may change (`check_owner`), each once, in their order, and
        why not for each other id (keyed by the id as text): no such job, or another's. The
        ids of no active job are read from the store together, a chunk at a time: read one by
        one, a cancel of 100,000 ids held the engine (every user's request) for 15 s."""
        s = self.state
        ids = list(dict.fromkeys(ids))
        found = {i: job for i in ids if (job := s.active_job(i)) is not None}
        rest = [i for i in ids if i not in found]
        for start in range(0, len(rest), self.LOOKUP_CHUNK):
            found.update(s.store.get_many(rest[start:start + self.LOOKUP_CHUNK]))
        admin = self.is_admin(user)  # (once: it may ask the system's group database)
        jobs: list[Job] = []
        errors: dict[str, str] = {}
        for job_id in ids:
            job = found.get(job_id)
            if job is None:
                errors[str(job_id)] = f"no job {job_id}"  # (as `EngineState.get` says)
            elif job.user != user and not admin:
                errors[str(job_id)] = _not_theirs(job)
            else:
                jobs.append(job)
        return jobs, errors

    def get_private(self, job_id: int, viewer: str | None) -> Job:
        """A job whose private data (log, events, stats) `viewer` may see; PermissionDenied
        when it is another's and private (see `may_see`)."""
        job = self.state.get(job_id)
        if not self.may_see(job, viewer):
            raise PermissionDenied(f"job {job.id} belongs to {job.user}; its details are private "
                                   "(only its owner and admins see them)")
        return job

    def events(self, job_id: int, viewer: str | None = None) -> list[dict[str, Any]]:
        """A job's events, oldest first, to a `viewer` who may see them."""
        self.get_private(job_id, viewer)
        return self.state.store.events(job_id=job_id)

    def root_for(self, user: str) -> Path:
        """Where a user's relative paths start: the server's root dir, or on an engine that runs
        jobs as their owners, the owner's home."""
        try:
            unix_user = run_as(user, self.state.run_as_owner)
        except NotAUnixUser:
            return self.state.root_dir
        if unix_user is not None:
            import pwd

            return Path(pwd.getpwnam(unix_user).pw_dir)
        return self.state.root_dir

    # ------------------------------------------------------------------ views of jobs

    def view(self, job: Job, viewer: str | None = None) -> dict[str, Any]:
        """A job as the API shows it (with its queue position, reason and expected start).
        A stored copy of an active job is shown as the engine knows it now. To a `viewer` who
        may not see its private data, only its queue view (`redact`)."""
        out = self._view(job)
        return out if self.may_see(job, viewer) else redact(out)

    def _view(self, job: Job) -> dict[str, Any]:
        s = self.state
        job = s.active_job(job.id) or job
        reason = job.reason
        position = None
        expected = None
        kind = None
        span: list[float] | tuple[float, float] | None = None  # the range of its expected start
        note = None  # why its expected start moved (scheduler/estimates.py)
        if job.state is JobState.PENDING:
            if s.positions is None:
                s.positions = {jid: i + 1 for i, jid in enumerate(s.waiting)}
            position = s.positions.get(job.id)
            if job.id not in s.pulling:  # (a job waiting for its image: the pull's progress)
                reason = s.plan.reasons.get(job.id) or reason or "waiting for the next scheduling cycle"
            plan = s.plan
            if job.id in plan.expected_start:
                expected, predicted = plan.expected_start[job.id], job.id in plan.predicted
                span = plan.expected_range.get(job.id)
            else:
                expected, predicted = s.estimates.get(job.id), job.id in s.estimates_predicted
                span = s.estimate_ranges.get(job.id)
            note = s.estimate_notes.get(job.id)
            now = s.clock()
            if expected is not None and expected < now - OVERDUE_S:  # known to be wrong: unknown until re-estimated
                note = f"its expected start passed {format_duration(now - expected)} ago; it is estimated again"
                expected = span = None
            if expected is not None:  # a prediction from runtimes, or a bound from time limits
                kind = "prediction" if predicted else "bound"
                if span is not None:  # (what already passed is now)
                    span = [max(span[0], min(now, expected)), max(span[1], expected)]
            else:
                span = None
        ends_at, warn_at = s.limit_times(job) if job.state is JobState.RUNNING else (None, None)
        out = {
            "id": job.id, "name": job.name, "user": job.user, "kind": job.kind, "state": view_state(job),
            "gpus": job.gpus, "gpu_type": job.gpu_type, "assigned_gpus": list(job.assigned_gpus),
            "host": job.host, "submitted_at": job.submitted_at, "started_at": job.started_at,
            "ended_at": job.ended_at, "time_limit_s": job.time_limit_s, "exit_code": job.exit_code,
            "signal": job.signal, "reason": reason, "position": position, "expected_start": expected,
            "expected_start_kind": kind, "expected_start_range": span, "expected_start_note": note,
            "priority": job.priority, "group": job.group, "preemptible": job.preemptible,
            "borrowed": job.borrowed, "command": job.command, "cwd": job.cwd, "payload": job.payload,
            "depends": [f"{d.kind}:{d.job_id}" for d in job.depends], "begin": job.begin,
            "offpeak": job.offpeak, "array_job_id": job.array_job_id, "array_index": job.array_index,
            "restarts": job.restarts, "output_notebook": job.payload.get("output"),
            "ends_at": ends_at, "warn_at": warn_at, "mem_bytes": job.mem_bytes, "cpus": job.cpus,
            "share": job.share, "gpu_memory": job.gpu_memory, "nodes": job.nodes,
            # the signal asked for before the end (submitted as `signal`; "signal" is how a run ended)
            "warn_signal": job.warn_signal, "requeue": job.requeue, "max_requeues": job.max_requeues,
            "requeues": job.requeues,
            "held": job.held, "retries": job.retries, "retried": job.retried,
            "retry_backoff_s": job.retry_backoff_s, "retry_oom": job.retry_oom,
            "image": job.image,
        }
        return out

    # ------------------------------------------------------------------ the queue

    def _in_queue_order(self) -> Iterator[Job]:
        """Pending jobs in scheduling order, the jobs no cycle has placed yet last (by id).
        Lazy: a page of the head of a 10k-job queue, polled by many clients, reads a page."""
        pending = self.state.pending
        placed = 0
        for jid in self.state.plan.order:
            job = pending.get(jid)
            if job is not None:
                placed += 1
                yield job
        if placed < len(pending):
            ordered = set(self.state.plan.order)
            for jid in sorted(jid for jid in pending if jid not in ordered):
                yield pending[jid]

    def queue(self) -> list[Job]:
        """Pending jobs in scheduling order (jobs not yet seen by a cycle last)."""
        return list(self._in_queue_order())

    def queue_state(self) -> tuple[Any, ...]:
        """What the pages of the queue depend on, cheap to compare: the last plan (compare it by
        identity), how many jobs wait and the newest of them, how many run. While it is the
        same, so is every `queue_page`."""
        s = self.state
        return s.plan, len(s.pending), next(reversed(s.pending), None), len(s.running)

    def held_count(self, user: str | None = None) -> int:
        """How many pending jobs are held (of `user`'s, when given)."""
        return sum(1 for j in self.state.pending.values() if j.held and (user is None or j.user == user))

    def queue_page(self, offset: int, limit: int, user: str | None = None) -> tuple[list[Job], int]:
        """Jobs `offset` to `offset + limit` of `queue()` (of `user`'s jobs only, when given)
        and how many there are in all."""
        if user is None:
            total = len(self.state.pending)
            if offset >= total:  # (also keeps islice's bounds within sys.maxsize for any offset)
                return [], total
            return list(islice(self._in_queue_order(), offset, min(offset + limit, total))), total
        mine = [job for job in self._in_queue_order() if job.user == user]
        return mine[offset:offset + limit], len(mine)


def _not_theirs(job: Job) -> str:
    """Why someone else may not change `job` (`check_owner`)."""
    return f"job {job.id} belongs to {job.user}; only they or an admin may change it"


#: An expected start this far in the past, its job still waiting, is known to be wrong: the
#: view says "unknown" (and why) until the next estimating cycle moves it
OVERDUE_S = 60.0

#: What anyone may see of any job: the queue view (Slurm's PrivateData=jobs).
PUBLIC_FIELDS = frozenset({
    "id", "user", "kind", "state", "gpus", "gpu_type", "assigned_gpus", "host", "submitted_at",
    "started_at", "ended_at", "time_limit_s", "reason", "position", "expected_start", "expected_start_kind", "priority",
    "expected_start_range", "expected_start_note",
    "group", "preemptible", "borrowed", "begin", "offpeak", "array_job_id", "array_index",
    "ends_at", "warn_at", "share", "gpu_memory", "held", "nodes",
})


def redact(view: dict[str, Any]) -> dict[str, Any]:
    """A job view without its private data: the other fields are None, and `private` is true.
    Why it ended is only its end (`model.public_reason`): the reason may name its command;
    why it waits without its image (`_public_reason`)."""
    out: dict[str, Any] = {k: (v if k in PUBLIC_FIELDS else None) for k, v in view.items()}
    out["reason"] = _public_reason(view.get("state"), view.get("reason"), view.get("image"))
    out["depends"] = []
    out["private"] = True
    return out


def gpu_views_for(views: list[dict[str, Any]], admin: bool) -> list[dict[str, Any]]:
    """`views` (Inventory.gpu_views) for an admin (`admin`) or for anyone else: the
    `foreign_public` text and what to do take the place of `foreign` and `foreign_todo`."""
    out = []
    for view in views:
        view = dict(view)
        public = view.pop("foreign_public", None)
        if public is not None and not admin:
            view["foreign"], view["foreign_todo"] = public
        out.append(view)
    return out


def redact_event(event: dict[str, Any], image: str | None = None) -> dict[str, Any]:
    """A job's event without its private data: no data, and the reason as `redact` gives it
    (`image`: the job's, which its reason must not name). A change (`UPDATED`) of a private
    field (its name) says only who made it: its reason names the old and new values."""
    out = {k: event.get(k) for k in ("job_id", "time", "state", "actor", "reason")}
    out["reason"] = _public_reason(out["state"], out["reason"], image)
    if out["state"] == "UPDATED" and any(k not in PUBLIC_FIELDS for k in event.get("data") or {}):
        out["reason"] = f"updated by {out['actor']}"
    out["data"] = {}
    return out


def _public_reason(state: str | None, reason: str | None, image: str | None) -> str | None:
    """`model.public_reason` (which leaves out how its last run ended) less the job's image
    (a path in its owner's folder, a registry of theirs; a waiting job's reason is the progress
    of its image's pull: "pulling image docker-archive:/home/ann/x.tar: ..." shows as "pulling
    its image: ...")."""
    reason = public_reason(state, reason)
    if not reason:
        return reason
    if image and image in reason:
        reason = reason.replace(f"image {image}", "its image").replace(image, "its image")
    return reason
