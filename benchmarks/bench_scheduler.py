"""Cycle time of the scheduler: median of one `schedule()` call.

    python benchmarks/bench_scheduler.py            # 1k and 10k pending over 64 and 512 GPUs
    python benchmarks/bench_scheduler.py --repeat 5  # fewer repetitions

For each size it prints the median of the v1 policy (classes, FIFO, limits, backfill) and of
every policy on (fair-share, quotas with guarantees, urgent reserve, preemption, off-peak,
dependencies, arrays), and the ratio against a baseline measured in the same run (sorting the
pending list by (class, submit time)), because machines are noisy. Times are CPU time of this
process (`time.process_time`), medians of --repeat runs; the baseline and the cycles of one
size take turns, so that their medians span the same seconds of a noisy machine. The default
reservation depth (`Policy.reservation_depth` = 100) applies; `--depth N` (or `--depth all`)
changes it. The snapshot: a half busy cluster of 8-GPU hosts, 40 users in 4 groups, a
Philly-like size mix (mostly 1 GPU). The pending jobs are handed to `schedule()` as the server
hands them: the dictionary by id that it keeps from one cycle to the next.

Two kinds of cycle, every policy on:
- "decide": `schedule(..., estimate=False)`, what the server runs every cycle: every start,
  preemption, reason and the first 100 reservations, no estimate past the reservation depth;
- "all": a full cycle with the expected start of every job, what the server runs every
  `GPUJobs.estimate_interval` (10 s).
And two states: "burst", the snapshot as built (10k jobs meet a half-free cluster: hundreds of
starts and preemptions in one cycle), and "steady", the same after the server has carried out
the cycles that start what fits (the cluster full, the queue deep), the cycle a server runs
over and over.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jupyter_gpujobs.engine.scheduler import Usage, schedule  # noqa: E402
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


def medians_ms(fns: dict[str, object], repeat: int) -> dict[str, float]:
    """Median CPU time of each function, in ms. The functions take turns, one run each per
    round, so that each median spans the same stretch of time as the baseline's: on a shared
    machine whose speed changes from second to second, every ratio then compares like with
    like. CPU time of this process (a cycle is single-threaded and does no I/O, so on an idle
    machine it equals wall time; on a shared one it does not count other processes).
    The garbage collector is paused around each run, as the server pauses it around a cycle
    (`service.py`): a cycle makes only acyclic garbage, and a collection would scan the whole
    heap of the process it happens to run in, which says nothing about the scheduler."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            gc.disable()
            t0 = time.process_time()
            fn()  # type: ignore[operator]
            times[name].append((time.process_time() - t0) * 1000)
            gc.enable()
    return {name: statistics.median(ts) for name, ts in times.items()}


def settle(now: float, pending: list[Job], running: list[Job], gpus: list[GPU], policy: Policy,
           usage: Usage, finished: dict[int, JobState]) -> tuple[float, list[Job], list[Job]]:
    """Carry out cycles as the server does (starts run, victims go back to the queue, the
    preemptors start after the grace period) until a cycle starts and preempts nothing."""
    for _ in range(10):
        plan = schedule(now, pending, running, gpus, policy, usage, finished)
        if not plan.starts and not plan.preemptions:
            break
        queue = {j.id: j for j in pending}
        active = {j.id: j for j in running}
        for p in plan.preemptions:
            v = active.pop(p.job_id)
            queue[v.id] = replace(v, state=JobState.PENDING, started_at=None, host=None, assigned_gpus=(),
                                  borrowed=False)
        for s in plan.starts:
            j = queue.pop(s.job_id)
            active[j.id] = replace(j, state=JobState.RUNNING, started_at=now, host=s.host,
                                   assigned_gpus=s.gpus, borrowed=s.borrowed)
        pending, running = list(queue.values()), list(active.values())
        now += policy.preempt_grace_s + 1
    return now, pending, running


def kept_order(t: float, queue: list[Job], active: list[Job], gpus: list[GPU], policy: Policy,
               usage: Usage, finished: dict[int, JobState]) -> object:
    """The priority order the steady deciding cycle keeps: between estimating cycles the server
    passes the order of the last one (5 s ago here, before the 20 newest jobs arrived), and
    they are placed into it in the cycle."""
    newest = set(sorted(j.id for j in queue)[-20:])
    return schedule(t - 5, [j for j in queue if j.id not in newest], active, gpus, policy, usage, finished).queue_order


def measure(n: int, hosts: int, repeat: int) -> dict[str, float]:
    now, pending, running, gpus, usage, finished = snapshot(n, hosts)
    full = all_policies(len(gpus))
    rank = PRIORITY_RANK
    t, queue, active = settle(now, pending, running, gpus, full, usage, finished)
    kept = kept_order(t, queue, active, gpus, full, usage, finished)
    # the pending jobs by id, as the server (and the simulator) keep them and hand them over
    burst, steady = {j.id: j for j in pending}, {j.id: j for j in queue}
    ms = medians_ms({
        "baseline_ms": lambda: sorted(pending, key=lambda j: (-rank[j.priority], j.submitted_at, j.id)),
        "v1_ms": lambda: schedule(now, burst, running, gpus, V1),
        "all_ms": lambda: schedule(now, burst, running, gpus, full, usage, finished),
        "decide_ms": lambda: schedule(now, burst, running, gpus, full, usage, finished, estimate=False),
        "steady_all_ms": lambda: schedule(t, steady, active, gpus, full, usage, finished),
        "steady_ms": lambda: schedule(t, steady, active, gpus, full, usage, finished, estimate=False, order=kept),
    }, repeat)
    return {"pending": n, "gpus": len(gpus), **ms}


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
    print("every policy on; ms, and in brackets the ratio to the baseline (target: decide <= 20 ms at 10k x 512)")
    print(f"{'':14} {'':>12} {'':>12} {'burst':^27} {'steady':^27}")
    print(f"{'pending GPUs':>14} {'baseline':>12} {'v1':>12} {'decide':>13} {'all':>13} {'decide':>13} {'all':>13}")
    for r in run(args.repeat):
        b = r["baseline_ms"]
        cells = [f"{r[k]:6.1f} ({r[k] / b:4.1f})" for k in ("v1_ms", "decide_ms", "all_ms", "steady_ms", "steady_all_ms")]
        print(f"{r['pending']:>8} {r['gpus']:>5} {b:>12.2f} {cells[0]:>12} {cells[1]:>13} {cells[2]:>13}"
              f" {cells[3]:>13} {cells[4]:>13}")


if __name__ == "__main__":
    main()
