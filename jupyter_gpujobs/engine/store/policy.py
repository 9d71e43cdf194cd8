"""What the store keeps of the policy, beside the jobs: fair-share usage, advance
reservations, and the quotas set through the API with their audit rows. A mixin of `Store`
(`PolicyRecords`): its methods are the store's and use its sessions.

May call: `tables`, `rows` (reservation rows), `trouble` (`_writes`), SQLAlchemy."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session, sessionmaker

from ...model import Reservation
from .rows import _to_reservation
from .tables import QuotaChangeRow, QuotaRow, ReservationRow, UsageRow
from .trouble import _writes


class PolicyRecords:
    """Usage, reservations and quotas: mixed into `Store`, whose sessions it uses."""

    _session: sessionmaker[Session]

    # ----------------------------------------------------------------- fair-share usage

    def load_usage(self) -> dict[str, tuple[float, float]]:
        with self._session() as s:
            return {r.key: (r.gpu_seconds, r.updated_at) for r in s.scalars(select(UsageRow)).all()}

    @_writes
    def save_usage(self, usage: dict[str, float], now: float) -> None:
        with self._session.begin() as s:
            for key, value in usage.items():
                row = s.get(UsageRow, key)
                if row is None:
                    s.add(UsageRow(key=key, gpu_seconds=value, updated_at=now))
                else:
                    row.gpu_seconds = value
                    row.updated_at = now


    # ----------------------------------------------------------------- advance reservations

    def load_reservations(self) -> list[tuple[Reservation, str]]:
        """Every reservation, by id, with its source ("" or "finding:<id>")."""
        with self._session() as s:
            return [(_to_reservation(r), r.source) for r in s.scalars(select(ReservationRow).order_by(ReservationRow.id))]

    @_writes
    def add_reservation(self, fields: dict[str, Any], actor: str, now: float, source: str = "") -> Reservation:
        """Store a reservation (`model.validate_reservation`'s fields); returns it with its id."""
        with self._session.begin() as s:
            row = ReservationRow(name=fields["name"], gpus=fields["gpus"], gpu_type=fields["gpu_type"],
                                 host=fields["host"], start=fields["start"], duration_s=fields["duration_s"],
                                 repeat=fields["repeat"], users=list(fields["users"]), groups=list(fields["groups"]),
                                 created_by=actor, created_at=now, source=source)
            s.add(row)
            s.flush()
            return _to_reservation(row)

    @_writes
    def delete_reservation(self, reservation_id: int) -> bool:
        """Remove a reservation; False when there is none of that id."""
        with self._session.begin() as s:
            row = s.get(ReservationRow, reservation_id)
            if row is None:
                return False
            s.delete(row)
            return True

    # ----------------------------------------------------------------- quotas set through the API

    def load_quotas(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Stored quotas: {"users"|"groups": {name: {"quota", "set_by", "set_at"}}}."""
        out: dict[str, dict[str, dict[str, Any]]] = {"users": {}, "groups": {}}
        with self._session() as s:
            for r in s.scalars(select(QuotaRow)).all():
                out.setdefault(r.scope, {})[r.name] = {"quota": dict(r.quota or {}), "set_by": r.set_by,
                                                       "set_at": r.set_at}
        return out

    @_writes
    def set_quota(self, scope: str, name: str, quota: dict[str, Any] | None, actor: str, now: float) -> None:
        """Store (or with None, remove) a quota, with its audit row (who, when, before, after),
        in one transaction."""
        with self._session.begin() as s:
            row = s.get(QuotaRow, (scope, name))
            before = dict(row.quota or {}) if row is not None else None
            if quota is None:
                if row is not None:
                    s.delete(row)
            elif row is None:
                s.add(QuotaRow(scope=scope, name=name, quota=dict(quota), set_by=actor, set_at=now))
            else:
                row.quota, row.set_by, row.set_at = dict(quota), actor, now
            s.add(QuotaChangeRow(time=now, actor=actor, scope=scope, name=name, before=before,
                                 after=None if quota is None else dict(quota)))

    def quota_changes(self, names: Iterable[tuple[str, str]] | None = None, limit: int = 20) -> list[dict[str, Any]]:
        """The newest quota changes first, of the given (scope, name) pairs or of all."""
        q = select(QuotaChangeRow).order_by(QuotaChangeRow.id.desc()).limit(limit)
        if names is not None:
            pairs = list(names)
            if not pairs:
                return []
            q = q.where(or_(*(and_(QuotaChangeRow.scope == sc, QuotaChangeRow.name == n) for sc, n in pairs)))
        with self._session() as s:
            return [{"time": r.time, "actor": r.actor, "scope": r.scope, "name": r.name, "before": r.before,
                     "after": r.after} for r in s.scalars(q).all()]
