"""Live notebook widgets of the queue, built from ipywidgets 8 core widgets only (so they render
in JupyterLab with no extra front-end build):

- `JobWidget`: one job — state, queue position and expected start while pending, elapsed time
  against the time limit while running, a live log tail, a cancel button, `.wait()`, `.result()`.
  Returned by `%%gpujob --async`, `%gpujobs job ID`, `%gpujobs run` and `job(ID)`.
- `QuotaWidget`: my running GPUs against my guarantee, elastic (borrowed) use, limits, queued jobs.
- `QueueWidget`: the pending jobs with owners, GPUs, positions and expected starts.

Each widget polls the engine through the one client (`client.py`) from a background thread
(every `interval` seconds, 1 s by default) and updates its child widgets' traits; `refresh()`
does one poll by hand and `close()` stops the thread. A JobWidget stops polling once its job
has ended.

Clock times (an expected start: "by 14:05 at the latest") are written in the kernel, which does
not know the browser's locale: they use the CLI's 24-hour form on the kernel's local clock
(`model.format_expected_start`), so a widget, `%gpujobs` and `jupyter gpujobs` read alike. The
lab extension's panel and dashboard, drawn in the browser, follow the browser's locale.
"""

from __future__ import annotations

import html
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import ipywidgets as W

from ..client import FINAL_STATES, GPUJobsClient, GPUJobsError
from ..model import format_duration, safe_text
from .cells import (
    GPUJobFailed,
    _starts,
    cell_folder_of,
    describe,
    load_error,
    load_pulled,
    tail_lines,
)

_BAR_STYLE = {"COMPLETED": "success", "FAILED": "danger", "TIMEOUT": "danger", "LOST": "danger",
              "CANCELLED": "warning"}


class _Poller:
    """A background thread that calls `refresh()` every `interval` seconds until stopped."""

    def __init__(self, refresh: Any, interval: float, done: Any):
        self._refresh = refresh
        self._interval = interval
        self._done = done
        self._stop = threading.Event()
        self.error: str | None = None
        self._thread = threading.Thread(target=self._run, name="gpujobs-widget", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._refresh()
                self.error = None
            except GPUJobsError as err:
                self.error = err.message
            except Exception as err:  # keep polling: the widget shows what went wrong
                self.error = f"{type(err).__name__}: {err}"
            if self._done():
                return
            self._stop.wait(self._interval)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, wait: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(wait)


class _LiveWidget(W.VBox):
    """Shared by the three widgets: the client, the polling thread, refresh() and close()."""

    def __init__(self, client: GPUJobsClient | None, interval: float, autostart: bool, **kwargs: Any):
        super().__init__(**kwargs)
        self.client = client if client is not None else GPUJobsClient()
        self.interval = interval
        self._lock = threading.RLock()
        self._poller: _Poller | None = None
        self.error = W.HTML("")
        if autostart:
            self.start()

    def refresh(self) -> None:
        """Poll the engine once and update the widget."""
        raise NotImplementedError

    def _finished(self) -> bool:
        return False

    def start(self) -> None:
        """Start (or restart) the background polling."""
        if self._poller is None or not self._poller.alive:
            self._poller = _Poller(self._safe_refresh, self.interval, self._finished)

    def _safe_refresh(self) -> None:
        try:
            self.refresh()
            self.error.value = ""
        except GPUJobsError as err:
            self.error.value = f'<span style="color: #dc322f">{html.escape(err.message)}</span>'
            raise

    @property
    def polling(self) -> bool:
        return self._poller is not None and self._poller.alive

    def stop(self) -> None:
        """Stop the background polling (the widget stays on screen)."""
        if self._poller is not None:
            self._poller.stop()

    def close(self) -> None:
        """Stop polling and close the widget and its children."""
        self.stop()
        for child in self.children:
            child.close()
        self.error.close()
        super().close()


# ----------------------------------------------------------------------------- one job


class JobWidget(_LiveWidget):
    """One job, live: state, position and expected start, elapsed against the time limit, the
    log tail and a cancel button.

    `wait()` blocks until the job ends; `result()` waits and returns the `--pull` variables of a
    `%%gpujob` cell (put into the notebook's namespace too when the magic made the widget), or
    raises `GPUJobFailed` when the job did not complete.
    """

    def __init__(self, job_id: int, client: GPUJobsClient | None = None, *, job: dict[str, Any] | None = None,
                 folder: Path | str | None = None, pull: list[str] | None = None,
                 namespace: dict[str, Any] | None = None, interval: float = 1.0, autostart: bool = True,
                 log_lines: int = 20):
        self.job_id = int(job_id)
        self.log_lines = log_lines
        self.job: dict[str, Any] = job or {}
        self.log_text = ""  # everything read so far (the tail of it is shown)
        self._log_offset = 0
        self._log_done = False
        self._folder = Path(folder) if folder is not None else None
        self._pull = list(pull or [])
        self._namespace = namespace
        self._pulled: dict[str, Any] | None = None
        self._ended = threading.Event()

        self.title = W.HTML()
        self.status = W.HTML()
        self.progress = W.FloatProgress(value=0.0, min=0.0, max=1.0, description="queued",
                                        layout=W.Layout(width="auto"), style={"description_width": "initial"})
        self.log_view = W.HTML(layout=W.Layout(max_height="16em", overflow="auto"))
        self.cancel_button = W.Button(description="Cancel", button_style="danger", icon="stop",
                                      tooltip="cancel this job")
        self.cancel_button.on_click(self._on_cancel)
        client = client if client is not None else GPUJobsClient()
        super().__init__(client, interval, autostart=False)
        self.children = [W.HBox([self.title, self.cancel_button]), self.status, self.progress, self.log_view, self.error]
        if not self.job:
            self.job = self.client.job(self.job_id)
        if self._folder is None:
            self._folder = cell_folder_of(self.job)
        self._render()
        if autostart:
            self.start()

    # --- state, for code and tests
    @property
    def state(self) -> str:
        return self.job.get("state", "")

    @property
    def position(self) -> int | None:
        return self.job.get("position")

    @property
    def expected_start(self) -> float | None:
        return self.job.get("expected_start")

    @property
    def done(self) -> bool:
        return self.state in FINAL_STATES

    @property
    def log_tail(self) -> str:
        return tail_lines(self.log_text, self.log_lines)

    def _finished(self) -> bool:
        return self.done and self._log_done

    # --- polling
    def refresh(self) -> None:
        with self._lock:
            self.job = self.client.job(self.job_id)
            if self.state not in ("PENDING", "HELD") and not self._log_done:
                for _ in range(16):  # at most 4 MiB per refresh
                    chunk = self.client.log(self.job_id, self._log_offset)
                    self._log_offset = chunk["offset"]
                    self.log_text += chunk["data"]
                    if len(self.log_text) > 1 << 20:
                        self.log_text = self.log_text[-(1 << 19):]
                    self._log_done = bool(chunk["done"]) and self.done
                    if not chunk["data"] or self._log_done:
                        break
            self._render()
            if self.done and (self._log_done or self.state in ("PENDING", "HELD")):
                self._ended.set()
            if self.done and not self._log_done and not self.job.get("started_at"):
                self._log_done = True  # never ran: no log to read
                self._ended.set()

    def _render(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        job = self.job
        name = html.escape(safe_text(job.get("name") or job.get("kind") or "job"))
        self.title.value = f"<b>job {self.job_id}</b> {name} <code>{html.escape(self.state)}</code>"
        self.status.value = html.escape(describe(job, now))
        if job.get("output_notebook"):
            self.status.value += f"<br>output notebook: <code>{html.escape(str(job['output_notebook']))}</code>"
        limit = job.get("time_limit_s") or 0
        if self.state in ("PENDING", "HELD"):
            self.progress.max = 1.0
            self.progress.value = 0.0
            self.progress.bar_style = ""
            self.progress.description = ("held: starts once released" if self.state == "HELD"
                                         else f"queued, expected start {_starts(job, now)}")
        else:
            started = job.get("started_at") or now
            ended = job.get("ended_at") if self.done and job.get("ended_at") else now
            elapsed = max(0.0, ended - started)
            self.progress.max = float(limit) if limit else max(elapsed, 1.0)
            self.progress.value = min(elapsed, self.progress.max)
            self.progress.description = f"{format_duration(elapsed)} of {format_duration(limit or None)}"
            if self.done:
                self.progress.bar_style = _BAR_STYLE.get(self.state, "")
            else:
                self.progress.bar_style = "warning" if limit and elapsed > 0.9 * limit else "info"
        tail = self.log_tail
        self.log_view.value = (f'<pre style="margin: 0; font-size: 85%">{html.escape(tail)}</pre>' if tail else "")
        self.cancel_button.disabled = self.done

    @property
    def elapsed(self) -> float:
        """Seconds the job has run (0 while pending)."""
        if not self.job.get("started_at"):
            return 0.0
        end = self.job.get("ended_at") if self.done and self.job.get("ended_at") else time.time()
        return max(0.0, end - self.job["started_at"])

    # --- actions
    def _on_cancel(self, button: Any = None) -> None:
        self.cancel()

    def cancel(self) -> dict[str, Any]:
        """Cancel the job (what the button does)."""
        with self._lock:
            self.cancel_button.disabled = True
            try:
                self.job = self.client.cancel(self.job_id)
            except GPUJobsError as err:
                self.error.value = f'<span style="color: #dc322f">{html.escape(err.message)}</span>'
                self.cancel_button.disabled = False
                raise
        self.refresh()
        return self.job

    def wait(self, timeout: float | None = None) -> dict[str, Any]:
        """Block until the job has ended (and its log was read), or `timeout` seconds; returns the job."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._finished():
            if self.polling:
                left = self.interval if deadline is None else min(self.interval, deadline - time.monotonic())
                self._ended.wait(max(0.0, left))
                if self._ended.is_set() and not self._finished():
                    self.refresh()
            else:
                self.refresh()
                if not self._finished():
                    time.sleep(0.2)
            if deadline is not None and time.monotonic() >= deadline:
                break
        return self.job

    def result(self, timeout: float | None = None) -> dict[str, Any]:
        """Wait for the job; the pulled variables of a completed cell job ({} for other kinds).

        Raises GPUJobFailed (reason, log tail) when the job did not complete, TimeoutError when
        `timeout` passed first."""
        if self._pulled is not None:
            return self._pulled
        job = self.wait(timeout)
        if job.get("state") not in FINAL_STATES:
            raise TimeoutError(f"job {self.job_id} is still {job.get('state')} after {timeout}s")
        folder = self._folder
        if job["state"] != "COMPLETED":
            error = load_error(folder) if folder is not None else None
            if folder is not None and self._pull:
                shutil.rmtree(folder, ignore_errors=True)
            raise GPUJobFailed(job, self.log_tail, error)
        pulled = load_pulled(folder) if folder is not None else {}
        if folder is not None and self._pull:
            shutil.rmtree(folder, ignore_errors=True)
        if self._namespace is not None:
            self._namespace.update(pulled)
        self._pulled = pulled
        return pulled


def job(job_id: int, client: GPUJobsClient | None = None, **kwargs: Any) -> JobWidget:
    """A live widget of one job: `jupyter_gpujobs.notebook.widgets.job(12)`."""
    return JobWidget(job_id, client=client, **kwargs)


# ----------------------------------------------------------------------------- quota


def _bar(label: str) -> W.IntProgress:
    bar = W.IntProgress(value=0, min=0, max=1, description=label,
                        style={"description_width": "initial"}, layout=W.Layout(width="auto"))
    bar.label = label  # the fixed part of the description
    return bar


def _set(bar: W.IntProgress, value: int, maximum: int, text: str) -> None:
    """Set a bar to value/maximum, with the numbers in its description."""
    bar.max = max(int(maximum), 1)
    bar.value = min(int(value), bar.max)
    bar.description = f"{bar.label}: {text}"
    bar.tooltip = text


class QuotaWidget(_LiveWidget):
    """My GPU quota, live: running GPUs against the guarantee, elastic (borrowed) use, the
    running-jobs limit, queued jobs and the time limit cap (`client.quota()`)."""

    def __init__(self, client: GPUJobsClient | None = None, *, user: str | None = None, interval: float = 1.0,
                 autostart: bool = True):
        self.user = user
        self.quota: dict[str, Any] = {}
        self.title = W.HTML()
        self.guaranteed_bar = _bar("within guarantee")
        self.elastic_bar = _bar("elastic (borrowed)")
        self.gpus_bar = _bar("running GPUs")
        self.jobs_bar = _bar("running jobs")
        self.details = W.HTML()
        super().__init__(client, interval, autostart=False)
        self.children = [self.title, self.gpus_bar, self.guaranteed_bar, self.elastic_bar, self.jobs_bar,
                         self.details, self.error]
        self.refresh()
        if autostart:
            self.start()

    def refresh(self) -> None:
        with self._lock:
            self.quota = self.client.quota(self.user)
            self._render()

    def _render(self) -> None:
        q = self.quota
        total = int(q.get("total_gpus") or 0)
        running = int(q.get("running_gpus") or 0)
        borrowed = int(q.get("borrowed_gpus") or 0)
        guaranteed = int(q.get("guaranteed_gpus") or 0)
        max_gpus = q.get("max_gpus")
        cap = int(max_gpus) if max_gpus is not None else max(total, running, 1)
        self.title.value = f"<b>GPU quota of {html.escape(str(q.get('user', '')))}</b>"
        _set(self.gpus_bar, running, cap,
             f"{running} of {'max ' + str(max_gpus) if max_gpus is not None else str(total) + ' on the server'}")
        within = max(0, running - borrowed)
        _set(self.guaranteed_bar, min(within, guaranteed) if guaranteed else 0, max(guaranteed, 1),
             f"{min(within, guaranteed)} of {guaranteed} guaranteed")
        elastic_room = max(cap - guaranteed, borrowed, 1)
        _set(self.elastic_bar, borrowed, elastic_room,
             f"{borrowed} borrowed" + ("" if q.get("elastic", True) else " (elastic use off)"))
        max_jobs = q.get("max_running_jobs")
        jobs = int(q.get("running_jobs") or 0)
        _set(self.jobs_bar, jobs, int(max_jobs) if max_jobs else max(jobs, 1),
             f"{jobs} of {max_jobs if max_jobs is not None else 'no limit'}")
        self.gpus_bar.bar_style = "warning" if borrowed else ("success" if running else "")
        lines = [f"queued jobs: {q.get('pending_jobs', 0)} ({q.get('pending_gpus', 0)} GPUs)",
                 f"max time limit: {format_duration(q.get('max_time_limit_s'))}"]
        for name, g in (q.get("groups") or {}).items():
            gq = g.get("quota") or {}
            lines.append(f"group {name}: {g.get('running_gpus', 0)} GPUs running "
                         f"(guaranteed {gq.get('guaranteed_gpus', 0)}, max {gq.get('max_gpus', 'no limit')})")
        for b in q.get("budgets") or ():  # GPU-hour budgets (issue 30): used and left in this period
            lines.append(f"budget of {b['scope'][:-1]} {b['name']}: {b['used_gpu_hours']:.2f} of {b['gpu_hours']:g} "
                         f"GPU-hours used this {b['period']}, {b['left_gpu_hours']:.2f} left"
                         + (" (used up)" if b.get("used_up") else ""))
        self.details.value = "<br>".join(html.escape(safe_text(line)) for line in lines)


# ----------------------------------------------------------------------------- queue


class QueueWidget(_LiveWidget):
    """The queue, live: the first `limit` pending jobs in scheduling order with owner, GPUs,
    position, expected start and why each waits, and how many wait in all."""

    def __init__(self, client: GPUJobsClient | None = None, *, interval: float = 1.0, autostart: bool = True,
                 limit: int = 50):
        self.jobs: list[dict[str, Any]] = []
        self.total = 0
        self.limit = limit
        self.table = W.HTML()
        self.title = W.HTML()
        super().__init__(client, interval, autostart=False)
        self.children = [self.title, self.table, self.error]
        self.refresh()
        if autostart:
            self.start()

    def refresh(self) -> None:
        with self._lock:
            page = self.client.queue_page(limit=self.limit)
            self.jobs, self.total = page["jobs"], page["total"]
            self._render()

    def _render(self) -> None:
        from .cells import queue_table

        n = self.total
        self.title.value = f"<b>queue</b>: {n} pending job{'s' if n != 1 else ''}"
        self.table.value = (queue_table(self.jobs, total=n)._repr_html_() if self.jobs
                            else "<i>queue is empty</i>")


__all__ = ["JobWidget", "QuotaWidget", "QueueWidget", "job"]
