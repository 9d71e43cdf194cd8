"""Repository functions of the `notifications` table (users' notification settings), each
taking a `Store`. What the settings mean and who may set them: engine/notify.py."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from . import Store, _writes
from .tables import NotificationRow

__all__ = ["load_settings", "save_settings"]


def load_settings(store: Store) -> dict[str, dict[str, Any]]:
    """Every user's stored settings: {user: {"email", "webhook", "events", "updated_at"}}."""
    with store._session() as s:
        return {r.user: {"email": r.email, "webhook": r.webhook, "events": list(r.events or []),
                         "updated_at": r.updated_at}
                for r in s.scalars(select(NotificationRow)).all()}


@_writes
def save_settings(store: Store, user: str, settings: dict[str, Any] | None, now: float) -> None:
    """Store a user's settings (`email`, `webhook`, `events`), or with None remove them."""
    with store._session.begin() as s:
        row = s.get(NotificationRow, user)
        if settings is None:
            if row is not None:
                s.delete(row)
            return
        if row is None:
            row = NotificationRow(user=user)
            s.add(row)
        row.email, row.webhook = settings.get("email"), settings.get("webhook")
        row.events, row.updated_at = list(settings.get("events") or []), now
