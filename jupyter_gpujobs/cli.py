"""`jupyter gpujobs ...`: the command line, on top of the one client.

    jupyter gpujobs submit --gpus 1 --type A100 --time 30m -- python train.py
    jupyter gpujobs queue | list | show ID | cancel ID | log -f ID | gpus | quota
    jupyter gpujobs run-notebook NB.ipynb -g 1 -t 2h -p alpha=0.1
    jupyter gpujobs kernelspec install --name python3-gpu --gpus 1 --time 4h
    jupyter gpujobs usage --since 30d --by group | usage --heatmap | findings
    jupyter gpujobs notify --email alice@example.org --webhook https://... --events ended,failed
    jupyter gpujobs doctor

Errors are one line on stderr and a non-zero exit (2 for a wrong command line, 1 for an
answer of the engine).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from collections.abc import Sequence
from typing import Any

from .cli_usage import UsageError
from .client import GPUJobsClient, GPUJobsError
from .model import InvalidInput, format_duration, format_expected_start, format_relative, safe_text


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2
        raise UsageError(f"{self.prog}: {message}")


def _ago(t: float | None, now: float) -> str:
    return format_relative(t, now, "-")


def _starts(job: dict[str, Any], now: float) -> str:
    """A pending job's expected start: "14:20-15:05 (about 14:40, in 24m)" (a prediction and
    its range), "by 14:05 at the latest (in 29m)" (a bound from time limits), "unknown"."""
    return format_expected_start(job.get("expected_start"), job.get("expected_start_kind"), now,
                                 span=job.get("expected_start_range"))


def _table(rows: list[list[str]], headers: list[str]) -> str:
    """Aligned columns; control, bidi and zero-width characters in a cell (a job's name, command
    or reason comes from whoever submitted it) are shown escaped, never sent to the terminal."""
    rows = [[safe_text(cell) for cell in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    return "\n".join(lines)


def gpus_text(job: dict[str, Any]) -> str:
    """`2xA100 [0,1]`: what a job asks for and, once running, which GPUs it holds."""
    text = str(job["gpus"])
    share, memory = job.get("share"), job.get("gpu_memory")
    if share is not None or memory is not None:  # part of one GPU: 0.25, 20G or 0.25/20G
        text = "/".join(([f"{share:g}"] if share is not None else [])
                        + ([f"{memory / (1 << 30):.3g}G"] if memory is not None else []))
    if job.get("gpu_type"):
        text += f"x{job['gpu_type']}"
    if job.get("assigned_gpus"):
        text += " [" + ",".join(str(i) for i in job["assigned_gpus"]) + "]"
    return text


def format_jobs(jobs: list[dict[str, Any]], now: float) -> str:
    rows = []
    for j in jobs:
        if j["state"] == "RUNNING":
            when = f"{format_duration(now - j['started_at'])}/{format_duration(j['time_limit_s'])}"
        elif j["state"] in ("PENDING", "HELD"):
            when = "starts " + _starts(j, now) if j.get("expected_start") else "-"
        else:
            when = "ended " + _ago(j.get("ended_at"), now)
        rows.append([str(j["id"]), j["user"], j.get("name") or "-", j["state"], gpus_text(j), j["priority"],
                     when, j.get("reason") or ""])
    return _table(rows, ["ID", "USER", "NAME", "STATE", "GPUS", "PRIORITY", "TIME", "REASON"])


def format_queue(jobs: list[dict[str, Any]], now: float) -> str:
    rows = []
    for j in jobs:
        rows.append([str(j.get("position") or "-"), str(j["id"]), j["user"], j.get("name") or "-", gpus_text(j),
                     j["priority"], _starts(j, now),
                     j.get("reason") or ""])
    return _table(rows, ["POS", "ID", "USER", "NAME", "GPUS", "PRIORITY", "EXPECTED START", "REASON"])


def share_text(holder: dict[str, Any]) -> str:
    """`job 12 (alice) 0.25 = 20 GiB, using 3.1`: one holder of a shared GPU."""
    text = f"job {holder['job_id']} ({holder.get('user') or '?'})"
    if holder.get("share") is None:
        return text + " whole card"
    text += f" {holder['share']:.2g} = {holder['memory_mb'] / 1024:.3g} GiB"
    if holder.get("used_mb") is not None:
        text += f", using {holder['used_mb'] / 1024:.1f}"
    return text


def format_gpus(gpus: list[dict[str, Any]]) -> str:
    """The GPUs and their holders; grouped by node (a NODE column) on a cluster (Slurm)."""
    cluster = len({g.get("host") for g in gpus}) > 1 or any("slurm_job_id" in g for g in gpus)
    rows = []
    for g in sorted(gpus, key=lambda g: (str(g.get("host")), g["index"])) if cluster else gpus:
        mem = f"{g['memory_used_mb'] / 1024:.1f}/{g['memory_total_mb'] / 1024:.0f} GiB"
        shared = [h for h in g.get("holders") or [] if h.get("share") is not None]
        if shared:
            holder = ", ".join(share_text(h) for h in g["holders"])
            left = 1.0 - sum(h["share"] for h in shared)
            holder += f"; {max(0.0, left):.2g} free" if left > 0.005 else "; full"
        elif g.get("job_id"):
            holder = f"job {g['job_id']} ({g['user']})"
        elif g.get("slurm_job_id"):
            holder = f"Slurm job {g['slurm_job_id']} ({g.get('user') or '?'})"
        elif g.get("foreign") and g.get("foreign_override"):
            holder = f"{g['foreign']}; handed out all the same (override by {g['foreign_override']})"
        elif g.get("foreign"):
            holder = f"busy: {g['foreign']}"
        else:
            holder = "free"
        if g.get("draining"):
            holder = "draining (no new jobs)" + ("" if holder == "free" else f"; {holder}")
        row = [str(g["index"]), g["name"], f"{g['utilization']:.0f}%", mem, holder]
        rows.append([str(g.get("host")), *row] if cluster else row)
    head = ["GPU", "MODEL", "UTIL", "MEMORY", "HELD BY"]
    return _table(rows, ["NODE", *head] if cluster else head)


def _env_pairs(pairs: Sequence[str], what: str) -> dict[str, str]:
    out = {}
    for pair in pairs:
        if "=" not in pair:
            raise UsageError(f"{what} {pair!r}: expected NAME=VALUE")
        key, value = pair.split("=", 1)
        out[key] = value
    return out


def _param_pairs(pairs: Sequence[str]) -> dict[str, Any]:
    """`-p alpha=0.1 -p name=run1 -p layers=[1,2]`: values read as JSON when they parse."""
    out: dict[str, Any] = {}
    for key, value in _env_pairs(pairs, "parameter").items():
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="jupyter gpujobs", description="GPU job queue for Jupyter servers.")
    p.add_argument("--url", help="Jupyter server URL (default: GPUJOBS_URL, else the newest running Jupyter "
                   "server with jupyter-gpujobs, from Jupyter's runtime dir)")
    p.add_argument("--token", help="Jupyter server token (default: GPUJOBS_TOKEN or the running server's)")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND", parser_class=_Parser)

    def job_options(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("-g", "--gpus", default="1", help="number of GPUs (default 1; 0 for a CPU job), or a "
                        "share of one GPU, e.g. 0.25 (a quarter of its memory and time, beside other shares)")
        sp.add_argument("--gpu-mem", dest="gpu_memory", help="GPU memory on one shared GPU, e.g. 20G")
        sp.add_argument("-N", "--nodes", type=int, help="nodes of a multi-node job (Slurm runner only), "
                        "with --gpus GPUs on each")
        sp.add_argument("--type", dest="gpu_type", help="GPU model, e.g. A100")
        sp.add_argument("-t", "--time", dest="time_limit", help="time limit, e.g. 30m, 2h, 1d (default: server's)")
        sp.add_argument("--priority", default=None, help="low, normal, high or urgent")
        sp.add_argument("--name", help="job name")
        sp.add_argument("--group", help="project the job is accounted to")
        sp.add_argument("--preemptible", action="store_true", help="may be stopped and requeued for others")
        sp.add_argument("--begin", help="not before this time (2026-12-24T20:00, +2h)")
        sp.add_argument("--when", choices=["offpeak"], help="start only in off-peak hours")
        sp.add_argument("--after", action="append", default=[], help="start after job ID ends")
        sp.add_argument("--afterok", action="append", default=[], help="start after job ID completes")
        sp.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
        sp.add_argument("--mem", help="host memory limit, e.g. 32G (the job is stopped past it)")
        sp.add_argument("--cpus", help="CPU limit in cores, e.g. 8 or 0.5")
        sp.add_argument("--signal", help="a signal before the end, e.g. USR1@5m (B:USR1@5m: to the first process "
                        "only); also sent at once when preempted (docs/long-jobs.md)")
        sp.add_argument("--requeue", action="store_true", help="back to the queue at the time limit or when the run "
                        "is lost, with its checkpoint folder (up to the server's max_requeues times)")
        sp.add_argument("--max-requeues", dest="max_requeues", type=int, help="requeue at most this many times "
                        "(implies --requeue)")
        sp.add_argument("--retries", type=int, help="retry a failed run this many times (not a cancel, a time "
                        "limit or out of memory)")
        sp.add_argument("--retry-backoff", dest="retry_backoff", help="wait before the first retry (default 30s; "
                        "each next one waits twice as long)")
        sp.add_argument("--retry-oom", dest="retry_oom", action="store_true", help="retry runs out of memory too")
        sp.add_argument("--hold", action="store_true", help="submit it held: it starts once released")
        sp.add_argument("--image", help="container image to run in, e.g. localhost/pytorch:2.3 (podman, as you) or "
                        "/shared/images/cuda.sif (Apptainer); '' for the host when the site has a default "
                        "image (docs/containers.md)")
        sp.add_argument("--json", action="store_true", help="print the job as JSON")

    s = sub.add_parser("submit", help="submit a command as a GPU job", description="Submit a command: "
                       "jupyter gpujobs submit -g 1 -t 30m -- python train.py")
    job_options(s)
    s.add_argument("--array", help="job array, e.g. 0-15%%4 (index in GPUJOBS_ARRAY_INDEX)")
    s.add_argument("--no-requeue", action="store_true", help="cancel instead of requeue when preempted")
    s.add_argument("--cwd", help="working directory (default: the current one)")
    s.add_argument("--test-only", dest="test_only", action="store_true",
                   help="submit nothing: say when it would start, what nearby choices would start sooner, "
                        "and advice from your earlier runs of its name (as sbatch --test-only)")
    s.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")

    rn = sub.add_parser("run-notebook", help="queue a notebook for execution on GPUs")
    job_options(rn)
    rn.add_argument("notebook")
    rn.add_argument("-p", "--parameter", action="append", default=[], metavar="NAME=VALUE",
                    help="papermill-style parameter (value read as JSON when it parses)")
    rn.add_argument("--kernel", help="kernel name (default: the notebook's own)")
    rn.add_argument("--output", help="path of the executed notebook (default: next to the input)")

    q = sub.add_parser("queue", help="pending jobs in scheduling order, a page at a time")
    q.add_argument("-n", "--limit", type=int, default=50, help="jobs per page (default 50, at most 1000)")
    q.add_argument("--offset", type=int, default=0, help="start at this position (0: the head of the queue)")
    q.add_argument("--user", help="only this user's jobs ('me' for yours)")
    q.add_argument("--json", action="store_true")
    ls = sub.add_parser("list", help="jobs, newest first")
    ls.add_argument("--state", help="e.g. RUNNING,PENDING")
    ls.add_argument("--user", help="only this user's jobs ('me' for yours)")
    ls.add_argument("--all", action="store_true", help="everyone's jobs (default: yours)")
    ls.add_argument("-n", "--limit", type=int, default=50)
    ls.add_argument("--json", action="store_true")
    sh = sub.add_parser("show", help="one job and its events")
    sh.add_argument("id", type=int)
    sh.add_argument("--json", action="store_true")
    c = sub.add_parser("cancel", help="cancel jobs (many at once in one request)")
    c.add_argument("ids", type=int, nargs="*")
    which = c.add_mutually_exclusive_group()
    which.add_argument("--user", help="every active job of this user (yours; admins: anyone's)")
    which.add_argument("--array", type=int, metavar="ID", help="every active task of this array")
    which.add_argument("--all", action="store_true", help="every active job you may cancel (admins: everyone's)")
    lg = sub.add_parser("log", help="print a job's output")
    lg.add_argument("id", type=int)
    lg.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends")
    for verb, what in (("hold", "keep pending jobs from starting (HELD) until released"),
                       ("release", "let held jobs start again")):
        hd = sub.add_parser(verb, help=what)
        hd.add_argument("ids", type=int, nargs="+")
    up = sub.add_parser("update", help="change a job's time limit (a running job's too), priority, name or begin")
    up.add_argument("id", type=int)
    up.add_argument("-t", "--time", dest="time_limit", help="new time limit, e.g. 4h")
    up.add_argument("--priority", help="low, normal, high or urgent")
    up.add_argument("--name", help="new name")
    up.add_argument("--begin", help="not before this time (2026-12-24T20:00, +2h; 'now')")
    up.add_argument("--json", action="store_true", help="print the job as JSON")
    for verb, what in (("drain", "admins: start no new job on a GPU (running ones go on)"),
                       ("undrain", "admins: hand a drained GPU out again")):
        dn = sub.add_parser(verb, help=what)
        dn.add_argument("gpu", type=int, help="GPU index")
        dn.add_argument("--host", help="the GPU's host (default: this engine's)")
        if verb == "drain":
            dn.add_argument("--reason", default="", help="why (shown with the GPU)")
    g = sub.add_parser("gpus", help="the GPUs and who holds them")
    g.add_argument("--json", action="store_true")
    g.add_argument("--override", type=int, metavar="GPU",
                   help="admins: hand out this GPU although a process outside the queue uses it (until it is unused)")
    g.add_argument("--end-override", type=int, metavar="GPU", help="admins: take such an override back")
    g.add_argument("--reason", default="", help="why (with --override)")
    qt = sub.add_parser("quota", help="show your quota, or (admins) set one")
    qt.add_argument("--user", help="whose quota to show (admins)")
    qt.add_argument("--set", nargs=2, metavar=("SCOPE:NAME", "JSON"),
                    help="admins: set a quota, e.g. --set group:vision '{\"guaranteed_gpus\": 4}'")
    qt.add_argument("--clear", metavar="SCOPE:NAME", help="admins: remove a quota set through the API")
    qt.add_argument("--json", action="store_true")

    rs = sub.add_parser("reserve", help="advance reservations: list them, or (admins) keep GPUs for users or "
                        "groups", description="Without options: list the reservations. With --gpus, --start and "
                        "--duration: reserve (admins), e.g. reserve --gpus 4 --type A100 --start 2026-12-11T09:00 "
                        "--duration 4h --repeat weekly --groups vision")
    rs.add_argument("--gpus", type=int, help="how many GPUs (on one host)")
    rs.add_argument("--type", dest="gpu_type", help="GPU model, e.g. A100")
    rs.add_argument("--host", help="on this host only")
    rs.add_argument("--start", help="first start: 2026-12-11T09:00 (UTC unless it has an offset), epoch seconds "
                    "or +2h")
    rs.add_argument("--duration", help="how long each occurrence lasts, e.g. 4h")
    rs.add_argument("--repeat", choices=["daily", "weekly", "none"], default=None)
    rs.add_argument("--users", help="comma-separated users who may use the GPUs")
    rs.add_argument("--groups", help="comma-separated groups who may use the GPUs")
    rs.add_argument("--name", help="a name shown in reasons and the panel")
    rs.add_argument("--delete", type=int, metavar="ID", help="remove reservation ID")
    rs.add_argument("--accept", type=int, metavar="FINDING",
                    help="reserve what a reservation_proposal finding proposes (see: jupyter gpujobs findings "
                    "--kind reservation_proposal)")
    rs.add_argument("--json", action="store_true")

    nt = sub.add_parser("notify", help="be told of your jobs outside Lab: e-mail or a webhook (Slack, Mattermost) "
                        "when they start, end, fail or near their time limit")
    notify_options(nt)
    nt.add_argument("--json", action="store_true")

    us = sub.add_parser("usage", help="GPU-hours by user, group or GPU model (--heatmap: utilization by "
                        "weekday and hour)")
    us.add_argument("--since", default="7d", help="start: a date (2026-03-01), epoch seconds or a duration "
                    "before now such as 30d (default 7d)")
    us.add_argument("--until", help="end, same forms (default: now)")
    us.add_argument("--by", choices=["user", "group", "model"], default="user")
    us.add_argument("--heatmap", action="store_true", help="utilization by weekday x hour of day, as a grid")
    us.add_argument("--json", action="store_true")
    fd = sub.add_parser("findings", help="what the monitor found: out of memory, repeated failures, idle GPUs, "
                        "GPU errors, rogue processes")
    fd.add_argument("--kind", help="oom, repeated_failure, idle_hog, gpu_errors, gpu_drained, rogue_process, job_set_aside, "
                    "reservation_proposal, offpeak_suggestion")
    fd.add_argument("--job", type=int, help="only this job's findings")
    fd.add_argument("--all", action="store_true", help="closed findings too (default: open ones)")
    fd.add_argument("--json", action="store_true")

    sub.add_parser("engine", help="run this machine's shared engine for every user (as root; "
                   "--socket, --state-dir, --db-url, --admin-group, --config; see docs/shared-server.md)",
                   add_help=False)
    ks = sub.add_parser("kernelspec", help="install GPU kernelspecs")
    ks_sub = ks.add_subparsers(dest="ks_cmd", metavar="ACTION", parser_class=_Parser)
    ki = ks_sub.add_parser("install", help="write a kernelspec whose kernels queue for GPUs")
    ki.add_argument("--name", required=True)
    ki.add_argument("--display-name")
    ki.add_argument("-g", "--gpus", default="1", help="GPUs of each kernel, or a share of one GPU, e.g. 0.5")
    ki.add_argument("--gpu-mem", dest="gpu_memory", help="GPU memory of each kernel on one shared GPU, e.g. 16G")
    ki.add_argument("-t", "--time", dest="time_limit", default="4h")
    ki.add_argument("--type", dest="gpu_type")
    ki.add_argument("--priority", default="normal")
    ki.add_argument("--idle-timeout", help="shut the kernel down after this long idle, e.g. 30m")
    ki.add_argument("--max-wait", help="give up starting after waiting this long in the queue")
    ki.add_argument("--signal", help="a signal to each kernel before its time limit, e.g. USR1@5m (the kernel "
                    "must handle it: jupyter_gpujobs.checkpoint.on_signal)")
    ki.add_argument("--image", help="container image each kernel runs in (docs/containers.md), e.g. "
                    "localhost/pytorch:2.3, with ipykernel in it or mounted by the site")
    ki.add_argument("--kernel", default="python3", help="kernelspec to wrap (default python3)")
    where = ki.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="install for this user")
    where.add_argument("--sys-prefix", action="store_true", help="install into sys.prefix (the venv)")
    where.add_argument("--prefix", help="install under this prefix")
    ks_sub.add_parser("list", help="the installed GPU kernelspecs")
    dr = sub.add_parser("doctor", help="what is in force and what is wrong: engine, GPUs, isolation, store, "
                        "lab extension, GPU kernels, and what to do about each problem")
    dr.add_argument("--json", action="store_true")
    from . import admin_cli  # budget, audit, accounting (issue 30)

    admin_cli.add_parsers(sub)
    return p


def notify_options(p: Any) -> None:
    """The options of `jupyter gpujobs notify` and `%gpujobs notify` (argparse or IPython's)."""
    p.add_argument("--email", help="mail this address")
    p.add_argument("--webhook", help="post to this Slack/Mattermost-compatible incoming webhook URL")
    p.add_argument("--events", help="what to be told, comma-separated: started, ended, failed, warning "
                                    "(nears its time limit), finding (default: all)")
    p.add_argument("--no-email", action="store_true", help="stop mailing")
    p.add_argument("--no-webhook", action="store_true", help="stop posting to the webhook")
    p.add_argument("--off", action="store_true", help="turn notifications off")
    p.add_argument("--test", action="store_true", help="send a test message now")


def notify_parser(prog: str) -> argparse.ArgumentParser:
    """The parser of `%gpujobs notify` (a wrong line raises UsageError)."""
    p = _Parser(prog=prog, add_help=False)
    notify_options(p)
    return p


def notify(client: GPUJobsClient, args: Any) -> dict[str, Any]:
    """Carry out `notify` options through the client; returns the settings after them."""
    if args.off:
        settings = client.clear_notifications()
    else:
        changes: dict[str, Any] = {}
        if args.email is not None or args.no_email:
            changes["email"] = None if args.no_email else args.email
        if args.webhook is not None or args.no_webhook:
            changes["webhook"] = None if args.no_webhook else args.webhook
        if args.events is not None:
            changes["events"] = [e.strip() for e in args.events.split(",") if e.strip()]
        settings = client.set_notifications(**changes) if changes else client.notifications()
    if args.test:
        settings["test"] = client.test_notifications()["queued"]
    return settings


def format_notifications(n: dict[str, Any]) -> str:
    """A user's notification settings in words."""
    if not n.get("email") and not n.get("webhook"):
        lines = ["notifications: off (set --email ADDRESS or --webhook URL)"]
    else:
        lines = [f"notifications on {', '.join(n['events']) or 'nothing'} to:"]
        if n.get("email"):
            lines.append(f"  e-mail   {safe_text(n['email'])}")
        if n.get("webhook"):
            lines.append(f"  webhook  {safe_text(n['webhook'])}")
    if not n.get("email_available"):
        lines.append("(this engine sends no e-mail: it has no mail server; webhooks work)")
    if n.get("webhook_hosts"):
        lines.append(f"(webhooks may post to {', '.join(n['webhook_hosts'])} only)")
    if n.get("test"):
        lines.append(f"test message sent to: {', '.join(n['test'])}")
    return "\n".join(lines)


def _client(args: argparse.Namespace) -> GPUJobsClient:
    return GPUJobsClient(url=args.url, token=args.token)


def _job_body(args: argparse.Namespace) -> dict[str, Any]:
    gpus: int | float
    try:  # a whole number, or a share of one GPU (0.25); the server says what is wrong with either
        gpus = int(args.gpus)
    except ValueError:
        try:
            gpus = float(args.gpus)
        except ValueError:
            raise UsageError(f"--gpus: expected a number of GPUs (2) or a share of one GPU (0.25), "
                             f"got {args.gpus!r}") from None
    body: dict[str, Any] = {"gpus": gpus}
    for key in ("gpu_type", "time_limit", "priority", "name", "group", "begin", "when", "mem", "cpus", "gpu_memory",
                "nodes", "signal", "max_requeues", "retries", "retry_backoff", "image"):
        if getattr(args, key, None) is not None:
            body[key] = getattr(args, key)
    if args.preemptible:
        body["preemptible"] = True
    for flag in ("retry_oom", "hold"):
        if getattr(args, flag, False):
            body[flag] = True
    if args.requeue:
        body["requeue"] = True
    deps = [f"after:{i}" for i in args.after] + [f"afterok:{i}" for i in args.afterok]
    if deps:
        body["depends"] = deps
    if args.env:
        body["env"] = _env_pairs(args.env, "--env")
    return body


def _print_job(job: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(job, indent=2))
        return
    extra = ""
    if job["state"] == "PENDING" and job.get("position"):
        extra = f" (position {job['position']}; {job.get('reason')})"
    print(f"job {job['id']} {job['state']}{extra}")


def run(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    if args.cmd is None:
        build_parser().print_help()
        return 2
    if args.cmd == "kernelspec":
        from .jupyter import kernelspec

        return kernelspec.main(args)
    if args.cmd == "doctor":
        from . import doctor

        return doctor.main(args.url, args.token, args.json)
    if args.cmd == "submit":
        command = list(args.command)
        if command and command[0] == "--":
            command = command[1:]
        if not command:
            raise UsageError("submit: give the command after --, e.g. jupyter gpujobs submit -g 1 -- python train.py")
        body = _job_body(args)
        body["command"] = command
        body["cwd"] = os.path.abspath(args.cwd or os.getcwd())
        if args.array:
            body["array"] = args.array
        if args.no_requeue:
            if args.requeue or args.max_requeues:
                raise UsageError("submit: --no-requeue cannot go with --requeue or --max-requeues")
            body["requeue"] = False
        if args.test_only:
            from .whatif_text import format_what_if

            answer = _client(args).what_if(**body)
            print(json.dumps(answer, indent=2) if args.json else format_what_if(answer, time.time()))
            return 0
        client = _client(args)
        job = client.submit(**body)
        if job.get("array_tasks") and not args.json:
            print(f"job array {job['id']}: tasks {', '.join(str(t) for t in job['array_tasks'])}")
        else:
            _print_job(job, args.json)
        if not args.json:  # a smaller request your earlier runs of this name say would have done
            advice = client.job(job["id"], advice=True).get("advice")
            if advice and advice.get("suggest"):
                print(f"advice: {safe_text(advice['text'])}")
        return 0
    if args.cmd == "run-notebook":
        body = _job_body(args)
        nb = args.notebook
        job = _client(args).submit_notebook(
            os.path.abspath(nb), parameters=_param_pairs(args.parameter), kernel=args.kernel,
            output=os.path.abspath(args.output) if args.output else None, **body)
        if args.json:
            print(json.dumps(job, indent=2))
        else:
            _print_job(job, False)
            if job.get("output_notebook"):
                print(f"output notebook: {job['output_notebook']}")
        return 0
    client = _client(args)
    if args.cmd == "queue":
        user = client.whoami()["user"] if args.user == "me" else args.user
        page = client.queue_page(limit=args.limit, offset=args.offset, user=user)
        jobs = page["jobs"]
        if args.json:
            print(json.dumps(page, indent=2))
        elif not jobs:
            print("queue is empty" if not page["total"] else f"no jobs past position {args.offset} "
                  f"of {page['total']}")
        else:
            print(format_queue(jobs, time.time()))
            if page["next"] is not None or args.offset:
                print(f"jobs {args.offset + 1}-{args.offset + len(jobs)} of {page['total']} pending"
                      + (f"; next page: --offset {page['next']}" if page["next"] is not None else ""))
    elif args.cmd == "list":
        user = args.user
        if user == "me" or (user is None and not args.all):
            user = client.whoami()["user"]
        jobs = client.jobs(state=args.state, user=user, limit=args.limit)["jobs"]
        print(json.dumps(jobs, indent=2) if args.json else (format_jobs(jobs, time.time()) if jobs else "no jobs"))
    elif args.cmd == "show":
        job = client.job(args.id, advice=True)
        if args.json:
            job["events"] = [] if job.get("private") else client.events(args.id)
            print(json.dumps(job, indent=2))
        else:
            print(format_jobs([job], time.time()))
            if job.get("expected_start_note"):
                print("expected start " + safe_text(job["expected_start_note"]))
            if job.get("private"):
                print(f"its command, log and events are private to {safe_text(job.get('user'))}")
                return 0
            if job.get("command"):
                print("command: " + safe_text(shlex.join(job["command"])))
            if job.get("warn_signal") or job.get("max_requeues") is not None:
                print(safe_text(f"signal before the end: {job.get('warn_signal') or 'none'}; requeued at its time "
                                f"limit: {job.get('requeues', 0)} of at most {job.get('max_requeues') or 0} time(s)"))
            if job.get("retries"):
                print(f"retries: {job.get('retried', 0)} of {job['retries']} used (the first after "
                      f"{format_duration(job.get('retry_backoff_s'))}, each next one twice as long)")
            if job.get("advice"):
                print(f"advice: {safe_text(job['advice']['text'])}")
            for e in client.events(args.id):
                print(safe_text(f"  {_when(e['time'])}  {e['state']:<9}  {e['actor']:<10}  {e['reason']}"))
    elif args.cmd == "cancel":
        if bool(args.ids) == bool(args.user is not None or args.array is not None or args.all):
            print("error: give job ids, or one of --user, --array, --all", file=sys.stderr)
            return 2
        done = client.cancel_many(ids=args.ids or None, user=args.user, array=args.array, all=args.all)
        for job_id in done["cancelled"]:
            print(f"job {job_id} CANCELLED")
        for job_id in done["stopping"]:
            print(f"job {job_id} stopping")
        for job_id, why in done["errors"].items():
            said = safe_text(why)  # the engine's message names the job as a rule
            print(f"error: {said}" if f"job {job_id}" in said else f"error: job {job_id}: {said}", file=sys.stderr)
        if not args.ids and not done["cancelled"] and not done["stopping"]:
            print("no active jobs to cancel")
        return 1 if done["errors"] else 0
    elif args.cmd == "log":
        if args.follow:
            for chunk in client.follow_log(args.id):
                sys.stdout.write(chunk)
                sys.stdout.flush()
        else:
            offset = 0
            while True:
                chunk = client.log(args.id, offset)
                sys.stdout.write(chunk["data"])
                if not chunk["data"] or chunk["offset"] == offset:
                    break
                offset = chunk["offset"]
    elif args.cmd == "gpus":
        for gpu, override in ((args.override, True), (args.end_override, False)):
            if gpu is not None:
                client.set_foreign_override(gpu, override, args.reason)
        report = client.gpu_report()
        gpus = report["gpus"]
        if args.json:
            print(json.dumps(gpus, indent=2))
        else:
            print(format_gpus(gpus) if gpus else "no GPUs on this server")
            if report.get("isolation"):
                print(report["isolation"])
            if report.get("share_enforcement"):
                print(report["share_enforcement"])
    elif args.cmd in ("hold", "release", "update", "drain", "undrain"):
        return _change(client, args)
    elif args.cmd == "quota":
        return _quota(client, args)
    elif args.cmd == "reserve":
        return _reserve(client, args)
    elif args.cmd == "notify":
        settings = notify(client, args)
        print(json.dumps(settings, indent=2) if args.json else format_notifications(settings))
    elif args.cmd in ("usage", "findings"):
        return _monitor_command(client, args)
    elif args.cmd in ("budget", "audit", "accounting"):
        from . import admin_cli

        return admin_cli.run(client, args)
    return 0


def _change(client: GPUJobsClient, args: argparse.Namespace) -> int:
    """`hold`, `release`, `update` of jobs and `drain`, `undrain` of a GPU."""
    if args.cmd in ("hold", "release"):
        failed = 0
        for job_id in args.ids:
            try:
                job = client.hold(job_id) if args.cmd == "hold" else client.release(job_id)
            except GPUJobsError as err:
                print(f"error: job {job_id}: {safe_text(err.message)}", file=sys.stderr)
                failed += 1
                continue
            print(f"job {job['id']} {job['state']}")
        return 1 if failed else 0
    if args.cmd == "update":
        changes = {k: getattr(args, k) for k in ("time_limit", "priority", "name", "begin")
                   if getattr(args, k) is not None}
        if not changes:
            raise UsageError("update: give what to change: --time, --priority, --name or --begin")
        if changes.get("begin") == "now":
            changes["begin"] = None
        job = client.update(args.id, **changes)
        if args.json:
            print(json.dumps(job, indent=2))
        else:
            print(f"job {job['id']} {job['state']}: time limit {format_duration(job['time_limit_s'])}, "
                  f"priority {job['priority']}" + (f", name {safe_text(job['name'])}" if job.get("name") else ""))
        return 0
    draining = args.cmd == "drain"
    gpus = client.drain(args.gpu, getattr(args, "reason", ""), args.host, draining=draining)["gpus"]
    print(f"GPU {args.gpu} " + ("draining: no new job starts on it; running ones go on" if draining
                                else "handed out again"))
    print(format_gpus(gpus))
    return 0


def _quota(client: GPUJobsClient, args: argparse.Namespace) -> int:
    target = args.set[0] if args.set else args.clear
    if target:
        scope, _, name = target.partition(":")
        if scope not in ("user", "group") or not name:
            raise UsageError(f"quota: {target!r}: expected user:NAME or group:NAME")
        quota = None
        if args.set:
            try:
                quota = json.loads(args.set[1])
            except ValueError as err:
                raise UsageError(f"quota: the quota is not JSON: {err}") from None
        client.set_quota(scope + "s", name, quota)
        print(f"quota of {scope} {name}: {json.dumps(quota) if quota else 'cleared'}")
        return 0
    q = client.quota(args.user)
    if args.json:
        print(json.dumps(q, indent=2))
        return 0

    def lim(v: Any) -> str:
        return "no limit" if v is None else str(v)

    print(f"user {safe_text(q['user'])}")
    print(f"  running GPUs   {q['running_gpus']} (guaranteed {q['guaranteed_gpus']}, "
          f"max {lim(q['max_gpus'])}, borrowed {q['borrowed_gpus']})")
    print(f"  running jobs   {q['running_jobs']} (max {lim(q['max_running_jobs'])})")
    caps = [f"max {q['max_pending_jobs']} waiting" if q.get("max_pending_jobs") is not None else "",
            f"arrays of at most {q['max_array_tasks']} tasks" if q.get("max_array_tasks") is not None else ""]
    caps_text = "; ".join(c for c in caps if c)
    print(f"  queued jobs    {q['pending_jobs']}" + (f" ({caps_text})" if caps_text else ""))
    if q.get("priorities"):
        print(f"  priorities     {', '.join(q['priorities'])}")
    print(f"  max time limit {format_duration(q['max_time_limit_s'])}")
    if q.get("set"):
        print(f"  quota set by {q['set']['by']} at {_when(q['set']['at'])}: {json.dumps(q['set']['quota'])}")
    for name, g in q.get("groups", {}).items():
        gq = g.get("quota") or {}
        print(f"  group {safe_text(name)}: {g['running_gpus']} GPUs running (guaranteed {gq.get('guaranteed_gpus', 0)}, "
              f"max {lim(gq.get('max_gpus'))})")
        if g.get("set"):
            print(f"    quota set by {g['set']['by']} at {_when(g['set']['at'])}: {json.dumps(g['set']['quota'])}")
    if q.get("budgets"):
        from .admin_cli import format_budgets

        print("  GPU-hour budgets")
        print("\n".join("    " + line for line in format_budgets(q["budgets"]).splitlines()))
    if q.get("changes"):
        print("  quota changes (newest first)")
        for c in q["changes"]:
            what = json.dumps(c["after"]) if c["after"] is not None else "cleared"
            print(f"    {_when(c['time'])}  {c['actor']} set {c['scope'][:-1]} {c['name']}: {what}")
    return 0


def _reserve(client: GPUJobsClient, args: argparse.Namespace) -> int:
    """`reserve`: create (--gpus ...), accept a proposal, delete, or list."""
    made = None
    if args.delete is not None:
        client.delete_reservation(args.delete)
        print(f"reservation {args.delete} removed")
        return 0
    if args.accept is not None:
        made = client.accept_reservation(args.accept)
    elif any(v is not None for v in (args.gpus, args.start, args.duration, args.users, args.groups)):
        missing = [o for o, v in (("--gpus", args.gpus), ("--start", args.start), ("--duration", args.duration))
                   if v is None]
        if missing:
            raise UsageError(f"reserve: give {', '.join(missing)} (and --users or --groups)")
        made = client.reserve(args.gpus, args.start, args.duration, gpu_type=args.gpu_type, host=args.host,
                              repeat=args.repeat, name=args.name,
                              users=args.users.split(",") if args.users else None,
                              groups=args.groups.split(",") if args.groups else None)
    if made is not None:
        print(json.dumps(made, indent=2) if args.json else "reserved: " + format_reservations([made]))
        return 0
    found = client.reservations()
    if args.json:
        print(json.dumps(found, indent=2))
    else:
        print(format_reservations(found) if found else "no reservations")
    return 0


def format_reservations(rows: list[dict[str, Any]]) -> str:
    """One line per reservation: id, name, GPUs, for whom, when, next occurrence."""
    out = []
    for r in rows:
        what = f"{r['gpus']} {r['gpu_type'] or 'GPU'}" + ("s" if r["gpus"] > 1 and not r["gpu_type"] else "")
        where = f" ({r['assigned']['text']}{' on ' + r['assigned']['host'] if r['host'] else ''})" if r.get("assigned") else ""
        every = {"daily": "every day", "weekly": "every week"}.get(r["repeat"] or "", "once")
        if r["next_start"] is None:
            nxt = "over"
        elif r["active"]:
            nxt = f"on now, until {_when(r['next_end'])}"
        else:
            nxt = f"next {_when(r['next_start'])} to {_when(r['next_end'])}"
        out.append(f"{r['id']:>4}  {safe_text(r['label'])}: {what}{where} for {safe_text(r['holders'])}, "
                   f"{format_duration(r['duration_s'])} {every}; {nxt}")
    return "\n".join(out)


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _monitor_command(client: GPUJobsClient, args: argparse.Namespace) -> int:
    """`usage` and `findings`, through the monitor's endpoints."""
    from .engine.monitor.text import format_findings, format_heatmap, format_usage

    if args.cmd == "findings":
        params = {"kind": args.kind, "job": args.job, "open": None if args.all else "1"}
        found = client.api("GET", "findings", params={k: v for k, v in params.items() if v is not None})["findings"]
        print(json.dumps(found, indent=2) if args.json else (format_findings(found, time.time()) if found else "no findings"))
        return 0
    params = {"since": args.since, "until": args.until}
    params = {k: v for k, v in params.items() if v is not None}
    if args.heatmap:
        report = client.api("GET", "usage/heatmap", params=params)
        print(json.dumps(report, indent=2) if args.json else format_heatmap(report))
    else:
        report = client.api("GET", "usage", params={**params, "by": args.by})
        print(json.dumps(report, indent=2) if args.json else format_usage(report))
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["engine"]:  # a long-running server with Jupyter-style (traitlets) options
        from .engine.app import EngineApp

        EngineApp.launch_instance(args[1:])
        return
    try:
        code = run(args)
        sys.stdout.flush()  # here, so that a reader gone early (`| head`) is caught below
    except BrokenPipeError:
        # the reader of our output closed it (`jupyter gpujobs list | head`): stop quietly, as Unix
        # tools do; stdout goes to /dev/null so that Python's exit flush does not complain
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 141  # 128 + SIGPIPE, what a shell reports for a tool stopped by a closed pipe
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        code = 2
    except GPUJobsError as err:
        where = f" ({err.field})" if err.field and not err.message.startswith(err.field) else ""
        print(safe_text(f"error{where}: {err.message}"), file=sys.stderr)
        code = 1
    except InvalidInput as err:
        print(f"error: {err}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)


if __name__ == "__main__":
    main()
