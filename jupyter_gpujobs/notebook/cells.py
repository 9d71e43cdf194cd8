"""What a job means to a person in a notebook, shared by the magics and the widgets: the
`GPUJobFailed` error, a one-line description of where a job stands, and what a finished `%%gpujob`
cell left in its folder (pulled variables, the cell's exception)."""

from __future__ import annotations

import html
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from ..model import format_duration, format_expected_start, format_relative, safe_text
from . import cell_job


class GPUJobFailed(RuntimeError):
    """A `%%gpujob` cell (or a job waited on with `JobWidget.result()`) did not complete.

    `job` is the job as the engine reports it, `state` its final state, `reason` why it ended,
    `error` the cell's exception (`{"type", "message", "line"}`) when the cell raised one, and
    `log_tail` the last lines of its output.
    """

    def __init__(self, job: dict[str, Any], log_tail: str = "", error: dict[str, Any] | None = None,
                 log_shown: bool = False):
        self.job = job
        self.state: str = job.get("state", "")
        self.reason: str = job.get("reason") or ""
        self.error = error
        self.log_tail = log_tail
        self.log_shown = log_shown
        message = f"job {job.get('id')} {self.state}"
        if self.reason:
            message += f": {self.reason}"
        if error:
            where = f" (line {error['line']} of the cell)" if error.get("line") else ""
            message += f"; {error.get('type')}: {error.get('message')}{where}"
        super().__init__(message)

    def _render_traceback_(self) -> list[str]:
        """What IPython shows instead of a traceback through the magic's own code."""
        lines = [f"\x1b[31mGPUJobFailed\x1b[0m: {self}"]
        if self.log_tail and not self.log_shown:
            lines += ["", "last lines of the job's output:", *self.log_tail.rstrip("\n").splitlines()]
        return lines


class JobCancelled(KeyboardInterrupt):
    """A `%%gpujob` cell was interrupted and its job cancelled. It is a KeyboardInterrupt, so the
    notebook stops as at any interrupt ("Run All" goes no further), shown as one line rather
    than a traceback through the magic's own code."""

    def __init__(self, job: dict[str, Any]):
        super().__init__(f"job {job['id']} {str(job.get('state', 'CANCELLED')).lower()} (the cell was interrupted)")

    def _render_traceback_(self) -> list[str]:
        return [f"\x1b[31mKeyboardInterrupt\x1b[0m: {self}"]


def tail_lines(text: str, n: int = 20) -> str:
    lines = text.splitlines(keepends=True)
    return "".join(lines[-n:])


def cell_folder_root(cwd: str) -> Path:
    """Where cell folders go: `$GPUJOBS_CELL_DIR`, else `.gpujobs/cells` under the working
    directory (visible to the job on any host sharing it), else a temp dir."""
    configured = os.environ.get("GPUJOBS_CELL_DIR")
    if configured:
        return Path(configured)
    base = Path(cwd) / ".gpujobs" / "cells"
    try:
        base.mkdir(parents=True, exist_ok=True)
        return base
    except OSError:
        return Path(tempfile.gettempdir()) / f"gpujobs-cells-{os.getuid()}"


def load_pulled(folder: Path) -> dict[str, Any]:
    """The `--pull` variables a completed cell left in its folder."""
    result = folder / cell_job.RESULT_FILE
    if not result.exists():
        return {}
    import cloudpickle

    with open(result, "rb") as f:
        return dict(cloudpickle.load(f))


def load_error(folder: Path) -> dict[str, Any] | None:
    path = folder / cell_job.ERROR_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def cell_folder_of(job: dict[str, Any]) -> Path | None:
    """The cell folder of a `cell` job (the last word of its command)."""
    command = job.get("command") or []
    if job.get("kind") == "cell" and len(command) >= 3 and command[-2] == cell_job.__name__:
        return Path(command[-1])
    return None


def _ago(t: float | None, now: float) -> str:
    return format_relative(t, now, "unknown")


def _starts(job: dict[str, Any], now: float) -> str:
    """A pending job's expected start, saying whether it is a prediction or a bound."""
    return format_expected_start(job.get("expected_start"), job.get("expected_start_kind"), now,
                                 span=job.get("expected_start_range"))


def describe(job: dict[str, Any], now: float | None = None) -> str:
    """One line on where a job stands: queue position and expected start, GPUs and elapsed time,
    or how it ended."""
    now = time.time() if now is None else now
    head = f"job {job['id']}"
    state = job["state"]
    if state == "HELD":
        return safe_text(f"{head} HELD: it starts once released (jupyter gpujobs release {job['id']})")
    if state == "PENDING":
        pos = f"position {job['position']} in the queue" if job.get("position") else "queued"
        start = f"expected start {_starts(job, now)}"
        reason = f" ({job['reason']})" if job.get("reason") else ""
        note = f"; {job['expected_start_note']}" if job.get("expected_start_note") else ""
        return safe_text(f"{head} PENDING: {pos}, {start}{reason}{note}")
    gpus = ",".join(str(i) for i in job.get("assigned_gpus") or []) or "none"
    if state == "RUNNING":
        elapsed = format_duration(now - job["started_at"]) if job.get("started_at") else "0s"
        limit = format_duration(job.get("time_limit_s"))
        return f"{head} RUNNING on GPU {gpus}: {elapsed} of {limit}"
    ran = ""
    if job.get("started_at") and job.get("ended_at"):
        ran = f" after {format_duration(job['ended_at'] - job['started_at'])}"
    reason = f": {job['reason']}" if job.get("reason") and state != "COMPLETED" else ""
    return safe_text(f"{head} {state}{ran}{reason}")


class Table:
    """An HTML table with a text/plain fallback (for `%gpujobs list|queue|gpus`). Cells show
    control, bidi and zero-width characters escaped; `note` is a line under the table."""

    def __init__(self, headers: list[str], rows: list[list[str]], text: str, note: str = ""):
        self.headers = headers
        self.rows = [[safe_text(cell) for cell in row] for row in rows]
        self.text = text + (f"\n{note}" if note else "")
        self.note = note

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(h)}</th>" for h in self.headers)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in self.rows)
        note = f"<div>{html.escape(self.note)}</div>" if self.note else ""
        return f'<table class="gpujobs-table"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{note}'

    def __repr__(self) -> str:
        return self.text


def _gpus_text(job: dict[str, Any]) -> str:
    from ..cli import gpus_text

    return gpus_text(job)


def jobs_table(jobs: list[dict[str, Any]], now: float | None = None) -> Table:
    from ..cli import format_jobs

    now = time.time() if now is None else now
    rows = []
    for j in jobs:
        if j["state"] == "RUNNING":
            when = f"{format_duration(now - (j.get('started_at') or now))}/{format_duration(j.get('time_limit_s'))}"
        elif j["state"] == "PENDING":
            when = "starts " + _starts(j, now)
        else:
            when = "ended " + _ago(j.get("ended_at"), now)
        rows.append([str(j["id"]), j["user"], j.get("name") or "-", j["kind"], j["state"], _gpus_text(j),
                     j["priority"], when, j.get("reason") or ""])
    return Table(["id", "user", "name", "kind", "state", "GPUs", "priority", "time", "reason"], rows,
                 format_jobs(jobs, now) if jobs else "no jobs")


def queue_table(jobs: list[dict[str, Any]], now: float | None = None, total: int | None = None) -> Table:
    """The queue's first jobs; `total`: how many are pending in all (a note says so when the
    table shows fewer)."""
    from ..cli import format_queue

    now = time.time() if now is None else now
    note = f"the first {len(jobs)} of {total} pending jobs" if total and total > len(jobs) else ""
    rows = [[str(j.get("position") or "-"), str(j["id"]), j["user"], j.get("name") or "-", _gpus_text(j),
             j["priority"], _starts(j, now), j.get("reason") or ""] for j in jobs]
    return Table(["position", "id", "user", "name", "GPUs", "priority", "expected start", "reason"], rows,
                 format_queue(jobs, now) if jobs else "queue is empty", note)


def gpus_table(gpus: list[dict[str, Any]]) -> Table:
    from ..cli import format_gpus

    rows = []
    for g in gpus:
        mem = f"{g['memory_used_mb'] / 1024:.1f}/{g['memory_total_mb'] / 1024:.0f} GiB"
        holder = f"job {g['job_id']} ({g['user']})" if g.get("job_id") else "free"
        rows.append([str(g["index"]), g["name"], f"{g['utilization']:.0f}%", mem, holder])
    return Table(["GPU", "model", "utilization", "memory", "held by"], rows,
                 format_gpus(gpus) if gpus else "no GPUs on this server")
