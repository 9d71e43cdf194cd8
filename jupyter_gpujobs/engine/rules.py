"""The rules admins change while the engine runs: quotas set through the API or CLI, and
advance reservations (made by an admin, or accepted from a learned proposal).

Owns both (stored, so they outlive restarts, and loaded at start), and the policy in force
(`current_policy`: the configured `Policy` with the quotas set), which admission and the
cycle read. It may call the store, `access.Access` (who may), `inventory.Inventory` (the
GPUs a reservation needs), `events.Events.broadcast` (a proposal's finding closed) and the
pure reservation and quota helpers of the scheduler.
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
from .scheduler.quotas import Quotas
from .scheduler.reservations import gpus_text, occurrence_at, occurrences, occurrences_between
from .state import EngineState

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
        self.state.store.set_quota(scope, name, quota, actor, now)  # stored first: it survives restarts
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
