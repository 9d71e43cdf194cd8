"""The panel's GPU card for a GPU in use outside the queue: it says by what (which process, how
much) and what to do, and is free again once that process ends; the memory the driver reserves
is shown apart, not as used (issue 26)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from labtools import Lab, isolated_env, open_lab, open_panel, start_lab, stop_lab, wait_for

pytestmark = [pytest.mark.ui, pytest.mark.usefixtures("idle_engine")]


def test_a_gpu_in_use_outside_the_queue_says_by_what_and_what_to_do(page: Any, lab: Lab, client: Any) -> None:
    fleet = client.api("GET", "info")["fake_fleet"]
    env = {**os.environ, "GPUJOBS_FAKE_FLEET": fleet, "GPUJOBS_FAKE_GPU_USE": "1", "GPUJOBS_FAKE_MEM_MB": "2150"}
    env.pop("GPUJOBS_JOB_ID", None)
    rogue = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env=env)
    try:
        panel = open_panel(page)
        card = panel.locator('.jp-GPUJobs-gpu[data-gpu-index="1"]')
        card.locator(".jp-GPUJobs-foreign").wait_for(timeout=20000)
        assert card.locator(".jp-GPUJobs-tag.jp-mod-warn").inner_text() == "outside the queue"
        text = card.locator(".jp-GPUJobs-foreign").inner_text()
        assert f"in use outside the queue (2.1 GiB held by pid {rogue.pid}, " in text, text
        assert "→ ask root to stop pid" in text and "jupyter gpujobs gpus --override 1" in text, text
        other = panel.locator('.jp-GPUJobs-gpu[data-gpu-index="0"]')
        assert other.locator(".jp-GPUJobs-tag.jp-mod-free").inner_text() == "free"
    finally:
        rogue.kill()
        rogue.wait()
    wait_for(lambda: card.locator(".jp-GPUJobs-tag.jp-mod-free").count() == 1, 20, "the card free again")
    assert card.locator(".jp-GPUJobs-foreign").count() == 0


def test_the_memory_the_driver_reserves_is_shown_apart(browser: Any, tmp_path: Path) -> None:
    """An idle H200 whose driver reserves 616 MiB (driver 580): free, nothing used, 0.6 GiB reserved."""
    lab = start_lab(tmp_path, env=isolated_env(tmp_path, GPUJOBS_FAKE_GPUS="1xH200-141GB[reserved:616M]"))
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    try:
        page = context.new_page()
        open_lab(page, lab.url)
        card = open_panel(page).locator('.jp-GPUJobs-gpu[data-gpu-index="0"]')
        card.wait_for(timeout=15000)
        memory = card.locator(".jp-GPUJobs-gpuMem").inner_text()
        assert memory.startswith("0.0 / 141 GiB") and memory.endswith("· 0.6 GiB reserved"), memory
        assert card.locator(".jp-GPUJobs-tag.jp-mod-free").inner_text() == "free"
    finally:
        context.close()
        stop_lab(lab)
