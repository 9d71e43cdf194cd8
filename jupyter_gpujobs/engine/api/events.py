"""The websocket of the engine's events: job state changes (as each viewer may see them),
GPU updates, the monitor's findings to whom may see them, and budget warnings to the users
whose budget it is and the admins.

May call: `base`, `monitor.may_see`, the JobService's subscription and views."""

from __future__ import annotations

import json
import time
from typing import Any

from tornado import websocket

from ..access import gpu_views_for
from ..monitor import may_see
from ..service import JobService
from .base import AuthorizedWebSocket, job_owner


class EventsHandler(AuthorizedWebSocket):
    """Websocket of job state changes (`{"type": "job", ...}`), GPU updates (`{"type": "gpus"}`)
    and the monitor's findings as they open and close (`{"type": "finding", "finding": {...}}`),
    the last only to whom `GET findings` shows them: the finding's user and admins. A budget's
    warning (`{"type": "budget"}`, for the notifier) only to the users it names and admins,
    as `GET budgets` shows budgets."""

    @property
    def service(self) -> JobService:
        return self.settings["gpujobs_service"]

    def open(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        self._viewer = job_owner(self)
        self._admin = self.service.is_admin(self._viewer)
        self._unsubscribe = self.service.subscribe(self._send)
        from tornado.ioloop import PeriodicCallback

        self._gpus_timer = PeriodicCallback(self._send_gpus, 3000)
        self._gpus_timer.start()
        self._send_gpus()

    #: The GPUs' message is made at most this often for all the websockets together.
    GPUS_EVERY_S = 1.0

    def _send(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "finding" and not may_see(message["finding"], self._viewer, self._admin):
            return
        if kind == "budget" and not (self._admin or self._viewer in message.get("users", ())):
            return  # (as `GET budgets`: a user's own, and those of their groups)
        try:
            self.write_message(self._text(message))
        except websocket.WebSocketClosedError:
            self.on_close()

    def _text(self, message: dict[str, Any]) -> str:
        """The JSON of a broadcast message as this viewer may see it. A message goes to every
        websocket in turn: it is encoded once for all those who see it whole, and once for
        those who see its job's queue view only, not once per websocket."""
        last: list[Any] = self.settings.setdefault("gpujobs_ws_last", [None, {}])
        if last[0] is not message:
            last[0], last[1] = message, {}
        shown = self.service.job_message_for(message, self._viewer) if message.get("type") == "job" else message
        whole = shown is message
        text = last[1].get(whole)
        if text is None:
            text = last[1][whole] = json.dumps(shown)
        return text

    def _send_gpus(self) -> None:
        # [made at, the admins' message, everyone else's] (gpu_views_for: whose process uses a GPU)
        cached: list[Any] = self.settings.setdefault("gpujobs_ws_gpus", [-float("inf"), None, None])
        now = time.monotonic()
        if now - cached[0] >= self.GPUS_EVERY_S:
            views = self.service.gpu_views()
            cached[:] = [now, {"type": "gpus", "gpus": gpu_views_for(views, True)},
                         {"type": "gpus", "gpus": gpu_views_for(views, False)}]
        self._send(cached[1] if self._admin else cached[2])

    def on_message(self, message: str | bytes) -> None:
        pass

    def on_close(self) -> None:
        unsubscribe = getattr(self, "_unsubscribe", None)
        if unsubscribe:
            unsubscribe()
            self._unsubscribe = None
        timer = getattr(self, "_gpus_timer", None)
        if timer:
            timer.stop()
