"""Replay traces and synthetic mixes through the simulator: the default policy vs fifo and fifo+backfill.

    python benchmarks/replay.py                  # every trace in ../shared/traces + the synthetic mixes
    python benchmarks/replay.py --quick          # a few minutes on 2 busy cores (see --quick below)
    python benchmarks/replay.py DIR --limit 6000 --loads 0.9 --seeds 1,2,3

Workloads: every trace CSV of the folder (whole, or its first --limit jobs) and the synthetic
mixes (`synthetic`: many small jobs with a few 8-GPU ones, submitted in bursts by users of very
different weight; one run per --seeds). For each workload and each load of --loads (default 0.7,
0.9, 1.1) the cluster of 8-GPU hosts is sized so that the workload's mean GPU demand is that
share of it (`sim.contention_cluster`), and fifo, fifo+backfill and default (`sim.POLICIES`)
replay it in parallel processes.

Per policy, over the whole workload: mean, p50, p90, p99 and max wait, the worst user's mean
wait, mean JCT, mean bounded slowdown (`sim.bounded_slowdown`: wait + run over max(run, 10 s)), GPU
utilization (`Result.metrics`), and the start-estimate rows `waited_ok`, `waited_5m25`,
`waited_in_range` when the simulator's metrics have them; with the default's ratio to
fifo+backfill and to fifo. Then the same figures over sliding windows of --window jobs in submit
order, every --step jobs (a window's utilization: GPU-seconds of every job run between the
submits of its first and last job, over the cluster's GPU-seconds then): each window's
default/fifo+backfill ratio of mean and p99 wait, and the share of windows where the default's
is no higher. Then the default's tail: the jobs at or above its p99 wait, by size and user (with
the user's part of all GPU-time), their waits under fifo+backfill, and what passed them (jobs
submitted later that started earlier: how many, their sizes and users).

Targets (issue 33), per workload and load: the default's mean and p99 wait <= fifo+backfill's,
overall and in >= 90 % of windows; and on the traces, the wins over fifo that the whole trace
showed kept: mean wait <= 0.2 x fifo, mean JCT <= 0.7 x fifo, utilization >= 0.99 x fifo, worst
user's mean wait <= 0.5 x fifo. A last table lists every target per workload and load, met (+)
or not (-); on the synthetic mixes the wins over fifo are shown in brackets, not targets there
(a mix at load 0.7 waits so little under fifo that JCT <= 0.7 x fifo's is out of reach: its
runs alone are over 0.8 of fifo's JCT).

--quick: the first 7,000 jobs of each trace, 4,000 jobs per mix, seeds 1 and 2, windows of
3,000 jobs every 1,000. --references adds `greedy` (sim.GREEDY, the work-conserving reference
for utilization) and `default/limits` (expected starts from time limits only) to the tables.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jupyter_gpujobs.model import Policy  # noqa: E402
from jupyter_gpujobs.sim import (  # noqa: E402
    GREEDY,
    POLICIES,
    TraceJob,
    bounded_slowdown,
    contention_cluster,
    folded,
    percentile,
    read_trace,
    simulate,
)

GPUS_PER_HOST = 8
#: the first N_BOTH targets of `report` hold on traces and mixes; the rest (wins over fifo) on traces
N_BOTH = 4
NAMES = ("fifo", "fifo+backfill", "default")
#: --references: the work-conserving reference for utilization (`sim.GREEDY`) and the default
#: policy with expected starts from time limits only (the estimates before runtime predictions)
REFERENCES = {"greedy": GREEDY, "default/limits": replace(POLICIES["default"], use_predictions=False)}
BASE = "fifo+backfill"
#: rows of the whole-workload table: (key, label); the estimate rows only when the metrics have them
ROWS = [("mean_wait", "mean wait s"), ("p50_wait", "p50 wait s"), ("p90_wait", "p90 wait s"),
        ("p99_wait", "p99 wait s"), ("max_wait", "max wait s"), ("worst_user_wait", "worst user's mean wait s"),
        ("mean_jct", "mean JCT s"), ("mean_bsld", "mean bounded slowdown"), ("utilization", "GPU utilization")]
ESTIMATE_ROWS = [("waited_ok", "waited: start within max(60s,10%)"), ("waited_5m25", "waited: start within 5m/25%"),
                 ("waited_in_range", "waited: start within its range")]


# -- workloads ------------------------------------------------------------------------------

def synthetic(seed: int, n: int, wide: float = 0.03) -> list[TraceJob]:
    """A mix of `n` jobs: many small ones and a few (`wide`) 8-GPU ones, from 30 users whose
    weights fall as 1/rank (one heavy user, many light ones), each submitting bursts of 1-20
    jobs alike in size and length (a sweep, an array). Run times log-normal (median 20 min,
    clipped to [30 s, 3 days]); 8-GPU jobs run longer (median 2 h). Arrivals of bursts: Poisson."""
    rng = random.Random(seed)
    users = [f"s{u:02d}" for u in range(1, 31)]
    weights = [1.0 / r for r in range(1, 31)]
    out: list[TraceJob] = []
    t = 0.0
    while len(out) < n:
        t += rng.expovariate(1 / 600.0)
        user = rng.choices(users, weights)[0]
        x = rng.random()
        gpus = 8 if x < wide else 4 if x < wide + 0.04 else 2 if x < wide + 0.10 else 1
        median = 7200.0 if gpus == 8 else 1200.0
        for _ in range(min(n - len(out), rng.choice((1, 1, 1, 2, 4, 8, 20)))):
            d = min(3 * 86400.0, max(30.0, rng.lognormvariate(math.log(median), 1.5)))
            out.append(TraceJob(len(out) + 1, user, round(t + rng.uniform(0, 60)), round(d), gpus))
    out.sort(key=lambda j: (j.submit, j.id))
    return [TraceJob(i + 1, j.user, j.submit, j.duration, j.gpus) for i, j in enumerate(out)]


@dataclass
class Workload:
    name: str
    jobs: list[TraceJob]
    trace: bool = False  # a trace CSV (the whole-trace targets apply), not a synthetic mix


def workloads(folder: Path, limit: int | None, seeds: list[int], mix_jobs: int) -> list[Workload]:
    out = [Workload(p.stem, read_trace(p, limit), trace=True) for p in sorted(folder.glob("*.csv"))]
    for seed in seeds:
        out.append(Workload(f"mix-small+8 seed {seed}", synthetic(seed, mix_jobs)))
        out.append(Workload(f"mix-wide seed {seed}", synthetic(seed, mix_jobs, wide=0.10)))
    return out


# -- figures --------------------------------------------------------------------------------

def summary(jobs: list[TraceJob], wait: dict[int, float]) -> dict[str, float]:
    """Wait, JCT and slowdown figures of `jobs` (those that started) from their waits."""
    w: list[float] = []
    jct: list[float] = []
    bsld: list[float] = []
    per_user: dict[str, list[float]] = {}
    for j in jobs:
        if j.id not in wait:
            continue
        x = wait[j.id]
        d = folded(j, GPUS_PER_HOST)[1]
        w.append(x)
        jct.append(x + d)
        bsld.append(bounded_slowdown(x, d))
        per_user.setdefault(j.user, []).append(x)
    n = max(1, len(w))
    w.sort()
    return {"mean_wait": sum(w) / n, "p50_wait": percentile(w, 50), "p90_wait": percentile(w, 90),
            "p99_wait": percentile(w, 99),
            "max_wait": w[-1] if w else 0.0, "mean_jct": sum(jct) / n, "mean_bsld": sum(bsld) / n,
            "worst_user_wait": max((sum(v) / len(v) for v in per_user.values()), default=0.0)}


def busy_share(all_jobs: list[TraceJob], wait: dict[int, float], a: float, b: float, gpus: int) -> float:
    """GPU-seconds run between `a` and `b` over the cluster's GPU-seconds then."""
    if b <= a:
        return 0.0
    busy = 0.0
    for j in all_jobs:
        if j.id not in wait:
            continue
        g, d = folded(j, GPUS_PER_HOST)
        s = j.submit + wait[j.id]
        busy += g * max(0.0, min(b, s + d) - max(a, s))
    return busy / (gpus * (b - a))


def windows(jobs: list[TraceJob], size: int, step: int) -> list[tuple[int, int]]:
    """(first, end) index ranges of the sliding windows in submit order (one window if too few)."""
    if len(jobs) <= size:
        return [(0, len(jobs))]
    return [(k, k + size) for k in range(0, len(jobs) - size + 1, step)]


def _run(args: tuple[str, list[TraceJob], str, Policy, int]) -> tuple[str, str, dict[str, float], dict[int, float], float]:
    key, jobs, name, policy, hosts = args
    t0 = time.perf_counter()
    res = simulate(jobs, policy, hosts, GPUS_PER_HOST, name)
    return key, name, res.metrics(), dict(res.job_waits), time.perf_counter() - t0


def fmt(v: float) -> str:
    return f"{v:>14.3f}" if abs(v) < 100 else f"{v:>14.0f}"


def ratio(a: float, b: float) -> float:
    return a / b if b else (1.0 if a == b else math.inf)


def report(w: Workload, load: float, hosts: int, metrics: dict[str, dict[str, float]],
           waits: dict[str, dict[int, float]], walls: dict[str, float], win: int, step: int,
           tail: bool) -> list[tuple[str, bool]]:
    """Print one workload at one load (the policies of `metrics`: NAMES, then any references);
    return its targets (name, met)."""
    gpus = hosts * GPUS_PER_HOST
    names = list(metrics)
    print(f"\n## {w.name}, load {load}: {len(w.jobs)} jobs on {hosts} hosts x {GPUS_PER_HOST} = {gpus} GPUs "
          f"(replay s: " + ", ".join(f"{n} {walls[n]:.0f}" for n in names) + ")", flush=True)
    whole = {n: summary(w.jobs, waits[n]) | {"utilization": metrics[n]["utilization"]} for n in names}
    rows = ROWS + [r for r in ESTIMATE_ROWS if r[0] in metrics["default"]]
    print(f"{'metric':<36}" + "".join(f"{n:>15}" for n in names) + f"{'default/fb':>12}{'default/fifo':>13}")
    for key, label in rows:
        vals = [whole[n][key] if key in whole[n] else metrics[n].get(key, math.nan) for n in names]
        d, fb, ff = vals[2], vals[1], vals[0]
        print(f"{label:<36}" + "".join(" " + fmt(v) for v in vals) + f"{ratio(d, fb):>12.2f}{ratio(d, ff):>13.2f}")
    # sliding windows
    spans = windows(w.jobs, win, step)
    per: list[tuple[int, dict[str, dict[str, float]]]] = []
    for a, b in spans:
        sub = w.jobs[a:b]
        t0, t1 = sub[0].submit, sub[-1].submit
        per.append((a, {n: summary(sub, waits[n]) | {"utilization": busy_share(w.jobs, waits[n], t0, t1, gpus)}
                        for n in (BASE, "default")}))
    mean_ok = sum(p["default"]["mean_wait"] <= p[BASE]["mean_wait"] for _, p in per)
    p99_ok = sum(p["default"]["p99_wait"] <= p[BASE]["p99_wait"] for _, p in per)
    print(f"windows of {min(win, len(w.jobs))} jobs every {step}: default/fb per window (from job #)")
    print(f"{'  from':<8}{'mean wait':>11}{'p99 wait':>10}{'max wait':>10}{'worst user':>11}{'JCT':>7}"
          f"{'bsld':>7}{'util':>7}   default mean / p99 wait s")
    for a, p in per:
        d, fb = p["default"], p[BASE]
        print(f"{a + 1:<8}" + "".join(f"{ratio(d[k], fb[k]):>{wd}.2f}" for k, wd in
                                      (("mean_wait", 11), ("p99_wait", 10), ("max_wait", 10), ("worst_user_wait", 11),
                                       ("mean_jct", 7), ("mean_bsld", 7), ("utilization", 7)))
              + f"   {d['mean_wait']:.0f} / {d['p99_wait']:.0f}")
    print(f"windows where default <= fifo+backfill: mean wait {mean_ok}/{len(per)}, p99 wait {p99_ok}/{len(per)}")
    if tail:
        print_tail(w.jobs, waits["default"], waits[BASE])
    d, fb, ff = whole["default"], whole[BASE], whole["fifo"]
    return [("mean wait <= fb", d["mean_wait"] <= fb["mean_wait"]),
            ("p99 wait <= fb", d["p99_wait"] <= fb["p99_wait"]),
            ("windows mean <= fb >= 90%", mean_ok >= 0.9 * len(per)),
            ("windows p99 <= fb >= 90%", p99_ok >= 0.9 * len(per)),
            ("mean wait <= 0.2x fifo", d["mean_wait"] <= 0.2 * ff["mean_wait"]),
            ("JCT <= 0.7x fifo", d["mean_jct"] <= 0.7 * ff["mean_jct"]),
            ("util >= 0.99x fifo", d["utilization"] >= 0.99 * ff["utilization"]),
            ("worst user <= 0.5x fifo", d["worst_user_wait"] <= 0.5 * ff["worst_user_wait"])]


def print_tail(jobs: list[TraceJob], wait: dict[int, float], base: dict[int, float]) -> None:
    """The default's tail: jobs at or above its p99 wait, and what passed them."""
    cut = percentile(sorted(wait.values()), 99)
    tail = [j for j in jobs if wait.get(j.id, -1.0) >= cut and wait[j.id] > 0]
    if not tail:
        print("default's tail: none (its p99 wait is 0)")
        return
    used = Counter[str]()
    for j in jobs:
        used[j.user] += j.gpus * j.duration
    total = sum(used.values()) or 1.0
    start = {j.id: j.submit + wait[j.id] for j in jobs if j.id in wait}
    passers: Counter[int] = Counter()
    passer_users: Counter[str] = Counter()
    counts = []
    for t in tail:
        later = [j for j in jobs if j.submit > t.submit and start.get(j.id, math.inf) < start[t.id]]
        counts.append(len(later))
        passers.update(min(j.gpus, GPUS_PER_HOST) for j in later)
        passer_users.update("same user" if j.user == t.user else j.user for j in later)
    sizes = Counter(min(j.gpus, GPUS_PER_HOST) for j in tail)
    users = Counter(j.user for j in tail).most_common(4)
    fb = sorted(base[j.id] for j in tail if j.id in base)
    print(f"default's tail: {len(tail)} jobs waited >= {cut:.0f} s (p99); GPUs "
          + ", ".join(f"{k}: {v}" for k, v in sorted(sizes.items())) + "; users "
          + ", ".join(f"{u} {n} ({used[u] / total:.0%} of GPU-time)" for u, n in users)
          + f"; their fifo+backfill wait median {percentile(fb, 50):.0f} s, max {fb[-1] if fb else 0:.0f} s")
    print(f"  passed by (submitted later, started earlier): median {percentile(sorted(counts), 50):.0f} jobs each; sizes "
          + ", ".join(f"{k}: {v}" for k, v in sorted(passers.items())) + "; by "
          + ", ".join(f"{u} {n}" for u, n in passer_users.most_common(4)))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="?", default=str(ROOT.parent / "shared" / "traces"),
                    help="folder of trace CSVs (default ../shared/traces relative to the repository)")
    ap.add_argument("--limit", type=int, default=None, help="replay only the first N jobs of each trace")
    ap.add_argument("--loads", default="0.7,0.9,1.1", help="mean demand / cluster size, comma-separated")
    ap.add_argument("--seeds", default="1,2,3", help="seeds of the synthetic mixes ('' for none)")
    ap.add_argument("--mix-jobs", type=int, default=8000, help="jobs per synthetic mix")
    ap.add_argument("--window", type=int, default=5000, help="jobs per sliding window")
    ap.add_argument("--step", type=int, default=1000, help="jobs between window starts")
    ap.add_argument("--no-tail", action="store_true", help="leave out the analysis of the default's tail")
    ap.add_argument("--quick", action="store_true", help="a smaller run (see the module docstring)")
    ap.add_argument("--references", action="store_true",
                    help="also replay greedy and default/limits (whole-workload table only)")
    ap.add_argument("--workers", type=int, default=None, help="processes (default: the CPUs)")
    args = ap.parse_args(argv)
    if args.quick:
        args.limit, args.mix_jobs, args.window = args.limit or 7000, 4000, 3000
        args.seeds = "1,2" if args.seeds == "1,2,3" else args.seeds
    loads = [float(x) for x in args.loads.split(",") if x]
    seeds = [int(x) for x in args.seeds.split(",") if x]
    loads_bad = [x for x in loads if x <= 0]
    if loads_bad:
        ap.error(f"--loads must be positive, not {loads_bad}")
    t_start = time.perf_counter()
    todo = []
    policies = {n: POLICIES[n] for n in NAMES} | (REFERENCES if args.references else {})
    plan: list[tuple[Workload, float, int]] = []
    for w in workloads(Path(args.traces), args.limit, seeds, args.mix_jobs):
        for load in loads:
            hosts = contention_cluster(w.jobs, GPUS_PER_HOST, load)
            plan.append((w, load, hosts))
            todo += [(f"{w.name}@{load}", w.jobs, n, p, hosts) for n, p in policies.items()]
    with ProcessPoolExecutor(max_workers=args.workers or os.cpu_count() or 1) as pool:
        done = list(pool.map(_run, todo))
    out = {(k, n): (m, wt, s) for k, n, m, wt, s in done}
    table: list[tuple[str, list[tuple[str, bool]]]] = []
    for w, load, hosts in plan:
        k = f"{w.name}@{load}"
        checks = report(w, load, hosts, {n: out[k, n][0] for n in policies}, {n: out[k, n][1] for n in policies},
                        {n: out[k, n][2] for n in policies}, args.window, args.step, not args.no_tail)
        table.append((k, checks))
    print("\n## targets of the default policy (met: +, missed: -; in brackets: shown, not a target there)")
    names = [c for c, _ in table[0][1]] if table else []
    for i, c in enumerate(names):
        print(f"  {i + 1}. {c}")
    print(f"{'workload@load':<34}" + "".join(f"{i + 1:>4}" for i in range(len(names))))
    met = n_targets = 0
    for (k, checks), (w, _, _) in zip(table, plan):
        marks = []
        for i, (_, ok) in enumerate(checks):
            target = w.trace or i < N_BOTH
            met += target and ok
            n_targets += target
            marks.append(('+' if ok else '-') if target else ('(+)' if ok else '(-)'))
        print(f"{k:<34}" + "".join(f"{m:>4}" for m in marks))
    print(f"{met} of {n_targets} targets met; all replayed in {time.perf_counter() - t_start:.0f} s wall")


if __name__ == "__main__":
    main()
