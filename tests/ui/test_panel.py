"""The GPU Jobs sidebar, status bar item, run-notebook dialog, log viewer and notifications in a
real JupyterLab (base_url /lab-under-test/, fake GPUs 2xA100) driven by Chromium."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from labtools import (
    REPO,
    Lab,
    burner,
    copy_to_docs,
    isolated_env,
    open_lab,
    open_panel,
    run_command,
    screenshot,
    screenshot_on_failure,
    set_theme,
    sleeper,
    start_lab,
    stop_lab,
    wait_for,
)

pytestmark = [pytest.mark.ui, pytest.mark.usefixtures("idle_engine")]

FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "LOST")





def job_row(page: Any, job_id: int) -> Any:
    return page.locator(f'#gpujobs-panel .jp-GPUJobs-job[data-job-id="{job_id}"]')


def status_text(page: Any) -> str:
    return page.locator(".jp-GPUJobs-statusText").inner_text()


# ---------------------------------------------------------------------------- GPUs


def test_panel_lists_the_gpus(page: Any) -> None:
    panel = open_panel(page)
    cards = panel.locator(".jp-GPUJobs-gpu")
    cards.first.wait_for(timeout=10000)
    assert cards.count() == 2
    for i in range(2):
        card = cards.nth(i)
        assert "A100" in card.inner_text()
        assert card.locator(".jp-GPUJobs-tag.jp-mod-free").inner_text() == "free"
        assert card.locator("svg.jp-GPUJobs-gauge").count() == 1
        assert card.locator(".jp-GPUJobs-memBar").count() == 1
    # The REST calls and the websocket go under the non-root base_url.
    assert panel.locator(".jp-GPUJobs-conn.jp-mod-live").count() == 1
    assert "GPU: 0 running · 0 queued" in status_text(page)


def test_panel_says_what_confines_the_jobs(page: Any, lab: Lab) -> None:
    """The isolation line of GET gpus, under the GPU cards ("GPU fence: ..."), as the CLI's
    `gpus` and the engine's log say it."""
    import httpx

    isolation = httpx.get(lab.url + "gpujobs/api/gpus", timeout=10).json()["isolation"]
    assert isolation.startswith("GPU fence: ")
    panel = open_panel(page)
    line = panel.locator(".jp-GPUJobs-isolation")
    line.wait_for(timeout=10000)
    assert line.inner_text() == isolation


# ------------------------------------------------------- live: queued, running, done


def test_cli_job_appears_live_and_goes_queued_running_done(page: Any, lab: Lab, client: Any) -> None:
    open_panel(page)
    # Both A100s busy for a few seconds, so the CLI job has to wait its turn.
    blocker = client.submit(sleeper(4), gpus=2, time_limit="1m", name="blocker")
    cli = [str(Path(sys.executable).with_name("jupyter")), "gpujobs", "--url", lab.url, "--token", "",
           "submit", "-g", "1", "-t", "1m", "--name", "from-cli", "--",
           sys.executable, "-c", "import time; time.sleep(3)"]
    out = subprocess.run(cli, env=lab.env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    submitted = time.monotonic()
    job_id = int(out.stdout.split()[1])  # "job 2 PENDING (...)"

    row = job_row(page, job_id)
    row.wait_for(timeout=2000)  # no reload: it comes over the websocket
    assert time.monotonic() - submitted < 2.5
    assert "from-cli" in row.inner_text()

    seen_states: list[str] = []
    seen_status: set[str] = set()
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        state = row.get_attribute("data-state")
        if not seen_states or seen_states[-1] != state:
            seen_states.append(state)
        seen_status.add(status_text(page))
        if state in FINAL:
            break
        time.sleep(0.1)
    assert seen_states[0] == "PENDING", seen_states
    assert "RUNNING" in seen_states, seen_states
    assert seen_states[-1] == "COMPLETED", seen_states
    assert seen_states.index("RUNNING") < seen_states.index("COMPLETED")
    # The status bar followed: the blocker running with mine queued, then mine running.
    assert "GPU: 1 running · 1 queued" in seen_status, seen_status
    wait_for(lambda: status_text(page) == "GPU: 0 running · 0 queued", 10, "the status bar to clear")
    assert client.job(blocker["id"])["state"] == "COMPLETED"


def test_pending_job_shows_queue_position_reason_and_expected_start(page: Any, client: Any) -> None:
    panel = open_panel(page)
    running = client.submit(sleeper(30), gpus=2, time_limit="2m", name="hog")
    waiting = client.submit(sleeper(1), gpus=1, time_limit="1m", name="waiter")
    row = job_row(page, waiting["id"])
    row.wait_for(timeout=5000)
    wait_for(lambda: job_row(page, running["id"]).get_attribute("data-state") == "RUNNING", 15, "hog running")
    wait_for(lambda: "in queue" in row.inner_text(), 10, "the queue position")
    # no history of "waiter": its start is a bound from the hog's time limit, and says so
    kind = client.job(waiting["id"])["expected_start_kind"]
    assert kind == "bound", kind
    wait_for(lambda: "at the latest" in row.inner_text(), 10, "the start said as a bound")
    # on the page's locale's clock (Chromium's default en-US: "4:06 PM"; en-GB: test_dashboard)
    assert re.search(r"starts by \d?\d:\d\d [AP]M at the latest \(in \d", row.inner_text()), row.inner_text()
    queue_row = panel.locator(f'.jp-GPUJobs-queue tr[data-job-id="{waiting["id"]}"]')
    queue_row.wait_for(timeout=5000)
    assert "1×any GPU" in queue_row.inner_text()
    # The running job's time bar and the GPU card that holds it.
    hog = job_row(page, running["id"])
    assert hog.locator(".jp-GPUJobs-timeBar").count() == 1
    assert "/ 2m" in hog.inner_text()
    wait_for(lambda: panel.locator(".jp-GPUJobs-gpu.jp-mod-busy").count() == 2, 10, "busy GPU cards")
    assert f"job #{running['id']}" in panel.locator(".jp-GPUJobs-gpu").first.inner_text()
    # My quota counts the running GPUs.
    wait_for(lambda: "2 of 2 GPUs in use; no limit set" in panel.locator(".jp-GPUJobs-quota-gpus").inner_text(), 10,
             "the quota to say how many GPUs are in use")


def test_queue_names_each_job_with_its_reason_and_start_before_finished_jobs(page: Any, client: Any) -> None:
    """The queue table says which job waits (id, name, owner, GPUs), why, and when it is expected
    to start; the queue comes before my finished jobs; the quota says what its numbers are."""
    done = client.submit(sleeper(0.2), gpus=1, time_limit="1m", name="already-done")
    wait_for(lambda: client.job(done["id"])["state"] in FINAL, 20, "the short job to end")
    panel = open_panel(page)
    client.submit(sleeper(30), gpus=2, time_limit="2m", name="hog")
    waiting = client.submit(sleeper(1), gpus=1, time_limit="1m", name="waiter")
    row = panel.locator(f'.jp-GPUJobs-queue tr[data-job-id="{waiting["id"]}"]')
    row.wait_for(timeout=10000)
    view = wait_for(lambda: (j := client.job(waiting["id"]))["reason"] and j["expected_start"] and j, 15,
                    "the engine's reason and expected start")
    assert row.locator(".jp-GPUJobs-qId").inner_text() == f"#{waiting['id']}"
    assert row.locator(".jp-GPUJobs-qName").inner_text() == "waiter"
    assert "you · 1×any GPU" in row.locator(".jp-GPUJobs-qMeta").inner_text()
    # the row may first show the reason of the cycle before (the panel follows the engine live)
    wait_for(lambda: row.locator(".jp-GPUJobs-qReason").count() == 1
             and row.locator(".jp-GPUJobs-qReason").inner_text() == view["reason"], 10, "the engine's reason in the queue")
    starts = row.locator(".jp-GPUJobs-starts")
    assert re.fullmatch(r"now|[~≤]?(\d+s|\d+m|\d+h.*)", starts.inner_text()), starts.inner_text()
    assert (starts.get_attribute("title") or "").startswith("expected start: ")
    if view["expected_start_kind"] == "bound":
        assert starts.inner_text().startswith("≤") and "at the latest" in (starts.get_attribute("title") or "")
    # sections in this order: GPUs, my (active) jobs, the queue, then my finished jobs
    order = panel.evaluate(
        "p => [...p.querySelectorAll('.jp-GPUJobs-section')].map(s => s.className.match(/section-(\\w+)/)[1])")
    assert order[:5] == ["gpus", "myjobs", "queue", "finished", "quota"], order
    assert job_row(page, done["id"]).count() == 1
    assert panel.locator(f'.jp-GPUJobs-section-myjobs .jp-GPUJobs-job[data-job-id="{done["id"]}"]').count() == 0
    quota = panel.locator(".jp-GPUJobs-quota")
    wait_for(lambda: "2 of 2 GPUs in use; no limit set" in quota.inner_text(), 15, "the GPUs in use in words")
    assert "1 running job; no limit set" in quota.inner_text()
    assert "1 job of yours waiting for 1 GPU" in quota.inner_text()
    screenshot(page, "panel-queue", panel)
    screenshot(page, "panel-quota", quota)


def test_the_quota_says_how_many_gpu_hours_of_a_budget_are_left(page: Any, client: Any) -> None:
    """A GPU-hour budget (issue 30) shows in the panel's quota section as a bar with what is left
    of it this period."""
    me = client.whoami()["user"]
    client.set_budget("users", me, {"gpu_hours": 10, "period": "month"})
    try:
        quota = open_panel(page).locator(".jp-GPUJobs-quota")
        wait_for(lambda: "GPU-hours left this month" in quota.inner_text(), 15, "the budget in the quota section")
        assert re.search(r"\d+\.\d of 10 GPU-hours left this month", quota.inner_text()), quota.inner_text()
        screenshot(page, "panel-budget", quota)
    finally:
        client.set_budget("users", me, None)


def test_gpu_shares_reservations_and_notification_settings_in_the_panel(page: Any, client: Any, lab: Lab) -> None:
    """Two jobs on halves of one GPU show on its card with their parts; an advance reservation
    shows with when it is on; notifications are opted into (a webhook) and off again."""
    import httpx

    panel = open_panel(page)
    halves = [client.submit(sleeper(60), gpus=0.5, time_limit="2m", name=f"half-{i}") for i in range(2)]
    wait_for(lambda: all(client.job(j["id"])["state"] == "RUNNING" for j in halves), 20, "both halves to run")
    card = panel.locator(".jp-GPUJobs-gpu", has=page.locator(".jp-GPUJobs-tag.jp-mod-shared"))
    card.wait_for(timeout=10000)
    items = card.locator(".jp-GPUJobs-shareList li")
    wait_for(lambda: items.count() == 2, 10, "the two shares on the card")
    assert {int(items.nth(i).get_attribute("data-job-id") or 0) for i in range(2)} == {j["id"] for j in halves}
    assert "you · 50% · " in items.first.inner_text()
    assert card.locator(".jp-GPUJobs-sharePart").count() == 2
    screenshot(page, "panel-shares", card)
    for j in halves:
        client.cancel(j["id"])

    r = httpx.post(lab.url + "gpujobs/api/reservations",
                   json={"gpus": 1, "start": "+2h", "duration": "1h", "users": ["alice"], "name": "demo-day"},
                   timeout=10)
    assert r.status_code in (200, 201), r.text
    rid = r.json()["id"]
    try:
        item = panel.locator(f'.jp-GPUJobs-reservation[data-reservation-id="{rid}"]')
        item.wait_for(timeout=15000)
        text = item.inner_text()
        assert "demo-day" in text and "1×GPU" in text and "alice" in text, text
        assert re.search(r"in (1h 5\dm|2h)", text), text
        screenshot(page, "panel-reservation", panel.locator(".jp-GPUJobs-section-reservations"))
    finally:
        httpx.delete(lab.url + f"gpujobs/api/reservations/{rid}", timeout=10)
    item.wait_for(state="detached", timeout=15000)

    notify = panel.locator(".jp-GPUJobs-notify")
    notify.wait_for(timeout=10000)
    assert notify.get_attribute("data-on") == "false"
    assert "Off" in notify.inner_text()
    notify.locator('button[data-action="notify-edit"]').click()
    dialog = page.locator(".jp-Dialog")
    dialog.wait_for(timeout=5000)
    dialog.locator('input[name="webhook"]').fill("https://hooks.example.org/services/T0/B0/x")
    dialog.locator('input[name="events"][value="started"]').check()
    dialog.locator("button", has_text="Save").click()
    wait_for(lambda: notify.get_attribute("data-on") == "true", 10, "notifications on")
    assert "webhook to hooks.example.org" in notify.inner_text()
    assert "for: started" in notify.inner_text()
    saved = httpx.get(lab.url + "gpujobs/api/notifications", timeout=10).json()
    assert saved["webhook"] == "https://hooks.example.org/services/T0/B0/x" and "started" in saved["events"]
    assert notify.locator('button[data-action="notify-test"]').count() == 1
    screenshot(page, "panel-notify", panel.locator(".jp-GPUJobs-section-notifications"))
    notify.locator('button[data-action="notify-off"]').click()
    wait_for(lambda: notify.get_attribute("data-on") == "false", 10, "notifications off")
    assert httpx.get(lab.url + "gpujobs/api/notifications", timeout=10).json()["webhook"] is None


# ------------------------------------------------------------------------- cancel


def test_cancel_from_the_panel_ends_a_running_job(page: Any, client: Any) -> None:
    open_panel(page)
    job = client.submit(sleeper(120), gpus=1, time_limit="5m", name="to-cancel")
    row = job_row(page, job["id"])
    wait_for(lambda: row.get_attribute("data-state") == "RUNNING", 20, "the job to run")
    row.locator('button[data-action="cancel"]').click()
    dialog = page.locator(".jp-Dialog")
    dialog.wait_for(timeout=5000)
    assert f"Cancel job #{job['id']}?" in dialog.inner_text()
    dialog.locator("button", has_text="Cancel job").click()
    wait_for(lambda: row.get_attribute("data-state") == "CANCELLED", 20, "the row to say cancelled")
    assert client.job(job["id"])["state"] == "CANCELLED"


def test_a_job_past_its_warning_time_counts_down_to_its_limit(page: Any, client: Any) -> None:
    """A 10 s limit is warned 2 s before (a fifth of it): from then the card says when the
    job will be stopped, in the warning colour, and counts down."""
    open_panel(page)
    job = client.submit(sleeper(60), gpus=1, time_limit="10s", name="nearly-out")
    row = job_row(page, job["id"])
    wait_for(lambda: row.get_attribute("data-state") == "RUNNING", 20, "the job to run")
    running = client.job(job["id"])
    assert running["warn_at"] == running["ends_at"] - 2
    stops = row.locator(".jp-GPUJobs-stopsIn")
    assert stops.count() == 0, "no countdown before the warning time"
    stops.wait_for(timeout=15000)
    assert re.search(r"stops in [12]s", stops.inner_text()), stops.inner_text()
    screenshot(page, "job-stops-in", row)
    color = stops.evaluate("e => getComputedStyle(e).color")
    warn = page.evaluate(
        "() => { const e = document.createElement('span'); e.style.color = 'var(--jp-warn-color0)';"
        " document.body.append(e); const c = getComputedStyle(e).color; e.remove(); return c; }")
    assert color == warn, (color, warn)
    wait_for(lambda: row.get_attribute("data-state") == "TIMEOUT", 20, "the job to time out")
    assert row.locator(".jp-GPUJobs-stopsIn").count() == 0


# --------------------------------------------------------------------- log viewer


def test_log_opens_in_the_main_area_and_follows_live(page: Any, client: Any) -> None:
    open_panel(page)
    code = "import time\nfor i in range(5):\n    print('line', i, flush=True)\n    time.sleep(0.6)\nprint('the end')"
    job = client.submit([sys.executable, "-c", code], gpus=1, time_limit="1m", name="chatty")
    row = job_row(page, job["id"])
    wait_for(lambda: row.get_attribute("data-state") == "RUNNING", 20, "the job to run")
    row.locator('button[data-action="log"]').click()
    log = page.locator(f"#gpujobs-log-{job['id']} .jp-GPUJobs-logText")
    log.wait_for(timeout=5000)
    first = wait_for(lambda: log.inner_text() or None, 10, "the first log lines")
    assert "the end" not in first  # it opened while the job was still writing
    wait_for(lambda: "the end" in log.inner_text(), 20, "the log to follow to the end")
    assert [ln for ln in log.inner_text().splitlines() if ln.startswith("line")] == [f"line {i}" for i in range(5)]
    status = page.locator(f"#gpujobs-log-{job['id']} .jp-GPUJobs-logStatus")
    wait_for(lambda: "finished" in status.inner_text(), 10, "the viewer to see the end")



def test_log_of_a_silent_job_says_there_is_no_output_yet(page: Any, client: Any) -> None:
    """A job that has printed nothing: its log tab says so (not a blank page), and once it has
    ended, that it wrote nothing. No "Jupyter news?" toast covers the page (the tests' Lab
    has the announcements plugin off)."""
    page.set_viewport_size({"width": 1024, "height": 640})
    open_panel(page)
    job = client.submit(sleeper(60), gpus=1, time_limit="2m", name="quiet-one")
    row = job_row(page, job["id"])
    wait_for(lambda: row.get_attribute("data-state") == "RUNNING", 20, "the job to run")
    row.locator('button[data-action="log"]').click()
    empty = page.locator(f"#gpujobs-log-{job['id']} .jp-GPUJobs-logEmpty")
    empty.wait_for(state="visible", timeout=10000)
    assert "No output yet" in empty.inner_text()
    assert page.locator(f"#gpujobs-log-{job['id']} .jp-GPUJobs-logText").inner_text() == ""
    assert "news" not in " ".join(page.locator(".Toastify__toast").all_inner_texts()).lower()
    screenshot(page, "log-no-output-yet")
    client.cancel(job["id"])
    status = page.locator(f"#gpujobs-log-{job['id']} .jp-GPUJobs-logStatus")
    wait_for(lambda: "finished" in status.inner_text(), 15, "the viewer to see the end")
    assert "The job wrote no output." in empty.inner_text()


# ------------------------------------------------------------- run notebook dialog


def test_run_notebook_dialog_submits_and_the_output_notebook_opens(page: Any, lab: Lab, client: Any) -> None:
    nb_dir = lab.root / "experiments"
    nb_dir.mkdir(exist_ok=True)
    shutil.copyfile(REPO / "binder" / "square.ipynb", nb_dir / "square.ipynb")
    run_command(page, "filebrowser:go-to-path", {"path": "experiments"})
    item = page.locator(".jp-DirListing-item", has_text="square.ipynb")
    item.wait_for(timeout=15000)

    posted: list[dict[str, Any]] = []
    page.on("request", lambda r: posted.append(json.loads(r.post_data))
            if r.method == "POST" and r.url.split("?")[0].endswith("/gpujobs/api/jobs") else None)

    item.click(button="right")
    page.locator(".lm-Menu-item", has_text="Run on GPU queue…").click()
    dialog = page.locator(".jp-Dialog")
    dialog.wait_for(timeout=10000)
    assert "Run on GPU queue" in dialog.inner_text()
    # a time limit the engine cannot read: the dialog comes back with its message on that row
    dialog.locator('input[name="time_limit"]').fill("soon")
    dialog.locator("button", has_text="Submit").click()
    bad = page.locator('.jp-Dialog .jp-GPUJobs-formRow.jp-GPUJobs-mod-invalid[data-field="time_limit"]')
    bad.wait_for(timeout=10000)
    assert "soon" in bad.locator(".jp-GPUJobs-formError").inner_text(), bad.inner_text()
    wait_for(lambda: page.locator(".jp-Dialog").count() == 1, 10, "the first dialog to close")
    dialog = page.locator(".jp-Dialog")
    assert dialog.locator('input[name="time_limit"]').input_value() == "soon"  # what was typed is kept
    assert page.locator(".jp-Dialog .jp-GPUJobs-formError").count() == 1
    # an image that is not there (docs/containers.md): refused naming it, on the image row
    dialog.locator('input[name="time_limit"]').fill("2m")
    dialog.locator('input[name="image"]').fill("localhost/no-such-image:1")
    dialog.locator("button", has_text="Submit").click()
    bad = page.locator('.jp-Dialog .jp-GPUJobs-formRow.jp-GPUJobs-mod-invalid[data-field="image"]')
    bad.wait_for(timeout=20000)
    assert "localhost/no-such-image:1" in bad.locator(".jp-GPUJobs-formError").inner_text(), bad.inner_text()
    assert posted[-1]["image"] == "localhost/no-such-image:1"
    wait_for(lambda: page.locator(".jp-Dialog").count() == 1, 10, "the second dialog to close")
    dialog = page.locator(".jp-Dialog")
    dialog.locator('input[name="image"]').fill("")
    dialog.locator('select[name="gpu_type"]').select_option("A100")
    dialog.locator('input[name="time_limit"]').fill("2m")
    dialog.locator('select[name="priority"]').select_option("high")
    dialog.locator('textarea[name="parameters"]').fill("n=7\nlabel=seven")
    screenshot(page, "submit-dialog", dialog.locator(".jp-Dialog-content"))
    dialog.locator("button", has_text="Submit").click()

    wait_for(lambda: len(posted) == 3, 10, "the third POST jobs request")
    body = posted[2]
    assert "image" not in body  # empty: the site's default (none here), the host
    assert body["kind"] == "notebook"
    assert body["gpus"] == 1 and body["gpu_type"] == "A100" and body["time_limit"] == "2m"
    assert body["priority"] == "high" and body["name"] == "square"
    assert body["payload"] == {"notebook": "experiments/square.ipynb", "parameters": {"n": 7, "label": "seven"}}

    job = wait_for(lambda: next(iter(client.jobs(kind="notebook", limit=1)["jobs"]), None), 10, "the job")
    row = job_row(page, job["id"])
    row.wait_for(timeout=5000)
    wait_for(lambda: row.get_attribute("data-state") in FINAL, 120, "the notebook job to end")
    assert row.get_attribute("data-state") == "COMPLETED", client.log(job["id"])["data"]
    button = row.locator('button[data-action="output"]')
    button.wait_for(timeout=10000)
    output = client.job(job["id"])["output_notebook"]
    assert output and not output.startswith("/"), output  # relative to the server root
    button.click()
    tab = page.locator(".lm-TabBar-tab", has_text=Path(output).name)
    tab.wait_for(timeout=15000)
    page.locator(".jp-NotebookPanel:visible .jp-OutputArea-output", has_text="7 squared is 49").wait_for(
        timeout=20000)


# ------------------------------------------------------------------ notifications


def test_notification_when_my_job_fails(page: Any, client: Any) -> None:
    open_panel(page)
    job = client.submit(sleeper(0.5, code=3), gpus=1, time_limit="1m", name="doomed")
    toasts = page.locator(".Toastify__toast", has_text=f"Job #{job['id']} doomed failed")
    toasts.first.wait_for(timeout=20000)
    page.wait_for_timeout(1500)  # the websocket event and the REST refresh both saw it: one toast
    assert toasts.count() == 1, toasts.all_inner_texts()
    toast = toasts.first
    final = client.job(job["id"])
    assert final["state"] == "FAILED"
    reason = final["reason"] or f"exit code {final['exit_code']}"
    assert reason in toast.inner_text()


def test_notification_of_a_finding_about_my_job(page: Any, client: Any) -> None:
    """The monitor's finding arrives over the websocket and shows in its own words, as an error."""
    open_panel(page)
    code = "import sys\nprint('RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB')\nsys.exit(1)"
    job = client.submit([sys.executable, "-c", code], gpus=1, time_limit="1m", name="big")
    text = f"job {job['id']} ('big' of {job['user']}) ran out of GPU memory"
    toasts = page.locator(".Toastify__toast", has_text=text)
    toasts.first.wait_for(timeout=20000)
    page.wait_for_timeout(1000)
    assert toasts.count() == 1, toasts.all_inner_texts()
    toast = toasts.first
    assert "Toastify__toast--error" in (toast.get_attribute("class") or "")
    finding = client.api("GET", "findings", params={"kind": "oom", "job": job["id"]})["findings"][0]
    # JupyterLab cuts a notification at 140 characters; "Details" shows all of it
    assert finding["message"][:130] in toast.inner_text()
    toast.get_by_text("Details").click()
    dialog = page.locator(".jp-Dialog")
    dialog.wait_for(timeout=5000)
    assert finding["message"] in dialog.inner_text()
    dialog.get_by_role("button", name="OK").click()


def test_notifications_setting_turns_them_off(page: Any, lab: Lab, client: Any) -> None:
    settings_file = Path(lab.env["JUPYTERLAB_SETTINGS_DIR"]) / "jupyter-gpujobs" / "plugin.jupyterlab-settings"
    settings_file.parent.mkdir(parents=True, exist_ok=True)
    settings_file.write_text('{"notifications": false}')
    try:
        open_lab(page, lab.url)  # the setting is read at start
        open_panel(page)
        job = client.submit(sleeper(0.2, code=1), gpus=1, time_limit="1m", name="quiet")
        row = job_row(page, job["id"])
        wait_for(lambda: row.get_attribute("data-state") == "FAILED", 20, "the job to fail")
        page.wait_for_timeout(1000)
        assert page.locator(".Toastify__toast", has_text=f"Job #{job['id']}").count() == 0
    finally:
        settings_file.unlink()


# ------------------------------------------------------------------- screenshots


def test_screenshots_light_and_dark(page: Any, client: Any) -> None:
    """A representative panel: a running job, one waiting, a finished and a failed one."""
    done = client.submit(sleeper(0.5), gpus=1, gpu_type="A100", time_limit="10m", name="warmup")
    failed = client.submit(sleeper(0.5, code=2), gpus=1, time_limit="10m", name="bad-config")
    wait_for(lambda: client.job(failed["id"])["state"] in FINAL and client.job(done["id"])["state"] in FINAL,
             30, "the short jobs to end")
    client.submit(burner(300, 0.8), gpus=1, gpu_type="A100", time_limit="30m", name="train-resnet")
    client.submit(burner(300, 0.35), gpus=1, gpu_type="A100", time_limit="1h", name="finetune-llm")
    page.set_viewport_size({"width": 1400, "height": 1400})
    panel = open_panel(page)
    wait_for(lambda: panel.locator(".jp-GPUJobs-gpu.jp-mod-busy").count() == 2, 15, "both GPUs busy")
    waiting = client.submit(sleeper(300), gpus=2, gpu_type="A100", time_limit="2h", priority="high",
                            name="sweep-lr")
    job_row(page, waiting["id"]).wait_for(timeout=10000)
    page.wait_for_timeout(8000)  # some elapsed time and a few utilization samples
    page.evaluate("document.querySelectorAll('.Toastify__toast').forEach(t => t.remove())")
    light = screenshot(page, "panel-light", panel)
    screenshot(page, "lab-light")
    set_theme(page, "JupyterLab Dark")
    dark = screenshot(page, "panel-dark", panel)
    screenshot(page, "lab-dark")
    set_theme(page, "JupyterLab Light")
    copy_to_docs(light, "panel-light.png")
    copy_to_docs(dark, "panel-dark.png")


# ------------------------------------------------------- empty and error states


def _nvml_has_gpus() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetCount() > 0
    except Exception:
        return False


@contextmanager
def _panel_of_own_lab(page: Any, tmp: Path, env: dict[str, str]) -> Iterator[Any]:
    """Start a Lab of its own with `env`, open the panel in `page`, stop the Lab after."""
    lab = start_lab(tmp, env=env)
    try:
        open_lab(page, lab.url)
        yield open_panel(page)
    finally:
        stop_lab(lab)


def test_empty_and_unreachable_states(browser: Any, tmp_path: Path) -> None:
    """A server without GPUs says so; a server without the engine says what to do."""
    context = browser.new_context(viewport={"width": 1200, "height": 800})
    page = context.new_page()
    try:
        with screenshot_on_failure(page, "empty-and-unreachable"):
            if not _nvml_has_gpus():
                env = isolated_env(tmp_path / "nogpu")
                env.pop("GPUJOBS_FAKE_GPUS")
                with _panel_of_own_lab(page, tmp_path / "nogpu", env) as panel:
                    empty = panel.locator(".jp-GPUJobs-section-gpus .jp-GPUJobs-empty")
                    empty.wait_for(timeout=10000)
                    assert "No GPUs on this server" in empty.inner_text()
                    assert "GPUJOBS_FAKE_GPUS" in empty.inner_text()
                    screenshot(page, "panel-no-gpus", panel)
            env = isolated_env(tmp_path / "noengine")
            cfg = Path(env["JUPYTER_CONFIG_DIR"])
            cfg.mkdir(parents=True, exist_ok=True)
            (cfg / "jupyter_server_config.json").write_text(
                json.dumps({"ServerApp": {"jpserver_extensions": {"jupyter_gpujobs": False}}}))
            with _panel_of_own_lab(page, tmp_path / "noengine", env) as panel:
                error = panel.locator(".jp-GPUJobs-error")
                error.wait_for(timeout=10000)
                text = error.inner_text()
                assert "unreachable" in text
                assert "jupyter server extension enable jupyter_gpujobs" in text
                assert "engine unreachable" in status_text(page)
                screenshot(page, "panel-unreachable", panel)
    finally:
        context.close()
