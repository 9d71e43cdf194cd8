"""What advance reservations cost a scheduling cycle: the 10k-pending x 512-GPU steady cycle
of bench_scheduler.py (every policy on), without reservations and with 8 of them (4 on now,
4 starting within the day; 1, 2, 4 or 8 GPUs each, for a user or a group of the snapshot).

    python benchmarks/bench_reservations.py [--repeat 9]

Prints the median CPU ms of the deciding and the estimating cycle each way, and the ratio.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_scheduler import all_policies, kept_order, medians_ms, settle, snapshot  # noqa: E402

from jupyter_gpujobs.engine.scheduler import schedule  # noqa: E402
from jupyter_gpujobs.model import Reservation  # noqa: E402


def reservations(now: float) -> list[Reservation]:
    out = []
    for n in range(8):
        start = now - 1800 if n < 4 else now + 3600 * (n - 3)
        holders = {"users": (f"u{n}",)} if n % 2 else {"groups": (f"g{n % 4}",)}
        out.append(Reservation(id=n + 1, gpus=(1, 2, 4, 8)[n % 4], start=start, duration_s=4 * 3600,
                               host=f"node{n * 7:02d}", repeat="weekly", **holders))  # type: ignore[arg-type]
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=9)
    args = ap.parse_args(argv)
    now, pending, running, gpus, usage, finished = snapshot(10000, 64)
    full = all_policies(len(gpus))
    t, queue, active = settle(now, pending, running, gpus, full, usage, finished)
    kept = kept_order(t, queue, active, gpus, full, usage, finished)
    steady = {j.id: j for j in queue}
    res = reservations(t)
    ms = medians_ms({
        "decide": lambda: schedule(t, steady, active, gpus, full, usage, finished, estimate=False, order=kept),
        "decide+res": lambda: schedule(t, steady, active, gpus, full, usage, finished, estimate=False, order=kept,
                                       reservations=res),
        "all": lambda: schedule(t, steady, active, gpus, full, usage, finished),
        "all+res": lambda: schedule(t, steady, active, gpus, full, usage, finished, reservations=res),
    }, args.repeat)
    print("steady cycle, 10k pending x 512 GPUs, every policy on (median CPU ms)")
    for kind in ("decide", "all"):
        print(f"  {kind:<7} without reservations {ms[kind]:7.1f}   with 8 {ms[kind + '+res']:7.1f}"
              f"   ratio {ms[kind + '+res'] / ms[kind]:.2f}")


if __name__ == "__main__":
    main()
