"""What isolation costs on the dispatch path: the median time from `LocalRunner.start()` to the
job's first command running, with subreaper supervision only (the baseline, cgroups off), with
each job in its own cgroups (tree + device fence + a memory limit), and with that and the job
run as another Unix user. Needs root (cgroups, users: scripts/install-multiuser.sh --users);
prints the medians and the ratios to the baseline, measured in the same run, interleaved.

    .venv/bin/python benchmarks/bench_isolation.py [ROUNDS]
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from jupyter_gpujobs.engine.runners import LaunchRequest, LocalRunner

USER = "gpujobs-u1"


def one(runner: LocalRunner, folder: Path, job_id: int, **kw: object) -> float:
    marker = folder / f"t{job_id}"
    t0 = time.time()
    handle = runner.start(LaunchRequest(job_id=job_id, command=["/bin/sh", "-c", f"date +%s.%N > {marker}"],
                                        cwd=str(folder), log_path=str(folder / f"job-{job_id}.log"),
                                        time_limit_s=60, **kw))  # type: ignore[arg-type]
    while not runner.poll({job_id: handle}):
        time.sleep(0.005)
    return float(marker.read_text()) - t0


def main() -> None:
    if os.geteuid() != 0:
        sys.exit("bench_isolation: needs root (cgroups and another Unix user)")
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 15
    folder = Path(tempfile.mkdtemp(prefix="gpujobs-bench-isolation-"))
    os.chmod(folder, 0o1777)
    # a runner per mode: each has its standby supervisor ready, as a server between dispatches
    plain = LocalRunner(folder / "run-plain", cgroups_mode="off")
    confined = LocalRunner(folder / "run-cgroups")
    as_user = LocalRunner(folder / "run-as-user")
    print(f"isolation: {confined.isolation.describe()}")
    modes = {"subreaper only (baseline)": (plain, {}),
             "own cgroups + fence + --mem": (confined, {"mem_bytes": 1 << 30}),
             "... and run as another user": (as_user, {"mem_bytes": 1 << 30, "run_as": USER})}
    times: dict[str, list[float]] = {name: [] for name in modes}
    job_id = 0
    for _ in range(rounds):
        for name, (runner, kw) in modes.items():
            job_id += 1
            times[name].append(one(runner, folder, job_id, **kw))
            time.sleep(0.2)  # the next standby supervisor gets ready, as between real dispatches
    base = statistics.median(times["subreaper only (baseline)"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:32s} median {median * 1000:6.1f} ms  ratio {median / base:4.2f}")
    for runner in (plain, confined, as_user):
        runner.close()


if __name__ == "__main__":
    main()
