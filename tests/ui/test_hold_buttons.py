"""Hold and Release in the GPU Jobs panel (issue 27): a pending job's card has a Hold button;
held, the card says HELD (and why it waits), the status bar counts it, and Release lets it
start; a job with retries says which run it is on."""

from __future__ import annotations

from typing import Any

import pytest
from labtools import open_panel, screenshot, sleeper, wait_for

pytestmark = [pytest.mark.ui, pytest.mark.usefixtures("idle_engine")]


def job_row(page: Any, job_id: int) -> Any:
    return page.locator(f'#gpujobs-panel .jp-GPUJobs-job[data-job-id="{job_id}"]')


def test_hold_and_release_from_the_panel(page: Any, client: Any) -> None:
    open_panel(page)
    job = client.submit(sleeper(60), gpus=1, time_limit="5m", name="hold-me", begin="+1h")
    row = job_row(page, job["id"])
    wait_for(lambda: row.get_attribute("data-state") == "PENDING", 20, "the pending job's card")
    assert row.locator('button[data-action="release"]').count() == 0
    row.locator('button[data-action="hold"]').click()
    wait_for(lambda: row.get_attribute("data-state") == "HELD", 20, "the card to say held")
    assert client.job(job["id"])["state"] == "HELD"
    # its begin comes: held, it still does not start while the GPUs are free
    client.update(job["id"], begin=None)
    wait_for(lambda: "held: it starts only once released" in row.inner_text(), 20, "the card to say why it waits")
    assert row.locator(".jp-GPUJobs-state").inner_text() == "Held"
    assert "1 held" in page.locator(".jp-GPUJobs-statusText").inner_text()
    release = row.locator('button[data-action="release"]')
    assert release.inner_text() == "Release"
    screenshot(page, "job-held", row)
    release.click()
    wait_for(lambda: row.get_attribute("data-state") == "RUNNING", 20, "the released job to run")
    assert row.locator('button[data-action="hold"]').count() == 0
    assert [e["state"] for e in client.events(job["id"])][:4] == ["PENDING", "HELD", "UPDATED", "RELEASED"]


def test_a_job_with_retries_says_which_run_it_is_on(page: Any, client: Any) -> None:
    open_panel(page)
    job = client.submit(sleeper(0.2, code=2), gpus=1, name="flaky", retries=1, retry_backoff="30m")
    row = job_row(page, job["id"])
    row.wait_for(timeout=20000)
    # the first run failed: back in the queue for its retry, the card says so
    wait_for(lambda: "run 2 of 2" in row.inner_text(), 30, "the card to count the retry")
    assert row.get_attribute("data-state") == "PENDING"
    screenshot(page, "job-retry", row)
