"""What every runner speaks: the `Runner` interface, the `LaunchRequest` it is given and the
`Exit` it reports. A runner carries out decisions (start, stop); it never decides who runs.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Literal

#: How a run ended. The service maps these onto final job states.
OUTCOMES = ("completed", "failed", "timeout", "cancelled", "preempted", "oom", "lost")
Outcome = Literal["completed", "failed", "timeout", "cancelled", "preempted", "oom", "lost"]
StopOutcome = Literal["cancelled", "preempted", "timeout"]

#: Reason of a run whose supervisor disappeared without leaving a result.
LOST_REASON = "supervisor process vanished (was the machine rebooted or the process killed?)"


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
    grace_s: float = 10
    log_path: str = ""
    fake: bool = False
    #: the Unix user the job runs as (its owner); None or the engine's own user: as the engine
    run_as: str | None = None
    #: device nodes of the GPUs not given to this job, denied by its device cgroup where there is one
    deny_devices: list[str] = field(default_factory=list)
    mem_bytes: int | None = None  # host memory limit (cgroup)
    cpus: float | None = None  # CPU limit in cores (cgroup)


@dataclass
class Exit:
    """How one run ended."""

    job_id: int
    outcome: str  # one of OUTCOMES
    exit_code: int | None
    signal: int | None
    reason: str
    ended_at: float


class Runner(abc.ABC):
    """Starts runs, stops them, and reports their ends. Handles are JSON-able dicts that the
    service stores, so a restarted server can reattach to runs that outlived it."""

    @abc.abstractmethod
    def start(self, req: LaunchRequest) -> dict[str, Any]:
        """Start a run without waiting for it; return its handle."""

    @abc.abstractmethod
    def terminate(self, job_id: int, handle: dict[str, Any], reason: str,
                  outcome: StopOutcome = "cancelled", grace_s: float = 10) -> None:
        """Ask a run to stop (non-blocking): SIGTERM, `grace_s`, then SIGKILL; its Exit
        carries `outcome` and `reason`."""

    @abc.abstractmethod
    def poll(self, handles: dict[int, dict[str, Any]]) -> list[Exit]:
        """The runs among `handles` (job id -> handle) that have ended."""

    @abc.abstractmethod
    def alive(self, handle: dict[str, Any]) -> bool:
        """Is the run still going: its supervisor is there and has not written a result?"""
