"""The websocket of the engine's events: job state changes (as each viewer may see them),
GPU updates, the monitor's findings to whom may see them, and budget warnings to the users
whose budget it is and the admins. A client that stops reading is disconnected (see
`EventsHandler.STALLED_BYTES`), so its unread messages cannot pile up in the engine.

May call: `base`, `monitor.may_see`, the JobService's subscription and views."""

from __future__ import annotations

import json
import time
from asyncio import Future
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

    #: A client that leaves more than this many bytes of messages unread, and reads none of
    #: them for STALLED_TICKS GPU ticks (3 s each), is disconnected: the engine keeps what a
    #: socket has not taken, and a websocket that is never read grew its memory without end.
    STALLED_BYTES = 1 << 20
    STALLED_TICKS = 2
    #: More unread than this, however slowly it reads, and it is disconnected at once (a burst
    #: of job changes: a cancel of 20,000 jobs is about 30 MB; a reading client takes it).
    MAX_UNREAD_BYTES = 64 << 20

    def open(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        self._viewer = job_owner(self)
        self._admin = self.service.is_admin(self._viewer)
        self._unread = 0  # bytes handed to the socket that it has not taken yet
        self._taken = 0  # messages it has taken, and how many at the last GPU tick
        self._taken_at_tick = 0
        self._stalled_ticks = 0  # GPU ticks in a row with more than STALLED_BYTES unread and none taken
        self._unsubscribe = self.service.subscribe(self._send)
        from tornado.ioloop import PeriodicCallback

        self._gpus_timer = PeriodicCallback(self._send_gpus, self.GPUS_TIMER_S * 1000)
        self._gpus_timer.start()
        self._send_gpus()

    #: The GPUs' message is made at most this often for all the websockets together.
    GPUS_EVERY_S = 1.0
    #: How often each websocket is sent the GPUs (and looked at for a client that stopped reading).
    GPUS_TIMER_S = 3.0

    def _send(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "finding" and not may_see(message["finding"], self._viewer, self._admin):
            return
        if kind == "budget" and not (self._admin or self._viewer in message.get("users", ())):
            return  # (as `GET budgets`: a user's own, and those of their groups)
        if getattr(self, "_unsubscribe", None) is None:
            return  # closed, or being closed for not reading
        text = self._text(message)
        try:
            written = self.write_message(text)
        except websocket.WebSocketClosedError:
            self.on_close()
            return
        size = len(text)
        self._unread += size
        written.add_done_callback(lambda f, size=size: self._taken_one(f, size))
        if self._unread > self.MAX_UNREAD_BYTES:
            self._drop(f"more than {self.MAX_UNREAD_BYTES >> 20} MiB of events unread")

    def _taken_one(self, written: Future[None], size: int) -> None:
        if not written.cancelled():
            written.exception()  # (a closed socket's: on_close does the rest)
        self._unread -= size
        self._taken += 1

    def _drop(self, why: str) -> None:
        """Disconnect a client that does not read what it is sent, and send it nothing more."""
        self.log.warning("gpujobs: closing the events websocket of %s: %s", self._viewer, why)
        self.on_close()
        self.close(1008, why[:120])

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
        stalled = self._unread > self.STALLED_BYTES and self._taken == self._taken_at_tick
        self._stalled_ticks = self._stalled_ticks + 1 if stalled else 0
        if self._stalled_ticks >= self.STALLED_TICKS:
            self._drop(f"{self._unread} bytes of events unread, none read for "
                       f"{self.STALLED_TICKS * self.GPUS_TIMER_S:g} s")
            return
        self._taken_at_tick = self._taken
        # [made at, the admins' message, everyone else's] (gpu_views_for: whose process uses a GPU)
        cached: list[Any] = self.settings.setdefault("gpujobs_ws_gpus", [-float("inf"), None, None])
        now = time.monotonic()
        if now - cached[0] >= self.GPUS_EVERY_S:
            views = self.service.gpu_views()
            cached[:] = [now, {"type": "gpus", "gpus": gpu_views_for(views, True)},
                         {"type": "gpus", "gpus": gpu_views_for(views, False)}]
        self._send(cached[1] if self._admin else cached[2])

    #: Clients have nothing to send on this websocket (what they send is ignored): a message
    #: longer than this closes it (1009) before the engine reads it. At tornado's default of
    #: 10 MiB, a user's 256 connections each part-way through a long message held 2.5 GB of the
    #: engine's memory.
    MAX_CLIENT_MESSAGE = 4096

    @property
    def max_message_size(self) -> int:
        return self.MAX_CLIENT_MESSAGE

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
