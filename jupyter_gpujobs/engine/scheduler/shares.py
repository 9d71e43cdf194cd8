"""GPU shares in one scheduling cycle: packing jobs that ask for part of one GPU onto cards.

A share job (`model.is_share`) takes `share_fraction` of one card's time and
`share_memory_bytes` of its memory. Cards:

- A card holding shares is busy for whole-GPU jobs until its last share's end (the cluster's
  time line has it so); a share joins it only if its end delays no whole-GPU reservation
  booked on that card after the shares (`Cluster.shared` records their first start).
- A share goes first to a card that already holds shares and has room (memory and time-slice),
  best fit by memory: the card left with the least free memory. Only when none has room does
  it open a new card: a GPU free now whose hole is long enough (no booked whole-GPU job needs
  it before the share ends), the one with the least memory that fits, in the pool with the
  fewest free GPUs (large blocks of whole cards stay free).
- A share that cannot start now waits for the earliest time a card has room: a card with
  shares as its holds end, or a whole card as the time line frees it. That estimate is booked
  on the card as a future hold, so later shares neither take its room (backfill: a share may
  start now only if it delays no earlier share's estimate) nor get the same estimate.

Quotas and fair-share count a share as its fraction of one GPU (`weight`).
Pure, like the rest of the scheduler: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ...model import GPU, Job, is_share, share_fraction, share_memory_bytes
from .placement import INF, Cluster, View

_EPS = 1e-9


@dataclass(slots=True)
class Card:
    """One card that holds shares, now or in an estimate."""

    pool: int
    index: int  # GPU index; -1 for a card an estimate opens (any card of the pool)
    memory: int  # bytes
    # (start, end, fraction, bytes): running shares, this cycle's starts and booked estimates
    holds: list[tuple[float, float, float, int]] = field(default_factory=list)
    end: float = 0.0  # the last end of a share running now (the card's end for whole-GPU jobs)

    def fits(self, t: float, limit: float, frac: float, mem: int) -> bool:
        """Is there room for (frac, mem) over [t, t + limit) beside the holds?"""
        stop = t + limit
        points = [t] + [s for s, _, _, _ in self.holds if t < s < stop]
        for x in points:
            used_f, used_m = frac, mem
            for s, e, f, m in self.holds:
                if s <= x < e:
                    used_f += f
                    used_m += m
            if used_f > 1 + _EPS or used_m > self.memory:
                return False
        return True

    def earliest(self, floor: float, limit: float, frac: float, mem: int, until: float) -> float:
        """The first time from `floor` with room for the whole limit, ending by `until`."""
        for t in sorted({floor, *(e for _, e, _, _ in self.holds if e > floor)}):
            if t + limit > until:
                return INF
            if self.fits(t, limit, frac, mem):
                return t
        return INF

    def free_memory(self, t: float) -> int:
        return self.memory - sum(m for s, e, _, m in self.holds if s <= t < e)


def gpu_bytes(gpus: Sequence[GPU]) -> dict[tuple[str, int], int]:
    """Memory of each card, by (host, index)."""
    return {(g.host, g.index): g.memory_total_mb << 20 for g in gpus}


def running_weight(j: Job, card_bytes: Mapping[tuple[str, int], int]) -> float:
    """What a running job counts for quotas and fair-share: its GPUs, or its fraction of its card."""
    if not is_share(j):
        return float(len(j.assigned_gpus) or j.gpus)
    total = card_bytes.get((j.host or "", j.assigned_gpus[0]), 0) if j.assigned_gpus else 0
    return share_fraction(j, total)


def gib_text(n: int) -> str:
    """`21474836480` -> `"20 GB"` (GB as the G of `gpu_memory: 20G`)."""
    return f"{n / (1 << 30):.3g} GB"


def _article(label: str) -> str:
    return "an" if label[:1].upper() in "AEFHILMNORSX8" else "a"


class Shares:
    """The cards with shares in one cycle, over the cycle's `Cluster`."""

    def __init__(self, cluster: Cluster, gpus: Sequence[GPU], running: Sequence[Job], ends: Mapping[int, float]):
        self.cl = cluster
        self.now = cluster.now
        self.memory: dict[tuple[int, int], int] = {}
        self.pool_memory: dict[int, int] = {}
        for g in gpus:
            p = cluster.by_host_index.get((g.host, g.index))
            if p is not None:
                self.memory[(p, g.index)] = g.memory_total_mb << 20
                self.pool_memory[p] = max(self.pool_memory.get(p, 0), g.memory_total_mb << 20)
        self.cards: dict[int, list[Card]] = {}  # by pool
        self.by_gpu: dict[tuple[int, int], Card] = {}
        self.future: set[tuple[int, int]] = set()  # whole cards an estimate books shares on
        for j in running:
            if not is_share(j) or j.host is None or not j.assigned_gpus:
                continue
            p = cluster.by_host_index.get((j.host, j.assigned_gpus[0]))
            if p is None:
                continue
            card = self._card(p, j.assigned_gpus[0])
            total = card.memory
            end = max(ends[j.id], self.now)
            card.holds.append((-INF, end, share_fraction(j, total), share_memory_bytes(j, total) or 0))
            card.end = max(card.end, end)
        self.failed: dict[tuple[str | None, float, int], float] = {}  # (type, frac, mem) -> least limit

    def _card(self, p: int, i: int) -> Card:
        card = self.by_gpu.get((p, i))
        if card is None:
            card = self.by_gpu[(p, i)] = Card(p, i, self.memory.get((p, i), 0))
            self.cards.setdefault(p, []).append(card)
            self.cl.shared[(p, i)] = self.cl.hole[p].get(i, INF)  # a reservation booked on it while free
        return card

    def _until(self, p: int, i: int) -> float:
        """When the first reservation on a card with shares begins: a whole-GPU job booked on
        it after its shares, or an advance reservation (its hole)."""
        return min(self.cl.shared.get((p, i), INF), self.cl.hole[p].get(i, INF))

    def _need(self, j: Job, memory: int) -> tuple[float, int]:
        return share_fraction(j, memory), share_memory_bytes(j, memory) or 0

    # ------------------------------------------------------------------ what to count
    def weight(self, j: Job, view: View) -> float:
        """The part of a GPU a pending share counts for quotas: its share, or its memory over
        the largest card it may run on."""
        if j.share is not None:
            return j.share
        return share_fraction(j, max((self.pool_memory.get(p, 0) for p in view.pids), default=0))

    def impossible(self, j: Job, view: View) -> str | None:
        """Why no card of the view can ever hold this share, or None."""
        if j.gpu_memory is None:
            return None
        largest = max((self.pool_memory.get(p, 0) for p in view.pids), default=0)
        if largest and j.gpu_memory > largest:
            return (f"asks for {gib_text(j.gpu_memory)} of GPU memory but the largest of the {view.label} "
                    f"has {gib_text(largest)}")
        return None

    # ------------------------------------------------------------------ now
    def start_now(self, j: Job, view: View, limit: float) -> tuple[int, int, float, bool] | None:
        """Place a share now: (pool, GPU index, fraction, whether it opened a free unreserved
        card), or None."""
        now = self.now
        stop = now + limit
        memo = (j.gpu_type, j.share or 0.0, j.gpu_memory or 0)
        if limit >= self.failed.get(memo, INF):
            return None
        best: tuple[int, int, int, Card] | None = None  # (free memory left, pool, index, card)
        for p in view.pids:
            for card in self.cards.get(p, ()):
                if card.index < 0:
                    continue
                frac, mem = self._need(j, card.memory)
                if stop > self._until(p, card.index) or not card.fits(now, limit, frac, mem):
                    continue
                left = card.free_memory(now) - mem
                if best is None or (left, p, card.index) < best[:3]:
                    best = (left, p, card.index, card)
        opened = False
        if best is not None:
            card = best[3]
            frac, mem = self._need(j, card.memory)
        else:
            gpu = self._open(j, view, stop)
            if gpu is None:
                self.failed[memo] = min(limit, self.failed.get(memo, INF))
                return None
            card = self._card(*gpu)
            frac, mem = self._need(j, card.memory)
            opened = card.index not in self.cl.hole[card.pool]
        card.holds.append((now, stop, frac, mem))
        if stop > card.end:
            self.cl.occupy(card.pool, card.index, stop, card.end)
            card.end = stop
        return card.pool, card.index, frac, opened

    def _open(self, j: Job, view: View, stop: float) -> tuple[int, int] | None:
        """A free card for a new share: no reservation on it before `stop`, enough memory; the
        least memory that fits, then the pool with the fewest free GPUs, then the shortest hole."""
        cl = self.cl
        best: tuple[int, int, float, int, int] | None = None
        for p in view.free_pids:
            fp, hp = cl.free[p], cl.hole[p]
            n = len(fp)
            for i in fp:
                memory = self.memory.get((p, i), 0)
                hole = hp.get(i, INF)
                if hole < stop or (share_memory_bytes(j, memory) or 0) > memory:
                    continue
                key = (memory, n, hole, p, i)
                if best is None or key < best:
                    best = key
        return None if best is None else (best[3], best[4])

    # ------------------------------------------------------------------ later
    def book_estimate(self, j: Job, view: View, floor: float, limit: float) -> float:
        """The earliest start of a share that cannot start now, booked as a future hold."""
        best_t, best_card = INF, None
        for p in view.pids:
            for card in self.cards.get(p, ()):
                frac, mem = self._need(j, card.memory)
                until = self._until(p, card.index) if card.index >= 0 else INF
                t = card.earliest(floor, limit, frac, mem, until)
                if t < best_t:
                    best_t, best_card = t, card
        # or a whole card as the time line frees one (opened by this estimate, which then
        # books later shares on it too)
        whole: tuple[float, int, int] | None = None
        for p in view.pids:
            memory = self.pool_memory.get(p, 0)
            if (share_memory_bytes(j, memory) or 0) > memory:
                continue
            for t, i in self.cl.avail[p]:
                if (p, i) not in self.by_gpu and (p, i) not in self.future:
                    if whole is None or (t, p, i) < whole:
                        whole = (t, p, i)
                    break
        if whole is not None and max(whole[0], floor) < best_t:
            best_t = max(whole[0], floor)
            _, p, i = whole
            self.future.add((p, i))
            best_card = Card(p, -1, self.memory.get((p, i), 0))
            self.cards.setdefault(p, []).append(best_card)
        if best_card is None or best_t == INF:
            return INF
        frac, mem = self._need(j, best_card.memory)
        best_card.holds.append((best_t, best_t + limit, frac, mem))
        return best_t

    def waiting_reason(self, j: Job, view: View) -> str:
        """"waiting for 20 GB on an A100", "waiting for a 0.25 share of a GPU"."""
        label = j.gpu_type or "GPU"
        if j.gpu_memory is not None:
            return f"waiting for {gib_text(j.gpu_memory)} on {_article(label)} {label}"
        return f"waiting for a {j.share:g} share of {_article(label)} {label}"
