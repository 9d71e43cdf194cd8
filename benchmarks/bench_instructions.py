"""Instructions per steady deciding cycle (10k pending x 512 GPUs, every policy on), counted
by valgrind, against the plain sort of the same queue.

    .venv/bin/python benchmarks/bench_instructions.py   # needs valgrind (apt install valgrind)

Timings on a shared VM vary by up to 2x from run to run; instruction counts do not, so this is
the number to compare between two versions of the scheduler (it does not see cache misses,
which `bench_scheduler.py` does). The snapshot is the one `bench_scheduler.py` calls "steady".
Each count is the difference between a run of 6 cycles and a run of 1 (so the Python start-up
and the snapshot load cancel out), divided by 5; `PYTHONHASHSEED=0` makes it repeatable.
"""

from __future__ import annotations

import gc
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def child(snapshot: str, what: str, runs: int) -> None:
    """Run `runs` cycles (or sorts) of the pickled snapshot: what valgrind counts."""
    from bench_scheduler import kept_order

    from jupyter_gpujobs.engine.scheduler import schedule
    from jupyter_gpujobs.model import PRIORITY_RANK

    with open(snapshot, "rb") as f:
        t, queue, active, gpus, policy, usage, finished = pickle.load(f)
    kept = kept_order(t, queue, active, gpus, policy, usage, finished)
    by_id = {j.id: j for j in queue}  # as the server keeps the pending jobs and hands them over
    gc.disable()
    for _ in range(runs):
        if what == "sort":
            sorted(queue, key=lambda j: (-PRIORITY_RANK[j.priority], j.submitted_at, j.id))
        else:
            schedule(t, by_id, active, gpus, policy, usage, finished, estimate=False, order=kept)


def count(snapshot: str, what: str, runs: int) -> int:
    cmd = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
           sys.executable, __file__, "--child", snapshot, what, str(runs)]
    out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"},
                         check=True).stderr
    found = re.search(r"I\s+refs:\s+([\d,]+)", out)
    assert found, out[-2000:]
    return int(found.group(1).replace(",", ""))


def per_run(snapshot: str, what: str) -> float:
    return (count(snapshot, what, 6) - count(snapshot, what, 1)) / 5


def main() -> None:
    if shutil.which("valgrind") is None:
        sys.exit("bench_instructions: valgrind is not installed (Debian: apt install valgrind)")
    import bench_scheduler as bench

    print("building the steady 10k x 512 snapshot ...", flush=True)
    now, pending, running, gpus, usage, finished = bench.snapshot(10_000, 64)
    policy = bench.all_policies(len(gpus))
    t, queue, active = bench.settle(now, pending, running, gpus, policy, usage, finished)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "snapshot.pickle")
        with open(path, "wb") as f:
            pickle.dump((t, queue, active, gpus, policy, usage, finished), f)
        print("counting under valgrind (about a minute) ...", flush=True)
        cycle, base = per_run(path, "cycle"), per_run(path, "sort")
    print(f"steady deciding cycle, 10k pending x 512 GPUs, every policy on: {cycle / 1e6:.1f}M instructions; "
          f"baseline sort {base / 1e6:.1f}M; ratio {cycle / base:.2f}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        main()
