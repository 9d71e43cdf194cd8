"""The planner: one scheduling cycle, `schedule()`, tying the small modules together.

Order the queue (priority.py), then walk it once. Each job either starts now on free GPUs
that no earlier job's reservation needs (placement.py), asks for preemption (preemption.py),
or is booked on the GPU time line, which gives its expected start and keeps later jobs from
delaying it. Deferral (deferral.py) and limits (quotas.py) give a job a floor on that time
line. Jobs waiting for a dependency are walked last, from their targets' expected ends.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..model import GPU, Job, JobState, Plan, Policy, Preemption, Start
from .deferral import clock_text, dependency_status, next_window_start
from .fairshare import Usage, as_usage
from .placement import INF, Cluster, View
from .preemption import choose_victims, victims_text
from .priority import order_pending
from .quotas import Limit, Quotas


def schedule(now: float, pending: Sequence[Job], running: Sequence[Job], gpus: Sequence[GPU],
             policy: Policy, usage: Usage | Mapping[str, float] | None = None,
             finished: Mapping[int, JobState] | None = None) -> Plan:
    """Decide one cycle. Pure: reads only its arguments, returns a `Plan`."""
    return _Cycle(now, running, gpus, policy, finished or {}, pending).run(pending, as_usage(usage))


class _Cycle:
    def __init__(self, now: float, running: Sequence[Job], gpus: Sequence[GPU], policy: Policy,
                 finished: Mapping[int, JobState], pending: Sequence[Job]):
        self.now = now
        self.policy = policy
        self.finished = finished
        self.gpus = gpus
        self.running = running
        self.plan = Plan()
        dl = policy.default_time_limit_s
        self.ends = {j.id: (j.started_at if j.started_at is not None else now) + (j.time_limit_s or dl)
                     for j in running}
        self.cluster = Cluster(now, gpus, running, self.ends)
        self.quotas = Quotas(policy)
        self.active = {j.id for j in pending} | {j.id for j in running}
        self.limits: dict[tuple[str, object], Limit | None] = {}
        self.user_limits: dict[str, list[tuple[Limit, bool]]] = {}
        self.group_limits: dict[str | None, list[tuple[Limit, bool]]] = {}
        self.user_gpus: dict[str, int] = {}
        self.group_gpus: dict[str, int] = {}
        self.claimed: dict[str, int] = {}
        self.expected: dict[int, float | None] = self.plan.expected_start
        self.reserve_limit: Limit | None = None
        if policy.urgent_reserve_gpus > 0:
            cap = max(0, self.cluster.total - policy.urgent_reserve_gpus)
            self.reserve_limit = Limit(cap, f"the last {policy.urgent_reserve_gpus} GPUs are kept for urgent jobs")
        self.victims: set[int] = set()
        self.candidates: dict[int, list[Job]] | None = None
        self._limit_s: dict[int, float] = {}
        for j in running:
            self._account_running(j)

    # ------------------------------------------------------------------ limits
    def _limit(self, key: tuple[str, object], cap: int | None, text: str) -> Limit | None:
        if key in self.limits:
            return self.limits[key]
        lim = Limit(cap, text) if cap is not None else None
        self.limits[key] = lim
        return lim

    def _limits_of(self, j: Job) -> list[tuple[Limit, bool]]:
        """(limit, counts GPUs?) pairs that apply to a job."""
        ul = self.user_limits.get(j.user)
        if ul is None:
            jobs_cap, gpus_cap = self.quotas.user_caps(j.user)
            ul = []
            lim = self._limit(("uj", j.user), jobs_cap, f"user limit of {jobs_cap} running jobs reached")
            if lim:
                ul.append((lim, False))
            lim = self._limit(("ug", j.user), gpus_cap, f"user limit of {gpus_cap} GPUs reached")
            if lim:
                ul.append((lim, True))
            self.user_limits[j.user] = ul
        gl = self.group_limits.get(j.group)
        if gl is None:
            jobs_cap, gpus_cap = self.quotas.group_caps(j.group)
            gl = []
            lim = self._limit(("gj", j.group), jobs_cap, f"group {j.group} limit of {jobs_cap} running jobs reached")
            if lim:
                gl.append((lim, False))
            lim = self._limit(("gg", j.group), gpus_cap, f"group {j.group} limit of {gpus_cap} GPUs reached")
            if lim:
                gl.append((lim, True))
            self.group_limits[j.group] = gl
        out = ul + gl if gl else ul
        if j.array_job_id is not None and j.array_max_running:
            lim = self._limit(("a", j.array_job_id), j.array_max_running,
                              f"array limit of {j.array_max_running} running tasks")
            if lim:
                out = out + [(lim, False)]
        if self.reserve_limit is not None and j.priority != "urgent":
            out = out + [(self.reserve_limit, True)]
        return out

    def _account_running(self, j: Job) -> None:
        n = len(j.assigned_gpus) if j.assigned_gpus else j.gpus
        end = self.ends[j.id]
        for lim, per_gpu in self._limits_of(j):
            lim.add_running(end, n if per_gpu else 1)
        self.user_gpus[j.user] = self.user_gpus.get(j.user, 0) + n
        if j.group:
            self.group_gpus[j.group] = self.group_gpus.get(j.group, 0) + n

    # ------------------------------------------------------------------ the walk
    def run(self, pending: Sequence[Job], usage: Usage) -> Plan:
        plan, now, policy = self.plan, self.now, self.policy
        queue: list[Job] = []
        waiting_dep: dict[int, int] = {}
        for j in pending:
            if j.depends:
                status, what = dependency_status(j, self.finished, self.active)
                if status == "cancel":
                    plan.cancels.append((j.id, str(what)))
                    continue
                if status == "wait":
                    waiting_dep[j.id] = int(what)  # type: ignore[arg-type]
            queue.append(j)
        ordered = order_pending(now, queue, policy, usage, self.cluster.largest_host)
        plan.order = [j.id for j in ordered]
        windows = policy.offpeak_windows
        off = policy.utc_offset_s
        offpeak_now = next_window_start(now + off, windows) if windows else None
        later: list[Job] = []
        self.top_reserved: int | None = None
        self.fifo_blocked: int | None = None
        self.last_start = now
        self.failed_shapes: set[tuple[int, str | None, float]] = set()
        reasons = plan.reasons
        for j in ordered:
            if j.id in waiting_dep:
                later.append(j)
                continue
            floor = now
            why: str | None = None
            if j.begin is not None and j.begin > now:
                floor = j.begin
                why = f"begins at {clock_text(j.begin, now, off)}"
            if j.offpeak and windows:
                nxt = offpeak_now if floor == now else next_window_start(floor + off, windows)
                if nxt is not None and nxt - off > floor:
                    floor = nxt - off
                    why = "waiting for off-peak hours"
            self._place(j, floor, why)
        # dependency waiters, from their targets' expected ends
        for _ in range(len(later) + 1):
            rest: list[Job] = []
            for j in later:
                floor = self._dependency_floor(j)
                if floor is None:
                    rest.append(j)
                    continue
                dep = next(d for d in j.depends if d.job_id in self.active)
                self._place(j, max(floor, now), f"waiting for job {dep.job_id} ({dep.kind})", deferred=True)
            if len(rest) == len(later):
                break
            later = rest
        for j in later:
            dep = next(d for d in j.depends if d.job_id in self.active)
            reasons[j.id] = f"waiting for job {dep.job_id} ({dep.kind})"
            self.expected[j.id] = None
        return plan

    def _dependency_floor(self, j: Job) -> float | None:
        floor = self.now
        dl = self.policy.default_time_limit_s
        for d in j.depends:
            if d.job_id not in self.active:
                continue
            if d.job_id in self.ends:
                t: float | None = self.ends[d.job_id]
            else:
                est = self.expected.get(d.job_id, -1.0)
                if est == -1.0:
                    return None  # not walked yet
                if est is None:
                    return INF
                target_limit = self._limit_s.get(d.job_id, dl)
                t = est + target_limit
            floor = max(floor, t if t is not None else INF)
        return floor

    def _place(self, j: Job, floor: float, why: str | None, deferred: bool = False) -> None:
        plan, now, policy, cl = self.plan, self.now, self.policy, self.cluster
        reasons, expected = plan.reasons, self.expected
        k = j.gpus
        limit = float(j.time_limit_s or policy.default_time_limit_s)
        self._limit_s[j.id] = limit
        if floor == INF:
            reasons[j.id] = why or "cannot be predicted"
            expected[j.id] = None
            return
        mtl, who = self.quotas.max_time_limit(j.user, j.group)
        if mtl is not None and limit > mtl:
            reasons[j.id] = f"time limit of {int(limit)} s is over the maximum of {mtl} s for {who}"
            expected[j.id] = None
            return
        lims = self._limits_of(j)
        blocked: Limit | None = None
        for lim, per_gpu in lims:
            if not lim.fits_now(k if per_gpu else 1):
                blocked = lim
                break
        view: View | None = None
        if k > 0:
            if not cl.pool_host:
                reasons[j.id] = "no GPUs on this server"
                expected[j.id] = None
                return
            view = cl.view(j.gpu_type)
            if not view.pids:
                reasons[j.id] = f"no {j.gpu_type} GPUs on this server"
                expected[j.id] = None
                return
            if k > view.max_size:
                reasons[j.id] = f"asks for {k} {view.label} but one host has at most {view.max_size}"
                expected[j.id] = None
                return
        if floor <= now and blocked is None:
            if k == 0:
                host = cl.pool_host[0] if cl.pool_host else (self.gpus[0].host if self.gpus else "localhost")
                plan.starts.append(Start(j.id, host, (), False))
                self._book(j, lims, now, now + limit)
                return
            assert view is not None
            if self.fifo_blocked is None or policy.backfill:
                placed = None
                shape = (k, j.gpu_type, limit)
                if view.free_pids and shape not in self.failed_shapes:
                    placed = cl.start_now(view, k, limit)
                    if placed is None:
                        self.failed_shapes.add(shape)
                if placed is not None:
                    p, idx = placed
                    borrowed = self.quotas.any_guarantee and not self._within_guarantee(j, k)
                    plan.starts.append(Start(j.id, cl.pool_host[p], idx, borrowed))
                    self._book(j, lims, now, now + limit)
                    self.user_gpus[j.user] = self.user_gpus.get(j.user, 0) + k
                    if j.group:
                        self.group_gpus[j.group] = self.group_gpus.get(j.group, 0) + k
                    self.last_start = now
                    return
            if policy.preemption and self._try_preempt(j, k, limit, view):
                return
            if self.fifo_blocked is not None and not policy.backfill:
                why = f"behind job {self.fifo_blocked} (first in line)"
            elif self.top_reserved is not None and cl.free_count(view, k):
                why = f"behind job {self.top_reserved} (reserved)"
            else:
                why = f"waiting for {k} free {view.label if k > 1 or view.label != 'GPUs' else 'GPU'}"
        elif why is None:
            why = blocked.reason if blocked is not None else "waiting"
        # book it on the time line: the expected start
        t = floor
        for lim, per_gpu in lims:
            e = lim.earliest(k if per_gpu else 1, floor)
            if e > t:
                t = e
        if not policy.backfill and k > 0 and not deferred and t < self.last_start:
            t = self.last_start
        if t == INF:
            reasons[j.id] = why
            expected[j.id] = None
            return
        if k > 0:
            assert view is not None
            start = cl.reserve(view, k, limit, t)
            if start == INF:
                reasons[j.id] = why
                expected[j.id] = None
                return
            if self.top_reserved is None and start > now:
                self.top_reserved = j.id
            if self.fifo_blocked is None and not deferred and blocked is None and floor <= now:
                self.fifo_blocked = j.id
            if not policy.backfill and not deferred:
                self.last_start = start
        else:
            start = t
        start = max(start, now)
        self._book(j, lims, start, start + limit)
        reasons[j.id] = why
        expected[j.id] = start

    def _book(self, j: Job, lims: list[tuple[Limit, bool]], start: float, end: float) -> None:
        for lim, per_gpu in lims:
            lim.book(start, end, j.gpus if per_gpu else 1, self.now)

    # ------------------------------------------------------------------ quotas and preemption
    def _within_guarantee(self, j: Job, k: int) -> bool:
        ug, gg = self.quotas.guarantees(j.user, j.group)
        if ug > 0 and self.user_gpus.get(j.user, 0) + self.claimed.get(j.user, 0) + k <= ug:
            return True
        return bool(gg > 0 and j.group and self.group_gpus.get(j.group, 0) + self.claimed.get("group:" + j.group, 0) + k <= gg)

    def _guarantee_owner(self, j: Job, k: int) -> str:
        ug, _ = self.quotas.guarantees(j.user, j.group)
        if ug > 0 and self.user_gpus.get(j.user, 0) + self.claimed.get(j.user, 0) + k <= ug:
            return f"user {j.user}"
        return f"group {j.group}"

    def _try_preempt(self, j: Job, k: int, limit: float, view: View) -> bool:
        urgent = j.priority == "urgent"
        if not urgent and not (self.quotas.any_guarantee and self._within_guarantee(j, k)):
            return False
        cl = self.cluster
        if self.candidates is None:
            self.candidates = {}
            for r in self.running:
                if not (r.borrowed or r.preemptible) or r.host is None or not r.assigned_gpus:
                    continue
                p = cl.by_host_index.get((r.host, r.assigned_gpus[0]))
                if p is not None:
                    self.candidates.setdefault(p, []).append(r)
        if not self.candidates:
            return False
        pids = set(view.pids)
        cands = {p: js for p, js in self.candidates.items() if p in pids and js}
        free_usable = {p: sum(1 for i in cl.free[p] if i not in cl.hole[p]) for p in cands}
        chosen = choose_victims(self.now, j, k, cands, free_usable, urgent)
        if chosen is None:
            return False
        p, victims = chosen
        why = "urgent" if urgent else f"guarantee of {self._guarantee_owner(j, k)}"
        for v in victims:
            self.plan.preemptions.append(Preemption(v.id, j.id, f"preempted by job {j.id} ({why})"))
            self.victims.add(v.id)
            self.candidates[p].remove(v)
        if not urgent:
            key = j.user if why == f"guarantee of user {j.user}" else "group:" + (j.group or "")
            self.claimed[key] = self.claimed.get(key, 0) + k
        gpus = [i for v in victims for i in v.assigned_gpus]
        need = k - len(gpus)
        if need > 0:
            gpus += sorted(i for i in cl.free[p] if i not in cl.hole[p])[:need]
        start = self.now + self.policy.preempt_grace_s
        cl.reserve_on(p, gpus[:k], limit, start)
        self._book(j, self._limits_of(j), start, start + limit)
        self.plan.reasons[j.id] = victims_text(victims)
        self.expected[j.id] = start
        return True
