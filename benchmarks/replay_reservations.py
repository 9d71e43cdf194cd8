"""What a learned reservation saves: a weekly habit planted in a real trace, found by the
engine's detector, reserved, and replayed again.

    python benchmarks/replay_reservations.py                       # ../shared/traces/philly-11cb48.csv
    python benchmarks/replay_reservations.py TRACE.csv --limit 6000

The trace is shifted to begin on a Monday 00:00 UTC, and group `vision` (users v1, v2) is
added: every Friday at 09:05 and 09:20 one 4-GPU job each, running 2.5-2.9 h (so 4 h time
limits, as the simulator models them). The cluster is sized for 90 % of the mean demand
(`sim.contention_cluster`). The default policy replays it twice:

1. as it is (no reservation);
2. with the reservation the detector (engine/monitor/habits.py) proposes from what the engine
   would have recorded in the first `--learn-weeks` weeks (each job's submit, limit and
   runtime), in force from the first Friday after.

It prints the proposal, the holders' wait on each Friday after it (before / after), and what
the others pay for it (their mean wait and the utilization, before / after).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jupyter_gpujobs.engine.monitor.habits import find_habits, proposal_finding  # noqa: E402
from jupyter_gpujobs.model import Job, JobState, Reservation, validate_reservation  # noqa: E402
from jupyter_gpujobs.sim import (  # noqa: E402
    POLICIES,
    Result,
    TraceJob,
    contention_cluster,
    read_trace,
    simulate,
    typical_limit,
)

MONDAY = 1795996800.0  # 2026-11-30 00:00 UTC
WEEK = 7 * 86400


def planted(path: Path, limit: int | None, seed: int = 1) -> tuple[list[TraceJob], list[int]]:
    """The trace from a Monday, with group vision's Friday habit; returns (trace, vision's ids)."""
    rnd = random.Random(seed)
    trace = read_trace(path, limit)
    for t in trace:
        t.submit += MONDAY
    end = max(t.submit for t in trace)
    ids: list[int] = []
    friday = MONDAY + 4 * 86400
    while friday + 9 * 3600 < end:
        for user, minute in (("v1", 5), ("v2", 20)):
            trace.append(TraceJob(len(trace) + 1, user, friday + 9 * 3600 + minute * 60,
                                  rnd.uniform(2.5, 2.9) * 3600, 4, group="vision"))
            ids.append(trace[-1].id)
        friday += WEEK
    trace.sort(key=lambda t: (t.submit, t.id))
    return trace, ids


def history(trace: list[TraceJob], until: float) -> list[Job]:
    """What the engine's store holds of the jobs submitted before `until`, for the detector."""
    return [Job(id=t.id, user=t.user, group=t.group, gpus=t.gpus, gpu_type=t.gpu_type, submitted_at=t.submit,
                started_at=t.submit, ended_at=t.submit + t.duration, time_limit_s=typical_limit(t.duration),
                state=JobState.COMPLETED) for t in trace if t.submit < until]


def _run(args: tuple[list[TraceJob], int, list[Reservation]]) -> Result:
    trace, hosts, reservations = args
    return simulate(trace, POLICIES["default"], hosts, 8, "default", reservations=reservations)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", nargs="?", default=str(ROOT.parent / "shared" / "traces" / "philly-11cb48.csv"))
    ap.add_argument("--limit", type=int, default=None, help="only the first N jobs of the trace")
    ap.add_argument("--learn-weeks", type=int, default=4, help="weeks of history the detector sees")
    args = ap.parse_args(argv)
    trace, vision = planted(Path(args.trace), args.limit)
    hosts = contention_cluster(trace)
    learned_at = MONDAY + args.learn_weeks * WEEK
    habits = find_habits(history(trace, learned_at), learned_at)
    mine = [h for h in habits if h.name == "vision"]
    print(f"{Path(args.trace).name}: {len(trace)} jobs ({len(vision)} of group vision) on {hosts} hosts x 8 GPUs")
    print(f"habits found after {args.learn_weeks} weeks: {len(habits)} ({len(habits) - len(mine)} of other users)")
    if not mine:
        print("the detector did not find vision's habit")
        return
    print("proposal: " + proposal_finding(mine[0]).message)
    fields = validate_reservation(mine[0].reservation_body(), learned_at)
    reservation = Reservation(id=1, created_by="admin", created_at=learned_at, **fields)
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=2) as pool:
        before, after = pool.map(_run, [(trace, hosts, []), (trace, hosts, [reservation])])
    print(f"(replayed twice in {time.perf_counter() - t0:.0f} s wall)")
    later = [j for j in vision if next(t for t in trace if t.id == j).submit >= reservation.start]
    if not later:
        print("the trace ends before the reservation's first Friday: replay more of it")
        return
    print(f"\nholders' wait on the {len(later) // 2} Fridays after the reservation (s): before -> after")
    for j in later:
        t = next(t for t in trace if t.id == j)
        day = time.strftime("%a %d %b %H:%M", time.gmtime(t.submit))
        print(f"  job {j:>6} {t.user} {day}: {before.job_waits[j]:>8.0f} -> {after.job_waits[j]:>8.0f}")
    b = statistics.mean(before.job_waits[j] for j in later)
    a = statistics.mean(after.job_waits[j] for j in later)
    print(f"holders' mean wait: {b:.0f} s -> {a:.0f} s")
    others = [t.id for t in trace if t.group != "vision"]
    ob = statistics.mean(before.job_waits[j] for j in others)
    oa = statistics.mean(after.job_waits[j] for j in others)
    mb, ma = before.metrics(), after.metrics()
    print(f"others' mean wait: {ob:.0f} s -> {oa:.0f} s; utilization {mb['utilization']:.3f} -> {ma['utilization']:.3f}")


if __name__ == "__main__":
    main()
