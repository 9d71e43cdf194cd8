"""The Slurm runner: hands every job to a Slurm cluster with `sbatch` and mirrors what Slurm
does with it. Slurm decides (placement, priority, backfill, fair-share, preemption); the
engine shows it.

- `submit()` turns one job, or the jobs of one array, into one `sbatch` call: GPUs as
  `--gres=gpu[:type]:N`, `--time`, `--begin` (also for off-peak jobs), `--dependency`
  (the engine's job ids mapped to Slurm's), `--array=...%N`, the priority class's QOS and
  partition, the job's working directory, its environment, and its output to the job's log
  file (which must be on a filesystem the nodes share with the engine).
- `sync()` reads the state of every job of the engine with one `squeue --json` call: state,
  Slurm's pending reason in words, expected start, node and GPU indices, exit code and why a
  job ended. Jobs that left squeue (after MinJobAge) are looked up with one `sacct` call.
- `terminate()` is `scancel`; Slurm's KillWait is the grace between SIGTERM and SIGKILL.
- `SlurmGPUs` is the GPU inventory of the cluster (every node's gres), for `GET gpus`.

The command-line tools are used rather than slurmrestd: they are on every Slurm login node,
authenticate as the engine's user through munge with no token to hand out or renew, and need no
extra daemon; slurmrestd's API versions also change with every Slurm release. One `squeue`
per interval for all jobs keeps the load on slurmctld flat however many jobs there are.

The handle stored per job is `{"runner": "slurm", "slurm_id": "1234" | "1234_5",
"submitted_at": ...}`.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from traitlets import Dict, Float, Integer, List, Unicode
from traitlets.config import Configurable

from ...model import GPU, Job
from ..gpus.base import GPUBackend, GPUProcess, GPUSample
from .base import Exit, LaunchRequest, Runner, StopOutcome
from .shim import how_it_ended
from .slurm_text import (  # Slurm's words and lists, read here
    PENDING_REASONS,
    _gpu_indices,
    _in_task_string,
    _node_gpus,
    _per_node,
    expand_nodes,  # noqa: F401 (public here before it moved)
    pending_reason,
)

log = logging.getLogger("jupyter_gpujobs")


class Slurm(Configurable):
    """Settings of the Slurm runner (`c.Slurm.<name>`), used when `c.GPUJobs.runner = "slurm"`."""

    partition = Unicode("", config=True, help="Partition of every job (empty: the cluster's default).")
    partitions = Dict(config=True, help="Partition per priority class, e.g. {'urgent': 'urgent'}; "
                                        "classes not named use `partition`.")
    qos = Dict(config=True, help="QOS per priority class, e.g. {'low': 'scavenger', 'urgent': 'high'}; "
                                 "classes not named get no --qos (the account's default).")
    account = Unicode("", config=True, help="--account of every job (empty: the user's default).")
    poll_interval = Float(1.0, config=True, help="Seconds between the squeue calls that read every job's state.")
    extra_args = List(Unicode(), config=True, help="More sbatch options for every job, e.g. ['--mem=16G'].")
    nodes = Integer(0, config=True, help="--nodes of every job (0: Slurm's default, one node).")
    ntasks = Integer(0, config=True, help="--ntasks of every job (0: Slurm's default).")
    command_prefix = List(Unicode(), config=True,
                          help="Run Slurm's commands through this, e.g. ['ssh', 'login1'] (empty: directly).")
    container_option = Unicode("", config=True,
                               help="The sbatch option that runs a job in its image (issue 29), {image} standing "
                                    "for it: '--container-image={image}' (pyxis and enroot on the nodes) or "
                                    "'--container={image}' (Slurm's own OCI support, an OCI bundle's path). "
                                    "Empty: a job with an image is refused at submit.")


@dataclass
class SlurmState:
    """What Slurm says about one job of the engine."""

    job_id: int  # the engine's
    slurm_id: str
    state: str  # PENDING | RUNNING | ENDED
    reason: str = ""  # pending: why, in words
    code: str = ""  # pending: Slurm's reason code (e.g. "Resources")
    expected_start: float | None = None
    node: str | None = None
    gpus: tuple[int, ...] = ()
    started_at: float | None = None
    exit: Exit | None = None  # ENDED: how
    # a multi-node job: each node with its GPU indices ("n1", (0,)), in Slurm's node order
    per_node: tuple[tuple[str, tuple[int, ...]], ...] = ()


class SlurmError(RuntimeError):
    """A Slurm command failed; the message is Slurm's own."""


class SlurmIsolation:
    """What confines a job under Slurm: Slurm itself (its cgroup and gres settings)."""

    fence = False  # the engine fences nothing itself
    enabled = True  # --mem and --cpus go to Slurm as --mem and --cpus-per-task

    def limits(self) -> tuple[bool, bool]:
        """(a memory limit, a CPU limit) can be asked for: Slurm takes both."""
        return True, True

    def describe(self) -> str:
        return ("Slurm's own: each job gets the GPUs Slurm allocated (CUDA_VISIBLE_DEVICES); devices, memory "
                "and CPUs are confined where the cluster sets ConstrainDevices and its cgroup plugins")


class SlurmRunner(Runner):
    """Submits jobs to Slurm and reads their state back (see the module docstring)."""

    name = "slurm"
    #: The engine does not schedule: Slurm does, and the service only mirrors it.
    schedules_itself = True
    #: sbatch submits as the engine's own user, so jobs would run as it (root on a shared
    #: engine): jobs of other Unix users are refused (see Admission.validated).
    runs_as_owner = False

    @property  # type: ignore[override]
    def runs_containers(self) -> bool:
        """A job's image goes to Slurm's container support where the site names its option."""
        return bool(self.settings.container_option)

    def __init__(self, state_dir: Path, settings: Slurm | None = None):
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.settings = settings or Slurm()
        self.poll_interval = self.settings.poll_interval
        self.isolation = SlurmIsolation()
        self._stop_reasons: dict[str, tuple[str, str]] = {}  # slurm id -> (outcome, reason) we asked for
        self._running_jobs: list[dict[str, Any]] = []  # everyone's running jobs, for gpu_holders
        self._holders_at = -1e9

    # ------------------------------------------------------------------ commands

    def _run(self, args: Sequence[str], env: dict[str, str] | None = None, timeout: float = 30) -> str:
        cmd = [*self.settings.command_prefix, *args]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout,
                               stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise SlurmError(f"{args[0]}: {err}") from None
        if r.returncode != 0:
            msg = (r.stderr or r.stdout).strip().replace(f"{args[0]}: error: ", "")
            raise SlurmError(f"{args[0]}: {msg or f'exit code {r.returncode}'}")
        return r.stdout

    # ------------------------------------------------------------------ submit

    def sbatch_args(self, job: Job, dependency: str = "", begin: float | None = None) -> list[str]:
        """The sbatch options of `job` (of any task of an array: `--array` is added by submit)."""
        s = self.settings
        args = ["--parsable", f"--job-name={job.name or f'gpujob-{job.id}'}", "--open-mode=append"]
        if job.gpus:
            args.append(f"--gres=gpu:{job.gpu_type.lower() + ':' if job.gpu_type else ''}{job.gpus}")
        if job.time_limit_s:
            args.append(f"--time={max(1, -(-int(job.time_limit_s) // 60))}")  # minutes, rounded up
        if begin is not None and begin > time.time():
            args.append("--begin=" + time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(begin)))
        if dependency:
            args.append(f"--dependency={dependency}")
        partition = s.partitions.get(job.priority) or s.partition
        if partition:
            args.append(f"--partition={partition}")
        if s.qos.get(job.priority):
            args.append(f"--qos={s.qos[job.priority]}")
        if s.account:
            args.append(f"--account={s.account}")
        if job.nodes > 1 or s.nodes:  # a multi-node job: its --gres is per node
            args.append(f"--nodes={job.nodes if job.nodes > 1 else s.nodes}")
        if s.ntasks:
            args.append(f"--ntasks={s.ntasks}")
        if job.mem_bytes:
            args.append(f"--mem={max(1, -(-int(job.mem_bytes) // (1 << 20)))}M")
        if job.cpus:
            args.append(f"--cpus-per-task={max(1, -(-int(job.cpus * 100) // 100))}")
        if not job.requeue:
            args.append("--no-requeue")
        elif job.max_requeues is not None:
            args.append("--requeue")  # at a node failure; Slurm's MaxBatchRequeue bounds the count
        if job.warn_signal:  # stored in Slurm's own form ("B:USR1@300")
            args.append(f"--signal={job.warn_signal}")
        if job.image and s.container_option:  # (admission refuses an image without one)
            args.append(s.container_option.replace("{image}", job.image))
        return [*args, *s.extra_args]

    def submit(self, jobs: Sequence[Job], requests: Sequence[LaunchRequest], dependency: str = "",
               begin: float | None = None) -> list[dict[str, Any]]:
        """Submit one job, or the tasks of one array (all of `jobs`, which share array_job_id),
        with one sbatch call. Returns a handle per job. Raises SlurmError with Slurm's message."""
        owners = {r.run_as for r in requests if r.run_as}
        if owners:  # refused at submit; a job queued before an upgrade must not run as root either
            raise SlurmError(f"the Slurm runner cannot run jobs as {', '.join(sorted(owners))}: "
                             "it submits as the engine's own user")
        first = jobs[0]
        array = len(jobs) > 1 or first.array_index is not None
        script = self._write_script(jobs, requests)
        args = ["sbatch", *self.sbatch_args(first, dependency, begin), f"--chdir={requests[0].cwd}"]
        if array:
            indices = ",".join(str(j.array_index) for j in jobs)
            limit = f"%{first.array_max_running}" if first.array_max_running else ""
            args.append(f"--array={indices}{limit}")
            pattern = str(Path(requests[0].log_path).parent / f"array-{first.array_job_id or first.id}-%a.log")
            args.append(f"--output={pattern}")
        else:
            args.append(f"--output={requests[0].log_path}")
        env = {**self._base_environment(), **requests[0].env}
        for key in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "GPUJOBS_FAKE"):
            env.pop(key, None)  # Slurm sets the job's GPUs; never pass the engine's own on
        out = self._run([*args, str(script)], env=env)
        slurm_id = out.strip().split(";")[0]
        now = time.time()
        if not array:
            return [{"runner": "slurm", "slurm_id": slurm_id, "submitted_at": now,
                     "log_path": requests[0].log_path}]
        # one log per task, named by sbatch's %a pattern
        return [{"runner": "slurm", "slurm_id": f"{slurm_id}_{j.array_index}", "submitted_at": now,
                 "log_path": pattern.replace("%a", str(j.array_index))} for j in jobs]

    def _base_environment(self) -> dict[str, str]:
        """What sbatch (and so the job: --export=ALL) gets of the engine's environment: all of
        it in a personal server's engine; else the allow-list (shim.ENV_ALLOWED and
        c.GPUJobs.job_env_allow), Slurm's own variables (SLURM_CONF), PYTHONPATH and the
        engine account's HOME and USER, whose jobs these are: never a credential of the engine's."""
        if self.inherit_environment:
            return dict(os.environ)
        from .shim import ENV_ALLOWED, allowed_environment

        return allowed_environment(dict(os.environ), (*ENV_ALLOWED, *self.env_allow, "SLURM_*", "PYTHONPATH",
                                                      "HOME", "USER", "LOGNAME", "SHELL"))

    def _write_script(self, jobs: Sequence[Job], requests: Sequence[LaunchRequest]) -> Path:
        """The batch script: each task sets the variables the engine guarantees (the job id
        differs per array task) and execs the job's command in its working directory."""
        lines = ["#!/bin/sh", "# written by jupyter-gpujobs; options are on sbatch's command line",
                 'export GPUJOBS_SLURM_JOB_ID="$SLURM_JOB_ID" PYTHONUNBUFFERED=1 CUDA_DEVICE_ORDER=PCI_BUS_ID',
                 'export NVIDIA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-}"']
        if any(r.fake for r in requests):
            lines.append("export GPUJOBS_FAKE=1")
        branches = []
        for job, req in zip(jobs, requests):
            marker = shlex.quote(str(self._marker(job.id)))
            body = (f"echo \"$SLURMD_NODENAME ${{SLURM_JOB_GPUS:-}}\" > {marker}\n"
                    f"  export GPUJOBS_JOB_ID={job.id} GPUJOBS_TIME_LIMIT={job.time_limit_s or ''}"
                    + (f" GPUJOBS_ARRAY_INDEX={job.array_index}" if job.array_index is not None else "") + "\n"
                    f"  cd {shlex.quote(req.cwd)} || exit 1\n  exec {shlex.join(req.command)}")
            if len(jobs) == 1 and job.array_index is None:
                lines.append(body.replace("\n  ", "\n"))
                break
            branches.append(f"  {job.array_index})\n  {body} ;;")
        if branches:
            lines += ['case "$SLURM_ARRAY_TASK_ID" in', *branches, "esac",
                      'echo "no command for array task $SLURM_ARRAY_TASK_ID" >&2', "exit 1"]
        path = self.state_dir / f"job-{jobs[0].id}-{time.time_ns() // 1000:x}.sh"
        path.write_text("\n".join(lines) + "\n")
        path.chmod(0o700)
        return path

    def _marker(self, job_id: int) -> Path:
        """The file the batch script writes when a job starts: its node and Slurm's GPU indices
        (SLURM_JOB_GPUS). Slurm forgets a job's GPU indices once it ended, so a job that ends
        between two readings is known to have run on them only from here."""
        return self.state_dir / f"started-{job_id}"

    def _started_on(self, job_id: int) -> tuple[str | None, tuple[int, ...]]:
        try:
            node, _, gpus = self._marker(job_id).read_text().strip().partition(" ")
        except OSError:
            return None, ()
        return node or None, tuple(int(i) for i in gpus.split(",") if i.strip().isdigit())

    def start(self, req: LaunchRequest, handle: dict[str, Any] | None = None) -> dict[str, Any]:
        """The Runner interface: one job without Slurm-specific fields (used by nothing in the
        mirror path; kept so the runner is a complete Runner)."""
        job = Job(id=req.job_id, user="", command=list(req.command), gpus=len(req.gpu_indices),
                  time_limit_s=req.time_limit_s)
        return self.submit([job], [req])[0]

    # ------------------------------------------------------------------ stop

    def terminate(self, job_id: int, handle: dict[str, Any], reason: str,
                  outcome: StopOutcome = "cancelled", grace_s: float = 10) -> None:
        slurm_id = str(handle.get("slurm_id") or "")
        if not slurm_id:
            return
        self._stop_reasons[slurm_id] = (outcome, reason)
        try:
            self._run(["scancel", slurm_id], timeout=15)
        except SlurmError as err:
            log.warning("gpujobs: scancel %s failed: %s", slurm_id, err)

    def stopping(self, handle: dict[str, Any]) -> bool:
        """Has the engine scancelled this job already (its end is not reported yet)?"""
        return str(handle.get("slurm_id") or "") in self._stop_reasons

    # ------------------------------------------------------------------ watch

    def squeue(self, *filters: str) -> list[dict[str, Any]]:
        """The jobs Slurm knows, in one call. (Slurm 22.05 ignores filters with --json and
        lists every job; later releases apply them.)"""
        data = json.loads(self._run(["squeue", "--json", *filters]) or "{}")
        return list(data.get("jobs") or [])

    def sync(self, handles: dict[int, dict[str, Any]]) -> list[SlurmState]:
        """The state of each job among `handles` (engine id -> handle), from one squeue call
        (and one sacct call for jobs squeue no longer lists)."""
        if not handles:
            return []
        records: dict[str, dict[str, Any]] = {}
        arrays: dict[str, dict[str, Any]] = {}  # array job id -> its record of still-pending tasks
        for rec in self.squeue("--me"):  # the engine's own jobs
            if rec.get("array_job_id") and rec.get("array_task_id") is not None:
                records[f"{rec['array_job_id']}_{rec['array_task_id']}"] = rec
            elif rec.get("array_job_id") and rec.get("array_task_string"):
                arrays[str(rec["array_job_id"])] = rec
            else:
                records[str(rec["job_id"])] = rec
        out: list[SlurmState] = []
        missing: dict[str, int] = {}
        for job_id, handle in handles.items():
            sid = str(handle.get("slurm_id") or "")
            rec = records.get(sid)
            if rec is None and "_" in sid:
                master = arrays.get(sid.split("_")[0])
                if master is not None and _in_task_string(int(sid.split("_")[1]), master["array_task_string"]):
                    rec = master
            if rec is None:
                missing[sid] = job_id
                continue
            out.append(self._state(job_id, sid, rec))
        if missing:
            out += self._from_sacct(missing)
        return out

    def _state(self, job_id: int, sid: str, rec: dict[str, Any]) -> SlurmState:
        state = str(rec.get("job_state") or "")
        code = str(rec.get("state_reason") or "None")
        if state in ("PENDING", "REQUEUED", "SUSPENDED", "REQUEUE_HOLD", "RESV_DEL_HOLD"):
            start = rec.get("start_time") or None
            # Slurm's start time of a job it cannot place is a placeholder a year ahead
            if start and start > time.time() + 300 * 86400:
                start = None
            return SlurmState(job_id, sid, "PENDING", pending_reason(code), code=code, expected_start=start)
        if state in ("RUNNING", "CONFIGURING", "COMPLETING", "STOPPED"):
            gpus = _gpu_indices(rec.get("gres_detail") or [])
            return SlurmState(job_id, sid, "RUNNING", node=str(rec.get("nodes") or "") or None,
                              gpus=gpus or self._started_on(job_id)[1],
                              started_at=rec.get("start_time") or None, per_node=_per_node(rec))
        node, gpus = self._started_on(job_id)
        return SlurmState(job_id, sid, "ENDED", node=str(rec.get("nodes") or "") or node, gpus=gpus,
                          per_node=_per_node(rec),
                          started_at=rec.get("start_time") or None,
                          exit=self._exit(job_id, sid, state, code, int(rec.get("exit_code") or 0),
                                          float(rec.get("end_time") or time.time())))

    def _exit(self, job_id: int, sid: str, state: str, code: str, status: int, ended_at: float) -> Exit:
        """How a job ended, from Slurm's state, reason and wait status."""
        exit_code, sig = (status >> 8) & 0xFF, status & 0x7F
        asked = self._stop_reasons.pop(sid, None)
        if state == "COMPLETED":
            return Exit(job_id, "completed", 0, None, "completed", ended_at)
        if state == "TIMEOUT":
            return Exit(job_id, "timeout", exit_code, sig or None, "time limit reached (Slurm stopped it)", ended_at)
        if state in ("CANCELLED", "DEADLINE"):
            if asked is not None:
                return Exit(job_id, asked[0], exit_code, sig or None, asked[1], ended_at)
            return Exit(job_id, "cancelled", exit_code, sig or None,
                        "cancelled in Slurm (scancel by its owner or an administrator)", ended_at)
        if state == "PREEMPTED":
            return Exit(job_id, "preempted", exit_code, sig or None, "preempted by Slurm", ended_at)
        if state == "OUT_OF_MEMORY":
            return Exit(job_id, "oom", exit_code, sig or None, "out of memory (Slurm's memory limit)", ended_at)
        if state == "NODE_FAIL":
            return Exit(job_id, "lost", None, None, "its node failed (Slurm: NODE_FAIL)", ended_at)
        if state == "BOOT_FAIL":
            return Exit(job_id, "failed", None, None, "its node could not boot (Slurm: BOOT_FAIL)", ended_at)
        if sig:
            return Exit(job_id, "failed", None, sig, how_it_ended(None, sig), ended_at)
        return Exit(job_id, "failed", exit_code, None, f"failed ({how_it_ended(exit_code, None)})", ended_at)

    def _from_sacct(self, missing: dict[str, int]) -> list[SlurmState]:
        """Jobs squeue forgot (ended more than MinJobAge ago, e.g. while the engine was down):
        one sacct call; without accounting they are reported lost."""
        out: list[SlurmState] = []
        try:
            text = self._run(["sacct", "-n", "-P", "-X", "-o", "JobID,State,ExitCode,End",
                              "-j", ",".join(missing)])
        except SlurmError as err:
            text = ""
            log.debug("gpujobs: sacct: %s", err)
        for line in text.splitlines():
            parts = line.split("|")
            if len(parts) < 4 or parts[0] not in missing:
                continue
            sid, state, code, end = parts[0], parts[1].split()[0], parts[2], parts[3]
            job_id = missing.pop(sid)
            rc, _, sig = code.partition(":")
            status = (int(rc or 0) << 8) | int(sig or 0)
            try:
                ended = time.mktime(time.strptime(end, "%Y-%m-%dT%H:%M:%S"))
            except ValueError:
                ended = time.time()
            out.append(SlurmState(job_id, sid, "ENDED", exit=self._exit(job_id, sid, state, "", status, ended)))
        for sid, job_id in missing.items():
            out.append(SlurmState(job_id, sid, "ENDED", exit=Exit(
                job_id, "lost", None, None,
                f"Slurm no longer knows job {sid} (ended while the engine was not watching, and "
                "Slurm's accounting does not say how)", time.time())))
        return out

    def poll(self, handles: dict[int, dict[str, Any]]) -> list[Exit]:
        return [s.exit for s in self.sync(handles) if s.exit is not None]

    def alive(self, handle: dict[str, Any]) -> bool:
        sid = str(handle.get("slurm_id") or "")
        return any(s.state != "ENDED" for s in self.sync({0: {"slurm_id": sid}}))

    def close(self) -> None:
        pass

    # ------------------------------------------------------------------ the cluster's GPUs

    def nodes(self) -> list[dict[str, Any]]:
        """Every node (one `sinfo --json` call): name, state, state_flags, gres ('gpu:a100:4')."""
        data = json.loads(self._run(["sinfo", "--json"]) or "{}")
        return list(data.get("nodes") or [])

    def gpu_holders(self, max_age: float = 2.0) -> dict[tuple[str, int], dict[str, Any]]:
        """(node, GPU index) -> the Slurm job holding it ({slurm_id, user}), anyone's: one
        squeue call at most every `max_age` seconds."""
        now = time.monotonic()
        if now - self._holders_at > max_age:
            self._running_jobs = self.squeue("--states=RUNNING")
            self._holders_at = now
        out: dict[tuple[str, int], dict[str, Any]] = {}
        for rec in self._running_jobs:
            if rec.get("job_state") != "RUNNING":
                continue
            sid = (f"{rec['array_job_id']}_{rec['array_task_id']}" if rec.get("array_task_id") is not None
                   else str(rec["job_id"]))
            node = str(rec.get("nodes") or "")
            for index in _gpu_indices(rec.get("gres_detail") or []):
                out[(node, index)] = {"slurm_id": sid, "user": rec.get("user_name")}
        return out


class SlurmGPUs(GPUBackend):
    """The cluster's GPUs as Slurm configures them (every node's gpu gres), numbered per node
    in gres order as Slurm numbers them. Utilization and memory are not reported by Slurm."""

    name = "slurm"

    def __init__(self, runner: SlurmRunner):
        self.runner = runner

    def inventory(self) -> list[GPU]:
        out = []
        for node in self.runner.nodes():
            name = str(node.get("name") or node.get("hostname"))
            states = " ".join([str(node.get("state") or ""), *map(str, node.get("state_flags") or [])]).upper()
            down = any(s in states for s in ("DOWN", "FAIL", "NOT_RESPONDING"))
            draining = "DRAIN" in states
            index = 0
            for kind, count in _node_gpus(str(node.get("gres") or "")):
                for _ in range(count):
                    out.append(GPU(index=index, uuid=f"slurm:{name}:{index}", name=kind.upper(), host=name,
                                   healthy=not down, draining=draining))
                    index += 1
        return out

    def processes(self) -> dict[int, list[GPUProcess]]:
        return {}

    def sample(self) -> list[GPUSample]:
        return []

    def close(self) -> None:
        pass


#: c.GPUJobs settings that do nothing under Slurm (its scheduler and its own settings decide);
#: docs/slurm.md has the whole table.
IGNORED_SETTINGS = (
    "user_max_running_jobs", "user_max_gpus", "backfill", "reservation_depth", "fairshare",
    "fairshare_half_life", "weight_age", "weight_fairshare", "weight_class", "weight_size", "user_shares",
    "group_shares", "user_quotas", "group_quotas", "default_user_quota", "urgent_reserve_gpus", "preemption",
    "preempt_grace", "preempt_min_runtime", "cgroups", "use_predictions", "estimate_interval", "tick_interval",
    "poll_interval", "fake_gpus", "rogue_policy", "drain_after_errors",
)


def ignored_settings(cfg: Configurable) -> list[str]:
    """The IGNORED_SETTINGS that were set to something else than their default."""
    out = []
    for name in IGNORED_SETTINGS:
        trait = cfg.traits().get(name)
        if trait is not None and getattr(cfg, name) != trait.default():
            out.append(f"c.GPUJobs.{name}")
    return out


def make_slurm_runner(state_dir: Path, parent: Configurable | None = None) -> SlurmRunner:
    """The `slurm` entry point of `jupyter_gpujobs.runners`: settings from `c.Slurm`."""
    return SlurmRunner(state_dir, Slurm(parent=parent))


__all__ = ["IGNORED_SETTINGS", "PENDING_REASONS", "ignored_settings", "SlurmError", "SlurmGPUs", "Slurm", "SlurmRunner", "SlurmState",
           "make_slurm_runner", "pending_reason"]
