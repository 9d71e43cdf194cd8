"""REST endpoints for the people who run the machine (issue 30), under `{base_url}gpujobs/api/`
(`ACCOUNTING_HANDLERS`, mounted next to handlers.py `HANDLERS`):

- `GET budgets[?user=]`: GPU-hour budgets with what is used and left in their period (admins:
  all, or a user's; others: their own and their groups')
- `PUT budgets {"scope": "users"|"groups", "name": "vision", "budget": {"gpu_hours": 500,
  "period": "week"|"month"|"dates", "start", "end", "mode": "hold"|"low"} | null}`: admins
- `GET audit?since=&until=&action=&actor=&limit=`: the audit trail of admin actions and
  policy changes, newest first (admins)
- `GET accounting?since=&until=&user=&format=json|csv`: per-job accounting records of a
  period, as `sacct` gives them (admins: every job, or a user's; others: their own)

Handlers only decode, check roles and call the rules (engine/rules.py) or the store's
accounting (store/accounting.py), whose reads of a period run off the engine's loop
(`base.report`); they hold no rules of their own.
"""

from __future__ import annotations

import time

from jupyter_server.auth.decorator import authorized
from tornado import web

from ..monitor.usage import time_range
from ..store import accounting
from .base import report
from .handlers import API, ApiError, GPUJobsHandler

ACTIONS = ("quota", "budget", "reservation", "drain", "foreign", "cancel")


class BudgetsHandler(GPUJobsHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        user = self.service.access.records_of(self.owner, self.text_arg("user"), "budgets")
        self.reply({"budgets": self.service.rules.budget_views(user)})

    @web.authenticated
    @authorized
    async def put(self) -> None:
        body = self.json_object()
        unknown = set(body) - {"scope", "name", "budget"}
        if unknown:
            raise ApiError(400, sorted(unknown)[0], "unknown field; expected scope, name, budget")
        if "budget" not in body:
            raise ApiError(400, "budget", "expected the budget, or null to clear it")
        stored = self.service.rules.set_budget(self.owner, body.get("scope"), body.get("name"), body["budget"])
        self.reply({"scope": body["scope"], "name": body["name"], "budget": stored})


class AuditHandler(GPUJobsHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        self.service.access.require_admin(self.owner, "read the audit trail")
        since, until = time_range(self.get_argument("since", None), self.get_argument("until", None), time.time(),
                                  default_span_s=30 * 86400)
        action = self.text_arg("action")
        if action is not None and action not in ACTIONS:
            raise ApiError(400, "action", f"unknown action {action!r}; actions are {', '.join(ACTIONS)}")
        limit = self.int_arg("limit", 1000, low=1, high=100_000) or 1000
        rows = await report(accounting.list_audit, self.service.store, since, until, action, self.text_arg("actor"),
                            limit)
        self.reply({"since": since, "until": until, "audit": rows})


class AccountingHandler(GPUJobsHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        now = time.time()
        since, until = time_range(self.get_argument("since", None), self.get_argument("until", None), now)
        fmt = self.text_arg("format") or "json"
        if fmt not in ("json", "csv"):
            raise ApiError(400, "format", "expected json or csv")
        user = self.service.access.records_of(self.owner, self.text_arg("user"), "jobs")
        records = await report(accounting.job_records, self.service.store, since, until, now, user)
        if fmt == "csv":
            self.set_header("Content-Type", "text/csv; charset=utf-8")
            self.finish(accounting.records_csv(records))
            return
        self.reply({"since": since, "until": until, "records": records,
                    "total_gpu_hours": round(sum(r["gpu_hours"] for r in records), 4)})


ACCOUNTING_HANDLERS: list[tuple[str, type]] = [
    (rf"/{API}/budgets/?", BudgetsHandler),
    (rf"/{API}/audit/?", AuditHandler),
    (rf"/{API}/accounting/?", AccountingHandler),
]

__all__ = ["ACCOUNTING_HANDLERS"]
