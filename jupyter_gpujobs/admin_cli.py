"""The CLI's commands for the people who run the machine (issue 30): `budget` (GPU-hour
budgets: list, set, clear), `audit` (the audit trail of admin actions) and `accounting`
(per-job records of a period as CSV or JSON, as `sacct` gives them). cli.py mounts them
(`add_parsers`, `run`); they call the client, and the store's CSV form of the records.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from .cli_usage import UsageError

COMMANDS = ("budget", "audit", "accounting")


def add_parsers(sub: Any) -> None:
    b = sub.add_parser("budget", help="GPU-hour budgets: what is used and left, or (admins) set one",
                       description="Without options: the budgets you draw on (admins: all). --set user:NAME or "
                       "group:NAME with --gpu-hours sets one (admins), e.g. budget --set group:course "
                       "--gpu-hours 500 --period month")
    b.add_argument("--user", help="whose budgets to show (admins)")
    b.add_argument("--set", metavar="SCOPE:NAME", help="admins: set the budget of user:NAME or group:NAME")
    b.add_argument("--gpu-hours", type=float, help="GPU-hours in each period (with --set)")
    b.add_argument("--period", choices=["week", "month", "dates"], default="month",
                   help="week (from Monday), month (from the 1st) or dates (--start to --end)")
    b.add_argument("--start", help="with --period dates: the first day, e.g. 2026-09-01")
    b.add_argument("--end", help="with --period dates: the end, e.g. 2027-01-31")
    b.add_argument("--mode", choices=["hold", "low"], default="hold",
                   help="once used up: jobs wait (hold), or run at low priority (low)")
    b.add_argument("--clear", metavar="SCOPE:NAME", help="admins: remove a budget")
    b.add_argument("--json", action="store_true")
    a = sub.add_parser("audit", help="admins: who changed what and when (quotas, budgets, drains, reservations, "
                       "cancels of others' jobs)")
    a.add_argument("--since", default="30d", help="start: a date, epoch seconds or a duration before now (default 30d)")
    a.add_argument("--until", help="end, same forms (default: now)")
    a.add_argument("--action", help="only this kind: quota, budget, reservation, drain, foreign, cancel")
    a.add_argument("--actor", help="only what this admin did")
    a.add_argument("--json", action="store_true")
    x = sub.add_parser("accounting", help="per-job records of a period (user, group, GPUs, model, GPU-hours, "
                       "memory, wait, state) as CSV or JSON, as sacct")
    x.add_argument("--since", default="30d", help="start: a date, epoch seconds or a duration before now (default 30d)")
    x.add_argument("--until", help="end, same forms (default: now)")
    x.add_argument("--user", help="only this user's jobs (admins; others see their own)")
    x.add_argument("--format", choices=["csv", "json"], default="csv")


def _target(text: str) -> tuple[str, str]:
    scope, _, name = text.partition(":")
    if scope not in ("user", "group") or not name:
        raise UsageError(f"budget: {text!r}: expected user:NAME or group:NAME")
    return scope + "s", name


def _when(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


def format_budgets(budgets: list[dict[str, Any]]) -> str:
    """One line per budget: whose, used of total, left, the period and the mode."""
    if not budgets:
        return "no GPU-hour budgets"
    lines = []
    for b in budgets:
        whose = f"{b['scope'][:-1]} {b['name']}"
        period = f"{b['period']} from {_when(b['period_start'])} to {_when(b['period_end'])}"
        state = " USED UP" if b.get("used_up") else "" if b.get("in_force", True) else " (not in force now)"
        lines.append(f"{whose}: {b['used_gpu_hours']:.2f} of {b['gpu_hours']:g} GPU-hours used ({b['percent']:g} %), "
                     f"{b['left_gpu_hours']:.2f} left; {period}; when used up: "
                     f"{'low priority' if b['mode'] == 'low' else 'jobs wait'}{state}")
    return "\n".join(lines)


def run(client: Any, args: argparse.Namespace) -> int:
    if args.cmd == "budget":
        target = args.set or args.clear
        if target:
            scope, name = _target(target)
            budget = None
            if args.set:
                if args.gpu_hours is None:
                    raise UsageError("budget: --set needs --gpu-hours")
                budget = {"gpu_hours": args.gpu_hours, "period": args.period, "mode": args.mode}
                if args.period == "dates":
                    budget.update(start=args.start, end=args.end)
            out = client.set_budget(scope, name, budget)
            print(json.dumps(out, indent=2) if args.json else
                  f"budget of {scope[:-1]} {name}: {json.dumps(out['budget']) if out['budget'] else 'cleared'}")
            return 0
        found = client.budgets(args.user)
        print(json.dumps(found, indent=2) if args.json else format_budgets(found))
        return 0
    if args.cmd == "audit":
        rows = client.audit(args.since, args.until, args.action, args.actor)
        if args.json:
            print(json.dumps(rows, indent=2))
        elif not rows:
            print("no audited actions in this period")
        else:
            for r in rows:
                before = "-" if r["before"] is None else json.dumps(r["before"])
                after = "-" if r["after"] is None else json.dumps(r["after"])
                print(f"{_when(r['time'])}  {r['actor']}  {r['action']}  {r['target']}: {before} -> {after}")
        return 0
    report = client.accounting(args.since, args.until, args.user)
    if args.format == "json":
        print(json.dumps(report, indent=2))
    else:
        from .engine.store.accounting import records_csv

        print(records_csv(report["records"]), end="")
    return 0
