"""The job, quota and queue widgets, run in the test process with the sync client against a live
server: their child widgets' state follows the engine (states, positions, progress, log tail,
cancel through the button, quota numbers as `GET quota` has them)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import ipywidgets as W
import pytest
from test_magics import cancel_active, shared_server

from jupyter_gpujobs.notebook.magics import GPUJobFailed
from jupyter_gpujobs.notebook.widgets import JobWidget, QueueWidget, QuotaWidget, job


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    yield from shared_server(tmp_path_factory, "2xA100")


@pytest.fixture(autouse=True)
def no_job_left(server: Any) -> Iterator[None]:
    yield
    cancel_active(server)


def until(predicate: Callable[[], Any], timeout: float = 15.0, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


def py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_job_widget_follows_a_job_and_cancels_through_its_button(server: Any) -> None:
    client = server.client()
    running = client.submit(py("import time\nprint('hello from the job', flush=True)\ntime.sleep(30)"),
                            gpus=2, time_limit="2m", name="sleeper")
    waiting = client.submit(py("print('second')"), gpus=1, time_limit="1m", name="second")
    first = JobWidget(running["id"], client=client, autostart=False)
    second = job(waiting["id"], client=client, autostart=False)
    try:
        until(lambda: (first.refresh(), "hello from the job" in first.log_tail)[1])
        assert first.state == "RUNNING"
        assert first.progress.max == 120.0 and 0 <= first.progress.value <= 120
        assert first.progress.description.endswith("of 2m")
        assert "hello from the job" in first.log_view.value
        assert "RUNNING on GPU 0,1" in first.status.value
        assert not first.cancel_button.disabled

        second.refresh()
        assert second.state == "PENDING" and second.position == 1
        assert second.position == client.job(waiting["id"])["position"]
        assert second.progress.description.startswith("queued")
        assert "position 1 in the queue" in second.status.value

        first.cancel_button.click()  # what a person clicking it does
        assert client.job(running["id"])["state"] == "CANCELLED"
        first.refresh()
        assert first.state == "CANCELLED" and first.cancel_button.disabled
        assert first.progress.bar_style == "warning"

        finished = second.wait(timeout=20)
        assert finished["state"] == "COMPLETED"
        assert second.progress.bar_style == "success" and "second" in second.log_tail
        assert second.result() == {}
        with pytest.raises(GPUJobFailed, match="CANCELLED"):
            first.result()
    finally:
        first.close()
        second.close()
        client.close()


def test_background_polling_updates_and_close_stops_it(server: Any) -> None:
    client = server.client()
    submitted = client.submit(py("import time; time.sleep(1); print('done')"), gpus=1, time_limit="1m")
    widget = JobWidget(submitted["id"], client=client, interval=0.1)
    try:
        assert widget.polling
        until(lambda: widget.state == "COMPLETED" and "done" in widget.log_tail, timeout=20)
        until(lambda: not widget.polling)  # a job that ended needs no more polling
        assert widget.cancel_button.disabled
    finally:
        widget.close()
    queue_widget = QueueWidget(client=client, interval=0.1)
    assert queue_widget.polling
    queue_widget.close()
    assert not queue_widget.polling
    assert queue_widget.comm is None  # closed
    client.close()


def test_quota_widget_matches_get_quota(server: Any) -> None:
    client = server.client()
    widget = QuotaWidget(client=client, autostart=False)
    try:
        assert widget.quota == client.quota()
        assert widget.gpus_bar.value == 0 and widget.jobs_bar.value == 0
        jobs = [client.submit("sleep 30", gpus=1, time_limit="1m") for _ in range(3)]
        until(lambda: client.quota()["running_gpus"] == 2)
        widget.refresh()
        quota = client.quota()
        assert widget.quota == quota
        assert widget.gpus_bar.value == quota["running_gpus"] == 2
        assert widget.jobs_bar.value == quota["running_jobs"] == 2
        assert widget.elastic_bar.value == quota["borrowed_gpus"]
        assert widget.guaranteed_bar.value == min(quota["running_gpus"] - quota["borrowed_gpus"],
                                                   quota["guaranteed_gpus"])
        assert f"queued jobs: {quota['pending_jobs']}" in widget.details.value
        assert quota["pending_jobs"] == 1
        assert "2 of" in widget.gpus_bar.description

        queue_widget = QueueWidget(client=client, autostart=False)
        assert [j["id"] for j in queue_widget.jobs] == [j["id"] for j in client.queue()] == [jobs[2]["id"]]
        assert "<table" in queue_widget.table.value and quota["user"] in queue_widget.table.value
        assert "1 pending job" in queue_widget.title.value
        queue_widget.close()
        for j in jobs:
            client.cancel(j["id"])
        widget.refresh()
        assert widget.gpus_bar.value == 0
    finally:
        widget.close()
        client.close()


def test_async_magic_widget_result_pulls_into_the_namespace(server: Any, monkeypatch: Any) -> None:
    """`%%gpujob --async` in an IPython shell of this process: the widget's result() brings the
    pulled variables back."""
    from IPython.testing.globalipapp import get_ipython

    monkeypatch.setenv("GPUJOBS_URL", server.url)
    monkeypatch.setenv("GPUJOBS_TOKEN", server.token)
    monkeypatch.chdir(server.root)
    ip = get_ipython()
    ip.run_line_magic("load_ext", "jupyter_gpujobs")
    ip.user_ns["base"] = 10
    widget = ip.run_cell_magic("gpujob", "--async -t 1m --push base --pull answer", "answer = base * 4 + 2\n")
    try:
        assert isinstance(widget, JobWidget) and isinstance(widget, W.VBox)
        assert widget.result(timeout=20) == {"answer": 42}
        assert ip.user_ns["answer"] == 42
    finally:
        widget.close()
