"""Replay every trace through the simulator under fifo, fifo+backfill and default.

    python benchmarks/replay.py                 # every trace in ../shared/traces, whole traces
    python benchmarks/replay.py DIR --limit 3000 # another folder, first 3000 jobs of each

For each trace the cluster (8-GPU hosts) is sized so that the trace's mean GPU demand is 90 %
of it (real contention); the size is printed. The policies run in parallel processes, one per
policy, plus `greedy` (sim.GREEDY: submit order, no reservations, a job starts whenever it fits),
the work-conserving reference for utilization, and `default/limits` (the default policy with
expected starts from time limits only, `use_predictions=False`: the estimates before runtime
predictions, same starts). Then one table per trace, the policies side by side, the targets of
the default policy against fifo, and the cycle benchmark at 10k pending x 512 GPUs with all
policies.

Start accuracy: each job's expected start as the cycle at its submit gave it (a job that starts
at once counts as predicted), against the start it got: the share within 60 s, and within
max(60 s, 10 % of its wait); then the same over the jobs that waited, what share of their
estimates were bounds from time limits, how many of those bounds were kept (start no later than
60 s past it), and how many predictions were within max(60 s, 10 %).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from jupyter_gpujobs.model import Policy  # noqa: E402
from jupyter_gpujobs.sim import GREEDY, POLICIES, contention_cluster, read_trace, simulate  # noqa: E402

ROWS = [("mean_wait", "mean wait s"), ("p50_wait", "p50 wait s"), ("p99_wait", "p99 wait s"),
        ("mean_jct", "mean JCT s"), ("mean_bsld", "mean bounded slowdown"), ("utilization", "GPU utilization"),
        ("util_vs_greedy", "utilization / greedy's"), ("utilization_ub", "utilization upper bound (makespan LB)"),
        ("makespan", "makespan s"), ("makespan_lb", "makespan lower bound s"),
        ("worst_user_wait", "worst user's mean wait s"), ("jain_slowdown", "Jain index (user slowdown)"),
        ("predicted_1m", "starts predicted within 60 s"),
        ("predicted_ok", "starts predicted within max(60s,10%)"),
        ("waited_1m", "  of jobs that waited: within 60 s"), ("waited_ok", "  of jobs that waited: max(60s,10%)"),
        ("bounds_share", "  their estimates that are bounds"), ("bounds_kept", "  bounds kept (start <= bound + 60 s)"),
        ("predictions_ok", "  predictions within max(60s,10%)"), ("cycles", "scheduling cycles"),
        ("skipped", "event times without a cycle"), ("wall_s", "replay wall time s")]


def _one(args: tuple[str, int | None, str, Policy, int]) -> tuple[str, dict[str, float], dict[str, float]]:
    path, limit, name, policy, hosts = args
    trace = read_trace(path, limit)
    t0 = time.perf_counter()
    res = simulate(trace, policy, hosts, 8, name)
    m = res.metrics()
    m["wall_s"] = time.perf_counter() - t0
    m["skipped"] = float(res.skipped)
    return name, m, res.user_waits()


def replay(path: Path, limit: int | None, workers: int | None = None) -> None:
    trace = read_trace(path, limit)
    hosts = contention_cluster(trace)
    print(f"\n## {path.name}: {len(trace)} jobs on {hosts} hosts x 8 = {hosts * 8} GPUs", flush=True)
    policies = dict(POLICIES)
    policies["default/limits"] = replace(POLICIES["default"], use_predictions=False)
    policies["greedy"] = GREEDY
    t0 = time.perf_counter()
    jobs = [(str(path), limit, name, pol, hosts) for name, pol in policies.items()]
    with ProcessPoolExecutor(max_workers=workers or min(len(jobs), os.cpu_count() or 1)) as pool:
        out = list(pool.map(_one, jobs))
    metrics = {name: m for name, m, _ in out}
    waits = {name: w for name, _, w in out}
    for m in metrics.values():
        m["util_vs_greedy"] = m["utilization"] / metrics["greedy"]["utilization"]
    names = list(policies)
    print(f"{'metric':<40}" + "".join(f"{n:>15}" for n in names) + f"{'default/fifo':>14}")
    for key, label in ROWS:
        vals = [metrics[n][key] for n in names]
        ratio = metrics["default"][key] / metrics["fifo"][key] if metrics["fifo"][key] else float("nan")
        print(f"{label:<40}" + "".join(f"{v:>15.3f}" if abs(v) < 100 else f"{v:>15.0f}" for v in vals) + f"{ratio:>14.2f}")
    worse = max((waits["default"][u] / max(1.0, waits["fifo"][u]) for u in waits["fifo"]), default=0.0)
    print(f"{'worst user: default wait / fifo wait':<40}{worse:>15.2f}")
    d, f = metrics["default"], metrics["fifo"]
    checks = [("mean wait <= 0.3 x fifo", d["mean_wait"] <= 0.3 * f["mean_wait"]),
              ("mean JCT <= 0.7 x fifo", d["mean_jct"] <= 0.7 * f["mean_jct"]),
              ("utilization >= 97 % of greedy's", d["util_vs_greedy"] >= 0.97),
              ("no user's mean wait > 2 x fifo's", worse <= 2.0),
              (">= 65 % of starts predicted within 60 s", d["predicted_1m"] >= 0.65),
              (">= 85 % of starts predicted within max(60 s, 10 %)", d["predicted_ok"] >= 0.85)]
    print("targets (default vs fifo): " + "; ".join(f"{n}: {'met' if ok else 'NOT met'}" for n, ok in checks))
    print(f"(all policies replayed in {time.perf_counter() - t0:.0f} s wall)")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="?", default=str(ROOT.parent / "shared" / "traces"),
                    help="folder of trace CSVs (default ../shared/traces relative to the repository)")
    ap.add_argument("--limit", type=int, default=None, help="replay only the first N jobs of each trace")
    ap.add_argument("--repeat", type=int, default=15, help="repetitions of the cycle benchmark (as bench_scheduler.py)")
    ap.add_argument("--workers", type=int, default=None, help="processes (default: one per policy, at most the CPUs)")
    args = ap.parse_args(argv)
    for path in sorted(Path(args.traces).glob("*.csv")):
        replay(path, args.limit, args.workers)
    from bench_scheduler import measure

    r = measure(10000, 64, args.repeat)
    print(f"\ncycle, 10k pending x 512 GPUs, all policies (target: decide <= 20 ms): steady decide median "
          f"{r['steady_ms']:.1f} ms, with every estimate {r['steady_all_ms']:.1f} ms; burst decide "
          f"{r['decide_ms']:.1f} ms, with every estimate {r['all_ms']:.1f} ms (baseline sort "
          f"{r['baseline_ms']:.1f} ms; steady decide / baseline {r['steady_ms'] / r['baseline_ms']:.1f}x)")


if __name__ == "__main__":
    main()
