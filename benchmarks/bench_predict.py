"""Accuracy of runtime prediction (jupyter_gpujobs.engine.monitor.predict) on a real trace.

Replays a trace from ../shared/traces/ in submit order. Each job is predicted from the jobs
that ended before it was submitted (a job ends at submit + duration, as if it started at
once: the trace has no start times). The key is user + num_gpus (the Philly trace has no job
names or commands). Prints the median absolute error over actual runtime,
median(|predicted - actual| / actual), of the predictor and of baselines in the same run:

- last: the user's last ended runtime (global median when the user has none yet)
- last2: the mean of the user's last two runtimes (Tsafrir et al. 2007)
- global-median: the median runtime of every job ended so far

and, for the predictor, the same over its confident predictions only (what backfill uses),
with their coverage and how often they under-predict (which would delay a reserved job).

    .venv/bin/python benchmarks/bench_predict.py [--trace PATH] [--min-confidence 0.6]
"""

from __future__ import annotations

import argparse
import bisect
import csv
import heapq
import time
from collections import defaultdict, deque
from pathlib import Path
from statistics import median

from jupyter_gpujobs.engine.monitor.predict import RuntimePredictor

DEFAULT_TRACE = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "philly-11cb48.csv"


def load(path: Path) -> list[tuple[int, str, int, float]]:
    """(submit s, user, gpus, duration s) rows in submit order."""
    with open(path, newline="") as f:
        rows = [(int(r["submit_time_s"]), r["user"], int(r["num_gpus"]), float(r["duration_s"]))
                for r in csv.DictReader(f)]
    rows.sort(key=lambda r: r[0])
    return rows


def rel(pred: float, actual: float) -> float:
    return abs(pred - actual) / actual


def replay(rows: list[tuple[int, str, int, float]], window: int, min_conf: float) -> dict[str, object]:
    predictor = RuntimePredictor(window=window)
    user_last: dict[str, deque[float]] = defaultdict(lambda: deque(maxlen=2))
    ended_sorted: list[float] = []
    running: list[tuple[float, int, str, int, float]] = []
    errors: dict[str, list[float]] = defaultdict(list)
    confident: list[float] = []
    confident_under = 0
    upper_under = 0
    levels: dict[str, int] = defaultdict(int)
    predicted = 0
    for i, (submit, user, gpus, duration) in enumerate(rows):
        while running and running[0][0] <= submit:
            _, _, u, g, d = heapq.heappop(running)
            predictor.add((u, str(g), ""), d)
            user_last[u].append(d)
            bisect.insort(ended_sorted, d)
        heapq.heappush(running, (submit + duration, i, user, gpus, duration))
        if not ended_sorted:
            continue  # nothing has ended yet: no method can predict
        predicted += 1
        p = predictor.predict((user, str(gpus), ""))
        assert p.seconds is not None
        levels[p.level] += 1
        errors["predictor"].append(rel(p.seconds, duration))
        if p.confidence >= min_conf:
            confident.append(rel(p.seconds, duration))
            confident_under += p.seconds < duration
            upper_under += (p.upper_s or 0) < duration
        global_median = ended_sorted[len(ended_sorted) // 2]
        errors["global-median"].append(rel(global_median, duration))
        hist = user_last.get(user)
        errors["last"].append(rel(hist[-1] if hist else global_median, duration))
        errors["last2"].append(rel(sum(hist) / len(hist) if hist else global_median, duration))
    return {"jobs": len(rows), "predicted": predicted, "errors": errors, "confident": confident,
            "confident_under": confident_under, "upper_under": upper_under, "levels": dict(levels)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--window", type=int, default=8, help="latest runs per key the predictor keeps")
    ap.add_argument("--min-confidence", type=float, default=0.6)
    args = ap.parse_args()
    rows = load(args.trace)
    t0 = time.perf_counter()
    out = replay(rows, args.window, args.min_confidence)
    elapsed = time.perf_counter() - t0
    errors: dict[str, list[float]] = out["errors"]  # type: ignore[assignment]
    print(f"trace {args.trace.name}: {out['jobs']} jobs, {out['predicted']} predicted "
          f"(the rest had no ended job before them); key = user + num_gpus; window {args.window}")
    print(f"{'method':<28} {'median |err|/actual':>20} {'p75':>8}")
    for name in ("predictor", "last", "last2", "global-median"):
        e = sorted(errors[name])
        print(f"{name:<28} {median(e):>20.3f} {e[int(0.75 * len(e))]:>8.3f}")
    conf: list[float] = out["confident"]  # type: ignore[assignment]
    if conf:
        print(f"{'predictor, confidence>=' + str(args.min_confidence):<28} {median(conf):>20.3f} "
              f"{sorted(conf)[int(0.75 * len(conf))]:>8.3f}   coverage {len(conf) / out['predicted']:.1%}, "
              f"under-predicts {out['confident_under'] / len(conf):.1%} "
              f"(its upper bound, the longest recent run: {out['upper_under'] / len(conf):.1%})")
    print("levels used: " + ", ".join(f"{k} {v}" for k, v in sorted(out["levels"].items())))  # type: ignore[union-attr]
    print(f"replay + prediction time: {elapsed:.2f}s ({1e6 * elapsed / len(rows):.1f} us per job)")


if __name__ == "__main__":
    main()
