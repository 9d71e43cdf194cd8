"""Preemption in one scheduling cycle: who may preempt, and the booking of a preemptor (policy).

Part of the planner's cycle (planner.py). It owns the rights to preempt (urgent, or within a
user's or group's guarantee, quotas.py), the choice of victims (preemption.py) for a job with
the right, the guarantee GPUs claimed by each preemptor, and the booking of a preemptor on
its victims' GPUs, in this cycle (`_hold`) or while its victims of earlier cycles run out
their grace (`_hold_claim`). Whether an attempt can succeed at all is asked of the memos
first (plan_memo.py: `_victim_index_for`).

It is a mixin of the planner's `_Cycle` (planner.py): its methods read and write the
cycle's state, which `_Cycle.__init__` sets up in one place, and call the cycle's other
parts through `self`. It imports only the scheduler's pure modules and the model.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...model import Claim, Job, Preemption, preempt_grace
from .placement import View
from .preemption import choose_victims, victims_text


class Preempting:
    """Who may preempt, whom, and the preemptor's booking."""

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

    def _try_preempt(self, j: Job, k: int, limit: float, view: View, free_cap: int | None = None) -> bool:
        """Preempt for a job with the right to; `free_cap`: how many free GPUs it may use
        besides its victims' (None: all; the urgent reserve's room when the reserve is full)."""
        index = self._victim_index_for(j, k, view)
        if index is None:
            return False
        urgent = j.priority == "urgent"
        cl = self.cluster
        assert self.candidates is not None
        pids = set(view.pids)
        cands = {p: js for p, js in self.candidates.items() if p in pids and js}
        free_usable = {p: sum(1 for i in cl.free[p] if i not in cl.hole[p]) for p in cands}
        if free_cap is not None:
            free_usable = {p: min(n, max(0, free_cap)) for p, n in free_usable.items()}
        chosen = choose_victims(self.now, j, k, cands, free_usable, urgent)
        if chosen is None:
            self._no_victims(j, k, index)
            return False
        p, victims = chosen
        why = self._claim_guarantee(j, k)
        for v in victims:
            self.plan.preemptions.append(Preemption(v.id, j.id, f"preempted by job {j.id} ({why})"))
            self.victims.add(v.id)
            self.candidates[p].remove(v)
        self.victim_index.clear()
        self._hold(j, k, limit, p, victims, self.now + max(preempt_grace(v, self.policy)[0] for v in victims))
        return True

    def _claim_guarantee(self, j: Job, k: int) -> str:
        """Why `j` may preempt ("urgent", "guarantee of user alice"); a guarantee's GPUs are
        claimed for it, so that the next job of its owner asks for the rest only."""
        if j.priority == "urgent":
            return "urgent"
        why = f"guarantee of {self._guarantee_owner(j, k)}"
        key = j.user if why == f"guarantee of user {j.user}" else "group:" + (j.group or "")
        self.claimed[key] = self.claimed.get(key, 0) + k
        return why

    def _hold(self, j: Job, k: int, limit: float, p: int, victims: Sequence[Job], start: float) -> None:
        """Book `j` from `start` on pool p: on its victims' GPUs, and free ones for the rest;
        against the limits it counts from now."""
        cl = self.cluster
        gpus = [i for v in victims if v.host == cl.pool_host[p] for i in v.assigned_gpus]
        need = k - len(gpus)
        if need > 0:
            gpus += sorted(i for i in cl.free[p] if i not in cl.hole[p] and i not in gpus)[:need]
        cl.reserve_on(p, gpus[:k], limit, start)
        self._cluster_changed()
        # it holds its GPUs against the limits from now: a victim requeued meanwhile must not
        # take the room it leaves (outside the urgent reserve, in a quota) and be preempted again
        self._book(j, self._limits_of(j), start, start + limit, held=True)
        self.plan.reasons[j.id] = victims_text(victims)
        self.expected[j.id] = start

    def _hold_claim(self, j: Job, c: Claim) -> bool:
        """A claimant whose victims still run waits for them on their GPUs; False when none
        runs any more (it is then placed as any job, first)."""
        cl = self.cluster
        going = set(c.victims)
        victims = [r for r in self.running if r.id in going and r.host is not None and r.assigned_gpus]
        p = cl.by_host_index.get((victims[0].host, victims[0].assigned_gpus[0])) if victims else None
        if p is None or j.gpus <= 0:
            return False
        limit = float(j.time_limit_s or self.default_limit)
        self._limit_s[j.id] = limit
        if j.priority != "urgent" and self.quotas.any_guarantee and self._within_guarantee(j, j.gpus):
            self._claim_guarantee(j, j.gpus)
        self._hold(j, j.gpus, limit, p, victims, max(self.now, c.until))
        return True
