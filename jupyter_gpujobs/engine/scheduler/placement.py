"""Placement and the GPU time line: which GPUs a job gets now, and when it could start later.

GPUs are grouped in pools, one per (host, model): a job's GPUs come from one pool, so all of
them are on one host and of one model. Each GPU has an `avail` time (when it is free for the
next reservation: now, the end of its running job's time limit, or the end of a reservation)
and, while it is free now, a `hole` end (the start of the first reservation placed on it).

- `start_now` places a job on free GPUs whose hole is long enough for its time limit (so it
  delays no reservation), best fit: the pool with the fewest usable free GPUs, and in it the
  GPUs with the shortest sufficient holes, which keeps large blocks and long holes free.
- `reserve` books a job that cannot start now on the pool where its k-th earliest GPU frees
  first (list scheduling on `avail`); that start is the job's expected start, and the booking
  keeps later jobs from delaying it (conservative backfill: every blocked job holds one, up
  to `policy.reservation_depth` of them).
- `AggregateLine` gives the jobs deeper in the queue a cheap expected start: per GPU model, a
  heap of the times the GPUs free on the detailed time line; a k-GPU job takes the k earliest
  of its model (any host: no packing) from its floor. The planner clamps that start to be no
  earlier than `earliest` (when the detailed time line first has k GPUs on one host), so an
  estimate never promises a start the plan cannot give. It reserves nothing.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Sequence
from heapq import heapify, heappop, heappush, heapreplace

from ...model import GPU, Job, gpu_matches_type

INF = float("inf")


class View:
    """The pools a GPU-type constraint allows, with, for each k, the k-th earliest avail per pool."""

    __slots__ = ("pids", "kth", "free_pids", "max_size", "label", "note")

    def __init__(self, pids: list[int], sizes: list[int], label: str):
        self.pids = pids
        self.max_size = max((sizes[p] for p in pids), default=0)
        self.kth: list[list[float]] = [[] for _ in range(self.max_size + 1)]
        self.free_pids: set[int] = set()
        self.label = label
        self.note = ""  # its GPUs in use outside the queue, for waiting reasons


class Cluster:
    """The GPU state of one cycle; only `schedule()` builds and changes it."""

    def __init__(self, now: float, gpus: Sequence[GPU], running: Sequence[Job],
                 ends: dict[int, float]):
        self.now = now
        pools: dict[tuple[str, str], int] = {}
        self.pool_host: list[str] = []
        self.pool_name: list[str] = []
        members: list[list[int]] = []
        foreign: list[tuple[int, GPU]] = []  # (pool, GPU) of GPUs in use outside the queue
        for g in gpus:
            if not g.healthy or g.draining:
                continue
            key = (g.host, g.name)
            p = pools.get(key)
            if p is None:
                p = pools[key] = len(self.pool_host)
                self.pool_host.append(g.host)
                self.pool_name.append(g.name)
                members.append([])
            members[p].append(g.index)
            if g.foreign:
                foreign.append((p, g))
        self.by_host_index = {(self.pool_host[p], i): p for p, idx in enumerate(members) for i in idx}
        self.total = sum(len(m) for m in members)
        busy: dict[tuple[str, int], float] = {}
        for j in running:
            if j.host is None:
                continue
            end = max(ends[j.id], now)
            for i in j.assigned_gpus:  # a card with shares: busy until its last share's end
                key = (j.host, i)
                busy[key] = max(end, busy.get(key, end))
        # a GPU in use outside the queue is busy with no known end (until it is released)
        self.foreign_text: dict[int, list[str]] = {}
        one_host = len(set(self.pool_host)) <= 1
        for p, g in foreign:
            if (g.host, g.index) not in busy:
                busy[(g.host, g.index)] = INF
                where = f"GPU {g.index}" if one_host else f"GPU {g.index} on {g.host}"
                self.foreign_text.setdefault(p, []).append(f"{where} is {g.foreign}")
        self.avail: list[list[tuple[float, int]]] = []
        self.free: list[set[int]] = []
        self.hole: list[dict[int, float]] = []
        for p, idx in enumerate(members):
            host = self.pool_host[p]
            av = sorted((busy.get((host, i), now), i) for i in idx)
            self.avail.append(av)
            self.free.append({i for i in idx if (host, i) not in busy})
            self.hole.append({})
        self.sizes = [len(m) for m in members]
        self.largest_host = max(self.sizes, default=0)
        self.views: dict[str | None, View] = {}
        self.memberships: list[list[tuple[View, int]]] = [[] for _ in members]
        self.reserved_text: dict[int, list[str]] = {}  # pool -> its advance reservations, for reasons
        # cards holding shares (shares.py): (pool, index) -> start of the first reservation on it
        self.shared: dict[tuple[int, int], float] = {}
        # per pool, GPU -> (start, end) of an advance reservation far ahead that their avail
        # does not show yet (`block` with firm=False): a job started there moves their avail,
        # and a booking that would run into it makes it firm first (`reserve`)
        self.soft: list[dict[int, tuple[float, float]]] = [{} for _ in members]

    def block(self, p: int, i: int, start: float, end: float, firm: bool = True) -> float:
        """Keep GPU i of pool p from `start` to `end` (an advance reservation, before any view
        is made): from now when it has begun, else free until `start` (a hole) for jobs that
        end before it. Firm: the time line books nothing on it before `end`; not firm (an
        occurrence far ahead): only the hole keeps it, and bookings may use it before. Returns
        when the GPU was free before (now, or its running job's end)."""
        av = self.avail[p]
        k = next(n for n, e in enumerate(av) if e[1] == i)
        before = av[k][0]
        if start <= self.now:
            self.free[p].discard(i)
        else:  # (on a busy card too: shares.py keeps its new shares out of it by the hole)
            self.hole[p][i] = min(self.hole[p].get(i, INF), start)
        soft = self.soft[p]
        if firm or start <= self.now or i in soft:  # (two far occurrences on one GPU: firm)
            del av[k]
            insort(av, (max(before, end, soft.pop(i, (0.0, 0.0))[1]), i))
        else:
            soft[i] = (start, end)
        return before

    def _firm(self, p: int, gpus: Sequence[int]) -> None:
        """Show these GPUs' far reservations on the time line after all (see `soft`)."""
        av, soft = self.avail[p], self.soft[p]
        for i in gpus:
            k = next(n for n, e in enumerate(av) if e[1] == i)
            t = av.pop(k)[0]
            insort(av, (max(t, soft.pop(i)[1]), i))
        self._refresh(p)

    # ------------------------------------------------------------------ views
    def view(self, gpu_type: str | None) -> View:
        v = self.views.get(gpu_type)
        if v is not None:
            return v
        matches = {name: gpu_matches_type(name, gpu_type) for name in set(self.pool_name)}  # a few models
        pids = [p for p, name in enumerate(self.pool_name) if matches[name]]
        v = View(pids, self.sizes, f"{gpu_type} GPUs" if gpu_type else "GPUs")
        v.label = gpu_type if gpu_type else "GPUs"
        if self.foreign_text or self.reserved_text:
            v.note = "; ".join(t for p in pids for t in [*self.foreign_text.get(p, ()), *self.reserved_text.get(p, ())])
        for pos, p in enumerate(pids):
            self.memberships[p].append((v, pos))
            if self.free[p]:
                v.free_pids.add(p)
        for k in range(1, v.max_size + 1):
            v.kth[k] = [self.avail[p][k - 1][0] if self.sizes[p] >= k else INF for p in pids]
        self.views[gpu_type] = v
        return v

    def _refresh(self, p: int) -> None:
        av = self.avail[p]
        n = len(av)
        has_free = bool(self.free[p])
        for v, pos in self.memberships[p]:
            kth = v.kth
            for k in range(1, n + 1):
                kth[k][pos] = av[k - 1][0]
            if not has_free:
                v.free_pids.discard(p)

    # ------------------------------------------------------------------ now
    def free_count(self, view: View, k: int) -> bool:
        """Is there a pool with k free GPUs now (ignoring reservations)?"""
        free = self.free
        return any(len(free[p]) >= k for p in view.free_pids)

    def start_now(self, view: View, k: int, limit: float) -> tuple[int, tuple[int, ...]] | None:
        """Place a k-GPU job with this time limit on free GPUs now without delaying any
        reservation; returns (pool, GPU indices) or None."""
        need = self.now + limit
        best: tuple[int, int, list[int]] | None = None
        free, hole = self.free, self.hole
        for p in view.free_pids:
            fp = free[p]
            if len(fp) < k:
                continue
            hp = hole[p]
            if hp:
                usable = [i for i in fp if hp.get(i, INF) >= need]
                if len(usable) < k:
                    continue
            else:
                usable = list(fp)
            n = len(usable)
            if best is None or n < best[0] or (n == best[0] and p < best[1]):
                best = (n, p, usable)
                if n == k:
                    break
        if best is None:
            return None
        _, p, usable = best
        hp = hole[p]
        if hp:
            usable.sort(key=lambda i: (hp.get(i, INF), i))
        else:
            usable.sort()
        chosen = usable[:k]
        av = self.avail[p]
        moved = False
        soft = self.soft[p]
        for i in chosen:
            free[p].discard(i)
            if i not in hp or (i in soft and (self.now, i) in av):  # unreserved: busy until this job's limit
                av.remove((self.now, i))
                insort(av, (need, i))
                moved = True
        if moved or not free[p]:
            self._refresh(p)
        return p, tuple(sorted(chosen))

    # ------------------------------------------------------------------ later
    def earliest(self, view: View, k: int) -> float:
        """When the soonest pool of this view has k GPUs for a new reservation."""
        if k > view.max_size:
            return INF
        return min(view.kth[k]) if view.pids else INF

    def reserve(self, view: View, k: int, limit: float, floor: float) -> float:
        """Book k GPUs from max(earliest, floor) for `limit` seconds; returns that start."""
        kl = view.kth[k]
        m = min(kl)
        if m == INF:
            return INF
        p = view.pids[kl.index(m)]
        start = m if m >= floor else floor
        av = self.avail[p]
        end = start + limit
        soft = self.soft[p]
        if soft:
            crossing = [i for _, i in av[:k] if i in soft and end > soft[i][0] and start < soft[i][1]]
            if crossing:  # it would run into a far reservation: book around it
                self._firm(p, crossing)
                return self.reserve(view, k, limit, floor)
        taken = av[:k]
        del av[:k]
        fp, hp = self.free[p], self.hole[p]
        sh = self.shared
        for _, i in taken:
            if i in fp and start < hp.get(i, INF):
                hp[i] = start
            if sh and sh.get((p, i), -INF) > start:
                sh[(p, i)] = start
            insort(av, (end, i))
        self._refresh(p)
        return start

    def reserve_on(self, p: int, gpus: Sequence[int], limit: float, start: float) -> None:
        """Book these GPUs of pool p from `start` (a preemptor waiting for its victims)."""
        wanted = set(gpus)
        av = [e for e in self.avail[p] if e[1] not in wanted]
        sh = self.shared
        for i in gpus:
            insort(av, (start + limit, i))
            if i in self.free[p] and start < self.hole[p].get(i, INF):
                self.hole[p][i] = start
            self.soft[p].pop(i, None)
            if sh and sh.get((p, i), -INF) > start:
                sh[(p, i)] = start
        self.avail[p] = av
        self._refresh(p)

    def occupy(self, p: int, i: int, end: float, old_end: float) -> None:
        """GPU i of pool p holds shares until `end` (shares.py): a free GPU is taken; a card
        whose shares ended at `old_end` now ends later (unless a reservation was booked after
        them: that reservation's end stays on the time line)."""
        fp = self.free[p]
        if i in fp:
            fp.discard(i)
            if i in self.hole[p]:  # reserved later: the reservation's end stays
                self._refresh(p)
                return
            old_end = self.now
        elif self.shared.get((p, i), INF) < INF:
            return
        av = self.avail[p]
        n = next(n for n, e in enumerate(av) if e[1] == i)
        if av[n][0] > old_end:  # booked after its shares (an advance reservation): that end stays
            return
        del av[n]
        insort(av, (end, i))
        self._refresh(p)


class AggregateLine:
    """Cheap expected starts for the deep queue (see the module docstring)."""

    __slots__ = ("heaps", "by_view")

    def __init__(self, cluster: Cluster, busy_until: dict[tuple[str, int], float] | None = None):
        """From the cluster's time line, or with `busy_until` (host, index) -> end from running
        jobs' ends only (the GPUs not in it are free now)."""
        self.heaps: dict[str, list[float]] = {}
        for p, name in enumerate(cluster.pool_name):
            if busy_until is None:
                self.heaps.setdefault(name, []).extend(t for t, _ in cluster.avail[p])
            else:
                host, now = cluster.pool_host[p], cluster.now
                self.heaps.setdefault(name, []).extend(busy_until.get((host, i), now) for _, i in cluster.avail[p])
        for h in self.heaps.values():
            heapify(h)
        self.by_view: dict[int, list[list[float]]] = {}

    def _heaps(self, cluster: Cluster, view: View) -> list[list[float]]:
        hs = self.by_view.get(id(view))
        if hs is None:
            names = dict.fromkeys(cluster.pool_name[p] for p in view.pids)
            hs = self.by_view[id(view)] = [self.heaps[n] for n in names]
        return hs

    def single(self, cluster: Cluster, view: View) -> list[float] | None:
        """The heap of a view whose GPUs are all one model, else None."""
        hs = self._heaps(cluster, view)
        return hs[0] if len(hs) == 1 else None

    def take(self, cluster: Cluster, view: View, k: int, limit: float, floor: float) -> float:
        """The start of a k-GPU job from `floor` on; books its GPUs until start + limit."""
        hs = self._heaps(cluster, view)
        if len(hs) == 1:
            h = hs[0]
            if len(h) < k:
                return INF
            if k == 1:
                start = h[0] if h[0] > floor else floor
                heapreplace(h, start + limit)
                return start
        else:  # several models: the one whose k-th GPU frees first
            best: list[float] | None = None
            best_t = INF
            for h in hs:
                if len(h) < k:
                    continue
                if k == 1:
                    kth = h[0]
                else:
                    popped = [heappop(h) for _ in range(k)]
                    kth = popped[-1]
                    for x in popped:
                        heappush(h, x)
                if kth < best_t:
                    best, best_t = h, kth
            if best is None:
                return INF
            h = best
        taken = 0.0
        for _ in range(k):
            taken = heappop(h)
        start = taken if taken > floor else floor
        end = start + limit
        for _ in range(k):
            heappush(h, end)
        return start

    def started_now(self, model: str, n: int, now: float, end: float) -> None:
        """A job started now on n GPUs of `model` that were free and unreserved (avail = now)."""
        h = self.heaps[model]
        for _ in range(n):
            if h and h[0] <= now:
                heapreplace(h, end)
