"""Why a waiting job's expected start moved (issue 28): the note a user reads beside it.

An estimating cycle gives every waiting job a new expected start (planner.py,
plan_predict.py). Each job keeps the start it was last told (`refs`: its first estimate, then
the one of its last note). When a new estimate differs from it by more than max(60 s, 10 % of
the wait still ahead), or that start passed while the job still waits (it was overdue), the
start moved, and `moved_notes` says by how much and why: the jobs running past their
predicted end (named: they held the GPUs longer than predicted), else what can only be the
cause (jobs ahead ran longer or ended sooner than predicted, jobs of a higher priority came).
A note stays until the start moves again. Small steps add up against the start last told,
so an estimate that creeps later cycle after cycle is noted once it has moved enough.

Pure: no clock (`now` is an argument), no I/O; may call the model only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ...model import Job, format_duration

#: jobs named in one note at most
NAMED = 2
#: a start told this long ago while its job still waits is overdue (the cycle that starts a
#: job comes a moment after the GPUs free)
OVERDUE_GRACE_S = 5.0


def overdue_jobs(running: Iterable[Job], now: float) -> list[int]:
    """The running jobs past their predicted end (`started_at + predicted_runtime_s`), those
    furthest past it first."""
    late = [(now - j.started_at - j.predicted_runtime_s, j.id) for j in running
            if j.predicted_runtime_s is not None and j.started_at is not None
            and j.started_at + j.predicted_runtime_s < now]
    return [jid for _, jid in sorted(late, reverse=True)]


def moved(before: float, after: float, now: float) -> bool:
    """Whether an expected start changed by more than max(60 s, 10 % of the wait ahead), or
    was overdue (passed while its job still waits) and is later now."""
    if before < now - OVERDUE_GRACE_S and after > before:
        return True
    return abs(after - before) > max(60.0, 0.1 * (max(before, after) - now))


def moved_notes(refs: Mapping[int, float], notes: Mapping[int, str], after: Mapping[int, float | None],
                now: float, overdue: list[int]) -> tuple[dict[int, float], dict[int, str]]:
    """(refs, notes) of the jobs estimated in `after` (job id -> expected start, None:
    unknown): each job's start last told (`refs`) and why it moved (`notes`, a new one where it
    moved, else the one it had). `overdue`: the running jobs past their predicted end
    (`overdue_jobs`)."""
    new_refs: dict[int, float] = {}
    out: dict[int, str] = {}
    held = ""
    if overdue:
        named = ", ".join(f"job {jid}" for jid in overdue[:NAMED])
        if len(overdue) > NAMED:
            named += f" and {len(overdue) - NAMED} more"
        one = len(overdue) == 1
        held = f"{named} {'is' if one else 'are'} running past {'its' if one else 'their'} predicted end"
    for jid, t in after.items():
        b = refs.get(jid)
        note = notes.get(jid)
        if t is None or b is None or not moved(b, t, now):
            ref = b if b is not None else t
            if ref is not None:
                new_refs[jid] = ref
            if note is not None:
                out[jid] = note
            continue
        new_refs[jid] = t
        later = t > b
        by = format_duration(abs(t - b))
        if b < now - OVERDUE_GRACE_S:
            head = f"passed {format_duration(now - b)} ago while it waited: moved later by {by}"
        else:
            head = f"moved {'later' if later else 'earlier'} by {by}"
        if later:
            why = held or "jobs ahead ran longer than predicted, or jobs of a higher priority came"
        else:
            why = "jobs ahead ended sooner than predicted"
        out[jid] = f"{head}: {why}"
    return new_refs, out
