"""The submit dialog's "When would it start?" (issue 28, docs/what-if.md): on a busy fake cluster
it shows when the request would start and the nearby choices that start sooner, submitting
nothing; and a job's Advice button in the panel."""

from __future__ import annotations

import re
import shutil
from typing import Any

import pytest
from labtools import REPO, Lab, open_lab, open_panel, run_command, screenshot, sleeper, wait_for

pytestmark = [pytest.mark.ui, pytest.mark.usefixtures("idle_engine")]


def test_when_would_it_start_in_the_submit_dialog(page: Any, lab: Lab, client: Any) -> None:
    # a workspace of its own: notebooks earlier tests left open in the default one come back
    # there with a "Select Kernel" dialog over the file browser
    open_lab(page, lab.url, workspace="whatif-dialog")
    whole = client.submit(sleeper(600), gpus=1, time_limit="30m", name="holder")
    share = client.submit(sleeper(600), gpus=0.5, time_limit="20m", name="sharer")
    for job in (whole, share):
        wait_for(lambda j=job: client.job(j["id"])["state"] == "RUNNING", 30, "the GPUs to be held")
    before = [j["id"] for j in client.jobs(limit=100)["jobs"]]
    nb_dir = lab.root / "whatif"
    nb_dir.mkdir(exist_ok=True)
    shutil.copyfile(REPO / "binder" / "square.ipynb", nb_dir / "square.ipynb")
    run_command(page, "filebrowser:go-to-path", {"path": "whatif"})
    item = page.locator(".jp-DirListing-item", has_text="square.ipynb")
    item.wait_for(timeout=15000)
    item.click(button="right")
    page.locator(".lm-Menu-item", has_text="Run on GPU queue…").click()
    dialog = page.locator(".jp-Dialog")
    dialog.wait_for(timeout=10000)
    dialog.locator('select[name="gpu_type"]').select_option("A100")
    dialog.locator('input[name="time_limit"]').fill("1h")
    dialog.locator("button", has_text="When would it start?").click()
    start = dialog.locator(".jp-GPUJobs-whatIfStart")
    start.wait_for(timeout=10000)
    assert start.inner_text().startswith("Would start by ") and "at the latest (nothing was submitted)" in start.inner_text()
    choices = dialog.locator(".jp-GPUJobs-whatIfChoices").inner_text()
    assert re.match(r"1xA100 by \d{1,2}:\d{2}( [AP]M)?; ", choices), choices
    assert "a 0.5 share of A100 now" in choices and "a 0.25 share of A100 now" in choices, choices
    screenshot(page, "submit-dialog-what-if", dialog.locator(".jp-Dialog-content"))
    # a field the engine refuses: its message in the answer, as a submit would say it
    dialog.locator('input[name="time_limit"]').fill("soon")
    dialog.locator("button", has_text="When would it start?").click()
    wait_for(lambda: "time_limit:" in dialog.locator(".jp-GPUJobs-whatIf").inner_text(), 10, "the refusal")
    dialog.locator("button", has_text="Cancel").click()
    assert [j["id"] for j in client.jobs(limit=100)["jobs"]] == before, "nothing was submitted"
    # the panel's Advice of a job: its owner's earlier runs of that name (none for the holder)
    open_panel(page)
    row = page.locator(f'#gpujobs-panel .jp-GPUJobs-job[data-job-id="{whole["id"]}"]')
    row.wait_for(timeout=15000)
    row.locator('button[data-action="advice"]').click()
    advice = row.locator(".jp-GPUJobs-advice")
    advice.wait_for(timeout=10000)
    wait_for(lambda: "no earlier finished runs of this name" in advice.inner_text(), 10, "the advice line")
