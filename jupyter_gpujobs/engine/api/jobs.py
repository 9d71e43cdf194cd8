"""Handlers of the jobs and the queue: list, submit (or only ask when it would start:
`?dry_run=1`), show (with right-sizing advice for the owner: `?advice=1`), change, hold, release, cancel
(one or many), the end and adoption of a kernel's job, a job's log and events, and the queue's
pages (cached per state of the queue).

Owns only the HTTP side: it decodes and bounds the request and calls the JobService, which
holds the rules. May call: `base`, `model`, `identity`, the JobService."""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Any

from jupyter_server.auth.decorator import authorized
from tornado import web

from ...model import HELD, JOB_KINDS, JobState, parse_id
from .base import ApiError, GPUJobsHandler
from .identity import peer_pid


class JobsHandler(GPUJobsHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        states = [s for s in self.get_argument("state", "").upper().split(",") if s]
        for s in states:
            if s not in JobState.__members__ and s != HELD:
                raise ApiError(400, "state", f"unknown state {s!r}; states are {', '.join(JobState.__members__)}, "
                                             f"{HELD}")
        limit = self.int_arg("limit", 100, low=1, high=1000)
        cursor = self.int_arg("cursor", None, low=1)
        user = self.text_arg("user")
        kind = self.text_arg("kind")
        if kind is not None and kind not in JOB_KINDS:
            raise ApiError(400, "kind", f"unknown kind {kind[:40]!r}; kinds are {', '.join(JOB_KINDS)}")
        jobs, nxt = self.service.store.list_jobs(state=states or None, user=user, limit=limit or 100,
                                                 cursor=cursor, kind=kind)
        viewer = self.owner
        self.reply({"jobs": [self.service.view(j, viewer) for j in jobs], "next": nxt})

    @web.authenticated
    @authorized
    async def post(self) -> None:
        body = self.json_object("describing the job")
        if _flag(self, "dry_run"):  # a what-if: checked as a submission, answered, nothing stored
            self.reply(await self.service.what_if(self.owner, body))
            return
        jobs = await self.service.submit(self.owner, body)
        out = self.service.view(jobs[0])
        if len(jobs) > 1:
            out["array_tasks"] = [j.id for j in jobs]
        self.set_header("Location", self.request.path.rstrip("/") + f"/{jobs[0].id}")
        self.reply(out, status=201)


def _flag(handler: GPUJobsHandler, name: str) -> bool:
    """`?name=1` (or true/yes; 0/false/no or absent: no)."""
    raw = (handler.get_argument(name, None) or "").strip().lower()
    if raw in ("", "0", "false", "no"):
        return False
    if raw in ("1", "true", "yes"):
        return True
    raise ApiError(400, name, f"expected 1 or 0, got {raw[:40]!r}")


class JobHandler(GPUJobsHandler):
    @web.authenticated
    @authorized
    async def get(self, job_id: str) -> None:
        job = self.service.get(self.job_id(job_id))
        out = self.service.view(job, self.owner)
        # right-sizing advice from the owner's own history, to them only, when asked: clients
        # poll this view (a cell's magic 20 times a second), and advice reads the store
        if _flag(self, "advice") and job.user == self.owner:
            out["advice"] = self.service.advice(job)
        self.reply(out)

    @web.authenticated
    @authorized
    async def delete(self, job_id: str) -> None:
        job = await self.service.cancel(self.job_id(job_id), self.owner)
        self.reply(self.service.view(job))

    @web.authenticated
    @authorized
    async def patch(self, job_id: str) -> None:
        """Change a job's time_limit, priority, name or begin (409 saying why when it cannot)."""
        body = self.json_object("with the fields to change")
        self.reply(self.service.view(self.service.update(self.job_id(job_id), self.owner, body)))


class JobHoldHandler(GPUJobsHandler):
    """`POST jobs/{id}/hold`: keep a pending job from starting (it shows as HELD)."""

    @web.authenticated
    @authorized
    async def post(self, job_id: str) -> None:
        self.reply(self.service.view(self.service.hold(self.job_id(job_id), self.owner)))


class JobReleaseHandler(GPUJobsHandler):
    """`POST jobs/{id}/release`: let a held job start again."""

    @web.authenticated
    @authorized
    async def post(self, job_id: str) -> None:
        self.reply(self.service.view(self.service.release(self.job_id(job_id), self.owner)))


class JobsCancelHandler(GPUJobsHandler):
    """`POST jobs/cancel` with one of `{"ids": [...]}`, `{"user": "bob"}`, `{"array": ID}` or
    `{"all": true}`: cancel many jobs at once (of those, the ones the caller may cancel; a
    user's own unless an admin), the pending ones in one store transaction."""

    @web.authenticated
    @authorized
    async def post(self) -> None:
        body = self.json_object("saying which jobs to cancel")
        unknown = sorted(set(body) - {"ids", "user", "array", "all"})
        if unknown:
            raise ApiError(400, unknown[0], f"unknown field {unknown[0]!r}: give ids, user, array or all")
        if len(body) != 1 or body.get("all", True) is not True:
            raise ApiError(400, "body", "give exactly one of ids (a list of job ids), user, array or all: true")
        ids = body.get("ids")
        if ids is not None:
            if not isinstance(ids, list) or not ids or len(ids) > 100_000:
                raise ApiError(400, "ids", "ids must be a list of 1 to 100000 job ids")
            ids = [parse_id(i, "ids") for i in ids]
        user = body.get("user")
        if user is not None and (not isinstance(user, str) or not 0 < len(user) <= 128):
            raise ApiError(400, "user", "user must be a user name")
        array = body.get("array")
        if array is not None:
            array = parse_id(array, "array")
        self.reply(await self.service.cancel_many(self.owner, ids, user, array))


class JobEndHandler(GPUJobsHandler):
    """`POST jobs/{id}/end {"state": "COMPLETED", "reason": "..."}`: the end of a job the engine
    did not launch itself (a kernel, reported by the kernel provisioner)."""

    @web.authenticated
    @authorized
    async def post(self, job_id: str) -> None:
        body = self.json_object()
        job = self.service.finish_external(self.job_id(job_id), self.owner, body.get("state", "COMPLETED"),
                                           body.get("reason"))
        self.reply(self.service.view(job))


class JobAdoptHandler(GPUJobsHandler):
    """`POST jobs/{id}/adopt {"pid": N}`: confine a running GPU kernel's process in its job's
    cgroup, with the device fence (asked by the kernel provisioner after each launch)."""

    @web.authenticated
    @authorized
    async def post(self, job_id: str) -> None:
        body = self.json_object()
        # the kernel must be a child of the caller: the user's Jupyter server on the shared
        # engine's socket, this very server where the engine is embedded (its provisioner)
        launcher = peer_pid(self) or os.getpid()
        self.reply(self.service.adopt(self.job_id(job_id), self.owner, body.get("pid"), launcher))


class JobLogHandler(GPUJobsHandler):
    @web.authenticated
    @authorized
    async def get(self, job_id: str) -> None:
        offset = self.int_arg("offset", 0) or 0
        data, nxt, done = self.service.read_log(self.job_id(job_id), offset, viewer=self.owner)
        self.reply({"offset": nxt, "data": data, "done": done})


class JobEventsHandler(GPUJobsHandler):
    @web.authenticated
    @authorized
    async def get(self, job_id: str) -> None:
        self.reply({"events": self.service.events(self.job_id(job_id), self.owner)})


class QueueHandler(GPUJobsHandler):
    """`GET queue?limit=&offset=&user=`: one page of the pending jobs in scheduling order, and
    how many there are (`total`); `next` is the offset of the next page (null on the last).

    Many clients poll the head of the queue (panels, widgets, `watch jupyter gpujobs queue`):
    a page is built once per state of the queue (the last plan and the pending jobs) and at
    most once a second, and served to every client that asks for it, so that polling leaves
    the event loop to the scheduler."""

    CACHE_S = 1.0

    @web.authenticated
    @authorized
    async def get(self) -> None:
        limit = self.int_arg("limit", 100, low=1, high=1000) or 100
        offset = self.int_arg("offset", 0) or 0
        user = self.text_arg("user")
        service = self.service
        state = service.queue_state()
        cache: dict[tuple[Any, ...], tuple[float, tuple[Any, ...], bytes, str]] = self.settings.setdefault(
            "gpujobs_queue_pages", {})
        viewer = self.owner
        # a page shows others' jobs as queue views when data is private: one page per viewer then
        key = (offset, limit, user, viewer if service.private_data else None)
        now = time.monotonic()
        hit = cache.get(key)
        # the plan by identity: comparing plans would compare their 10k-long orders
        fresh = hit is not None and hit[1][0] is state[0] and hit[1][1:] == state[1:] and now - hit[0] <= self.CACHE_S
        if not fresh:
            page, total = service.queue_page(offset, limit, user)
            nxt = offset + limit if offset + limit < total else None
            body = json.dumps({"jobs": [service.view(j, viewer) for j in page], "total": total, "offset": offset,
                               "next": nxt, "held": service.access.held_count(user)}, allow_nan=False).encode()
            if len(cache) > 256:
                cache.clear()
            # its ETag with it: hashing a 100 KiB page for every poll cost as much as serving it
            hit = cache[key] = (now, state, body, f'"{hashlib.sha1(body).hexdigest()}"')
        self._etag = hit[3]
        self.set_header("Content-Type", "application/json")
        self.finish(hit[2])

    def compute_etag(self) -> str | None:
        return getattr(self, "_etag", None) or super().compute_etag()
