"""Handlers of quotas and reservations: a user's quota report and an admin's change of a
quota, the reservations (list, create, accept a learned proposal, delete).

May call: `base`, `quota` (the report), the JobService (which checks who may change what)."""

from __future__ import annotations

from jupyter_server.auth.decorator import authorized
from tornado import web

from .base import ApiError, GPUJobsHandler


class QuotaHandler(GPUJobsHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        from ..quota import quota_report

        user = self.text_arg("user") or self.owner
        if user != self.owner and not self.service.is_admin(self.owner):
            raise ApiError(403, "user", "only admins may see another user's quota")
        self.reply(quota_report(self.service, user))

    @web.authenticated
    @authorized
    async def put(self) -> None:
        """Admin: `{"scope": "users"|"groups", "name": "alice", "quota": {...} | null}`."""
        body = self.json_object()
        unknown = set(body) - {"scope", "name", "quota"}
        if unknown:
            raise ApiError(400, sorted(unknown)[0], "unknown field; expected scope, name, quota")
        scope, name, quota = body.get("scope"), body.get("name"), body.get("quota")
        self.service.set_quota(self.owner, scope, name, quota)
        self.reply({"scope": scope, "name": name, "quota": quota})


class ReservationsHandler(GPUJobsHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        """Every reservation (what is kept for whom is no one's private data)."""
        self.reply({"reservations": self.service.list_reservations()})

    @web.authenticated
    @authorized
    async def post(self) -> None:
        """Admin: reserve GPUs (`model.validate_reservation`), or accept a learned proposal:
        `{"proposal": <finding id>}` (an admin, or a user for themselves within their quota)."""
        body = self.json_body()
        if isinstance(body, dict) and "proposal" in body:
            if set(body) != {"proposal"}:
                raise ApiError(400, sorted(set(body) - {"proposal"})[0], "a proposal is accepted as it is")
            self.reply(self.service.accept_reservation_proposal(self.owner, body["proposal"]), 201)
            return
        self.reply(self.service.create_reservation(self.owner, body), 201)


class ReservationHandler(GPUJobsHandler):
    @web.authenticated
    @authorized
    async def delete(self, reservation_id: str) -> None:
        self.reply({"id": self.service.delete_reservation(self.owner, reservation_id), "deleted": True})
