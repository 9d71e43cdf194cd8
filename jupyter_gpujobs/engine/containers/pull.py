"""Pulls before GPUs (issue 29): a job whose image is not there for its owner waits while the
image is pulled (or loaded) as the owner, out of the scheduler's sight, and only then may take
GPUs: a pull never holds a GPU.

Owns `Pulls`:
- which pending jobs wait for their image (`EngineState.pulling`: the cycle leaves them out of
  its snapshot as it leaves jobs set aside; their reason is the pull's progress);
- one pull per (owner, image), whatever the number of that owner's jobs waiting for it, run as
  the owner (rootless podman, the runtime's `pull_command`; never as root for a user), its
  output appended to the log of each job waiting for it under the cap of the job's own output
  (c.GPUJobs.log_max_bytes, `runners.joblog.CappedLog`), of its lines only the last one kept
  (its first `MAX_LINE` bytes: the image id, or the failure);
- where the runner confines jobs in cgroups, a pull's own cgroup (`pull-<job id>-<stamp>`, made
  as a job's by `runners.cgroups`) from its first process on, with the memory and CPU limits of
  the jobs it is for; at its end whatever it left there is killed and the cgroup removed;
- a pull's end: its jobs become eligible, or end FAILED with a reason naming the image and the
  runtime's message; its time limit (c.GPUJobs.container_pull_timeout); a pull that no job
  waits for any more (they were cancelled) is stopped;
- after a restart (`resume`), every pending job in an image is made ready the same way: a pull
  under way when the engine stopped runs again.

May call: `containers` (the interface, the site's settings), `containers.present` (the check
as the owner), `runners.joblog` (a job's log), `runners.cgroups` (its cgroup), `runners.users`,
`events.Events` (a job's end, its publication) and `state.EngineState`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from ...model import Job, JobState, format_duration
from ..runners import cgroups
from ..runners.joblog import CappedLog, open_log
from ..runners.users import NotAUnixUser, account, run_as
from . import ImageProblem, Runtime
from .present import as_owner, check_present, known_present

if TYPE_CHECKING:
    from ..events import Events
    from ..state import EngineState

log = logging.getLogger("jupyter_gpujobs")
Limit = TypeVar("Limit", int, float)

#: how often a running pull looks whether any job still waits for it (cancelled: it is stopped)
WATCH_S = 0.5
#: how long a stopped pull has after SIGTERM before SIGKILL
STOP_GRACE_S = 5.0
#: what the last line of a pull from a local transport must be: the image's id, which its job
#: is run by (`Containers.pulled`); nothing else of the pull's output reaches a command line
IMAGE_ID = re.compile(r"[0-9a-f]{12,64}")
#: the most of one line of a pull's output the engine keeps (the last line names the image id
#: or the failure); the rest of a longer line goes to the log only
MAX_LINE = 4096
#: how much of a pull's output is read at once
CHUNK = 1 << 16


@dataclass
class _Pull:
    image: str
    unix_user: str | None
    runtime: Runtime
    jobs: set[int] = field(default_factory=set)  # the jobs waiting for it
    logs: dict[int, CappedLog] = field(default_factory=dict)  # job id -> its log, open for appending
    copied: int = 0  # layers (blobs) copied so far
    last: str = ""  # the last line of output, at most MAX_LINE bytes (podman's: the image id; on failure its error)
    proc: asyncio.subprocess.Process | None = None
    task: asyncio.Future[None] | None = None
    cgroups: dict[str, str] = field(default_factory=dict)  # where it runs ({}: none, `Pulls._confine`)
    mem_bytes: int | None = None  # its memory limit


class Pulls:
    def __init__(self, state: EngineState, events: Events):
        self.state = state
        self.events = events
        self.running: dict[tuple[str, str], _Pull] = {}  # (Unix user or "", image) -> its pull

    def admit(self, job: Job) -> None:
        """An accepted pending job in an image: eligible now when its image is known to be
        there for its owner, else it waits for a pull (or a check, after a restart)."""
        s = self.state
        if not job.image or s.mirrored:
            return
        try:
            unix_user = run_as(job.user, s.run_as_owner)
            runtime = s.containers.runtime_for(job.image)
        except (NotAUnixUser, ImageProblem) as err:  # (after a restart: a user or runtime gone)
            self._fail([job.id], job.image, str(err))
            return
        if known_present(job.image, unix_user):
            return
        if runtime.exists_command(job.image) is None and runtime.local_source(job.image) is None:
            return  # a runtime that looks up no image (none of ours: apptainer's .sif is looked at with test -r)
        key = (unix_user or "", job.image)
        pull = self.running.get(key)
        if pull is None:
            pull = self.running[key] = _Pull(job.image, unix_user, runtime)
            pull.task = asyncio.ensure_future(self._run(key, pull))
        pull.jobs.add(job.id)
        s.pulling.add(job.id)
        self._show(pull, job.id)

    def resume(self) -> None:
        """After a restart: every pending job in an image is made ready again (`admit`)."""
        for job in sorted(self.state.pending.values(), key=lambda j: j.id):
            if job.image:
                self.admit(job)

    async def stop(self) -> None:
        """The engine stops: its pulls stop with it (a restart pulls again)."""
        for pull in list(self.running.values()):
            _signal(pull.proc, signal.SIGKILL)
            if pull.task is not None:
                pull.task.cancel()
        for pull in list(self.running.values()):
            if pull.task is not None:
                try:
                    await pull.task
                except (asyncio.CancelledError, Exception):
                    pass

    # ------------------------------------------------------------------ one pull

    async def _run(self, key: tuple[str, str], pull: _Pull) -> None:
        try:
            error = await self._fetch(key, pull)
        except asyncio.CancelledError:
            self._close(pull)
            raise
        except Exception as err:
            log.exception("gpujobs: the pull of image %s for %s failed", pull.image, key[0] or "the engine's user")
            error = f"{type(err).__name__}: {err}"
        finally:
            if self.running.get(key) is pull:
                del self.running[key]
        waiting = self._waiting(pull)
        for job_id in pull.jobs:
            self.state.pulling.discard(job_id)
        self._close(pull)
        if error is not None:
            self._fail(waiting, pull.image, error)
            return
        s = self.state
        for job_id in waiting:  # eligible from the next cycle on: its reason is the plan's
            job = s.pending[job_id] = s.pending[job_id].replace(reason=None)
            self.events.publish(job, {"job_id": job_id, "time": s.clock(), "state": "PENDING", "actor": "engine",
                                      "reason": f"image {pull.image} is there"})
        if waiting:
            s.wake()

    async def _fetch(self, key: tuple[str, str], pull: _Pull) -> str | None:
        """None once the image is there for its owner, else why not."""
        settings = self.state.containers
        runtime, image = pull.runtime, pull.image
        command = runtime.pull_command(image)
        if runtime.exists_command(image) is not None:
            try:
                await check_present(runtime, image, pull.unix_user)
                return None
            except ImageProblem as err:
                if command is None or not settings.pull:
                    return str(err)
        if command is None:
            return runtime.missing_text(image)
        self._line(pull, f"[gpujobs] pulling image {image} as {pull.unix_user or 'the engine user'}, "
                         "before the job takes GPUs")
        self._record(pull, "PULLING", f"pulling image {image}")
        try:
            self._confine(pull)
        except OSError as err:
            return f"the pull could not be confined in a cgroup: {err.strerror or err}"
        try:
            return await self._pull(key, pull, command)
        finally:
            await _release(pull.cgroups)

    async def _pull(self, key: tuple[str, str], pull: _Pull, command: list[str]) -> str | None:
        """Run the pull's `command` (`_fetch`): None once it gave the image, else why not."""
        settings = self.state.containers
        runtime, image = pull.runtime, pull.image
        proc = pull.proc = await _spawn(command, pull.unix_user, pull.cgroups)
        assert proc.stdout is not None
        reader = asyncio.ensure_future(self._read(pull, proc.stdout))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + settings.pull_timeout_s
        try:
            while not reader.done():
                await asyncio.wait({reader}, timeout=max(0.0, min(WATCH_S, deadline - loop.time())))
                if reader.done():
                    break
                if not self._waiting(pull):
                    self.running.pop(key, None)  # (a job admitted while it stops gets a pull of its own)
                    return "no job waits for it any more"
                if loop.time() >= deadline:
                    self._line(pull, f"[gpujobs] the pull of {image} is stopped at its time limit")
                    return (f"the pull gave no image within {format_duration(settings.pull_timeout_s)} "
                            "(c.GPUJobs.container_pull_timeout)")
            reader.result()  # (its failure is the pull's: else the pull, its output unread, could last for ever)
            code = await proc.wait()
        finally:
            if proc.returncode is None:
                await _stop(proc)
            if not reader.done():
                reader.cancel()
        if code != 0 and pull.cgroups and cgroups.oom_killed(pull.cgroups):
            return f"the pull ran out of memory at its limit of {cgroups.format_bytes(pull.mem_bytes or 0)} (--mem)"
        if code != 0:
            said = pull.last.removeprefix("Error: ").strip() or f"{command[0]} exited with {code}"
            return f"could not be pulled: {said[:400]}"
        if runtime.local_source(image) is not None:  # run by its id (no name for it)
            image_id = pull.last.strip()
            if not IMAGE_ID.fullmatch(image_id):  # (else the job would fail at its start, holding GPUs)
                return f"the pull named no image id (its last line: {image_id[:200]!r})"
            self._name(pull, image_id)
        self._line(pull, f"[gpujobs] image {image} is there; the job waits for GPUs")
        self._record(pull, "PULLED", f"image {image} pulled")
        return None

    async def _read(self, pull: _Pull, stream: asyncio.StreamReader) -> None:
        """The pull's output, as it comes, into its jobs' logs (`_write`: capped); its lines'
        first `MAX_LINE` bytes looked at (`_take`), its progress as their reason."""
        line = b""  # the line under way: its first MAX_LINE bytes
        while True:
            chunk = await stream.read(CHUNK)
            if not chunk:
                break
            self._write(pull, chunk)
            *ended, rest = chunk.split(b"\n")
            for part in ended:
                self._take(pull, line + part[:MAX_LINE - len(line)])
                line = b""
            line += rest[:MAX_LINE - len(line)]
            for job_id in self._waiting(pull):
                self._show(pull, job_id)
        if line:  # a last line without its newline: one is added, so the engine's lines start their own
            self._take(pull, line)
            self._write(pull, b"\n")

    @staticmethod
    def _take(pull: _Pull, raw: bytes) -> None:
        """One line of the pull's output (at most MAX_LINE bytes of it): the last one kept, the
        layers copied counted."""
        text = raw.decode(errors="replace").strip()
        if text:
            pull.last = text
            if text.startswith("Copying blob"):
                pull.copied += 1

    def _confine(self, pull: _Pull) -> None:
        """The cgroups `pull` is to run in (`pull.cgroups`), made as the runner makes a job's
        (none where it confines no job: cgroups off or not writable here), with the memory and
        CPU limits of the jobs it is for (the largest; none where one of them has none). OSError
        when the host refuses them."""
        s = self.state
        iso = getattr(s.runner, "isolation", None)
        if iso is None or not iso.enabled:
            return
        jobs = [s.pending[j] for j in self._waiting(pull)]
        pull.mem_bytes = _largest([j.mem_bytes for j in jobs])
        cg = iso.paths(f"pull-{min(pull.jobs)}-{time.time_ns() // 1000:x}")  # (apart from another engine's)
        try:  # (0755 as a container job's: rootless podman reads its cgroup as the owner)
            cgroups.create(cg, (), pull.mem_bytes, _largest([j.cpus for j in jobs]), iso.v2_controllers, iso.bpf,
                           readable=True)
        except OSError:
            cgroups.remove(cg)
            raise
        pull.cgroups = cg

    # ------------------------------------------------------------------ its jobs

    def _name(self, pull: _Pull, image_id: str) -> None:
        """The jobs waiting for `pull` run in `image_id`, the image their pull named, whatever a
        later pull of the same reference names (`Containers.pulled`); the ids of jobs no longer
        pending or running are dropped there."""
        s = self.state
        pulled = s.containers.pulled
        for job_id in [j for j in pulled if s.active_job(j) is None]:
            del pulled[job_id]
        pulled.update(dict.fromkeys(self._waiting(pull), image_id))

    def _waiting(self, pull: _Pull) -> list[int]:
        """The jobs still pending that wait for `pull`."""
        return sorted(j for j in pull.jobs if j in self.state.pending)

    def _show(self, pull: _Pull, job_id: int) -> None:
        """The job's reason: the pull's progress (the view shows it, the panel with it)."""
        s = self.state
        job = s.pending.get(job_id)
        if job is None:
            return
        reason = f"pulling image {pull.image}" + (f": {pull.copied} layer(s) copied" if pull.copied else "") + \
                 "; the job takes GPUs once it is there"
        if job.reason != reason:
            s.pending[job_id] = job = job.replace(reason=reason)
            self.events.publish(job, {"job_id": job_id, "time": s.clock(), "state": "PENDING", "actor": "engine",
                                      "reason": reason})

    def _record(self, pull: _Pull, what: str, reason: str) -> None:
        """An event in the history of each job waiting for `pull` (PULLING, PULLED)."""
        s = self.state
        for job_id in self._waiting(pull):
            s.store.add_event(job_id, what, "engine", reason, s.clock())

    def _line(self, pull: _Pull, text: str) -> None:
        """A line of the engine's own into the log of each job waiting for `pull`."""
        self._write(pull, (text + "\n").encode())

    def _write(self, pull: _Pull, data: bytes) -> None:
        """`data` into the log of each job waiting for `pull` (the engine's own log folder; the
        log is its owner's, as the supervisor makes it), capped as the job's own output."""
        for job_id in self._waiting(pull):
            capped = pull.logs.get(job_id)
            try:
                if capped is None:
                    capped = pull.logs[job_id] = self._open_log(job_id, pull.unix_user)
                capped.write(data)
            except OSError as err:
                log.warning("gpujobs: writing the pull's output to the log of job %s failed: %s", job_id, err)

    def _open_log(self, job_id: int, unix_user: str | None) -> CappedLog:
        s = self.state
        path = s.state_dir / "logs" / f"job-{job_id}.log"
        os.makedirs(path.parent, mode=0o700, exist_ok=True)
        acct = account(unix_user)
        fd = open_log(str(path), (int(acct[1]), int(acct[2])) if acct else None)  # type: ignore[call-overload]
        s.store.update_job(job_id, log_path=str(path))
        # the cap of the job's own output (c.GPUJobs.log_max_bytes), which the runner keeps; none
        # where the runner has none (the job's output is not capped there either)
        return CappedLog(fd, int(getattr(s.runner, "log_max_bytes", 0) or 0))

    def _close(self, pull: _Pull) -> None:
        for capped in pull.logs.values():
            os.close(capped.fd)
        pull.logs.clear()

    def _fail(self, job_ids: list[int], image: str, error: str) -> None:
        reason = error if error.startswith(f"image {image}") else f"image {image}: {error}"
        for job_id in job_ids:  # (none of them in `state.pulling`: `_run` took them out)
            self.events.set_state(job_id, JobState.FAILED, "engine", reason, expect=(JobState.PENDING,))


def _largest(limits: list[Limit | None]) -> Limit | None:
    """The largest of the jobs' `limits`; None (no limit) when one of them has none, or no job."""
    if not limits or any(limit is None for limit in limits):
        return None
    return max(limit for limit in limits if limit is not None)


#: what a confined pull runs first, as its owner: it waits for the engine to move it into its
#: cgroups (a line on stdin), then becomes the pull, so nothing of the pull starts outside them
ENTER = ("/bin/sh", "-c", 'read -r _ && exec "$@"', "sh")


async def _spawn(command: list[str], unix_user: str | None, cg: dict[str, str]) -> asyncio.subprocess.Process:
    """The pull's process: `command` run as `unix_user` (`as_owner`), in its own session, its
    output (stderr with stdout) to read; in the cgroups `cg` before it execs the pull (`ENTER`).
    OSError when it cannot start or be moved there (then it is killed)."""
    proc = await asyncio.create_subprocess_exec(
        *([*ENTER, *command] if cg else command),
        stdin=asyncio.subprocess.PIPE if cg else asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT, cwd="/", start_new_session=True, close_fds=True, limit=CHUNK,
        **as_owner(unix_user))  # type: ignore[arg-type]
    if cg:
        assert proc.stdin is not None
        try:
            for path in cgroups.procs_files(cg):
                with open(path, "w") as f:
                    f.write(str(proc.pid))
            proc.stdin.write(b"\n")
            await proc.stdin.drain()
        except OSError:
            await _stop(proc)
            raise
        finally:
            proc.stdin.close()
    return proc


async def _release(cg: dict[str, str]) -> None:
    """A pull's cgroups once it ended: whatever of it is left there (a process it left behind)
    is killed, and they are removed."""
    if not cg:
        return
    cgroups.kill(cg)
    for _ in range(100):  # (the killed are gone at once, unless stuck in the kernel: then left to it)
        if not cgroups.populated(cg):
            break
        await asyncio.sleep(0.05)
    cgroups.remove(cg)


def _signal(proc: asyncio.subprocess.Process | None, sig: int) -> None:
    if proc is None or proc.returncode is not None:
        return
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


async def _stop(proc: asyncio.subprocess.Process) -> None:
    """Stop a pull and all it started (its own session): SIGTERM, then SIGKILL."""
    _signal(proc, signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), STOP_GRACE_S)
    except asyncio.TimeoutError:
        _signal(proc, signal.SIGKILL)
        await proc.wait()
