"""What every runner speaks: the `Runner` interface, the `LaunchRequest` it is given and the
`Exit` it reports. A runner carries out decisions (start, stop); it never decides who runs.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

#: How a run ended. The service maps these onto final job states.
OUTCOMES = ("completed", "failed", "timeout", "cancelled", "preempted", "oom", "lost")
Outcome = Literal["completed", "failed", "timeout", "cancelled", "preempted", "oom", "lost"]
StopOutcome = Literal["cancelled", "preempted", "timeout", "failed"]  # failed: over its GPU share

#: Reason of a run whose supervisor disappeared without leaving a result.
LOST_REASON = "supervisor process vanished (was the machine rebooted or the process killed?)"

#: Reason of a run that was recorded but whose job never started (the engine stopped first).
NOT_STARTED_REASON = "the engine stopped before this run started; queued again"


@dataclass
class LaunchRequest:
    """Everything needed to start one run of a job."""

    job_id: int
    command: list[str]
    cwd: str
    env: dict[str, str] = field(default_factory=dict)  # additions to os.environ
    gpu_indices: list[int] = field(default_factory=list)
    gpu_uuids: list[str] = field(default_factory=list)
    time_limit_s: int | None = None
    grace_s: float = 10  # SIGTERM to SIGKILL at the time limit or a cancel (GPUJOBS_KILL_GRACE)
    preempt_grace_s: float | None = None  # the same when preempted (GPUJOBS_PREEMPT_GRACE); None: grace_s
    log_path: str = ""
    fake: bool = False
    #: the Unix user the job runs as (its owner); None or the engine's own user: as the engine
    run_as: str | None = None
    #: device nodes of the GPUs not given to this job, denied by its device cgroup where there is one
    deny_devices: list[str] = field(default_factory=list)
    mem_bytes: int | None = None  # host memory limit (cgroup)
    cpus: float | None = None  # CPU limit in cores (cgroup)
    #: a signal before the end, "USR1@300" or "B:USR1@300" (model.WarnSignal.text); None: none
    warn_signal: str | None = None
    #: the container the job runs in (issue 29: `containers.ContainerRun.as_spec()`, made by the
    #: engine's container settings); None: the host's environment
    container: dict[str, Any] | None = None


@dataclass
class Exit:
    """How one run ended."""

    job_id: int
    outcome: str  # one of OUTCOMES
    exit_code: int | None
    signal: int | None
    reason: str
    ended_at: float
    started: bool = True  # False: the job's process never started (stopped before it could)


class Runner(abc.ABC):
    """Starts runs, stops them, and reports their ends. Handles are JSON-able dicts that the
    service stores, so a restarted server can reattach to runs that outlived it."""

    #: The runner's name, as `c.GPUJobs.runner` and GET info give it.
    name = ""
    #: Whether the runner starts a job as the Unix user `LaunchRequest.run_as` names. A runner
    #: that cannot must not be handed such a job: it would run it as the engine's own user
    #: (root, on a shared engine), so the service refuses those jobs at submit.
    runs_as_owner = True
    #: Whether the runner runs a job in a container image (`LaunchRequest.container`, issue 29); a
    #: job with an image is refused at submit by an engine whose runner does not.
    runs_containers = False
    #: Whether the runner's own scheduler decides (Slurm): the engine then mirrors it
    #: (engine/mirror.py) instead of running its cycle.
    schedules_itself = False
    #: Whether a job run as the engine's own user gets the engine's whole environment (a
    #: personal server's engine: the user's own session); otherwise, and always for a job run
    #: as another user, only the allow-listed names (shim.ENV_ALLOWED and `env_allow`).
    inherit_environment = False
    #: More names (shell patterns) of the engine's environment every job keeps (c.GPUJobs.job_env_allow).
    env_allow: tuple[str, ...] = ()
    #: Folders of the engine's (its socket's) that a job with a private /tmp must still reach
    #: where they lie under /tmp; set by the engine, never from a job's request.
    tmp_keep: tuple[str, ...] = ()
    #: Set by the service: called on the event loop when a run may just have ended, so that
    #: it polls now rather than at its next poll (a runner that cannot tell leaves it unused).
    on_exit: Callable[[], None] | None = None

    def prepare(self, req: LaunchRequest) -> dict[str, Any]:
        """Choose where the run will live, before anything starts: the handle the service
        records with the job's RUNNING transition, so that a restart finds the run even if
        the engine stops between recording it and starting it (see `reattach`)."""
        return {}

    @abc.abstractmethod
    def start(self, req: LaunchRequest, handle: dict[str, Any] | None = None) -> dict[str, Any]:
        """Start a run (prepared with `prepare`, or not yet) without waiting for it; return
        its handle."""

    def reattach(self, job_id: int, handle: dict[str, Any]) -> dict[str, Any] | Exit | None:
        """After a restart, a run recorded by `prepare` whose start was not confirmed: its
        handle if its supervisor is there, its Exit if it ended, or None if it never started
        and now never will (its job can go back to the queue)."""
        return Exit(job_id, "lost", None, None, LOST_REASON, time.time())

    @abc.abstractmethod
    def terminate(self, job_id: int, handle: dict[str, Any], reason: str,
                  outcome: StopOutcome = "cancelled", grace_s: float = 10) -> None:
        """Ask a run to stop (non-blocking): SIGTERM, `grace_s`, then SIGKILL; its Exit
        carries `outcome` and `reason`."""

    def withdraw_stop(self, job_id: int, handle: dict[str, Any]) -> bool:
        """Take back a preemption's stop in its grace (its preemptor is gone): no SIGKILL, the
        run goes on (an end within the grace is still its answer to the stop). False when this
        runner cannot, or the run is not stopping for a preemption."""
        return False

    def set_time_limit(self, job_id: int, handle: dict[str, Any], time_limit_s: int) -> bool:
        """Change a running job's time limit (counted from its start), for `PATCH jobs/{id}`.
        False when this runner cannot."""
        return False

    @abc.abstractmethod
    def poll(self, handles: dict[int, dict[str, Any]]) -> list[Exit]:
        """The runs among `handles` (job id -> handle) that have ended."""

    @abc.abstractmethod
    def alive(self, handle: dict[str, Any]) -> bool:
        """Is the run still going: its supervisor is there and has not written a result?"""

    def discard(self, handle: dict[str, Any]) -> None:
        """Forget a run that was prepared but will not start (its job was not started after all)."""
        return None

    def close(self) -> None:
        """The engine stops: let go of what the runner holds (running jobs are not touched)."""
        return None

    # ---- processes the engine did not start (a GPU kernel, launched by its provisioner)

    def adopt(self, req: LaunchRequest, pids: list[int],
              handle: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """Confine running processes of job `req.job_id` as a run of its own would be (its
        cgroup, device fence and limits from `req`; `req.command` is unused), joining those of
        `handle` when an earlier call made them (a kernel restart). Returns the handle to keep
        (`adopted_alive`, `stop_adopted`, `release_adopted` take it), or None where this runner
        cannot confine them (OSError: the host refused)."""
        return None

    def adopted_run(self, handle: dict[str, Any] | None) -> str:
        """The run name (the cgroup's folder name) of an adopted job's handle; "" for none."""
        return ""

    def adopted_alive(self, handle: dict[str, Any]) -> bool:
        """Is any process of an adopted job left (however it daemonized)?"""
        return False

    def stop_adopted(self, handle: dict[str, Any]) -> bool:
        """SIGKILL every process of an adopted job at once; True when none is left."""
        return True

    def release_adopted(self, handle: dict[str, Any]) -> None:
        """The adopted job ended: remove what confined it."""
        return None
