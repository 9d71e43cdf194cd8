"""Admission: a submission checked, stored and made an active job (request -> store).

Owns the checks of a submission beyond its own fields (`validated`: the user's group, the
quotas that would never let it start, dependencies, the working directory (`~` is the job's
user's home; the folder is looked at as them: `check_cwd`) and the Unix user it runs as,
limits this machine can enforce, a notebook's payload, its image: there for its user or one a
pull can fetch, `containers.pull.Pulls` then fetching it before the job may take GPUs), the
group commit of the submissions of one event-loop turn (`submit`, `store_submissions`) and the
burst timer that gives a burst of submissions one scheduling cycle once it pauses.

It may call the store, `access.Access` (where a user's paths start), `inventory.Inventory`
(the GPUs, the limits enforceable), `rules.Rules` (the policy in force), `events.Events`
(the submission's publication), the notebook helpers (a notebook is looked at as its user,
off the loop: `userfiles`), `userpolicy` (the priority classes a user may use, the caps on
what one user may queue) and `state.EngineState.wake`.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import replace
from typing import Any

from ..model import InvalidInput, Job, validate_submission
from ..notebook.notebooks import check_notebook_files
from .access import Access
from .containers import ImageProblem
from .containers.present import check_present, check_readable
from .containers.pull import Pulls
from .events import Events
from .inventory import Inventory
from .rules import Rules
from .runners.users import NotAUnixUser, expand_home, run_as
from .scheduler.quotas import Quotas
from .state import EXTERNAL_KINDS, EngineState
from .store import NewJobs, StoreUnavailable
from .userfiles import Bounds, HelperFailed, check_directory
from .userpolicy import check_priority, check_queue_caps

log = logging.getLogger("jupyter_gpujobs")


class Admission:
    #: A burst of submissions gets one scheduling cycle once it pauses this long (seconds) ...
    SUBMIT_SETTLE_S = 0.02
    #: ... or this long after its first submission, whichever comes first.
    SUBMIT_MAX_DELAY_S = 0.5

    def __init__(self, state: EngineState, access: Access, inventory: Inventory, rules: Rules, events: Events):
        self.state = state
        self.access = access
        self.inventory = inventory
        self.rules = rules
        self.events = events
        self.submissions: list[tuple[NewJobs, asyncio.Future[list[Job]]]] = []  # to commit this turn
        self.burst_timer: asyncio.TimerHandle | None = None  # the cycle after a burst of submissions
        self.burst_started_at = 0.0  # loop time of the first submission no cycle has seen yet
        self.last_submit_at = 0.0
        # how far the look at a notebook job's notebook may go (c.GPUJobs.notebook_max_bytes, _check_timeout)
        self.input_bounds = Bounds()
        self.pulls = Pulls(state, events)  # jobs whose image is pulled before they may take GPUs

    async def submit(self, user: str, body: dict[str, Any]) -> list[Job]:
        """Validate and store a submission; returns the new job(s) (several for an array)
        once they are committed.

        Submissions that arrive in the same event-loop turn are committed together (group
        commit): validated one by one here, so a bad one fails alone with its InvalidInput,
        then inserted in one transaction by `store_submissions`.
        """
        new = await self.checked(user, body)
        future: asyncio.Future[list[Job]] = asyncio.get_running_loop().create_future()
        if not self.submissions:
            asyncio.get_running_loop().call_soon(self.store_submissions)
        self.submissions.append((new, future))
        return await future

    async def checked(self, user: str, body: dict[str, Any]) -> NewJobs:
        """Every check of a submission (`validated`, its folder and notebook looked at as the
        user, the caps on what one user may queue), storing nothing: `submit` stores what
        passes, a what-if (`whatif.WhatIf`) answers it. Raises InvalidInput."""
        new = self.validated(user, body)
        if new.specs:
            await self.check_cwd(user, body.get("cwd"), new.specs[0]["cwd"])
        if new.specs and new.specs[0].get("image") and not self.state.mirrored:  # as the user, off the loop
            await self.check_image(user, new.specs[0]["image"])
        if new.specs and new.specs[0]["kind"] == "notebook":  # looked at as the user, off the loop
            await check_notebook_files(new.specs[0]["payload"], run_as(user, self.state.run_as_owner),
                                       self.input_bounds, self.state.job_python)
        # (after any wait: the jobs of this turn's submissions count as waiting already)
        coming = sum(len(n.specs) for n, _ in self.submissions if n.actor == user)
        check_queue_caps(self.rules.current_policy(), self.access.is_admin(user),
                         self.state.pending_of.get(user, 0) + coming, len(new.specs), new.array)
        return new

    def validated(self, user: str, body: dict[str, Any]) -> NewJobs:
        """A submission checked and turned into the rows to store; raises InvalidInput."""
        s = self.state
        now = s.clock()
        inventory = self.inventory.inventory
        fields = validate_submission(body, inventory, s.policy, now)
        check_priority(self.rules.current_policy(), fields["priority"], user, self.access.is_admin(user))
        if s.mirrored and fields["kind"] in EXTERNAL_KINDS and not fields["command"]:
            raise InvalidInput("command", "a GPU kernel under the Slurm runner runs as a Slurm job and needs "
                                          "its launch command (the GPU kernel provisioner gives it)")
        if fields["nodes"] > 1 and not s.mirrored:
            raise InvalidInput("nodes", f"asks for {fields['nodes']} nodes, but this server runs jobs on its own "
                                        "GPUs (one host); multi-node jobs need the Slurm runner (c.GPUJobs.runner)")
        group = fields["group"]
        if group and s.group_members and user not in s.group_members.get(group, []):
            raise InvalidInput("group", f"user {user} is not a member of group {group!r}")
        never = Quotas(self.rules.current_policy()).never_starts(
            user, group, fields["gpus"], fields["time_limit_s"], fields["priority"] == "urgent",
            len(self.inventory.inventory))
        if never is not None:
            raise InvalidInput(*never)
        for dep in fields["depends"]:
            if s.active_job(dep.job_id) is None and s.store.get(dep.job_id) is None:
                raise InvalidInput("depends", f"no job {dep.job_id} to depend on")
        root = self.access.root_for(user)
        try:
            unix_user = run_as(user, s.run_as_owner)
        except NotAUnixUser as err:
            raise InvalidInput("user", str(err)) from None
        fields["cwd"] = _resolve_cwd(_at_home(fields["cwd"], unix_user, "cwd"), str(root))
        if unix_user is not None and not s.runner.runs_as_owner:
            raise InvalidInput("user", f"this engine runs as {_engine_user()} and its {s.runner.name} runner "
                                       f"would run the job as {_engine_user()}, not as {unix_user}: run the engine "
                                       "as the account that submits to the cluster (docs/slurm.md)")
        fields["image"] = self._image(fields["image"])
        memory_ok, cpu_ok = self.inventory.limits_enforceable()
        for key, ok, what in (("mem_bytes", memory_ok, "mem"), ("cpus", cpu_ok, "cpus")):
            if fields.get(key) is not None and not ok:
                raise InvalidInput(what, f"this machine cannot enforce a --{what} limit ({self.inventory.isolation})")
        if fields["kind"] == "notebook":
            from ..notebook.notebooks import check_notebook_payload

            payload = fields["payload"]
            if isinstance(payload, dict):
                payload = {**payload, **{key: _at_home(payload[key], unix_user, f"payload.{key}")
                                         for key in ("notebook", "output") if isinstance(payload.get(key), str)}}
            fields["payload"] = check_notebook_payload(payload, root)
        array = fields.pop("array")
        limit = fields.pop("array_max_running")
        base = {**fields, "user": user}
        if not array:
            return NewJobs([base], actor=user, now=now)
        return NewJobs([{**base, "array_index": i, "array_max_running": limit} for i in array],
                       actor=user, now=now, array=True)

    def store_submissions(self) -> None:
        """Commit the submissions that arrived since the last call (one event-loop turn) in
        one transaction, then answer each with its own jobs or its own error."""
        batch, self.submissions = self.submissions, []
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
        store = self.state.store
        try:
            outcomes: list[list[Job] | Exception] = list(store.add_submissions(batch))
            self.state.store_ok()
            return outcomes
        except StoreUnavailable as err:  # each alone would fail the same way
            self.state.note_store_trouble(err)
            return [err for _ in batch]
        except Exception as err:
            if len(batch) == 1:
                return [err]
            log.warning("gpujobs: storing %d submissions together failed (%s); storing them one by one",
                        len(batch), err)
        outcomes = []
        for new in batch:
            try:
                outcomes.append(store.add_submissions([new])[0])
            except Exception as err:
                outcomes.append(err)
        return outcomes

    def _accepted(self, jobs: list[Job], new: NewJobs) -> list[Job]:
        """Stored jobs join the engine's active set and are announced."""
        s = self.state
        if jobs and jobs[0].kind == "notebook":
            from ..notebook.notebooks import notebook_command

            for i, job in enumerate(jobs):
                command, payload = notebook_command(job, self.access.root_for(job.user), s.job_python or None)
                s.store.update_job(job.id, command=command, payload=payload)
                jobs[i] = replace(job, command=command, payload=payload)
        for job in jobs:
            s.keep(job)
            self.events.publish(job, {"job_id": job.id, "time": new.now, "state": "PENDING", "actor": new.actor,
                                      "reason": "submitted"})
            self.pulls.admit(job)  # (an image not there yet: it waits for its pull, not for GPUs)
        return jobs

    async def check_cwd(self, user: str, given: str | None, cwd: str) -> None:
        """The job's working folder `cwd` (from `given`, as submitted) looked at as the Unix
        user the job runs as, off the loop (`userfiles.check_directory`): it must be a folder
        they may enter, and a relative `given` must stay inside their root once their symbolic
        links are followed. A folder that is missing and one they may not reach get the same
        answer, whatever root could see behind a link. Raises InvalidInput("cwd", ...)."""
        unix_user = run_as(user, self.state.run_as_owner)
        who = unix_user or _engine_user()
        try:
            real = await check_directory(unix_user, cwd, self.input_bounds, self.state.job_python)
        except HelperFailed as err:
            raise InvalidInput("cwd", f"could not check {cwd} as {who}: {err}") from None
        if real is None:
            raise InvalidInput("cwd", f"no such directory, or {who} may not enter it: {cwd}")
        if given and not given.startswith(("/", "~")):
            root = os.path.realpath(self.access.root_for(user))
            if os.path.commonpath([root, real]) != root:
                raise InvalidInput("cwd", f"{given[:200]!r} leads outside the server's root directory; give a "
                                          "path inside it, or an absolute path")

    def _image(self, asked: str | None) -> str | None:
        """The image a job runs in (`asked`, else the site's default; None: the host's own
        environment), refused naming it when this engine cannot run it: a runner without
        containers, an image off the allow-list, a runtime that is not installed."""
        settings = self.state.containers
        image = settings.image_for(asked)
        if not image:
            return None
        runner = self.state.runner
        if not getattr(runner, "runs_containers", False):
            raise InvalidInput("image", f"image {image}: this server's {runner.name} runner runs no container "
                                        "images (docs/containers.md)")
        try:
            if self.state.mirrored:  # Slurm's nodes run it (c.Slurm.container_option): the allow-list only
                if not settings.allowed(image):
                    raise ImageProblem(f"image {image} is not allowed here; allowed: "
                                       f"{', '.join(settings.allowed_images)}")
            else:
                settings.check(image)
        except ImageProblem as err:
            raise InvalidInput("image", str(err)) from None
        return image

    async def check_image(self, user: str, image: str) -> None:
        """The job's image must be there for the Unix user it runs as, or be one a pull can
        fetch (with c.GPUJobs.container_pull: a registry reference, or a file or folder of this
        machine that user may read), which `Pulls` fetches before the job may take GPUs.
        Raises InvalidInput("image", ...) naming it."""
        settings = self.state.containers
        unix_user = run_as(user, self.state.run_as_owner)
        try:
            runtime = settings.check(image)
            source = runtime.local_source(image)
            if source is not None:
                if not settings.pull:
                    raise ImageProblem(f"image {image}: this site pulls no image for a job "
                                       "(c.GPUJobs.container_pull); load it first (podman load)")
                await check_readable(source, image, unix_user)
                return
            try:
                await check_present(runtime, image, unix_user)
            except ImageProblem:
                if not settings.pull or runtime.pull_command(image) is None:
                    raise
        except ImageProblem as err:
            raise InvalidInput("image", str(err)) from None

    # ------------------------------------------------------------------ the cycle after a burst

    def _wake_after_burst(self) -> None:
        """Submissions were stored: one cycle after their burst, not one per submission. The
        cycle waits until no submission came for SUBMIT_SETTLE_S, or at most SUBMIT_MAX_DELAY_S
        after the first submission that no cycle has seen yet."""
        loop = asyncio.get_running_loop()
        self.last_submit_at = loop.time()
        if self.burst_timer is None:
            self.burst_started_at = self.last_submit_at
            self.burst_timer = loop.call_later(self.SUBMIT_SETTLE_S, self._burst_check)

    def _burst_check(self) -> None:
        loop = asyncio.get_running_loop()
        due = min(self.last_submit_at + self.SUBMIT_SETTLE_S, self.burst_started_at + self.SUBMIT_MAX_DELAY_S)
        if loop.time() < due:
            self.burst_timer = loop.call_at(due, self._burst_check)
            return
        self.burst_timer = None
        self.state.wake()

    def seen_by_cycle(self) -> None:
        """A cycle starts: it sees every submission stored so far (no cycle for the burst)."""
        if self.burst_timer is not None:
            self.burst_timer.cancel()
            self.burst_timer = None


def _resolve_cwd(value: str | None, root_dir: str) -> str:
    """The working directory of a job as an absolute, normalised path.

    No cwd: the server's root. A relative cwd is taken from the root and must stay inside it,
    as the Jupyter file browser does: here its `..`, and once the folder is looked at as the
    user, its symbolic links (`Admission.check_cwd`). An absolute cwd is the user saying where
    they are (the CLI sends the shell's directory): it is accepted, normalised, because the job
    runs as its owner, who may enter it or not (`check_cwd` asks as them). Opens no file."""
    root = os.path.abspath(root_dir)
    if value is None or value == "":
        return root
    if os.path.isabs(value):
        return os.path.normpath(value)
    path = os.path.normpath(os.path.join(root, value))
    if os.path.commonpath([root, path]) != root:
        raise InvalidInput("cwd", f"{repr(value[:200])} leads outside the server's root directory; give a path "
                                  "inside it, or an absolute path")
    return path


def _at_home(value: Any, unix_user: str | None, field: str) -> Any:
    """A path given with a leading `~` made the home of the Unix user the job runs as (never
    the root engine's own home); InvalidInput when it names no home here."""
    if not isinstance(value, str) or not value.startswith("~"):
        return value
    path = expand_home(value, unix_user)
    if path is None:
        raise InvalidInput(field, f"{value[:200]!r}: no home folder here for {value.partition('/')[0]!r}; give an "
                                  "absolute path")
    return path


def _engine_user() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return f"uid {os.geteuid()}"
