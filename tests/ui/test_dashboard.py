"""The GPU dashboard in a real JupyterLab (fake GPUs 2xA100, base_url /lab-under-test/) driven by
Chromium: opened from the command palette and from the panel, every chart drawn from the
monitor's data and kept live by the websocket, findings with their admin actions, light and
dark themes at the main area's width and at a narrow one."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from labtools import (
    burner,
    copy_to_docs,
    open_lab,
    open_panel,
    run_command,
    screenshot,
    screenshot_on_failure,
    set_theme,
    sleeper,
    wait_for,
)

pytestmark = [pytest.mark.ui, pytest.mark.usefixtures("idle_engine")]

CHARTS = ("utilization", "memory", "heatmap", "users", "groups", "queue", "wait")





def chart(page: Any, name: str) -> Any:
    return page.locator(f'#gpujobs-dashboard-area .jp-GPUDash-chart[data-chart="{name}"]')


def points(page: Any, name: str) -> int:
    return int(chart(page, name).get_attribute("data-points") or 0)


def version(page: Any, name: str) -> int:
    return int(chart(page, name).get_attribute("data-version") or 0)


def drawn(page: Any, name: str) -> int:
    """Marks (SVG paths) Vega drew in the chart."""
    return chart(page, name).locator("svg path").count()


def axis_labels(page: Any, name: str) -> list[str]:
    """The time axis's labels of a chart as drawn (Vega's SVG)."""
    axis = chart(page, name).locator('g.role-axis[aria-label^="X-axis"]')
    return axis.locator("g.role-axis-label text").evaluate_all("ts => ts.map(t => t.textContent)")


def line_paths(page: Any, name: str) -> list[str]:
    """The `d` of each line Vega drew in a chart (one per series)."""
    return chart(page, name).locator("g.mark-line path").evaluate_all("ps => ps.map(p => p.getAttribute('d'))")


def open_dashboard(page: Any) -> Any:
    run_command(page, "gpujobs:open-dashboard")
    dash = page.locator("#gpujobs-dashboard-area")
    dash.wait_for(state="visible", timeout=15000)
    for name in CHARTS:
        chart(page, name).wait_for(timeout=15000)
    wait_for(lambda: version(page, "utilization") > 0, 30, "the first charts drawn")
    return dash


def test_dashboard_charts_have_data_and_follow_the_engine_live(page: Any, client: Any) -> None:
    """With a job running on GPU and one waiting for it, every chart has data, and each one
    changes without a reload as readings, job events and the queue move."""
    dash = open_dashboard(page)
    assert "GPU dashboard" in dash.inner_text()
    assert dash.locator('.jp-GPUDash-range[data-range="hour"]').get_attribute("aria-pressed") == "true"

    busy = client.submit(burner(60, 0.9), gpus=1, time_limit="5m", name="dash-burn")
    hog = client.submit(sleeper(4), gpus=1, time_limit="5m", name="dash-hog")
    wait_for(lambda: client.job(hog["id"])["state"] == "RUNNING", 20, "the hog to run")
    waiting = client.submit(sleeper(1), gpus=1, time_limit="1m", name="dash-wait")

    # GPU readings arrive over the websocket every few seconds and are appended: utilization
    # and memory redraw, and the burner's GPU climbs.
    for name in ("utilization", "memory"):
        before = (points(page, name), version(page, name))
        wait_for(lambda n=name, b=before: points(page, n) > b[0] and version(page, n) > b[1], 15,
                 f"the {name} chart to take live readings")
        assert drawn(page, name) > 0
    gpu = client.job(busy["id"])["assigned_gpus"][0]

    def burner_util() -> int:
        latest = dict(kv.split("=") for kv in (chart(page, "utilization").get_attribute("data-summary") or "").split(","))
        return int(latest.get(f"GPU {gpu}") or 0)

    wait_for(lambda: burner_util() >= 5, 20, "the burner's GPU to climb in the utilization chart")
    util = dash.locator('.jp-GPUDash-tile[data-tile="util"] .jp-GPUDash-tileValue')
    assert int(util.inner_text().rstrip("%")) > 0

    # The queue's live end: the waiting job counts, then it starts (and leaves a wait time).
    queue_tile = dash.locator('.jp-GPUDash-tile[data-tile="queue"] .jp-GPUDash-tileValue')
    wait_for(lambda: chart(page, "queue").get_attribute("data-last") == "1" or
             client.job(waiting["id"])["state"] != "PENDING", 10, "the queue chart to show the waiting job")
    wait_for(lambda: client.job(waiting["id"])["state"] != "PENDING", 30, "the waiting job to start")
    wait_for(lambda: chart(page, "queue").get_attribute("data-last") == "0", 15, "the queue chart to empty")
    assert queue_tile.inner_text() == "0 jobs"

    # Job events re-read usage and the waits: the jobs' GPU-hours and the wait appear.
    wait_for(lambda: points(page, "wait") > 0, 20, "the wait chart to show the job that waited")
    wait_for(lambda: points(page, "users") > 0 and points(page, "groups") > 0, 20, "GPU-hours per user and group")
    users_before = chart(page, "users").get_attribute("data-summary")
    wait_for(lambda: chart(page, "users").get_attribute("data-summary") != users_before, 60,
             "the GPU-hours to grow while the burner runs")
    client.cancel(busy["id"])

    # The last day: every chart is read again for it, and has data (the heatmap too: the
    # readings of this hour).
    dash.locator('.jp-GPUDash-range[data-range="day"]').click()
    assert dash.locator('.jp-GPUDash-range[data-range="day"]').get_attribute("aria-pressed") == "true"
    for name in CHARTS:
        wait_for(lambda n=name: points(page, n) > 0 and drawn(page, n) > 0, 30, f"the {name} chart of the last day")
    assert dash.locator(".jp-GPUJobs-error").count() == 0



def _seed_downtime(lab: Any, client: Any) -> None:
    """Per-minute readings of every GPU from 6 h to 4 h ago and from 2.5 h to 1 h ago, as a server
    that was down in between (a restart) leaves them."""
    from jupyter_gpujobs.engine.store import Store, default_url
    from jupyter_gpujobs.engine.store import monitoring as mstore

    store = Store(default_url(Path(lab.env["JUPYTER_DATA_DIR"]) / "gpujobs"))
    now = time.time()
    hole = (now - 4 * 3600, now - 2.5 * 3600)
    rows = []
    for g in client.gpus():
        for start, end in ((now - 6 * 3600, hole[0]), (hole[1], now - 3600)):
            t = start - start % 60
            while t < end:
                rows.append(mstore.SampleValues(g["host"], g["index"], g["uuid"], t, utilization=40 + 10 * g["index"],
                                                memory_used_mb=8000, memory_total_mb=g["memory_total_mb"], count=60))
                t += 60
    mstore.add_samples(store, rows, resolution=mstore.MINUTE)


def test_24_hour_locale_gaps_at_downtime_and_a_quiet_console(browser: Any, lab: Any, client: Any) -> None:
    """In a 24-hour locale (en-GB) the panel's expected start and the charts' time axes read
    14:39, not 02:39 PM; the last day's lines break where the server had no readings (a
    restart) instead of drawing across; and neither opening the dashboard nor switching its
    range logs a warning or an error (Vega's "Infinite extent" of empty charts, SVG sizes of
    1.8e308). At 1024x640 the tiles' values are whole or have their text as a tooltip."""
    _seed_downtime(lab, client)
    blocker = client.submit(sleeper(300), gpus=2, time_limit="10m", name="hold-both")
    wait_for(lambda: client.job(blocker["id"])["state"] == "RUNNING", 30, "the blocker to run")
    waiting = client.submit(sleeper(1), gpus=1, time_limit="5m", name="waits-for-a-gpu")
    context = browser.new_context(viewport={"width": 1400, "height": 900}, locale="en-GB")
    page = context.new_page()
    console: list[str] = []
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}") if m.type in ("warning", "error") else None)
    page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
    try:
        with screenshot_on_failure(page, "dashboard-24h"):
            open_lab(page, lab.url)
            panel = open_panel(page)
            expected = panel.locator(f'.jp-GPUJobs-job[data-job-id="{waiting["id"]}"] .jp-GPUJobs-expected')
            expected.wait_for(timeout=15000)
            wait_for(lambda: "at the latest" in expected.inner_text(), 15, "the waiting job's bound")
            text = expected.inner_text()
            assert re.search(r"by (Mon|Tue|Wed|Thu|Fri|Sat|Sun)?\s?\d{2}:\d{2} at the latest", text), text
            assert not re.search(r"\b[AP]M\b", text, re.I), text
            screenshot(page, "panel-24h", panel)

            dash = open_dashboard(page)
            labels = axis_labels(page, "utilization")
            assert any(re.fullmatch(r"\d{2}:\d{2}", t) for t in labels), labels
            assert not [t for t in labels if re.search(r"[AP]M", t)], labels
            assert console == [], console  # opening: no warnings, no errors

            dash.locator('.jp-GPUDash-range[data-range="day"]').click()
            wait_for(lambda: chart(page, "utilization").get_attribute("data-points") not in (None, "0")
                     and line_paths(page, "utilization"), 30, "the last day's readings drawn")
            page.wait_for_timeout(500)  # the other charts of the day (their data came together)
            paths = line_paths(page, "utilization")
            # one line per GPU, each broken at least at the hole (a restart): more than one
            # subpath ("M"), where a line drawn across the downtime has one
            assert len(paths) == 2 and all(d.count("M") >= 2 for d in paths), paths
            labels = axis_labels(page, "utilization")
            assert labels and not [t for t in labels if re.search(r"[AP]M", t)], labels
            screenshot(page, "dashboard-24h-day", dash)
            assert console == [], console  # the range switch: none either

            # At 1024x640 (a laptop), the tiles wrap or carry their whole text as a tooltip.
            page.set_viewport_size({"width": 1024, "height": 640})
            page.wait_for_timeout(500)
            memory = dash.locator('.jp-GPUDash-tile[data-tile="memory"]')
            value = memory.locator(".jp-GPUDash-tileValue")
            assert value.evaluate("e => e.scrollWidth <= e.clientWidth + 1"), "the memory tile's value is cut"
            assert value.inner_text().replace("\n", " ") in (memory.get_attribute("title") or "")
            screenshot(page, "dashboard-1024x640", page)
    finally:
        context.close()
        client.cancel(blocker["id"])


def test_a_reload_brings_the_dashboard_and_a_job_log_back(page: Any, client: Any, lab: Any) -> None:
    import httpx

    job = client.submit(sleeper(0.1), gpus=0, name="restore-me")
    # a workspace of its own: the layout saved here does not reach the other tests' pages
    open_lab(page, lab.url, workspace="gpujobs-restore")
    open_dashboard(page)
    run_command(page, "gpujobs:open-log", {"id": job["id"]})
    page.locator(f"#gpujobs-log-{job['id']}").wait_for(state="visible", timeout=15000)

    def saved() -> bool:
        r = httpx.get(lab.url + "lab/api/workspaces/gpujobs-restore", timeout=10)
        data = r.json().get("data", {}) if r.status_code == 200 else {}
        return "gpujobs-dashboard:dashboard" in data and f"gpujobs-log:{job['id']}" in data

    wait_for(saved, 15, "the layout with the dashboard and the log saved")
    page.reload(wait_until="domcontentloaded")
    page.wait_for_function("window.jupyterapp && window.jupyterapp.started !== undefined", timeout=60000)
    page.evaluate("async () => { await window.jupyterapp.restored; }")
    log = page.locator(f"#gpujobs-log-{job['id']}")
    log.wait_for(state="attached", timeout=15000)
    dash = page.locator("#gpujobs-dashboard-area")
    dash.wait_for(state="attached", timeout=15000)
    tabs = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tabLabel").all_inner_texts()
    assert "GPU Dashboard" in tabs and any(t.startswith(f"Log: job {job['id']}") for t in tabs), tabs
    run_command(page, "gpujobs:open-dashboard")  # the restored one, drawn, not a second one
    dash.wait_for(state="visible", timeout=15000)
    wait_for(lambda: version(page, "utilization") > 0, 30, "the restored dashboard drawn")
    assert page.locator("#gpujobs-dashboard-area").count() == 1


def test_dashboard_opens_from_the_panel_and_shows_findings_with_admin_actions(page: Any, client: Any,
                                                                            lab: Any) -> None:
    """An admin drains a GPU: the finding appears live; Undrain in the dashboard closes it and
    the GPU takes jobs again."""
    import httpx

    panel = open_panel(page)
    panel.locator('button[data-action="dashboard"]').click()
    dash = page.locator("#gpujobs-dashboard-area")
    dash.wait_for(state="visible", timeout=15000)
    # the findings have been read: none, or some (other servers' test processes on this
    # machine can show up on fake GPUs as rogue processes), but no drained GPU
    dash.locator("[data-findings]").first.wait_for(timeout=15000)
    drained = dash.locator('.jp-GPUDash-finding[data-kind="gpu_drained"]')
    assert drained.count() == 0
    r = httpx.post(lab.url + "gpujobs/api/gpus/drain", json={"gpu": 1, "reason": "fan noise"}, timeout=10)
    assert r.status_code == 200, r.text
    try:
        finding = dash.locator('.jp-GPUDash-finding[data-kind="gpu_drained"]')
        finding.wait_for(timeout=10000)  # over the websocket, no reload
        assert "fan noise" in finding.inner_text()
        assert "GPU drained" in finding.inner_text()
        tile = dash.locator('.jp-GPUDash-tile[data-tile="busy"] .jp-GPUDash-tileNote')
        wait_for(lambda: "1 draining" in tile.inner_text(), 10, "the GPU tile to count the drained GPU")
        finding.locator('button[data-action="undrain"]').click()
        finding.wait_for(state="detached", timeout=10000)
        assert drained.count() == 0
        gpus = httpx.get(lab.url + "gpujobs/api/gpus", timeout=10).json()["gpus"]
        assert [g["draining"] for g in gpus] == [False, False]
        # Drain from a finding about a GPU, then undrain it again from the same card.
        r = httpx.post(lab.url + "gpujobs/api/gpus/drain", json={"gpu": 0, "reason": "test"}, timeout=10)
        finding = dash.locator('.jp-GPUDash-finding[data-kind="gpu_drained"]')
        finding.wait_for(timeout=10000)
        assert finding.locator('button[data-action="resolve"]').count() == 0, "undrain is how it is resolved"
        finding.locator('button[data-action="undrain"]').click()
        finding.wait_for(state="detached", timeout=10000)
    finally:
        for gpu in (0, 1):
            httpx.post(lab.url + "gpujobs/api/gpus/drain", json={"gpu": gpu, "draining": False}, timeout=10)
    # advance reservations have a card of their own while there are any
    r = httpx.post(lab.url + "gpujobs/api/reservations",
                   json={"gpus": 2, "start": "+1h", "duration": "30m", "groups": ["vision"], "name": "retreat"},
                   timeout=10)
    assert r.status_code in (200, 201), r.text
    try:
        card = dash.locator('.jp-GPUDash-card[data-card="reservations"]')
        card.wait_for(timeout=15000)
        assert "retreat" in card.inner_text() and "2×GPU for group vision" in card.inner_text()
    finally:
        httpx.delete(lab.url + f"gpujobs/api/reservations/{r.json()['id']}", timeout=10)
    card.wait_for(state="detached", timeout=15000)


def _seed_history(lab: Any, client: Any) -> None:
    """A week of GPU readings and an hour of finished jobs in the Lab's store, as a team's server
    would have them (the screenshots show charts with history, not a server started seconds
    ago). Jobs are written finished, with a begin time far ahead while they are written so the
    scheduler never takes them."""
    import math
    import random

    from jupyter_gpujobs.engine.store import Store, default_url
    from jupyter_gpujobs.engine.store import monitoring as mstore
    from jupyter_gpujobs.model import JobState

    store = Store(default_url(Path(lab.env["JUPYTER_DATA_DIR"]) / "gpujobs"))
    inventory = client.gpus()
    gpus = inventory["gpus"] if isinstance(inventory, dict) else inventory
    rnd = random.Random(7)
    now = time.time()
    hour_start = ((now - 3600) // 3600 - 1) * 3600  # the last whole hour before the last hour
    hourly, raw = [], []
    for g in gpus:
        for h in range(7 * 24):
            t = hour_start - h * 3600
            local = time.localtime(t)
            day = 1.0 if local.tm_wday < 5 else 0.35
            office = math.exp(-((local.tm_hour - 14) / 4.5) ** 2)
            util = max(0.0, min(100.0, 100 * day * office * (0.8 + 0.25 * g["index"]) + rnd.uniform(-8, 8)))
            hourly.append(mstore.SampleValues(g["host"], g["index"], g["uuid"], t, utilization=util,
                                              memory_used_mb=g["memory_total_mb"] * util / 130,
                                              memory_total_mb=g["memory_total_mb"], count=720))
        t = hour_start + 3600
        while t < now - 10:
            phase = (t - hour_start) / 3600
            util = (78 + 12 * math.sin(phase * 9)) if g["index"] == 0 else (45 + 40 * math.sin(phase * 4 + 1) ** 2)
            util = max(0.0, min(100.0, util + rnd.uniform(-6, 6)))
            mem = g["memory_total_mb"] * (0.72 if g["index"] == 0 else 0.25 + 0.2 * math.sin(phase * 4) ** 2)
            raw.append(mstore.SampleValues(g["host"], g["index"], g["uuid"], t, utilization=util, memory_used_mb=mem,
                                           memory_total_mb=g["memory_total_mb"]))
            t += 20
    mstore.add_samples(store, hourly, resolution=3600)
    mstore.add_samples(store, raw)
    people = [("alice", "vision"), ("bob", "nlp"), ("carol", "vision"), ("dan", None), ("erin", "nlp")]
    t = now - 3300
    while t < now - 400:
        user, group = rnd.choice(people)
        wait = rnd.choice([5, 20, 60, 240, 600])
        run = rnd.uniform(300, 1500)
        gpu = rnd.choice(gpus)
        job = store.add_jobs([{"user": user, "group": group, "command": ["python", "train.py"], "gpus": 1,
                               "name": "train", "begin": now + 10 * 365 * 86400}], user, t)[0]
        store.start(job.id, gpu["host"], [(gpu["index"], gpu["uuid"])], t + wait)
        end = min(t + wait + run, now - 60)
        store.transition(job.id, JobState.COMPLETED, "runner", "completed", end, ended_at=end)
        t += rnd.uniform(120, 360)


def _representative_load(client: Any) -> None:
    jobs = [client.submit(burner(300, 0.8), gpus=1, gpu_type="A100", time_limit="30m", name="train-resnet"),
            client.submit(burner(300, 0.35), gpus=1, gpu_type="A100", time_limit="1h", name="finetune-llm")]
    wait_for(lambda: all(client.job(j["id"])["state"] == "RUNNING" for j in jobs), 30, "both GPUs busy")
    client.submit(sleeper(300), gpus=2, gpu_type="A100", time_limit="2h", name="sweep-lr")


def test_dashboard_screenshots_light_and_dark(page: Any, client: Any, lab: Any) -> None:
    """The dashboard at the main area's width and at a narrow one, in both themes
    (tests/ui/screenshots/dashboard-*.png), over a week of history and live jobs."""
    _seed_history(lab, client)
    _representative_load(client)
    page.set_viewport_size({"width": 1400, "height": 1230})
    run_command(page, "application:toggle-left-area")  # the main area gets the whole width
    dash = open_dashboard(page)
    page.wait_for_timeout(9000)  # a few live readings
    page.evaluate("document.querySelectorAll('.Toastify__toast').forEach(t => t.remove())")
    light = screenshot(page, "dashboard-light", dash)
    set_theme(page, "JupyterLab Dark")
    wait_for(lambda: version(page, "utilization") > 0 and drawn(page, "utilization") > 0, 15, "redrawn charts")
    page.wait_for_timeout(1500)
    dark = screenshot(page, "dashboard-dark", dash)
    page.set_viewport_size({"width": 460, "height": 2600})
    page.wait_for_timeout(1500)
    screenshot(page, "dashboard-narrow-dark", dash)
    set_theme(page, "JupyterLab Light")
    page.wait_for_timeout(1500)
    screenshot(page, "dashboard-narrow-light", dash)
    # nothing sticks out of a card at the narrow width
    overflow = page.evaluate(
        """() => [...document.querySelectorAll('#gpujobs-dashboard-area .jp-GPUDash-card')]
             .filter(c => c.scrollWidth > c.clientWidth + 1).map(c => c.innerText.slice(0, 30))""")
    assert overflow == []
    copy_to_docs(light, "dashboard-light.png")
    copy_to_docs(dark, "dashboard-dark.png")
