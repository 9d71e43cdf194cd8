"""Crash checks shared by the tests and `benchmarks/chaos.py`: jobs that record every run of
theirs, SIGKILLs of a real server while jobs are submitted and dispatched, and the counts that
must stay 0 (acknowledged jobs lost, jobs stuck, orphans, GPUs held twice, LOST jobs that ran).

A recording job writes `RUNS/<job id>-<pid>.json` when it starts (its GPUs, the time) and again
when it ends, so the checks see what really ran, where and when, whatever the store says.
"""

from __future__ import annotations

import errno
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

PY = sys.executable
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "LOST")

#: argv[1]: the runs directory; argv[2]: seconds to run. SIGTERM ends it early, recorded.
RECORDING_JOB = """
import json, os, signal, sys, time
runs, seconds = sys.argv[1], float(sys.argv[2])
path = os.path.join(runs, f"{os.environ['GPUJOBS_JOB_ID']}-{os.getpid()}.json")
run = {"job": int(os.environ["GPUJOBS_JOB_ID"]), "pid": os.getpid(),
       "gpus": os.environ.get("CUDA_VISIBLE_DEVICES", ""), "start": time.time(), "end": None}
def record():
    with open(path + ".tmp", "w") as f:
        json.dump(run, f)
    os.replace(path + ".tmp", path)
def stop(*_):
    run["end"] = time.time(); run["how"] = "SIGTERM"; record(); sys.exit(143)
signal.signal(signal.SIGTERM, stop)
record()
time.sleep(seconds)
run["end"] = time.time(); run["how"] = "done"; record()
"""


def recording_command(runs: Path, seconds: float) -> list[str]:
    return [PY, "-c", RECORDING_JOB, str(runs), str(seconds)]


@dataclass
class Counts:
    """What a crash must never cause (all 0), and what was checked."""

    acknowledged: int = 0
    acknowledged_lost: int = 0  # a 201 was answered, yet the server does not know the job
    stuck: int = 0  # not ended long after it should have
    orphans: int = 0  # a job's process alive once every job has ended
    double_holds: int = 0  # two runs on one GPU at the same time
    lost_that_ran: int = 0  # recorded LOST, yet its run went on (or finished)
    ran_twice: int = 0  # more than one run of a job that nobody preempted
    details: list[str] = field(default_factory=list)

    def add(self, other: Counts) -> None:
        for name in ("acknowledged", "acknowledged_lost", "stuck", "orphans", "double_holds", "lost_that_ran",
                     "ran_twice"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.details += other.details

    @property
    def failures(self) -> int:
        return (self.acknowledged_lost + self.stuck + self.orphans + self.double_holds + self.lost_that_ran
                + self.ran_twice)


def read_runs(runs: Path) -> list[dict[str, Any]]:
    out = []
    for p in runs.glob("*.json"):
        try:
            out.append(json.loads(p.read_text()))
        except (OSError, ValueError):
            continue
    return out


def wait_all_final(client: Any, ids: list[int], timeout: float) -> dict[int, dict[str, Any]]:
    """The jobs as they are once all ended, or at the timeout (unknown ids are left out)."""
    from jupyter_gpujobs.client import GPUJobsError

    deadline = time.monotonic() + timeout
    jobs: dict[int, dict[str, Any]] = {}
    while True:
        for job_id in ids:
            if job_id in jobs and jobs[job_id]["state"] in FINAL:
                continue
            try:
                jobs[job_id] = client.job(job_id)
            except GPUJobsError as err:
                if err.status != 404:
                    raise
        if all(job_id in jobs and jobs[job_id]["state"] in FINAL for job_id in ids) or time.monotonic() > deadline:
            return jobs
        time.sleep(0.2)


def check(client: Any, acked: list[int], runs: Path, timeout: float = 90) -> Counts:
    """Wait for every acknowledged job to end, then count what went wrong."""
    counts = Counts(acknowledged=len(acked))
    jobs = wait_all_final(client, acked, timeout)
    for job_id in acked:
        if job_id not in jobs:
            counts.acknowledged_lost += 1
            counts.details.append(f"job {job_id}: acknowledged, unknown to the server")
        elif jobs[job_id]["state"] not in FINAL:
            counts.stuck += 1
            counts.details.append(f"job {job_id}: still {jobs[job_id]['state']} ({jobs[job_id]['reason']})")
    time.sleep(0.5)  # a LOST job's process may still be finishing
    all_runs = read_runs(runs)
    by_job: dict[int, list[dict[str, Any]]] = {}
    for run in all_runs:
        by_job.setdefault(run["job"], []).append(run)
    now = time.time()
    if all(j["state"] in FINAL for j in jobs.values()):
        for p in job_processes(runs):
            counts.orphans += 1
            counts.details.append(f"process {p.pid} of a job still runs after every job ended")
    for job_id, job in jobs.items():
        mine = by_job.get(job_id, [])
        if job["state"] == "LOST" and mine:
            counts.lost_that_ran += 1
            counts.details.append(f"job {job_id}: LOST ({job['reason']}) but it ran: {mine}")
        if len(mine) > 1 + job.get("restarts", 0):
            counts.ran_twice += 1
            counts.details.append(f"job {job_id}: {len(mine)} runs, {job.get('restarts', 0)} restarts")
    spans: dict[str, list[tuple[float, float, int]]] = {}
    for run in all_runs:
        for gpu in filter(None, run["gpus"].split(",")):
            spans.setdefault(gpu, []).append((run["start"], run["end"] or now, run["job"]))
    for gpu, held in spans.items():
        held.sort()
        busy_until, holder = -1.0, 0
        for start, end, job_id in held:
            if start < busy_until - 0.05:
                counts.double_holds += 1
                counts.details.append(f"GPU {gpu}: job {job_id} started at {start:.2f} while job {holder} ran "
                                      f"until {busy_until:.2f}")
            if end > busy_until:
                busy_until, holder = end, job_id
    return counts


def submit_acked(client: Any, command: list[str], array: str | None = None, **kw: Any) -> list[int]:
    """Submit; the ids of the jobs the server acknowledged (none if the request failed)."""
    from jupyter_gpujobs.client import GPUJobsError

    try:
        out = client.submit(command, array=array, **kw) if array else client.submit(command, **kw)
    except (GPUJobsError, OSError):
        return []
    except Exception as err:  # the server died mid-request: nothing acknowledged
        if "connect" in str(err).lower() or "disconnect" in str(err).lower() or "closed" in str(err).lower():
            return []
        raise
    return list(out.get("array_tasks") or [out["id"]])


def kill_during_burst(server: Any, runs: Path, cycles: int, tasks: int = 32, seconds: float = 1.0,
                      rng: random.Random | None = None, log: Callable[[str], None] = lambda _: None) -> Counts:
    """SIGKILL the server 0.1-0.5 s after a `tasks`-task array was acknowledged, restart it,
    `cycles` times; then check every acknowledged job."""
    rng = rng or random.Random(0)
    acked: list[int] = []
    for n in range(cycles):
        client = server.client()
        acked += submit_acked(client, recording_command(runs, seconds), array=f"0-{tasks - 1}", gpus=1,
                              name=f"burst{n}")
        delay = rng.uniform(0.1, 0.5)
        time.sleep(delay)
        server.kill()
        log(f"burst {n}: killed {delay:.2f} s after {tasks} jobs were acknowledged")
        server.start()
    return check(server.client(), acked, runs)


def kill_during_dispatch(server: Any, runs: Path, cycles: int, jobs: int = 40, seconds: float = 0.4,
                         rng: random.Random | None = None, log: Callable[[str], None] = lambda _: None) -> Counts:
    """A backlog of short jobs keeps the engine dispatching; SIGKILL it at random moments
    (0.2-1.2 s apart), restart it, `cycles` times; then check every acknowledged job."""
    rng = rng or random.Random(1)
    client = server.client()
    acked = submit_acked(client, recording_command(runs, seconds), array=f"0-{jobs - 1}", gpus=1, name="backlog")
    for n in range(cycles):
        delay = rng.uniform(0.2, 1.2)
        time.sleep(delay)
        server.kill()
        log(f"dispatch {n}: killed after {delay:.2f} s")
        server.start()
    return check(server.client(), acked, runs)


def mount_tmpfs(where: Path, size: str) -> str | None:
    """Mount a tmpfs of `size` on `where` (a small disk to fill); None, or why it cannot be."""
    if os.geteuid() != 0:
        return "mounting a small file system needs root"
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(where)],
                       capture_output=True, text=True)
    return f"cannot mount a tmpfs here: {r.stderr.strip()}" if r.returncode else None


def fill(disk: Path) -> Path:
    """Write zeros into `disk` until it is full; returns the file to remove to free it."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        for chunk in (1 << 20, 4096, 512, 1):
            block = b"\0" * chunk
            while True:
                try:
                    f.write(block)
                except OSError as err:
                    if err.errno != errno.ENOSPC:
                        raise
                    break
    return filler


def job_processes(runs: Path) -> list[psutil.Process]:
    """Processes of recording jobs that write into `runs` (to clean up after a check)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if len(cmd) >= 4 and cmd[-2] == str(runs) and "GPUJOBS_JOB_ID" in cmd[-3]:
            found.append(p)
    return found


def kill_job_processes(runs: Path) -> None:
    for p in job_processes(runs):
        try:
            p.kill()
        except psutil.Error:
            pass


__all__ = ["Counts", "RECORDING_JOB", "check", "fill", "kill_during_burst", "kill_during_dispatch",
           "kill_job_processes", "mount_tmpfs", "read_runs", "recording_command", "submit_acked", "wait_all_final"]
