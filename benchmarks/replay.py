"""Replay every trace through the simulator under fifo, fifo+backfill and default.

    python benchmarks/replay.py                 # every trace in ../shared/traces
    python benchmarks/replay.py DIR --limit 3000 # another folder, first 3000 jobs of each

For each trace the cluster (8-GPU hosts) is sized so that the trace's mean GPU demand is 90 %
of it (real contention); the size is printed. Then one table of metrics per trace, the three
policies side by side, and the cycle benchmark at 10k pending x 512 GPUs with all policies.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from jupyter_gpujobs.sim import POLICIES, contention_cluster, read_trace, simulate  # noqa: E402

ROWS = [("mean_wait", "mean wait s"), ("p50_wait", "p50 wait s"), ("p99_wait", "p99 wait s"),
        ("mean_jct", "mean JCT s"), ("mean_bsld", "mean bounded slowdown"), ("utilization", "GPU utilization"),
        ("makespan", "makespan s"), ("makespan_lb", "makespan lower bound s"),
        ("worst_user_wait", "worst user's mean wait s"), ("jain_slowdown", "Jain index (user slowdown)"),
        ("predicted_ok", "starts predicted within max(60s,10%)"), ("cycles", "scheduling cycles"),
        ("wall_s", "replay wall time s")]


def replay(path: Path, limit: int | None) -> None:
    trace = read_trace(path, limit)
    hosts = contention_cluster(trace)
    print(f"\n## {path.name}: {len(trace)} jobs on {hosts} hosts x 8 = {hosts * 8} GPUs")
    metrics = {}
    waits = {}
    for name, policy in POLICIES.items():
        t0 = time.perf_counter()
        res = simulate(trace, policy, hosts, 8, name)
        m = res.metrics()
        m["wall_s"] = time.perf_counter() - t0
        metrics[name] = m
        waits[name] = res.user_waits()
    names = list(POLICIES)
    print(f"{'metric':<40}" + "".join(f"{n:>16}" for n in names) + f"{'default/fifo':>14}")
    for key, label in ROWS:
        vals = [metrics[n][key] for n in names]
        ratio = metrics["default"][key] / metrics["fifo"][key] if metrics["fifo"][key] else float("nan")
        print(f"{label:<40}" + "".join(f"{v:>16.3f}" if abs(v) < 100 else f"{v:>16.0f}" for v in vals) + f"{ratio:>14.2f}")
    worse = max((waits["default"][u] / max(1.0, waits["fifo"][u]) for u in waits["fifo"]), default=0.0)
    print(f"{'worst user: default wait / fifo wait':<40}{worse:>16.2f}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="?", default=str(ROOT.parent / "shared" / "traces"),
                    help="folder of trace CSVs (default ../shared/traces relative to the repository)")
    ap.add_argument("--limit", type=int, default=None, help="replay only the first N jobs of each trace")
    ap.add_argument("--repeat", type=int, default=7, help="repetitions of the cycle benchmark")
    args = ap.parse_args(argv)
    for path in sorted(Path(args.traces).glob("*.csv")):
        replay(path, args.limit)
    from bench_scheduler import measure

    r = measure(10000, 64, args.repeat)
    print(f"\ncycle, 10k pending x 512 GPUs, all policies: median {r['all_ms']:.1f} ms "
          f"(v1 {r['v1_ms']:.1f} ms; baseline sort {r['baseline_ms']:.1f} ms; ratio {r['all_ms'] / r['baseline_ms']:.1f}x)")


if __name__ == "__main__":
    main()
