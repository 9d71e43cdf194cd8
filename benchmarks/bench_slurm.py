"""N × 1 s jobs on 4 fake GPUs of a real single-node Slurm: through the Slurm runner (a live
Jupyter server with `c.GPUJobs.runner = "slurm"`, jobs submitted with the REST client) and
through plain `sbatch` from a loop, alternately, on the same cluster in the same run.

    .venv/bin/python benchmarks/bench_slurm.py [--jobs 24] [--rounds 2]    (as root: starts Slurm)

Prints per round and as medians:
- makespan: from the first submission until Slurm shows every job ended (the same clock and
  the same 50 ms squeue polling for both ways), and the ratio runner / sbatch (target ≤ 1.10);
- the engine's lag behind Slurm: for every job's start and end, the time between the benchmark
  seeing it in `squeue` and seeing it through the engine's API (both polled every 50 ms;
  target: median ≤ 1 s with the default c.Slurm.poll_interval of 1 s).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from servers import live_servers  # noqa: E402
from slurm_cluster import SlurmCluster  # noqa: E402

TICK = 0.05


def squeue() -> dict[str, dict[str, Any]]:
    out = subprocess.run(["squeue", "--json"], capture_output=True, text=True, check=True).stdout
    return {str(j["job_id"]): j for j in json.loads(out)["jobs"]}


def watch_slurm(ids: set[str], seen: dict[str, dict[str, float]]) -> bool:
    """Record when each Slurm job is first seen running and ended; True when all ended."""
    now = time.time()
    for sid, rec in squeue().items():
        if sid not in ids:
            continue
        state = rec["job_state"]
        marks = seen.setdefault(sid, {})
        if state in ("RUNNING", "COMPLETING") or (state not in ("PENDING", "CONFIGURING") and "run" not in marks):
            marks.setdefault("run", now)
        if state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
            marks.setdefault("end", now)
    return len(ids) == len(seen) and all("end" in m for m in seen.values())


def run_sbatch(n: int, workdir: Path) -> float:
    t0 = time.time()
    ids = set()
    for _ in range(n):
        out = subprocess.run(["sbatch", "--parsable", "--gres=gpu:1", "--time=5", f"--output={workdir}/sb-%j.log",
                              "--wrap", "sleep 1"], capture_output=True, text=True, check=True).stdout
        ids.add(out.strip())
    seen: dict[str, dict[str, float]] = {}
    while not watch_slurm(ids, seen):
        time.sleep(TICK)
    return time.time() - t0


def run_runner(n: int, server: Any) -> tuple[float, float, list[float]]:
    """(makespan as Slurm shows it, makespan as the engine shows it, lags in seconds)."""
    t0 = time.time()
    with server.client() as client:
        jobs = [client.submit(["sleep", "1"], gpus=1, time_limit="5m") for _ in range(n)]
        mine = {j["id"] for j in jobs}
        engine: dict[int, dict[str, float]] = {}
        slurm: dict[str, dict[str, float]] = {}
        sid_of: dict[int, str] = {}
        slurm_done = engine_done = None
        while slurm_done is None or engine_done is None:
            now = time.time()
            for j in client.jobs(limit=1000)["jobs"]:
                if j["id"] not in mine:
                    continue
                marks = engine.setdefault(j["id"], {})
                if j["state"] != "PENDING":
                    marks.setdefault("run", now)
                if j["state"] not in ("PENDING", "RUNNING"):
                    marks.setdefault("end", now)
            if len(sid_of) < n:
                for job_id in mine - set(sid_of):
                    for e in client.events(job_id):
                        if e["state"] == "SUBMITTED":
                            sid_of[job_id] = str(e["data"]["slurm_id"])
            if len(sid_of) == n and slurm_done is None and watch_slurm(set(sid_of.values()), slurm):
                slurm_done = time.time() - t0
            if len(engine) == n and all("end" in m for m in engine.values()) and engine_done is None:
                engine_done = time.time() - t0
            time.sleep(TICK)
    lags = []
    for job_id, sid in sid_of.items():
        for mark in ("run", "end"):
            if mark in slurm.get(sid, {}) and mark in engine.get(job_id, {}):
                lags.append(engine[job_id][mark] - slurm[sid][mark])
    return slurm_done, engine_done, lags


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-slurm-") as tmp:
        tmp_path = Path(tmp)
        cluster = SlurmCluster(tmp_path / "slurm").start()
        os.environ.update(cluster.env())
        (tmp_path / "live").mkdir()
        factory = live_servers(tmp_path / "live")
        make = next(factory)
        try:
            server = make(config={"runner": "slurm"})
            base, ours, ours_engine, lags = [], [], [], []
            for r in range(args.rounds):
                b = run_sbatch(args.jobs, tmp_path)
                try:
                    m, e, lag = run_runner(args.jobs, server)
                except Exception:
                    print(server.server_log()[-3000:], file=sys.stderr)
                    raise
                base.append(b)
                ours.append(m)
                ours_engine.append(e)
                lags += lag
                print(f"round {r + 1}: sbatch {b:.2f} s, runner {m:.2f} s (engine shows all ended at {e:.2f} s), "
                      f"ratio {m / b:.3f}; lag median {statistics.median(lag):.2f} s", flush=True)
            ideal = args.jobs / 4 * 1.0
            mb, mo = statistics.median(base), statistics.median(ours)
            print(f"\n{args.jobs} jobs x 1 s on 4 GPUs (ideal {ideal:.1f} s), medians of {args.rounds} rounds:")
            print(f"  makespan, plain sbatch:   {mb:.2f} s")
            print(f"  makespan, Slurm runner:   {mo:.2f} s (engine shows all ended at "
                  f"{statistics.median(ours_engine):.2f} s)")
            ratios = [o / b for o, b in zip(ours, base)]
            print(f"  ratio runner / sbatch:    {mo / mb:.3f} of the medians, {statistics.median(ratios):.3f} median "
                  f"of the rounds' ({min(ratios):.3f}-{max(ratios):.3f})  (target <= 1.10)")
            print(f"  engine lag behind Slurm:  median {statistics.median(lags):.2f} s, "
                  f"max {max(lags):.2f} s over {len(lags)} starts and ends  (target: median <= 1 s)")
        finally:
            next(factory, None)
            cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
