"""Cycle time of the scheduler: median of one `schedule()` call.

    python benchmarks/bench_scheduler.py            # 1k and 10k pending over 64 and 512 GPUs
    python benchmarks/bench_scheduler.py --repeat 5  # fewer repetitions

For each size it prints the median of the v1 policy (classes, FIFO, limits, backfill) and of
every policy on (fair-share, quotas with guarantees, urgent reserve, preemption, off-peak,
dependencies, arrays), and the ratio against a baseline measured in the same run (sorting the
pending list by (class, submit time)), because machines are noisy. Times are CPU time of this
process (`time.process_time`), medians of --repeat runs. The default reservation depth
(`Policy.reservation_depth` = 100) applies; `--depth N` (or `--depth all`) changes it. The snapshot: a half busy
cluster of 8-GPU hosts, 40 users in 4 groups, a Philly-like size mix (mostly 1 GPU).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jupyter_gpujobs.model import (  # noqa: E402
    GPU,
    PRIORITY_RANK,
    Dependency,
    Job,
    JobState,
    OffpeakWindow,
    Policy,
    Quota,
)
from jupyter_gpujobs.scheduler import Usage, schedule  # noqa: E402

V1 = Policy(fairshare=False, weight_age=0.0, weight_size=0.0, weight_fairshare=0.0,
            preemption=False, user_max_running_jobs=50, user_max_gpus=64)


DEPTH: int | None = Policy().reservation_depth


def all_policies(n_gpus: int) -> Policy:
    groups = {f"g{i}": Quota(guaranteed_gpus=n_gpus // 8, max_running_jobs=400) for i in range(4)}
    return Policy(
        reservation_depth=DEPTH,
        user_max_running_jobs=50, user_max_gpus=64, group_quotas=groups,
        user_quotas={"u0": Quota(guaranteed_gpus=8, max_gpus=32)},
        default_user_quota=Quota(max_time_limit_s=3 * 86400),
        urgent_reserve_gpus=8, preemption=True,
        user_shares={f"u{i}": 1.0 + (i % 3) for i in range(40)},
        offpeak_windows=(OffpeakWindow((0, 1, 2, 3, 4), 22, 30), OffpeakWindow((5, 6), 0, 24)),
        utc_offset_s=3600,
    )


def snapshot(n_pending: int, hosts: int, seed: int = 1) -> tuple[float, list[Job], list[Job], list[GPU], Usage, dict[int, JobState]]:
    rnd = random.Random(seed)
    now = 1_700_000_000.0
    gpus = [GPU(i, f"GPU-{h}-{i}", "A100" if h % 4 else "H100", host=f"node{h:02d}")
            for h in range(hosts) for i in range(8)]
    sizes = [1] * 87 + [2] * 8 + [4] * 3 + [8] * 2
    limits = [900, 3600, 4 * 3600, 12 * 3600, 86400]
    running: list[Job] = []
    jid = 1
    for h in range(hosts):
        free = list(range(8))
        rnd.shuffle(free)
        busy = free[: rnd.randint(2, 6)]  # about half busy
        for i in busy:
            u = rnd.randrange(40)
            running.append(Job(id=jid, user=f"u{u}", group=f"g{u % 4}", gpus=1, state=JobState.RUNNING,
                               host=f"node{h:02d}", assigned_gpus=(i,), started_at=now - rnd.uniform(0, 3600),
                               time_limit_s=rnd.choice(limits), submitted_at=now - 7200,
                               borrowed=rnd.random() < 0.3, preemptible=rnd.random() < 0.3))
            jid += 1
    pending: list[Job] = []
    classes = ["low"] * 2 + ["normal"] * 15 + ["high"] * 2 + ["urgent"]
    for _ in range(n_pending):
        u = rnd.randrange(40)
        j = Job(id=jid, user=f"u{u}", group=f"g{u % 4}", gpus=rnd.choice(sizes),
                gpu_type=rnd.choice([None, None, None, "A100", "H100"]), time_limit_s=rnd.choice(limits),
                priority=rnd.choice(classes), submitted_at=now - rnd.uniform(0, 86400),
                preemptible=rnd.random() < 0.2)
        r = rnd.random()
        if r < 0.01:
            j.offpeak = True
        elif r < 0.02:
            j.begin = now + rnd.uniform(0, 7200)
        elif r < 0.03 and pending:
            j.depends = (Dependency("afterok", pending[-1].id),)
        elif r < 0.06:
            j.array_job_id, j.array_max_running = 10_000_000 + u, 4
        pending.append(j)
        jid += 1
    usage = Usage({f"u{i}": rnd.uniform(0, 1e6) for i in range(40)}, {f"g{i}": rnd.uniform(0, 4e6) for i in range(4)})
    return now, pending, running, gpus, usage, {}


def median_ms(fn: object, repeat: int) -> float:
    """Median CPU time of this process (a cycle is single-threaded and does no I/O, so on an
    idle machine it equals wall time; on a shared one it does not count other processes)."""
    times = []
    for _ in range(repeat):
        t0 = time.process_time()
        fn()  # type: ignore[operator]
        times.append((time.process_time() - t0) * 1000)
    return statistics.median(times)


def measure(n: int, hosts: int, repeat: int) -> dict[str, float]:
    now, pending, running, gpus, usage, finished = snapshot(n, hosts)
    full = all_policies(len(gpus))
    rank = PRIORITY_RANK
    base = median_ms(lambda: sorted(pending, key=lambda j: (-rank[j.priority], j.submitted_at, j.id)), repeat)
    v1 = median_ms(lambda: schedule(now, pending, running, gpus, V1), repeat)
    allp = median_ms(lambda: schedule(now, pending, running, gpus, full, usage, finished), repeat)
    return {"pending": n, "gpus": len(gpus), "baseline_ms": base, "v1_ms": v1, "all_ms": allp}


def run(repeat: int = 15, sizes: tuple[int, ...] = (1000, 10000), hosts_list: tuple[int, ...] = (8, 64)) -> list[dict[str, float]]:
    return [measure(n, hosts, repeat) for hosts in hosts_list for n in sizes]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--depth", default=None, help="Policy.reservation_depth for both policies (a number or 'all')")
    args = ap.parse_args(argv)
    if args.depth is not None:
        global V1, DEPTH
        DEPTH = None if args.depth == "all" else int(args.depth)
        V1 = replace(V1, reservation_depth=DEPTH)
    print(f"{'pending':>8} {'GPUs':>5} {'baseline ms':>12} {'v1 ms':>8} {'all ms':>8} {'v1/base':>8} {'all/base':>9}")
    for r in run(args.repeat):
        print(f"{r['pending']:>8} {r['gpus']:>5} {r['baseline_ms']:>12.2f} {r['v1_ms']:>8.2f} {r['all_ms']:>8.2f}"
              f" {r['v1_ms'] / r['baseline_ms']:>8.1f} {r['all_ms'] / r['baseline_ms']:>9.1f}")


if __name__ == "__main__":
    main()
