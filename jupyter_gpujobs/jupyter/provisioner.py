"""The GPU kernel provisioner: a kernel that waits in the GPU queue like any other job.

`GPUKernelProvisioner` (entry point `gpujobs-provisioner`) owns the life of one kernel's
allocation, from the request to the release. It is a jupyter_client `LocalProvisioner`: the
kernel is an ordinary local process, started only once the engine gave it GPUs.

- `pre_launch`: submit a job of kind `kernel` through the client (`AsyncGPUJobsClient`, never
  blocking the server's event loop), wait until it runs (at most `max_wait`; after it the job
  is cancelled and the start fails with a message saying so), then put the allocation into
  the kernel's environment (`CUDA_VISIBLE_DEVICES`, `NVIDIA_VISIBLE_DEVICES`,
  `CUDA_DEVICE_ORDER=PCI_BUS_ID`, `GPUJOBS_JOB_ID`, ...). A restart keeps the job.
- `post_launch`: the engine is asked to confine the kernel's process in its job's cgroup
  (`POST jobs/{id}/adopt`: device fence, limits), so its time limit and GPU release hold even
  if this server dies; and a watcher task polls the kernel process and the job every `poll_interval`:
  the job ended by the engine (time limit, cancel, preemption) -> the kernel is shut down;
  the process gone on its own -> the job ends FAILED "kernel died"; no execution and ~0 %
  use of its GPUs for `idle_timeout` -> the job ends CANCELLED "idle for ..." and the kernel
  is shut down.
- `cleanup`: the job ends COMPLETED "kernel shut down" (kept on `cleanup(restart=True)`).
- Server restarts: each allocation is recorded in a small file in Jupyter's runtime dir
  (and in `get_provisioner_info`); `reconcile_kernel_jobs` ends the jobs whose kernel is gone.

Nothing here talks to the store: everything goes through the REST API. The Slurm path
(slurm_kernel.py) gets this provisioner as a `KernelHost` (kernel_host.py, which also holds
`GPUKernelStartError`), and neither module imports the other's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any

from jupyter_client.connect import KernelConnectionInfo
from jupyter_client.provisioning import LocalProvisioner
from jupyter_core.paths import jupyter_runtime_dir
from jupyter_core.utils import ensure_async
from traitlets import Bool, Float, Integer, Unicode, Union

from ..client import FINAL_STATES, AsyncGPUJobsClient, GPUJobsError
from ..model import (
    InvalidInput,
    format_duration,
    parse_duration,
    parse_gpu_memory,
    parse_gpus,
    parse_image,
    parse_priority,
    parse_warn_signal,
)
from .kernel_host import GPUKernelStartError
from .slurm_kernel import SlurmKernel, engine_runner

PROVISIONER_NAME = "gpujobs-provisioner"
#: The IPython extension that prints the time-limit notice in the kernel's cells.
NOTICE_EXTENSION = "jupyter_gpujobs.notebook.kernel_notice"

#: Provisioners alive in this process (for the shutdown release and the reconciliation).
_LIVE: weakref.WeakSet[GPUKernelProvisioner] = weakref.WeakSet()
#: Engines whose stale kernel jobs this process already reconciled.
_RECONCILED: set[str] = set()
#: Background tasks started here (kept referenced until done).
_TASKS: set[asyncio.Task[Any]] = set()
#: One client per (engine, token, event loop), shared by the kernels of this process: making
#: an httpx client (its SSL context) costs tens of milliseconds, a kernel start's budget.
_CLIENTS: dict[tuple[str | None, str | None, int], AsyncGPUJobsClient] = {}
#: Engine URL -> {GPU index: uuid} and whether its GPUs are fake (the inventory does not change).
_GPU_INFO: dict[str, tuple[dict[int, str], bool, str | None]] = {}
#: Engine URL -> {GPU index: memory MB}, for the memory hints of a kernel on a share of a GPU.
_GPU_MEMORY: dict[str, dict[int, int]] = {}


def _spawn(coro: Any) -> asyncio.Task[Any]:
    task = asyncio.ensure_future(coro)
    _TASKS.add(task)
    task.add_done_callback(_TASKS.discard)
    return task


def human_duration(seconds: float) -> str:
    """`1800` -> "30 min", `7200` -> "2 h", `5` -> "5 s", `90` -> "1m30s"."""
    seconds = int(round(seconds))
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds // 3600} h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds // 60} min"
    if seconds < 60:
        return f"{seconds} s"
    return format_duration(seconds)


def _optional_duration(value: Any, field: str) -> int | None:
    """None, "", 0 or "0" mean "no limit"; anything else is a duration."""
    if value in (None, "", 0, "0", "none", "off"):
        return None
    return parse_duration(value, field)


def _is_ipykernel(cmd: list[str]) -> bool:
    """An IPython kernel's command line (`python -m ipykernel_launcher -f ...`), which takes
    IPKernelApp options; other kernels (R, Julia...) get no extra argument."""
    return any(os.path.basename(part).startswith("ipykernel") for part in cmd)


def _pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        import psutil

        proc = psutil.Process(int(pid))
        return proc.status() != psutil.STATUS_ZOMBIE
    except Exception:
        return False


def state_dir() -> Path:
    """Where this machine's GPU kernels record their allocations (one JSON file per job)."""
    return Path(jupyter_runtime_dir()) / "gpujobs-kernels"


class GPUKernelProvisioner(LocalProvisioner):  # type: ignore[misc]
    """Starts a local kernel on GPUs allocated by the jupyter-gpujobs queue.

    Every setting can come from the kernelspec (`metadata.kernel_provisioner.config`) or from
    Jupyter config (`c.GPUKernelProvisioner.<name>`); the kernelspec wins.
    """

    gpus = Union([Integer(), Float(), Unicode()], default_value=1, config=True,
                 help="GPUs the kernel asks for, or a share of one GPU below 1 (e.g. 0.5: half of one "
                      "card's memory and time, beside other shares).")
    gpu_memory = Union([Integer(), Unicode()], default_value=None, allow_none=True, config=True,
                       help="GPU memory the kernel asks for on one shared GPU, e.g. '16G' (None: a whole "
                            "GPU, or the share `gpus` gives).")
    gpu_type = Unicode(None, allow_none=True, config=True, help="GPU model, e.g. 'A100' (None: any).")
    time_limit = Union([Integer(), Unicode()], default_value=None, allow_none=True, config=True,
                       help="Time limit of the kernel's GPU job, e.g. '4h' (None: the engine's default). "
                            "It counts from the kernel's first start; restarts do not reset it.")
    priority = Unicode("normal", config=True, help="Priority class: low, normal, high or urgent.")
    signal = Unicode(None, allow_none=True, config=True,
                     help="A signal sent to the kernel before its time limit, as Slurm's --signal: 'USR1@5m' "
                          "(the kernel must handle it, e.g. with jupyter_gpujobs.checkpoint.on_signal; "
                          "GPUJOBS_SIGNAL names it in the kernel).")
    idle_timeout = Union([Integer(), Unicode()], default_value=None, allow_none=True, config=True,
                         help="Shut the kernel down after this long with no execution and ~0 % use of "
                              "its GPUs, e.g. '30m' (None or 0: never).")
    max_wait = Union([Integer(), Unicode()], default_value="1h", allow_none=True, config=True,
                     help="Longest wait in the queue before the start fails and the job is cancelled "
                          "(None or 0: no limit). Jupyter's own start timeouts do not apply to this "
                          "wait: it happens before the kernel process exists.")
    idle_gpu_threshold = Float(5.0, config=True,
                               help="Utilization (percent) under which a GPU counts as unused.")
    poll_interval = Float(1.0, config=True,
                          help="Seconds between two checks of the kernel process and of its job.")
    request_timeout = Float(15.0, config=True, help="Timeout of one request to the engine (seconds).")
    autorestart = Bool(False, config=True,
                       help="Let Jupyter restart a GPU kernel that died by itself. Off (default): its job "
                            "ends FAILED 'kernel died', its GPUs go back to the queue and the notebook "
                            "shows the kernel as dead. On: the restart queues a new job.")
    image = Unicode(None, allow_none=True, config=True,
                    help="Container image the kernel runs in (docs/containers.md), e.g. localhost/pytorch:2.3: "
                         "the kernel's command runs there, as the user, on its GPUs alone; ipykernel must be "
                         "in the image or mounted into it by the site. None: the host's (or the site's default).")
    mark_fake_gpu_use = Bool(True, config=True,
                             help="On fake GPUs, set GPUJOBS_FAKE=1 in the kernel so the fake backend counts "
                                  "the kernel's CPU load as its GPUs' utilization (as it does for jobs).")
    notice_in_kernel = Bool(True, config=True,
                            help="In an IPython kernel, end each cell that runs after the job's time-limit "
                                 "warning with a line saying when the kernel will be shut down "
                                 "(jupyter_gpujobs.notebook.kernel_notice, loaded with --IPKernelApp.extra_extensions).")
    url = Unicode("", config=True, help="Engine URL (default: GPUJOBS_URL, set by the server extension).")
    token = Unicode("", config=True, help="Engine token (default: GPUJOBS_TOKEN).")

    # --- state (not configuration)
    job_id: int | None = None
    _client: AsyncGPUJobsClient | None = None
    _watcher: asyncio.Task[Any] | None = None
    _stopping = False  # the kernel manager is stopping the kernel (not a crash)
    _job_final = False  # the job is known to have ended
    _keep_record = False  # its end could not be reported: leave the record for reconciliation
    _inherited = False  # started inside a job that already holds GPUs: no queueing
    _idle_since = 0.0
    _deadline: float | None = None  # epoch seconds of the job's time limit
    _signal_at: float | None = None  # when the kernelspec's signal before the end is due (epoch seconds)
    _signal: int | None = None
    _pending_end: tuple[str, str] | None = None  # how cleanup() ends the job (idle, time limit)
    _fake_gpus = False
    _slurm: SlurmKernel | None = None  # the engine hands jobs to Slurm: the kernel is a Slurm job
    _image: str | None = None  # the image its job runs in (None: the host)
    _go_file: str | None = None  # a kernel in an image: where its launcher waits for its container
    _container: dict[str, Any] | None = None  # ... and the container it runs in (the engine's answer)

    # ================================================================= settings

    def _settings(self) -> dict[str, Any]:
        """The request, validated; a bad kernelspec fails the start with a 400 naming the field."""
        try:
            gpus, share = parse_gpus(self.gpus, "gpus")
            if gpus < 1:
                raise InvalidInput("gpus", "a GPU kernel needs at least 1 GPU or a share of one, e.g. 0.5")
            memory = parse_gpu_memory(self.gpu_memory) if self.gpu_memory not in (None, "") else None
            return {
                "gpus": gpus,
                "share": share,
                "gpu_memory": memory,
                "gpu_type": self.gpu_type or None,
                "time_limit": _optional_duration(self.time_limit, "time_limit"),
                "priority": parse_priority(self.priority or "normal"),
                "idle_timeout": _optional_duration(self.idle_timeout, "idle_timeout"),
                "max_wait": _optional_duration(self.max_wait, "max_wait"),
                # a signal before the time limit (`--signal USR1@5m`), only when the kernelspec asks
                **({"signal": parse_warn_signal(self.signal, None, "signal").text()} if self.signal else {}),
                **({"image": parse_image(self.image)} if self.image is not None else {}),
            }
        except InvalidInput as err:
            raise GPUKernelStartError(f"kernelspec {self._spec_name()!r}: {err}", 400) from None

    def _spec_name(self) -> str:
        return getattr(self.parent, "kernel_name", "") or (self.kernel_spec.display_name if self.kernel_spec else "")

    async def _get_client(self) -> AsyncGPUJobsClient:
        if self._client is None:
            url = self.url or os.environ.get("GPUJOBS_URL") or None
            token = self.token or None
            key = (url, token, id(asyncio.get_running_loop()))
            client = _CLIENTS.get(key)
            if client is None:
                try:
                    if url:
                        client = AsyncGPUJobsClient(url, token, self.request_timeout)
                    else:  # finding a running server does blocking I/O: keep it off the event loop
                        client = await asyncio.to_thread(AsyncGPUJobsClient, None, token, self.request_timeout)
                except GPUJobsError as err:
                    raise GPUKernelStartError(f"cannot queue a GPU kernel: {err.message}") from None
                _CLIENTS[key] = client
            self._client = client
        return self._client

    # ================================================================= launch

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        """Wait for an allocation (or keep the one of a restart), then prepare the launch."""
        self._stopping = False
        _LIVE.add(self)
        if os.environ.get("GPUJOBS_JOB_ID") and os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
            # A kernel started inside a job (a queued notebook): it already holds its GPUs.
            self._inherited = True
            self.log.info("gpujobs: kernel inside job %s uses its GPUs (%s); not queueing",
                          os.environ["GPUJOBS_JOB_ID"], os.environ["CUDA_VISIBLE_DEVICES"])
            return await super().pre_launch(**kwargs)
        settings = self._settings()
        self._slurm = None
        if await engine_runner(await self._get_client()) == "slurm":
            # the kernel runs as a Slurm job, submitted with its command line in launch_kernel
            self._slurm = SlurmKernel(self)
            return await super().pre_launch(**kwargs)
        job = await self._allocation(settings)
        self._remember(job)
        self._image = job.get("image")  # (the site's default image when the kernelspec names none)
        kwargs = await super().pre_launch(**kwargs)
        kwargs["env"].update(await self._gpu_env(job))
        return kwargs

    async def _allocation(self, settings: dict[str, Any], command: list[str] | None = None,
                          **extra: Any) -> dict[str, Any]:
        """Queue the kernel's job (a Slurm kernel's with its `command`) and wait until it runs."""
        client = await self._get_client()
        if client.url not in _RECONCILED:
            _RECONCILED.add(client.url)
            with contextlib.suppress(Exception):
                await reconcile_kernel_jobs(client)
        if self.job_id is not None and not self._job_final and command is None:
            # a restart: keep the allocation if the job still runs
            try:
                job = await client.job(self.job_id)
            except GPUJobsError:
                job = None
            if job is not None and job["state"] == "RUNNING":
                self.log.info("gpujobs: kernel %s restarts on its job %s (GPUs %s)", self.kernel_id,
                              self.job_id, job["assigned_gpus"])
                return job
        self._forget_job()
        name = self._spec_name()
        try:
            job = await client.submit(
                command, **extra, kind="kernel", name=f"kernel {name}".strip(),
                gpus=settings["share"] if settings["share"] is not None else settings["gpus"],
                gpu_memory=f"{settings['gpu_memory'] >> 20}M" if settings["gpu_memory"] is not None else None,
                gpu_type=settings["gpu_type"], time_limit=settings["time_limit"],
                priority=settings["priority"], signal=settings.get("signal"), image=settings.get("image"),
                payload={"kernel_id": self.kernel_id, "kernelspec": name, "server_pid": os.getpid(),
                         # the engine reclaims an idle kernel whose server is gone
                         "idle_timeout": settings["idle_timeout"]},
            )
        except GPUJobsError as err:
            field = f" ({err.field})" if err.field and not err.message.startswith(err.field) else ""
            status = 400 if err.status and 400 <= err.status < 500 else 503
            raise GPUKernelStartError(f"the GPU queue refused kernel {name!r}{field}: {err.message}",
                                      status) from None
        self.job_id = int(job["id"])
        self._job_final = self._keep_record = False
        self._write_state(kernel_pid=None)
        try:
            return await self._wait_for_start(client, job, settings["max_wait"])
        except BaseException:
            # gave up, failed, or the server is stopping: never leave the request queued
            if not self._job_final:
                with contextlib.suppress(BaseException):
                    await asyncio.shield(client.cancel(self.job_id))
            self._forget_job()
            raise

    async def _wait_for_start(self, client: AsyncGPUJobsClient, job: dict[str, Any],
                              max_wait: int | None) -> dict[str, Any]:
        t0 = time.monotonic()
        deadline = None if max_wait is None else t0 + max_wait
        interval = 0.01
        next_note = t0 + 30.0
        while True:
            if job["state"] == "RUNNING":
                waited = time.monotonic() - t0
                if waited > 1:
                    self.log.info("gpujobs: kernel job %s got GPUs %s after %.0fs in the queue", job["id"],
                                  job["assigned_gpus"], waited)
                return job
            if job["state"] in FINAL_STATES:
                self._job_final = True
                raise GPUKernelStartError(
                    f"GPU kernel job {job['id']} ended before the kernel started: {job['state']} "
                    f"({job.get('reason') or 'no reason given'})")
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                where = f" at position {job['position']}" if job.get("position") else ""
                why = f" ({job['reason']})" if job.get("reason") else ""
                raise GPUKernelStartError(
                    f"no GPU became free for kernel {self._spec_name()!r} within {format_duration(max_wait)} "
                    f"(max_wait); its job {job['id']} was cancelled. It was waiting{where}{why}.")
            if now >= next_note:
                next_note = now + 60.0
                self.log.info("gpujobs: kernel job %s waiting in the queue%s: %s", job["id"],
                              f" (position {job['position']})" if job.get("position") else "", job.get("reason"))
            sleep = interval if deadline is None else max(0.0, min(interval, deadline - now))
            await asyncio.sleep(sleep)
            interval = min(interval * 1.5, 0.5)
            try:
                job = await client.job(job["id"])
            except GPUJobsError as err:
                if err.status == 404:
                    raise GPUKernelStartError(f"GPU kernel job {job['id']} disappeared from the queue") from None
                self.log.warning("gpujobs: cannot read kernel job %s (%s); retrying", job["id"], err.message)

    def _remember(self, job: dict[str, Any]) -> None:
        started, limit = job.get("started_at"), job.get("time_limit_s")
        self._deadline = float(started) + float(limit) if started and limit else None
        warning = parse_warn_signal(job["warn_signal"]) if job.get("warn_signal") else None
        self._signal_at = (self._deadline - warning.before_s if warning is not None and self._deadline else None)
        self._signal = getattr(signal, "SIG" + warning.name) if warning is not None else None
        self._pending_end = None

    async def _gpu_env(self, job: dict[str, Any]) -> dict[str, str]:
        indices = ",".join(str(i) for i in job["assigned_gpus"])
        env = {
            "CUDA_VISIBLE_DEVICES": indices,
            "NVIDIA_VISIBLE_DEVICES": indices,
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "GPUJOBS_JOB_ID": str(job["id"]),
        }
        if job.get("time_limit_s"):
            env["GPUJOBS_TIME_LIMIT"] = str(job["time_limit_s"])
        warning = parse_warn_signal(job["warn_signal"]) if job.get("warn_signal") else None
        if warning is not None:  # for jupyter_gpujobs.checkpoint in the kernel
            env["GPUJOBS_SIGNAL"], env["GPUJOBS_SIGNAL_BEFORE"] = warning.name, str(warning.before_s)
        for field, name in (("ends_at", "GPUJOBS_ENDS_AT"), ("warn_at", "GPUJOBS_WARN_AT")):
            if job.get(field) is not None:  # epoch seconds, for the in-kernel notice
                env[name] = repr(float(job[field]))
        client = await self._get_client()
        uuids, fake, fleet = _GPU_INFO.get(client.url, ({}, False, None))
        if not all(i in uuids for i in job["assigned_gpus"]):
            try:
                answer = await client.gpu_report()
                mine = [g for g in answer["gpus"] if g.get("host") in (None, job.get("host"))]
                uuids = {int(g["index"]): str(g["uuid"]) for g in mine}
                fake = answer.get("backend") == "fake"
                fleet = answer.get("fake_fleet")
                _GPU_INFO[client.url] = (uuids, fake, fleet)
                _GPU_MEMORY[client.url] = {int(g["index"]): int(g.get("memory_total_mb") or 0) for g in mine}
            except (GPUJobsError, KeyError, TypeError, ValueError):
                pass
        if all(i in uuids for i in job["assigned_gpus"]):
            env["GPUJOBS_GPU_UUIDS"] = ",".join(uuids[i] for i in job["assigned_gpus"])
            # a MIG instance is addressed by its UUID only
            visible = ",".join(uuids[i] if uuids[i].startswith("MIG-") else str(i) for i in job["assigned_gpus"])
            env["CUDA_VISIBLE_DEVICES"] = env["NVIDIA_VISIBLE_DEVICES"] = visible
        total_mb = _GPU_MEMORY.get(client.url, {}).get(job["assigned_gpus"][0], 0) if job["assigned_gpus"] else 0
        if total_mb and (job.get("share") is not None or job.get("gpu_memory") is not None):
            # a share of one GPU: the memory hints a script job gets (engine/shares.py)
            from ..engine.shares import share_environment

            total = total_mb << 20
            limit = int(job["gpu_memory"]) if job.get("gpu_memory") is not None else int(float(job["share"]) * total)
            hints, facts = share_environment(limit, total, job.get("share"))
            env.update({**hints, **facts})
        self._fake_gpus = fake
        if self._fake_gpus and self.mark_fake_gpu_use:
            env["GPUJOBS_FAKE"] = "1"  # the fake backend sees the kernel on its GPUs
            if fleet:  # ... on this engine's alone, not on every fake GPU N of the machine
                env["GPUJOBS_FAKE_FLEET"] = str(fleet)
        return env

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> KernelConnectionInfo:
        if (self.job_id is not None or self._slurm) and self.notice_in_kernel and _is_ipykernel(cmd):
            cmd = [*cmd, f"--IPKernelApp.extra_extensions={NOTICE_EXTENSION}"]
        if self._slurm is not None:
            self.connection_info = await self._slurm.launch(cmd, self.parent.connection_file, kwargs.get("env") or {},
                                                            kwargs.get("cwd"), self._settings())
            return self.connection_info
        self._go_file = None
        if self.job_id is not None and self._image:
            # in its image: a launcher that becomes the container once the engine confined it (_confine)
            self._go_file = os.path.join(tempfile.mkdtemp(prefix="gpujobs-kernel-"), "go.json")
            cmd = [sys.executable, "-m", "jupyter_gpujobs.engine.containers.kernel", self._go_file, "--", *cmd]
        info = await super().launch_kernel(cmd, **kwargs)
        if self.job_id is not None:
            self._write_state(kernel_pid=self.pid)
        return info

    async def post_launch(self, **kwargs: Any) -> None:
        await super().post_launch(**kwargs)
        if self._inherited or self.job_id is None:
            return
        restarter = getattr(self.parent, "_restarter", None)
        if restarter is not None and not self.autorestart:
            # a crashed GPU kernel is not relaunched on its GPUs: its job ends (see _watch)
            restarter.restart_limit = 0
        self._idle_since = time.time()
        self._start_watcher()
        if self.pid:
            _spawn(self._confine(self.job_id, int(self.pid)))

    async def _confine(self, job_id: int, pid: int) -> None:
        """Have the engine confine the kernel in its job's cgroup (device fence, limits), so its
        time limit and GPU release hold even if this server dies. Off the start's path: the
        kernel is usable meanwhile. Where the host has no cgroups the engine says so, once."""
        try:
            answer = await (await self._get_client()).adopt(job_id, pid)
        except (GPUJobsError, GPUKernelStartError) as err:
            self.log.warning("gpujobs: kernel %s is not confined by the engine: %s", self.kernel_id,
                             getattr(err, "message", err))
            self._tell_launcher({"error": f"the engine did not confine the kernel: {getattr(err, 'message', err)}"})
            return
        self._tell_launcher(answer)
        if not answer.get("confined"):
            self.log.info("gpujobs: kernel %s runs unconfined (%s)", self.kernel_id, answer.get("isolation"))

    def _tell_launcher(self, answer: dict[str, Any]) -> None:
        """A kernel in an image: hand its launcher the engine's answer (its container), now that
        the launcher is in the job's cgroup (engine/containers/kernel.py)."""
        go, self._go_file = self._go_file, None
        if go is None:
            return
        self._container = answer.get("container")
        with open(go + ".tmp", "w") as f:
            json.dump(answer, f)
        os.rename(go + ".tmp", go)

    async def _remove_container(self) -> None:
        """A kernel in an image, once stopped: what its runtime keeps of its container (podman
        keeps a killed one's record and writable layer), removed as this server's user."""
        container, self._container = self._container, None
        if not container:
            return
        from ..engine.containers import cleanup

        argv = cleanup(container)
        if not argv:
            return
        import pwd

        env = {**os.environ, "HOME": pwd.getpwuid(os.getuid()).pw_dir}  # where the launcher's podman looked
        try:
            proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL,
                                                        stdout=asyncio.subprocess.DEVNULL,
                                                        stderr=asyncio.subprocess.DEVNULL, env=env, cwd="/")
            await asyncio.wait_for(proc.wait(), 30)
        except (OSError, asyncio.TimeoutError) as err:
            self.log.warning("gpujobs: could not remove kernel %s's container: %s", self.kernel_id, err)

    # ================================================================= watching

    def _start_watcher(self) -> None:
        if self._watcher is None or self._watcher.done():
            self._watcher = _spawn(self._watch())

    async def _stop_watcher(self) -> None:
        task, self._watcher = self._watcher, None
        if task is None or task.done() or task is asyncio.current_task():
            return
        task.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(task, 2.0)

    def _exit_status(self) -> tuple[bool, int | None]:
        """(the kernel process has exited, its return code when known)."""
        if self._slurm is not None:
            return False, None  # a Slurm kernel's end is its job's end, which the watcher reads
        if self.process is not None:
            rc = self.process.poll()
            return rc is not None, rc
        if self.pid:  # re-attached after load_provisioner_info: no Popen, only a pid
            return (not _pid_alive(self.pid)), None
        return False, None

    async def _watch(self) -> None:
        """Poll the kernel process and the job; act on a crash, an end and idleness."""
        settings = self._settings()
        idle_timeout = settings["idle_timeout"]
        while True:
            pause = self.poll_interval
            if self._deadline is not None:
                pause = max(0.0, min(pause, self._deadline - time.time()))
            if self._signal_at is not None:
                pause = max(0.0, min(pause, self._signal_at - time.time()))
            await asyncio.sleep(pause)
            if self._stopping or self.job_id is None:
                return
            exited, rc = self._exit_status()
            if exited:
                await self._on_exit(rc)
                return
            if self._signal_at is not None and time.time() >= self._signal_at and self._signal is not None:
                self._signal_at = None  # the signal the kernelspec asks for before the time limit
                self.log.info("gpujobs: kernel %s: sending SIG%s before its time limit", self.kernel_id,
                              signal.Signals(self._signal).name[3:])
                with contextlib.suppress(Exception):
                    await self.send_signal(self._signal)
            try:
                client = await self._get_client()
                job = await client.job(self.job_id)
            except (GPUJobsError, GPUKernelStartError) as err:
                self.log.debug("gpujobs: cannot read kernel job %s: %s", self.job_id, err)
                continue
            if self._deadline is not None and time.time() >= self._deadline and job["state"] == "RUNNING":
                # stop the kernel at its limit rather than one engine tick and one poll later
                reason = f"time limit of {format_duration(job['time_limit_s'])} reached"
                self.log.warning("gpujobs: kernel %s: %s; shutting it down and releasing GPU job %s",
                                 self.kernel_id, reason, self.job_id)
                self._pending_end = ("TIMEOUT", reason)
                _spawn(self._shutdown_kernel())
                return
            if job["state"] in FINAL_STATES:
                self._job_final = True
                self.log.warning("gpujobs: kernel %s: its GPU job %s ended (%s: %s); shutting the kernel down",
                                 self.kernel_id, self.job_id, job["state"], job.get("reason"))
                _spawn(self._shutdown_kernel())
                return
            if idle_timeout and await self._idle_for(client, idle_timeout):
                reason = f"idle for {human_duration(idle_timeout)}"
                self.log.warning("gpujobs: kernel %s %s; shutting it down and releasing GPU job %s",
                                 self.kernel_id, reason, self.job_id)
                self._pending_end = ("CANCELLED", reason)  # ended once the process is gone
                _spawn(self._shutdown_kernel())
                return

    async def _idle_for(self, client: AsyncGPUJobsClient, idle_timeout: int) -> bool:
        """Has the kernel run nothing, and its GPUs done ~nothing, for `idle_timeout`?"""
        km = self.parent
        state = getattr(km, "execution_state", None)
        if state is None:
            return False  # no activity tracking (not under jupyter_server): cannot tell
        now = time.time()
        if state == "busy":
            self._idle_since = now
            return False
        last = getattr(km, "last_activity", None)
        if last is not None:
            with contextlib.suppress(Exception):
                self._idle_since = max(self._idle_since, last.timestamp())
        if now - self._idle_since < idle_timeout:
            return False
        try:
            gpus = await client.gpus()
        except GPUJobsError:
            return False
        use = max((g.get("utilization") or 0.0 for g in gpus if g.get("job_id") == self.job_id), default=0.0)
        if use >= self.idle_gpu_threshold:
            self._idle_since = now  # no cell runs, but its GPUs work (a background thread)
            return False
        return True

    async def _on_exit(self, rc: int | None) -> None:
        """The kernel process ended without being asked to."""
        if self._deadline is not None and time.time() >= self._deadline:
            state, reason = "TIMEOUT", "time limit reached"  # the engine stopped it at the limit
        elif rc == 0:
            state, reason = "COMPLETED", "kernel exited"
        elif rc is not None and rc < 0:
            try:
                name = signal.Signals(-rc).name
            except ValueError:
                name = str(-rc)
            state, reason = "FAILED", f"kernel died ({name})"
        elif rc is not None:
            state, reason = "FAILED", f"kernel died (exit code {rc})"
        else:
            state, reason = "FAILED", "kernel died"
        self.log.warning("gpujobs: kernel %s: %s; releasing GPU job %s", self.kernel_id, reason, self.job_id)
        await self._end(state, reason)
        self._forget_job()  # an automatic restart (autorestart=True) queues a new job
        if not self.autorestart:
            _LIVE.discard(self)  # Jupyter drops the dead kernel without a cleanup

    async def _shutdown_kernel(self) -> None:
        """Shut this kernel down the way the server would (so it leaves the kernel list)."""
        km = self.parent
        mkm = getattr(km, "parent", None)
        kernel_id = self.kernel_id
        if self._slurm is not None and self._pending_end:
            await self._end(*self._pending_end)  # recorded before the kernel's exit ends its Slurm job
        try:
            if mkm is not None and hasattr(mkm, "shutdown_kernel") and kernel_id in mkm:
                await ensure_async(mkm.shutdown_kernel(kernel_id))
                return
            if km is not None and hasattr(km, "shutdown_kernel"):
                await ensure_async(km.shutdown_kernel())
                return
        except Exception:
            self.log.exception("gpujobs: graceful shutdown of kernel %s failed; killing it", kernel_id)
        await self.kill()
        await self.cleanup()

    async def _end(self, state: str, reason: str) -> None:
        """Report the end of the job (once); errors are logged, never raised."""
        if self.job_id is None or self._job_final:
            return
        self._job_final = True
        try:
            client = await self._get_client()
            await asyncio.wait_for(client.end(self.job_id, state, reason), self.request_timeout)
        except Exception as err:
            self.log.warning("gpujobs: could not report the end of kernel job %s (%s); it will be "
                             "reconciled: %s", self.job_id, state, err)
            self._keep_record = True
            return
        self._remove_state()

    # ================================================================= stopping

    async def shutdown_requested(self, restart: bool = False) -> None:
        self._stopping = True
        await super().shutdown_requested(restart=restart)

    async def _note_crash_before_stop(self) -> None:
        if not self._stopping and self.job_id is not None and not self._inherited:
            exited, rc = self._exit_status()
            if exited:  # e.g. the restarter found it dead before the watcher did
                await self._stop_watcher()
                await self._on_exit(rc)
        self._stopping = True

    async def terminate(self, restart: bool = False) -> None:
        await self._note_crash_before_stop()
        if self._slurm is not None:
            return await self._slurm_stop()
        await super().terminate(restart=restart)

    async def kill(self, restart: bool = False) -> None:
        await self._note_crash_before_stop()
        if self._slurm is not None:
            return await self._slurm_stop()
        await super().kill(restart=restart)

    # ================================================================= a kernel on a Slurm node

    async def _slurm_stop(self) -> None:
        assert self._slurm is not None
        await self._slurm.end(*(("COMPLETED", "kernel shut down") if self._stopping else ("CANCELLED", "kernel killed")))

    @property
    def has_process(self) -> bool:
        if self._slurm is not None:
            return self.job_id is not None and self._slurm.state not in FINAL_STATES
        return bool(super().has_process)

    async def poll(self) -> int | None:
        if self._slurm is not None:
            return await self._slurm.poll()
        return await super().poll()

    async def wait(self) -> int | None:
        if self._slurm is None:
            return await super().wait()
        while (rc := await self._slurm.poll()) is None:
            await asyncio.sleep(0.1)
        return rc

    async def send_signal(self, signum: int) -> None:
        if self._slurm is None:
            return await super().send_signal(signum)
        if signum in (signal.SIGTERM, signal.SIGKILL):
            await self._slurm_stop()
        elif signum:  # interrupts go as messages (interrupt_mode); nothing else crosses machines
            self.log.warning("gpujobs: signal %s not sent to kernel %s on its Slurm node", signum, self.kernel_id)

    async def cleanup(self, restart: bool = False) -> None:
        """Release the GPUs, unless this is the first half of a restart (which keeps them)."""
        await self._stop_watcher()
        await self._remove_container()
        if not restart:
            await self._end(*(self._pending_end or ("COMPLETED", "kernel shut down")))
            self._forget_job()
            _LIVE.discard(self)  # the client is shared by this process's kernels: kept open
        await super().cleanup(restart=restart)

    # ================================================================= persistence

    async def get_provisioner_info(self) -> dict[str, Any]:
        info = await super().get_provisioner_info()
        info.update({"gpujobs_job_id": self.job_id, "gpujobs_url": self._client.url if self._client else self.url})
        return info

    async def load_provisioner_info(self, provisioner_info: dict[str, Any]) -> None:
        """Re-attach to a kernel started by an earlier server: keep watching its job, or shut
        the kernel down if the job ended meanwhile."""
        await super().load_provisioner_info(provisioner_info)
        job_id = provisioner_info.get("gpujobs_job_id")
        if job_id is None:
            return
        if provisioner_info.get("gpujobs_url") and not self.url:
            self.url = provisioner_info["gpujobs_url"]
        self.job_id = int(job_id)
        self._job_final = False
        _LIVE.add(self)
        try:
            job = await (await self._get_client()).job(self.job_id)
        except (GPUJobsError, GPUKernelStartError):
            job = None
        if job is None or job["state"] in FINAL_STATES:
            self._job_final = True
            self.log.warning("gpujobs: re-attached kernel %s lost its GPU job %s; shutting it down",
                             self.kernel_id, self.job_id)
            _spawn(self._shutdown_kernel())
            return
        self._write_state(kernel_pid=self.pid)
        self._remember(job)
        self._idle_since = time.time()
        self._start_watcher()

    # ================================================================= the state file

    def _state_path(self) -> Path | None:
        return None if self.job_id is None else state_dir() / f"job-{self.job_id}.json"

    def _write_state(self, kernel_pid: int | None) -> None:
        path = self._state_path()
        if path is None or self._client is None:
            return
        record = {"job_id": self.job_id, "engine": self._client.url, "kernel_id": self.kernel_id,
                  "kernel_pid": kernel_pid, "server_pid": os.getpid(), "kernelspec": self._spec_name()}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(record))
            tmp.replace(path)
        except OSError as err:
            self.log.warning("gpujobs: cannot record kernel job %s in %s: %s", self.job_id, path, err)

    def _remove_state(self) -> None:
        path = self._state_path()
        if path is not None:
            with contextlib.suppress(OSError):
                path.unlink()

    def _forget_job(self) -> None:
        if self.job_id is not None and self._job_final and not self._keep_record:
            self._remove_state()
        self.job_id = None
        self._job_final = self._keep_record = False


# ===================================================================== server-wide helpers


async def reconcile_kernel_jobs(client: AsyncGPUJobsClient) -> tuple[list[int], int]:
    """End the kernel jobs of this machine whose kernel is gone (its server stopped or died).

    Reads the records in `state_dir()` that belong to `client`'s engine. A record whose kernel
    process is dead (or, before launch, whose server process is dead) ends its job FAILED
    (RUNNING) or CANCELLED (PENDING). Returns (ended job ids, records still undecided: a kernel
    alive whose server is gone, which ipykernel's parent poller stops within seconds).
    """
    ended: list[int] = []
    undecided = 0
    live = {p.job_id for p in list(_LIVE) if p.job_id is not None}
    folder = state_dir()
    if not folder.is_dir():
        return ended, 0
    for path in sorted(folder.glob("job-*.json")):
        try:
            record = json.loads(path.read_text())
            job_id = int(record["job_id"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if record.get("engine") != client.url or job_id in live:
            continue
        kernel_pid, server_pid = record.get("kernel_pid"), record.get("server_pid")
        if kernel_pid:
            if _pid_alive(kernel_pid):
                if not _pid_alive(server_pid):
                    undecided += 1
                continue
        elif _pid_alive(server_pid) and server_pid != os.getpid():
            continue  # another server of this machine is still starting that kernel
        try:
            job = await client.job(job_id)
            if job["state"] not in FINAL_STATES:
                state = "FAILED" if job["state"] == "RUNNING" else "CANCELLED"
                await client.end(job_id, state, "kernel gone: its Jupyter server stopped")
                ended.append(job_id)
        except GPUJobsError as err:
            if err.status != 404:
                continue
        with contextlib.suppress(OSError):
            path.unlink()
    return ended, undecided


def start_reconciler(log: logging.Logger | logging.LoggerAdapter[Any] | None = None, delay: float = 1.0,
                     retries: int = 6, interval: float = 5.0) -> asyncio.Task[Any] | None:
    """From the server extension's start: end stale kernel jobs once the server answers."""
    if not os.environ.get("GPUJOBS_URL"):
        return None
    logger = log or logging.getLogger("jupyter_gpujobs")

    async def run() -> None:
        log = logger
        await asyncio.sleep(delay)
        async with AsyncGPUJobsClient(os.environ["GPUJOBS_URL"], os.environ.get("GPUJOBS_TOKEN", ""),
                                      timeout=10.0) as client:
            _RECONCILED.add(client.url)
            for _ in range(retries):
                try:
                    ended, undecided = await reconcile_kernel_jobs(client)
                except Exception as err:  # the engine not answering yet
                    log.debug("gpujobs: kernel reconciliation failed: %s", err)
                    ended, undecided = [], 1
                if ended:
                    log.info("gpujobs: ended %d kernel job(s) whose kernel is gone: %s", len(ended),
                             ", ".join(map(str, ended)))
                if not undecided:
                    return
                await asyncio.sleep(interval)

    return _spawn(run())


async def release_kernel_jobs(reason: str = "Jupyter server stopped") -> list[int]:
    """From the server extension's stop, while the engine still answers: end the jobs of this
    process's GPU kernels (the kernels themselves are shut down by the server right after)."""
    released = []
    for provisioner in list(_LIVE):
        if provisioner.job_id is not None and not provisioner._job_final:
            job_id = provisioner.job_id
            await provisioner._stop_watcher()
            await provisioner._end("COMPLETED", reason)
            released.append(job_id)
    return released


__all__ = ["GPUKernelProvisioner", "GPUKernelStartError", "PROVISIONER_NAME", "reconcile_kernel_jobs",
           "release_kernel_jobs", "start_reconciler", "state_dir", "human_duration"]
