"""Handlers of a user's own notifications: their e-mail and webhook settings, and a test
message.

May call: `base`, the engine's `Notifier` (through the JobService)."""

from __future__ import annotations

from jupyter_server.auth.decorator import authorized
from tornado import web

from ..notify import Notifier
from ..service import JobService
from .base import ApiError, GPUJobsHandler


def _notifier(service: JobService) -> Notifier:
    if service.notifier is None:
        raise ApiError(404, None, "this engine sends no notifications")
    return service.notifier


class NotificationsHandler(GPUJobsHandler):
    """`GET/PUT/DELETE notifications`: the caller's own e-mail and webhook notifications."""

    @property
    def notifier(self) -> Notifier:
        return _notifier(self.service)

    @web.authenticated
    @authorized
    async def get(self) -> None:
        self.reply(self.notifier.settings_for(self.owner))

    @web.authenticated
    @authorized
    async def put(self) -> None:
        """`{"email": "...", "webhook": "https://...", "events": ["ended", ...]}` (any of them;
        null clears an address)."""
        body = self.json_object()
        self.reply(self.notifier.set_settings(self.owner, body))

    @web.authenticated
    @authorized
    async def delete(self) -> None:
        self.reply(self.notifier.set_settings(self.owner, {"email": None, "webhook": None}))


class NotificationsTestHandler(GPUJobsHandler):
    """`POST notifications/test`: send a test message to the caller's destinations now."""

    @web.authenticated
    @authorized
    async def post(self) -> None:
        self.reply({"queued": _notifier(self.service).send_test(self.owner)})
