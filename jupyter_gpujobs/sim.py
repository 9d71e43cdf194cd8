"""Simulator: a discrete-event replay of a job trace through the real `schedule()`.

The cluster is fake (hosts x GPUs per host). Policies are `Policy` settings only
(`POLICIES`): the simulator holds no copy of any scheduling rule. Events are job submissions
and job ends; all events at the same second are applied together and then one scheduling
cycle runs, so the cost is one `schedule()` call per distinct event time.

Modelling choices (the trace has no time limits and no hosts):
- time limit = the job's duration rounded up to the next "user-typical" limit of
  `LIMIT_STEPS` (15 min, 1 h, 4 h, 12 h, 1 d, 3 d, 7 d, then doubling), the way people pick
  a round number above what they expect to need; jobs end at their duration, never at the limit.
  That limit tells the runtime within one step, which flatters runtime predictions keyed by it;
  `limits="drawn"` first multiplies the duration by an overestimate factor drawn independently
  of it (`drawn_limit`);
- a job wider than one host is folded onto one host (GPUs = GPUs per host) with its duration
  stretched to keep its GPU-seconds;
- a preempted job goes back to the queue at once (no grace) and later runs its whole
  duration again; its preemptor has a `Claim` in the next cycle, as on a server;
- fair-share usage is updated with `decay_and_add` at every event time, before the jobs that
  end then leave (their last stretch counts), as the service does before every cycle;
- with `policy.use_predictions`, each job's `predicted_runtime_s` (and the spread behind it,
  `predicted_runtime_range`) comes from the engine's `RuntimePredictor` (key: user, and as
  the signature GPUs + time limit), fed with the runs that ended before its submit
  (`predicted_job`);
- an event time at which no job arrived and every pending job asks for more GPUs than any
  host has free runs no cycle (it could start nothing; not done when guarantees could preempt);
- advance reservations (`reservations`) are handed to every cycle as on a server; each
  occurrence's start and end is an event time of its own (a cycle runs there).
"""

from __future__ import annotations

import csv
import heapq
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from .engine.scheduler import Usage, decay_and_add, schedule
from .engine.scheduler.reservations import occurrences_between
from .model import GPU, Claim, Job, JobState, Policy, Reservation, is_share, share_fraction

if TYPE_CHECKING:
    from .engine.monitor.predict import Prediction

LIMIT_STEPS: tuple[int, ...] = (900, 3600, 4 * 3600, 12 * 3600, 86400, 3 * 86400, 7 * 86400)

#: the policies the benchmarks compare, as Policy settings only
POLICIES: dict[str, Policy] = {
    "fifo": Policy(backfill=False, fairshare=False, preemption=False, weight_age=0.0,
                   weight_fairshare=0.0, weight_size=0.0, weight_class=0.0, max_time_limit_s=None,
                   oldest_first=False),
    "fifo+backfill": Policy(backfill=True, fairshare=False, preemption=False, weight_age=0.0,
                            weight_fairshare=0.0, weight_size=0.0, weight_class=0.0, max_time_limit_s=None,
                            oldest_first=False),
    "default": Policy(max_time_limit_s=None, fairshare_half_life_s=86400.0),
}

#: the work-conserving reference for utilization: greedy list scheduling in submit order, no
#: reservations at all (reservation_depth=0), so a job starts whenever GPUs on one host fit it
#: and no GPU idles while a job that fits waits. Its utilization is the bound the others are
#: measured against (besides the makespan lower bound, see `Result.metrics`).
GREEDY = replace(POLICIES["fifo+backfill"], reservation_depth=0)


def typical_limit(duration: float) -> int:
    """The round time limit a user would give a job that runs `duration` seconds."""
    for step in LIMIT_STEPS:
        if duration <= step:
            return step
    limit = LIMIT_STEPS[-1]
    while limit < duration:
        limit *= 2
    return limit


#: `drawn_limit`: the most a user's time limit overestimates the runtime (before rounding up)
OVERESTIMATE_MAX = 8.0


def drawn_limit(duration: float, job_id: int, seed: int = 0) -> int:
    """A time limit as users set them, not knowing the runtime: the runtime times an
    overestimate factor drawn log-uniform in [1, OVERESTIMATE_MAX], independently of the runtime
    (seeded by the job), rounded up to a `typical_limit`. `typical_limit(duration)` alone tells
    the runtime within one step (15 min-1 h, 1-4 h, ...), which no user's limit does, and the
    replay's runtime predictions, keyed by the limit (`_key`), learn it."""
    factor = OVERESTIMATE_MAX ** random.Random(seed * 1_000_003 + job_id).random()
    return typical_limit(duration * factor)


@dataclass
class TraceJob:
    id: int
    user: str
    submit: float
    duration: float
    gpus: int
    gpu_type: str | None = None
    group: str | None = None
    share: float | None = None  # part of one GPU (gpus is then 1)
    gpu_memory: int | None = None  # bytes on one shared GPU


def folded(t: TraceJob, gpus_per_host: int) -> tuple[int, float]:
    """(GPUs, duration) a trace job runs with: one wider than a host is folded onto one host,
    its duration stretched to keep its GPU-seconds."""
    if t.gpus > gpus_per_host:
        return gpus_per_host, t.duration * t.gpus / gpus_per_host
    return t.gpus, t.duration


def read_trace(path: str | Path, limit: int | None = None) -> list[TraceJob]:
    """Jobs of a trace CSV (see the traces README), in submit order."""
    jobs: list[TraceJob] = []
    with open(path, newline="") as fh:
        for n, row in enumerate(csv.DictReader(fh)):
            if limit is not None and n >= limit:
                break
            jobs.append(TraceJob(n + 1, row["user"], float(row["submit_time_s"]), float(row["duration_s"]),
                                 int(row["num_gpus"]), row.get("gpu_type") or None))
    return jobs


@dataclass
class Result:
    policy: str
    jobs: int
    gpus: int
    wait: list[float] = field(default_factory=list)
    jct: list[float] = field(default_factory=list)
    slowdown: list[float] = field(default_factory=list)
    users: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # (wait, slowdown)
    job_waits: dict[int, float] = field(default_factory=dict)  # job id -> wait before its first start
    predicted_ok: int = 0  # expected start at submit within max(60 s, 10 % of the wait) of the first start
    predicted_1m: int = 0  # ... within 60 s of it
    predicted_n: int = 0
    waited_ok: int = 0  # the same two over the jobs that did not start at their submit
    waited_1m: int = 0
    waited_5m25: int = 0  # ... within max(5 min, 25 % of the wait)
    waited_in_range: int = 0  # ... inside the range given at submit (plan.expected_range), 60 s either side
    waited_n: int = 0
    bounds_n: int = 0  # jobs that waited with a bound at submit (from time limits) ...
    bounds_kept: int = 0  # ... and started no later than 60 s after it
    predictions_n: int = 0  # jobs that waited with a prediction at submit (from runtimes) ...
    predictions_ok: int = 0  # ... and started within max(60 s, 10 % of the wait) of it
    misses: list[tuple[int, float, float]] = field(default_factory=list)  # (job, wait, start - expected) of jobs that waited
    busy_gpu_s: float = 0.0
    work_gpu_s: float = 0.0
    first_submit: float = 0.0
    last_end: float = 0.0
    last_release: float = 0.0  # max over jobs of submit + duration: no schedule ends before it
    cycles: int = 0
    skipped: int = 0  # event times at which no cycle was needed (nothing could start)
    preemptions: int = 0

    def metrics(self) -> dict[str, float]:
        w = sorted(self.wait)
        span = max(1e-9, self.last_end - self.first_submit)
        # makespan lower bound: the work spread over every GPU from the first submit, or the
        # job that ends last if it starts at its submit, whichever is later
        lower = max(self.work_gpu_s / self.gpus, self.last_release - self.first_submit)
        per_user_sd = [sum(x[1] for x in v) / len(v) for v in self.users.values()]
        jain = (sum(per_user_sd) ** 2 / (len(per_user_sd) * sum(x * x for x in per_user_sd))) if per_user_sd else 1.0
        return {
            "mean_wait": sum(w) / len(w),
            "p50_wait": percentile(w, 50),
            "p99_wait": percentile(w, 99),
            "mean_jct": sum(self.jct) / len(self.jct),
            "mean_bsld": sum(self.slowdown) / len(self.slowdown),
            "utilization": self.busy_gpu_s / (self.gpus * span),
            "makespan": span,
            "makespan_lb": lower,
            "utilization_ub": self.work_gpu_s / (self.gpus * lower) if lower > 0 else 1.0,
            "worst_user_wait": max(self.user_waits().values()),
            "jain_slowdown": jain,
            "predicted_ok": self.predicted_ok / max(1, self.predicted_n),
            "predicted_1m": self.predicted_1m / max(1, self.predicted_n),
            "waited_ok": self.waited_ok / max(1, self.waited_n),
            "waited_1m": self.waited_1m / max(1, self.waited_n),
            "waited_5m25": self.waited_5m25 / max(1, self.waited_n),
            "waited_in_range": self.waited_in_range / max(1, self.waited_n),
            "bounds_kept": self.bounds_kept / max(1, self.bounds_n),
            "bounds_share": self.bounds_n / max(1, self.waited_n),
            "predictions_ok": self.predictions_ok / max(1, self.predictions_n),
            "cycles": float(self.cycles),
            "preemptions": float(self.preemptions),
        }

    def user_waits(self) -> dict[str, float]:
        return {u: sum(x[0] for x in v) / len(v) for u, v in self.users.items()}


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """The `p`th percentile (0-100) of sorted values, with linear interpolation (0 when empty)."""
    if not sorted_values:
        return 0.0
    pos = (len(sorted_values) - 1) * p / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def cluster(hosts: int, gpus_per_host: int, name: str = "A100", memory_mb: int = 0) -> list[GPU]:
    return [GPU(i, f"sim-{h}-{i}", name, host=f"node{h:03d}", memory_total_mb=memory_mb)
            for h in range(hosts) for i in range(gpus_per_host)]


def _weight(job: Job, memory_mb: int) -> float:
    """GPUs a job holds: its count, or its part of one card (a share)."""
    return share_fraction(job, memory_mb << 20) if is_share(job) else float(job.gpus)


def simulate(trace: Iterable[TraceJob], policy: Policy, hosts: int, gpus_per_host: int,
             name: str = "policy", skip_idle: bool = True, min_confidence: float = 0.6,
             reservations: Sequence[Reservation] = (), memory_mb: int = 0,
             limits: str = "rounded") -> Result:
    """Replay `trace` on hosts x gpus_per_host GPUs (of `memory_mb` each) under `policy`
    (`skip_idle`: run no cycle where nothing could start; the replay is the same either way,
    only faster). Jobs with a `share` or `gpu_memory` run on part of one GPU. With
    `policy.use_predictions`, a prediction at least `min_confidence` sure sets a job's
    `predicted_runtime_s`, as the engine's monitor does (`c.GPUJobs.predict_min_confidence`).
    `limits`: how jobs' time limits are made, "rounded" (`typical_limit` of the runtime) or
    "drawn" (`drawn_limit`: limits that do not tell the runtime's step)."""
    if limits not in ("rounded", "drawn"):
        raise ValueError(f"simulate: limits must be 'rounded' or 'drawn', not {limits!r}")
    gpus = cluster(hosts, gpus_per_host, memory_mb=memory_mb)
    card_bytes = {(g.host, g.index): memory_mb << 20 for g in gpus}
    todo = sorted(trace, key=lambda t: (t.submit, t.id))
    duration: dict[int, float] = {}
    jobs: dict[int, Job] = {}
    for t in todo:
        g, d = folded(t, gpus_per_host)
        duration[t.id] = d
        jobs[t.id] = Job(id=t.id, user=t.user, gpus=g, gpu_type=t.gpu_type, submitted_at=t.submit,
                         time_limit_s=typical_limit(d) if limits == "rounded" else drawn_limit(d, t.id),
                         preemptible=False, group=t.group, share=t.share,
                         gpu_memory=t.gpu_memory)
    res = Result(name, len(todo), len(gpus))
    weight = {i: _weight(j, memory_mb) for i, j in jobs.items()}
    res.work_gpu_s = sum(duration[i] * weight[i] for i in duration)
    res.first_submit = todo[0].submit if todo else 0.0
    res.last_release = max((t.submit + duration[t.id] for t in todo), default=0.0)
    pending: dict[int, Job] = {}
    running: dict[int, Job] = {}
    ends: list[tuple[float, int, int]] = []  # (end, job id, run number) for runs still valid
    runs: dict[int, int] = {}
    first_start: dict[int, float] = {}
    predicted: dict[int, float | None] = {}  # the expected start the cycle at its submit gave
    kind: dict[int, bool] = {}  # ... and whether it was a prediction (else a bound)
    ranges: dict[int, tuple[float, float]] = {}  # ... and its range (plan.expected_range)
    usage = Usage()
    last_t = res.first_submit
    claims: list[Claim] = []  # preemptors of the last cycle (their victims are back in the queue)
    i = 0
    finished: dict[int, JobState] = {}
    # skipping idle cycles: a cycle with no new job in which every pending job asks for more
    # GPUs than any host has free starts nothing, so it is not run (exact, not an
    # approximation) -- unless the policy could preempt (guarantees configured)
    free_on: dict[str, int] = {}
    for g in gpus:
        free_on[g.host] = free_on.get(g.host, 0) + 1
    sizes: dict[int, int] = {}  # GPUs asked -> pending jobs asking that many
    # with policy.use_predictions a job gets the runtime the engine's predictor
    # (monitor.predict, key user + GPUs) gives from the jobs that ended before its submit
    predictor = None
    if policy.use_predictions:
        from .engine.monitor.predict import RuntimePredictor  # the monitor package is heavy to import

        predictor = RuntimePredictor()
    may_preempt = policy.preemption and bool(policy.user_quotas or policy.group_quotas or policy.default_user_quota)
    # the starts and ends of the reservations' occurrences: event times of their own
    horizon = res.last_release + 30 * 86400
    bounds = sorted({t for r in reservations for o in occurrences_between(r, res.first_submit, horizon) for t in o})
    b = 0
    while i < len(todo) or ends or (pending and b < len(bounds)):
        t_sub = todo[i].submit if i < len(todo) else math.inf
        t_end = ends[0][0] if ends else math.inf
        t_bound = bounds[b] if b < len(bounds) else math.inf
        now = min(t_sub, t_end, t_bound)
        crossed = False
        while b < len(bounds) and bounds[b] <= now:
            b += 1
            crossed = True
        fresh: list[int] = []
        # charged before the jobs that end now leave `running`: their last stretch counts too
        usage = decay_and_add(usage, running.values(), now - last_t, policy.fairshare_half_life_s, card_bytes)
        last_t = now
        while ends and ends[0][0] <= now:
            _, jid, run = heapq.heappop(ends)
            if runs.get(jid) != run or jid not in running:
                continue
            job = running.pop(jid)
            free_on[job.host or ""] = free_on.get(job.host or "", 0) + len(job.assigned_gpus)
            res.busy_gpu_s += (now - _started(job, now)) * weight[jid]
            finished[jid] = JobState.COMPLETED
            if predictor is not None:
                predictor.add(_key(job), duration[jid])
            _record(res, jobs[jid], first_start[jid], now, duration[jid])
        while i < len(todo) and todo[i].submit <= now:
            jid = todo[i].id
            if predictor is not None:
                jobs[jid] = predicted_job(jobs[jid], predictor.predict(_key(jobs[jid])),
                                          min_confidence)
            pending[jid] = jobs[jid]
            size = _size(jobs[jid])
            sizes[size] = sizes.get(size, 0) + 1
            fresh.append(jid)
            i += 1
        if not pending:
            continue
        if skip_idle and not fresh and not crossed and not may_preempt and min(sizes) > max(free_on.values()):
            res.skipped += 1
            continue
        plan = schedule(now, pending, list(running.values()), gpus, policy, usage, finished, claims=claims,
                        reservations=reservations)
        claims = [Claim(by, (), now) for by in dict.fromkeys(p.by_job_id for p in plan.preemptions)]
        res.cycles += 1
        started_now = {s.job_id for s in plan.starts}
        for jid in fresh:
            predicted[jid] = now if jid in started_now else plan.expected_start.get(jid, now)
            kind[jid] = jid in plan.predicted
            if jid in plan.expected_range:
                ranges[jid] = plan.expected_range[jid]
        for p in plan.preemptions:
            victim = running.pop(p.job_id, None)
            if victim is None:
                continue
            res.preemptions += 1
            free_on[victim.host or ""] = free_on.get(victim.host or "", 0) + len(victim.assigned_gpus)
            sizes[_size(victim)] = sizes.get(_size(victim), 0) + 1
            res.busy_gpu_s += (now - _started(victim, now)) * weight[victim.id]
            pending[victim.id] = replace(victim, state=JobState.PENDING, started_at=None, host=None,
                                         assigned_gpus=(), borrowed=False, restarts=victim.restarts + 1)
        for s in plan.starts:
            job = pending.pop(s.job_id)
            size = _size(job)
            sizes[size] -= 1
            if not sizes[size]:
                del sizes[size]
            free_on[s.host] = free_on.get(s.host, 0) - len(s.gpus)
            job = replace(job, state=JobState.RUNNING, started_at=now, host=s.host, assigned_gpus=s.gpus,
                          borrowed=s.borrowed)
            running[job.id] = job
            first_start.setdefault(job.id, now)
            runs[job.id] = runs.get(job.id, 0) + 1
            heapq.heappush(ends, (now + duration[job.id], job.id, runs[job.id]))
        if not plan.starts and not ends and i >= len(todo) and pending and b >= len(bounds):
            break  # nothing can ever start (e.g. a job wider than every host)
    for jid, at in predicted.items():
        if jid in first_start:
            res.predicted_n += 1
            wait = first_start[jid] - jobs[jid].submitted_at
            waited = wait > 0
            res.waited_n += waited
            if at is None:
                continue
            miss = abs(at - first_start[jid])
            ok, one = miss <= max(60.0, 0.1 * wait), miss <= 60.0
            if waited:
                res.waited_5m25 += miss <= max(300.0, 0.25 * wait)
                lo, hi = ranges.get(jid, (at, at))
                res.waited_in_range += lo - 60.0 <= first_start[jid] <= hi + 60.0
            res.predicted_ok += ok
            res.predicted_1m += one
            if waited:
                res.misses.append((jid, wait, first_start[jid] - at))
                if kind[jid]:
                    res.predictions_n += 1
                    res.predictions_ok += ok
                else:
                    res.bounds_n += 1
                    res.bounds_kept += first_start[jid] <= at + 60.0
                res.waited_ok += ok
                res.waited_1m += one
    return res


def _key(job: Job) -> tuple[str, str, str]:
    """A job's prediction key (monitor.predict.job_key): the trace has no names nor commands,
    so its signature is its GPUs and time limit (a user's runs of one script ask alike)."""
    return (job.user, f"{job.gpus}x{job.time_limit_s}", "")


def predicted_job(job: Job, p: Prediction, min_confidence: float) -> Job:
    """A job with what a runtime prediction gives it, as the engine's monitor sets it
    (`monitor.predict.job_fields`)."""
    from .engine.monitor.predict import job_fields  # the monitor package is heavy to import

    return replace(job, **job_fields(p, job.time_limit_s, min_confidence))  # type: ignore[arg-type]


def _size(job: Job) -> int:
    """The free GPUs a pending job needs on one host to start (skip_idle): a share may start
    on a card that holds shares, with no GPU free, so it counts 0 (its cycles always run)."""
    return 0 if is_share(job) else job.gpus


def _started(job: Job, now: float) -> float:
    return now if job.started_at is None else job.started_at


def bounded_slowdown(wait: float, run: float) -> float:
    """max(1, (wait + run) / max(run, 10 s)): how much longer than its run a job took, with
    runs under 10 s counted as 10 s so that a short job's wait does not dominate."""
    return max(1.0, (wait + run) / max(run, 10.0))


def _record(res: Result, job: Job, start: float, end: float, duration: float) -> None:
    wait = start - job.submitted_at
    res.wait.append(wait)
    res.job_waits[job.id] = wait
    res.jct.append(end - job.submitted_at)
    sd = bounded_slowdown(wait, duration)
    res.slowdown.append(sd)
    res.users.setdefault(job.user, []).append((wait, sd))
    res.last_end = max(res.last_end, end)


def contention_cluster(trace: Sequence[TraceJob], gpus_per_host: int = 8, load: float = 0.9) -> int:
    """Hosts so that the trace's mean GPU demand is `load` of the cluster (real contention)."""
    if not trace:
        return 1
    span = max(1.0, max(t.submit for t in trace) - min(t.submit for t in trace))
    demand = sum(t.duration * t.gpus for t in trace) / span
    return max(1, round(demand / load / gpus_per_host))
