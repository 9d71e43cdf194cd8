"""Advance reservations in a cycle: which occurrence of each reservation is active or next,
on which GPUs, and who may use them.

Pure: `occurrences()` expands the reservations (`model.Reservation`) to the one occurrence of
each that is running at `now` or comes next, on concrete GPUs. The planner books each on the
GPU time line as a block from its start to its end for everyone but its holders (so only jobs
that end before it starts run on its GPUs meanwhile: backfill), and gives the holders the
block's GPUs inside it (`HolderLine`). Later occurrences of a repeating reservation come into
view when the current one ends. An occurrence more than `AHEAD_S` ahead is kept by its free
GPUs' holes only (no job that would run into it starts there), while the time line still
books waiting jobs on its GPUs before it: a block weeks ahead would hide them from every
booking meanwhile.

GPUs: `gpus` healthy GPUs of the reservation's type (and host, when given) on one host: the
first host (by name) that has enough, its lowest indices, skipping GPUs that an earlier
reservation (by id) holds at an overlapping time. The choice depends on the reservations and
the GPUs only, not on what runs, so it stays the same from one cycle to the next.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ...model import GPU, Reservation, gpu_matches_type
from .deferral import LocalClock, clock_text

PERIOD_S = {"daily": 86400, "weekly": 7 * 86400}
#: how far ahead an occurrence blocks its GPUs on the time line (see the module docstring)
AHEAD_S = 86400.0


def occurrence_at(r: Reservation, now: float) -> tuple[float, float] | None:
    """(start, end) of the occurrence of `r` running at `now` or the next one; None when a
    one-off reservation is over."""
    period = PERIOD_S.get(r.repeat or "")
    if period is None or now < r.start:
        start = r.start
    else:
        start = r.start + ((now - r.start) // period) * period
        if start + r.duration_s <= now:
            start += period
    end = start + r.duration_s
    return None if end <= now else (start, end)


def occurrences_between(r: Reservation, t0: float, t1: float) -> list[tuple[float, float]]:
    """Every occurrence of `r` that overlaps [t0, t1) (for calendars and the simulator)."""
    out: list[tuple[float, float]] = []
    t = t0
    while t < t1:
        occ = occurrence_at(r, t)
        if occ is None or occ[0] >= t1:
            break
        out.append(occ)
        t = occ[1]
    return out


@dataclass
class Occurrence:
    """One occurrence of a reservation, on concrete GPUs."""

    reservation: Reservation
    start: float
    end: float
    host: str
    gpus: tuple[int, ...]
    model: str  # the GPUs' model name

    def holds(self, user: str, group: str | None) -> bool:
        return self.reservation.holds(user, group)

    def active(self, now: float) -> bool:
        return self.start <= now < self.end


def gpus_text(indices: Sequence[int]) -> str:
    """"GPU 3", "GPUs 0-1", "GPUs 0, 2-3"."""
    idx = sorted(indices)
    runs: list[str] = []
    i = 0
    while i < len(idx):
        j = i
        while j + 1 < len(idx) and idx[j + 1] == idx[j] + 1:
            j += 1
        runs.append(str(idx[i]) if i == j else f"{idx[i]}-{idx[j]}")
        i = j + 1
    return ("GPU " if len(idx) == 1 else "GPUs ") + ", ".join(runs)


def reserved_text(o: Occurrence, now: float, clock: LocalClock | int, one_host: bool = True) -> str:
    """Why others may not use its GPUs: "GPUs 0-1 are reserved for group vision from Fri 09:00"."""
    where = gpus_text(o.gpus) + ("" if one_host else f" on {o.host}")
    verb = "is" if len(o.gpus) == 1 else "are"
    when = (f"until {clock_text(o.end, now, clock)}" if o.start <= now
            else f"from {clock_text(o.start, now, clock)}")
    return f"{where} {verb} reserved for {o.reservation.holders_text()} {when}"


def _overlaps(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def occurrences(reservations: Sequence[Reservation], gpus: Sequence[GPU], now: float) -> list[Occurrence]:
    """The active or next occurrence of each reservation, on its GPUs (see the module
    docstring); a reservation whose GPUs are not there (none of its type, too few healthy) or
    that is over is left out."""
    usable = sorted((g for g in gpus if g.healthy and not g.draining), key=lambda g: (g.host, g.index))
    out: list[Occurrence] = []
    for r in sorted(reservations, key=lambda r: r.id):
        when = occurrence_at(r, now)
        if when is None:
            continue
        taken = {(o.host, i) for o in out if _overlaps(when, (o.start, o.end)) for i in o.gpus}
        by_host: dict[str, list[GPU]] = {}
        for g in usable:
            if (r.host is None or g.host == r.host) and (g.host, g.index) not in taken \
                    and gpu_matches_type(g.name, r.gpu_type):
                by_host.setdefault(g.host, []).append(g)
        for host, gs in by_host.items():
            # one model per occurrence (a job's GPUs are of one model): the most common here
            models: dict[str, list[GPU]] = {}
            for g in gs:
                models.setdefault(g.name, []).append(g)
            same = max(models.values(), key=len)
            if len(same) >= r.gpus:
                chosen = same[:r.gpus]
                out.append(Occurrence(r, when[0], when[1], host, tuple(g.index for g in chosen), chosen[0].name))
                break
    return out


@dataclass
class HolderLine:
    """The time line of one occurrence's GPUs for its holders: when each is free of the jobs
    running on it and of the holders' jobs booked inside it. A holder's job uses it only when
    it ends by the occurrence's end (the GPUs are others' again after it)."""

    occ: Occurrence
    pool: int
    avail: dict[int, float] = field(default_factory=dict)

    def start_now(self, now: float, k: int, limit: float) -> tuple[int, ...] | None:
        """k of its GPUs free now for a job of this time limit, taken; None when not."""
        o = self.occ
        if not o.start <= now or now + limit > o.end:
            return None
        free = [i for i in o.gpus if self.avail[i] <= now]
        if len(free) < k:
            return None
        chosen = tuple(free[:k])
        for i in chosen:
            self.avail[i] = now + limit
        return chosen

    def earliest(self, k: int, floor: float, limit: float) -> float | None:
        """When a job of k GPUs and this limit could start inside the occurrence from `floor`
        (None: it does not fit before the occurrence ends)."""
        if k > len(self.occ.gpus):
            return None
        t = max(sorted(self.avail.values())[k - 1], floor, self.occ.start)
        return t if t + limit <= self.occ.end else None

    def book(self, k: int, start: float, limit: float) -> None:
        for i in sorted(self.avail, key=lambda i: (self.avail[i], i))[:k]:
            self.avail[i] = start + limit
