"""The rules admins change while the engine runs: quotas set through the API or CLI, GPU-hour
budgets (issue 30), and advance reservations (made by an admin, or accepted from a learned
proposal).

Owns them (stored, so they outlive restarts, and loaded at start), the policy in force
(`current_policy`: the configured `Policy` with the quotas set), which admission and the
cycle read, what was used of each budget in its period (`budget_states`, handed to the
cycle as data; warnings at 80 and 100 % broadcast as `{"type": "budget"}` for the notifier),
and the audit trail of admins' actions (`audit`). It may call the store, `access.Access`
(who may), `inventory.Inventory` (the GPUs a reservation needs), `events.Events.broadcast`
(a proposal's finding closed, a budget warning) and the pure reservation, quota and budget
helpers of the scheduler.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any

from ..model import (
    GPU,
    MAX_ID,
    InvalidInput,
    Policy,
    Reservation,
    check_plain_text,
    parse_id,
    validate_reservation,
)
from .access import Access
from .errors import Conflict, NotFound, PermissionDenied
from .events import Events
from .inventory import Inventory
from .scheduler.budgets import MODES, PERIODS, BudgetState, period_bounds
from .scheduler.quotas import Quotas
from .scheduler.reservations import gpus_text, occurrence_at, occurrences, occurrences_between
from .state import EngineState
from .store import accounting

log = logging.getLogger("jupyter_gpujobs")


class Rules:
    def __init__(self, state: EngineState, access: Access, inventory: Inventory, events: Events):
        self.state = state
        self.access = access
        self.inventory = inventory
        self.events = events
        # quotas an admin set through the API or CLI (stored; they win over the configured ones):
        # (scope, name) -> {"quota": its dict form, "by": who, "at": when}; `_policy` applies them
        self.quotas_set: dict[tuple[str, str], dict[str, Any]] = {}
        self._policy = state.policy
        # advance reservations (stored; an admin makes them, or a user accepts a learned one)
        self.reservations: list[Reservation] = []
        self.reservation_source: dict[int, str] = {}  # id -> "" or "finding:<id>"
        # GPU-hour budgets (stored): (scope, name) -> the budget's columns (store/accounting.py)
        self.budgets: dict[tuple[str, str], dict[str, Any]] = {}
        self._budget_states: list[BudgetState] = []
        self._budgets_at = -float("inf")  # when `_budget_states` was measured

    # ------------------------------------------------------------------ quotas

    def current_policy(self) -> Policy:
        """The configured policy with the quotas set through the API or CLI in force."""
        return self._policy

    def set_quota(self, actor: str, scope: Any, name: Any, quota: Any) -> None:
        """An admin sets (a dict as in c.GPUJobs.user_quotas) or clears (None) the quota of a user
        (`scope` "users") or group ("groups"); stored, so it outlives restarts."""
        if not self.access.is_admin(actor):
            raise PermissionDenied("only admins may change quotas")
        if scope not in ("users", "groups"):
            raise InvalidInput("scope", "expected 'users' or 'groups'")
        if not isinstance(name, str) or not name or len(name) > 200:
            raise InvalidInput("name", "expected the user or group name")
        check_plain_text(name, "name")
        if quota is not None:
            from traitlets import TraitError

            from ..config import _quota

            try:
                _quota("quota", quota)
            except TraitError as err:
                raise InvalidInput("quota", str(err)) from None
        now = self.state.clock()
        before = self.quotas_set.get((scope, name), {}).get("quota")
        self.state.store.set_quota(scope, name, quota, actor, now)  # stored first: it survives restarts
        self.audit(actor, "quota", f"{scope[:-1]}:{name}", before, quota)
        if quota is None:
            self.quotas_set.pop((scope, name), None)
        else:
            self.quotas_set[(scope, name)] = {"quota": quota, "by": actor, "at": now}
        self._policy = self._with_quotas_set()
        log.info("gpujobs: %s %s the quota of %s %s%s", actor, "cleared" if quota is None else "set",
                 scope[:-1], name, "" if quota is None else f" to {quota}")
        self.state.wake()

    def load_quotas(self) -> None:
        """Quotas set through the API before this start."""
        for scope, entries in self.state.store.load_quotas().items():
            for name, entry in entries.items():
                self.quotas_set[(scope, name)] = {"quota": entry["quota"], "by": entry["set_by"],
                                                  "at": entry["set_at"]}
        self._policy = self._with_quotas_set()

    def _with_quotas_set(self) -> Policy:
        """Built when a quota is set or loaded, not in every cycle."""
        policy = self.state.policy
        if not self.quotas_set:
            return policy
        from ..config import _quota

        quotas = {"users": dict(policy.user_quotas), "groups": dict(policy.group_quotas)}
        for (scope, name), entry in self.quotas_set.items():
            quotas[scope][name] = _quota(name, entry["quota"])
        return replace(policy, user_quotas=quotas["users"], group_quotas=quotas["groups"])

    # ------------------------------------------------------------------ advance reservations

    def create_reservation(self, actor: str, body: Any, source: str = "") -> dict[str, Any]:
        """An admin reserves GPUs for users or groups (`model.validate_reservation`); stored, so
        it outlives restarts, and in force from the next cycle."""
        if not self.access.is_admin(actor):
            raise PermissionDenied("only admins may reserve GPUs")
        return self._add_reservation(actor, body, source)

    def _add_reservation(self, actor: str, body: Any, source: str) -> dict[str, Any]:
        s = self.state
        if s.mirrored:
            raise Conflict("reservation", "this server hands its jobs to Slurm; make reservations there "
                                          "(scontrol create reservation)")
        now = s.clock()
        inventory = self.inventory.refresh()
        fields = validate_reservation(body, now, inventory)
        self._check_room(Reservation(id=MAX_ID, **fields), inventory, now)
        r = s.store.add_reservation(fields, actor, now, source)
        self.reservations.append(r)
        self.reservation_source[r.id] = source
        self.audit(actor, "reservation", f"reservation:{r.id}", None, _reservation_audit(r, source))
        log.info("gpujobs: %s reserved %d %s for %s (reservation %d)", actor, r.gpus, r.gpu_type or "GPUs",
                 r.holders_text(), r.id)
        s.wake()
        return self.reservation_view(r)

    def accept_reservation_proposal(self, actor: str, finding_id: Any) -> dict[str, Any]:
        """Reserve what a `reservation_proposal` finding proposes (monitor/habits.py) and close
        it. An admin may accept any; a user one for themselves, or for a group they are in,
        when its GPUs are within their (or that group's) GPU limit."""
        from .store import monitoring as mstore

        store = self.state.store
        fid = parse_id(finding_id, "proposal")
        finding = mstore.get_finding(store, fid)
        if finding is None or finding["kind"] != "reservation_proposal":
            raise NotFound(f"no reservation proposal {fid}")
        if not finding["open"]:
            raise Conflict("proposal", f"proposal {fid} is closed ({finding['action'] or 'no longer seen'})")
        body = dict(finding["data"].get("reservation") or {})
        if not self.access.is_admin(actor):
            self._may_accept(actor, body)
        view = self._add_reservation(actor, body, f"finding:{fid}")
        closed = mstore.resolve_finding(store, self.state.clock(), finding_id=fid,
                                        action=f"accepted by {actor}: reservation {view['id']}")
        if closed is not None:
            self.events.broadcast({"type": "finding", "finding": closed})
        return view

    def _may_accept(self, actor: str, body: dict[str, Any]) -> None:
        """A user accepts a proposal for themselves (or a group of theirs) within their quota."""
        quotas = Quotas(self.current_policy())
        n = int(body.get("gpus") or 0)
        if body.get("users") == [actor]:
            cap, who = quotas.user_caps(actor)[1], "your"
        elif len(body.get("groups") or []) == 1 and self.access.member(actor, body["groups"][0]):
            group = body["groups"][0]
            cap, who = quotas.group_caps(group)[1], f"group {group}'s"
        else:
            raise PermissionDenied("only admins may accept a proposal for someone else")
        if cap is None or n > cap:
            limit = "no GPU limit is set" if cap is None else f"the limit is {cap} GPUs"
            raise PermissionDenied(f"reserving {n} GPUs is beyond {who} quota ({limit}); ask an admin")

    def _check_room(self, new: Reservation, inventory: list[GPU], now: float) -> None:
        """Refuse (409) a reservation that would get no GPUs at one of its occurrences in the
        next 8 weeks, because earlier reservations hold them then."""
        for start, _ in occurrences_between(new, now, now + 8 * 7 * 86400)[:60]:
            if not any(o.reservation is new for o in occurrences([*self.reservations, new], inventory, start)):
                what = f"{new.gpus} {new.gpu_type or 'GPU'}{'s' if new.gpus > 1 and not new.gpu_type else ''}"
                raise Conflict("gpus", f"{what} on one host are not free of other reservations on "
                                       f"{time.strftime('%a %d %b %H:%M', time.localtime(start))}; see GET reservations")

    def delete_reservation(self, actor: str, reservation_id: Any) -> int:
        """An admin (or whoever made it) removes a reservation; returns its id."""
        rid = parse_id(reservation_id, "id")
        r = next((r for r in self.reservations if r.id == rid), None)
        if r is None:
            raise NotFound(f"no reservation {rid}")
        if not self.access.is_admin(actor) and actor != r.created_by:
            raise PermissionDenied(f"reservation {rid} was made by {r.created_by}; only they or an admin may remove it")
        self.state.store.delete_reservation(rid)
        self.audit(actor, "reservation", f"reservation:{rid}", _reservation_audit(r, self.reservation_source.get(rid, "")),
                   None)
        self.reservations = [x for x in self.reservations if x.id != rid]
        self.reservation_source.pop(rid, None)
        log.info("gpujobs: %s removed reservation %d", actor, rid)
        self.state.wake()
        return rid

    def list_reservations(self) -> list[dict[str, Any]]:
        """Every reservation with its active or next occurrence and the GPUs it has then."""
        return [self.reservation_view(r) for r in self.reservations]

    def reservation_view(self, r: Reservation) -> dict[str, Any]:
        now = self.state.clock()
        when = occurrence_at(r, now)
        occ = occurrences([x for x in self.reservations if x.id < r.id] + [r], self.inventory.refresh(), now)
        mine = next((o for o in occ if o.reservation.id == r.id), None)
        return {
            "id": r.id, "name": r.name, "label": r.label, "gpus": r.gpus, "gpu_type": r.gpu_type, "host": r.host,
            "start": r.start, "duration_s": r.duration_s, "repeat": r.repeat, "users": list(r.users),
            "groups": list(r.groups), "holders": r.holders_text(), "created_by": r.created_by,
            "created_at": r.created_at, "source": self.reservation_source.get(r.id, ""),
            "next_start": when[0] if when else None, "next_end": when[1] if when else None,
            "active": bool(when and when[0] <= now),
            "assigned": None if mine is None else {"host": mine.host, "gpus": list(mine.gpus),
                                                    "text": gpus_text(mine.gpus)},
        }

    def load_reservations(self) -> None:
        """Reservations made before this start."""
        self.reservations, self.reservation_source = [], {}
        for r, source in self.state.store.load_reservations():
            self.reservations.append(r)
            self.reservation_source[r.id] = source

    # ------------------------------------------------------------------ GPU-hour budgets

    def set_budget(self, actor: str, scope: Any, name: Any, budget: Any) -> dict[str, Any] | None:
        """An admin sets (`{"gpu_hours": 500, "period": "week"|"month"|"dates", "start", "end",
        "mode": "hold"|"low"}`) or clears (None) the GPU-hour budget of a user (`scope`
        "users") or group ("groups"; a project is a group: its jobs name it); stored and
        audited. Returns the budget as stored (None when cleared)."""
        if not self.access.is_admin(actor):
            raise PermissionDenied("only admins may change budgets")
        if scope not in ("users", "groups"):
            raise InvalidInput("scope", "expected 'users' or 'groups'")
        if not isinstance(name, str) or not name or len(name) > 128:
            raise InvalidInput("name", "expected the user or group name")
        check_plain_text(name, "name")
        fields = None if budget is None else self._valid_budget(budget)
        now = self.state.clock()
        accounting.set_budget(self.state.store, scope, name, fields, actor, now)  # stored and audited together
        if fields is None:
            self.budgets.pop((scope, name), None)
        else:
            old = self.budgets.get((scope, name))
            same = old is not None and all(old[k] == fields[k] for k in accounting.BUDGET_FIELDS)
            self.budgets[(scope, name)] = {
                "scope": scope, "name": name, **fields, "set_by": actor, "set_at": now,
                "warned_period": old["warned_period"] if same and old else None,
                "warned_level": old["warned_level"] if same and old else 0}
        log.info("gpujobs: %s %s the budget of %s %s%s", actor, "cleared" if fields is None else "set",
                 scope[:-1], name, "" if fields is None else f" to {fields}")
        self._budgets_at = -float("inf")  # measured anew by the next cycle
        self.state.wake()
        return fields

    def _valid_budget(self, body: Any) -> dict[str, Any]:
        from .monitor.usage import parse_time

        if not isinstance(body, dict):
            raise InvalidInput("budget", "expected an object such as {\"gpu_hours\": 500, \"period\": \"month\"}")
        unknown = set(body) - set(accounting.BUDGET_FIELDS)
        if unknown:
            raise InvalidInput(sorted(unknown)[0], f"unknown field; expected {', '.join(accounting.BUDGET_FIELDS)}")
        hours = body.get("gpu_hours")
        if isinstance(hours, bool) or not isinstance(hours, (int, float)) or not 0 < hours <= 1e9:
            raise InvalidInput("gpu_hours", "expected a number of GPU-hours above 0")
        period = body.get("period", "month")
        if period not in PERIODS:
            raise InvalidInput("period", f"expected one of {', '.join(PERIODS)}")
        mode = body.get("mode", "hold")
        if mode not in MODES:
            raise InvalidInput("mode", f"expected one of {', '.join(MODES)}")
        start = end = None
        if period == "dates":
            now = self.state.clock()
            if body.get("start") in (None, "") or body.get("end") in (None, ""):
                raise InvalidInput("start" if body.get("start") in (None, "") else "end",
                                   "a budget for dates needs its start and end (e.g. 2026-09-01)")
            start = parse_time(body["start"], now, "start", now)
            end = parse_time(body["end"], now, "end", now)
            if end <= start:
                raise InvalidInput("end", "must be after start")
        elif body.get("start") not in (None, "") or body.get("end") not in (None, ""):
            raise InvalidInput("start", "start and end are for a budget with the period 'dates'")
        return {"gpu_hours": float(hours), "period": period, "start": start, "end": end, "mode": mode}

    def load_budgets(self) -> None:
        """Budgets set before this start."""
        self.budgets = {(b["scope"], b["name"]): b for b in accounting.load_budgets(self.state.store)}
        self._budgets_at = -float("inf")

    def budget_states(self, now: float, pending: Any = ()) -> list[BudgetState]:
        """Each budget in force with what was used of it in its current period, measured from
        the store at most once a second (a running job's use counts up to now; a share by its
        fraction; `policy.budget_hour_s` seconds of one GPU are one GPU-hour). Crossing 80 %
        or 100 % broadcasts a warning once per period (kept in the store). `pending`: the
        pending jobs, whose users are told of their group's budget."""
        if not self.budgets:
            self._budget_states = []
            return []
        if now - self._budgets_at < 1.0:
            return self._budget_states
        self._budgets_at = now
        policy = self.state.policy
        spans = {key: period_bounds(b["period"], b["start"], b["end"], now, policy) for key, b in self.budgets.items()}
        live = {k: v for k, v in spans.items() if v is not None}
        if not live:
            self._budget_states = []
            return []
        since = min(start for start, _ in live.values())
        used: dict[tuple[str, str], float] = dict.fromkeys(live, 0.0)
        users: dict[tuple[str, str], set[str]] = {k: set() for k in live}
        for user, group, started, ended, fraction in accounting.charged_spans(self.state.store, since, now, now):
            for key in (("users", user), ("groups", group)):
                if key in live:
                    start, end = live[key]
                    seconds = min(ended, end if end is not None else ended) - max(started, start)
                    if seconds > 0:
                        used[key] += seconds * fraction
                        users[key].add(user)
        for j in pending:
            if j.group and ("groups", j.group) in users:
                users[("groups", j.group)].add(j.user)
        states = []
        for key, (start, end) in live.items():
            b = self.budgets[key]
            st = BudgetState(scope=key[0], name=key[1], gpu_hours=b["gpu_hours"],
                             used_gpu_hours=used[key] / policy.budget_hour_s, mode=b["mode"], period=b["period"],
                             period_start=start, period_end=end if b["period"] != "dates" else None)
            states.append(st)
            self._warn(b, st, users[key] | ({key[1]} if key[0] == "users" else set()))
        self._budget_states = states
        return states

    def _warn(self, b: dict[str, Any], st: BudgetState, users: set[str]) -> None:
        """A warning at 80 % and at 100 %, once per period (stored before it is sent)."""
        level = 100 if st.used_gpu_hours >= st.gpu_hours else 80 if st.used_gpu_hours >= 0.8 * st.gpu_hours else 0
        done = b["warned_level"] if b.get("warned_period") == st.period_start else 0
        if level <= done:
            return
        accounting.set_budget_warned(self.state.store, st.scope, st.name, st.period_start, level)
        b["warned_period"], b["warned_level"] = st.period_start, level
        log.info("gpujobs: the budget of %s is %d %% used", st.whose, level)
        self.events.broadcast({"type": "budget", "level": level, "users": sorted(users),
                               "budget": budget_view(b, st)})

    def budget_views(self, user: str | None = None) -> list[dict[str, Any]]:
        """Every budget (None), or those a user draws on (theirs, and those of the groups they
        are in or have jobs in), with its use: `{"scope", "name", "gpu_hours", "period",
        "mode", "in_force", "used_gpu_hours", "left_gpu_hours", "percent", "used_up",
        "period_start", "period_end", ...}`."""
        s = self.state
        states = {(st.scope, st.name): st for st in self.budget_states(s.clock(), s.pending.values())}
        mine = {j.group for j in [*s.pending.values(), *s.running.values()] if j.user == user and j.group}
        out = []
        for key, b in sorted(self.budgets.items()):
            if user is not None and key != ("users", user) and not (
                    key[0] == "groups" and (key[1] in mine or self.access.member(user, key[1]))):
                continue
            out.append(budget_view(b, states.get(key)))
        return out

    # ------------------------------------------------------------------ audit trail

    def audit(self, actor: str, action: str, target: str, before: Any, after: Any) -> None:
        """One row of the audit trail (who, what, when, before/after); a failure to write it
        is logged, never raised after the action was done."""
        try:
            accounting.add_audit(self.state.store, self.state.clock(), actor, action, target, _jsonable(before),
                                 _jsonable(after))
        except Exception:
            log.exception("gpujobs: writing the audit row of %s %s %s failed", actor, action, target)


def budget_view(b: dict[str, Any], st: BudgetState | None) -> dict[str, Any]:
    """A budget as the API shows it; `st` None: not in force now (dates past or to come)."""
    used = st.used_gpu_hours if st is not None else 0.0
    return {"scope": b["scope"], "name": b["name"], "gpu_hours": b["gpu_hours"], "period": b["period"],
            "start": b["start"], "end": b["end"], "mode": b["mode"], "set_by": b["set_by"], "set_at": b["set_at"],
            "in_force": st is not None, "used_gpu_hours": round(used, 4),
            "left_gpu_hours": round(max(0.0, b["gpu_hours"] - used), 4),
            "percent": round(100.0 * used / b["gpu_hours"], 1),
            "used_up": bool(st is not None and st.used_up),
            "period_start": st.period_start if st is not None else b["start"],
            "period_end": (st.period_end if st.period_end is not None else b["end"]) if st is not None else b["end"]}


def _reservation_audit(r: Reservation, source: str) -> dict[str, Any]:
    return {"name": r.name, "gpus": r.gpus, "gpu_type": r.gpu_type, "host": r.host, "start": r.start,
            "duration_s": r.duration_s, "repeat": r.repeat, "users": list(r.users), "groups": list(r.groups),
            "source": source}


def _jsonable(value: Any) -> dict[str, Any] | None:
    """An audit row's before/after: a dict as it is, None as None, anything else wrapped."""
    if value is None or isinstance(value, dict):
        return value
    return {"value": value}
