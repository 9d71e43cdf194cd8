"""A fractional GPU kernel from the Lab launcher: a kernelspec that asks for half a GPU
(`jupyter gpujobs kernelspec install -g 0.5`) shows as a Notebook card in the real JupyterLab
launcher (fake GPUs 2xA100); two notebooks from it run at once on halves of one GPU, the panel
shows that card as shared by both, and shutting the kernels down frees it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from labtools import Lab, open_panel, run_command, screenshot, wait_for, wait_for_kernel

pytestmark = [pytest.mark.ui, pytest.mark.usefixtures("idle_engine")]

SPEC = "python3-half-gpu"
DISPLAY = "Python 3 (0.5 of a GPU, 10m)"


def install_share_kernelspec(lab: Lab) -> Path:
    """Install the share kernelspec with the product's command into the Lab's JUPYTER_DATA_DIR."""
    jupyter = str(Path(sys.executable).with_name("jupyter"))
    done = subprocess.run([jupyter, "gpujobs", "kernelspec", "install", "--user", "--name", SPEC,
                           "--display-name", DISPLAY, "-g", "0.5", "-t", "10m"],
                          env=lab.env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return Path(lab.env["JUPYTER_DATA_DIR"]) / "kernels" / SPEC


def new_notebook_from_launcher(page: Any) -> Any:
    """Open a Launcher, click the share kernel's Notebook card; the notebook's panel once its
    kernel is idle."""
    before = page.locator(".jp-NotebookPanel").count()
    run_command(page, "launcher:create")
    launcher = page.locator(".jp-Launcher-body:visible")
    card = launcher.locator(f'.jp-LauncherCard[data-category="Notebook"][title="{DISPLAY}"]')
    card.wait_for(timeout=20000)
    card.click()
    wait_for(lambda: page.locator(".jp-NotebookPanel").count() == before + 1, 30, "the new notebook")
    wait_for_kernel(page)
    return page.locator(".jp-NotebookPanel:visible")


def run_cell(page: Any, notebook: Any, code: str) -> str:
    """Type `code` into the notebook's first cell, run it (Shift+Enter), its output text."""
    notebook.locator(".jp-Cell .jp-InputArea-editor .cm-content").first.click()
    page.keyboard.type(code)
    page.keyboard.press("Shift+Enter")
    output = notebook.locator(".jp-Cell").first.locator(".jp-OutputArea-output")
    output.wait_for(timeout=30000)
    wait_for(lambda: output.inner_text().strip(), 15, "the cell's output")
    return output.inner_text().strip()


def kernel_jobs(client: Any) -> list[dict[str, Any]]:
    return [j for j in client.jobs(state="RUNNING", limit=100)["jobs"]
            if j["kind"] == "kernel" and j["name"] == f"kernel {SPEC}"]


def test_fractional_gpu_kernel_from_the_launcher(page: Any, client: Any, lab: Lab) -> None:
    spec_dir = install_share_kernelspec(lab)
    http = httpx.Client(base_url=lab.url, timeout=30)
    try:
        # the Lab finds the new kernelspec (what its launcher lists)
        specs = http.get("api/kernelspecs").json()["kernelspecs"]
        assert specs[SPEC]["spec"]["display_name"] == DISPLAY
        page.evaluate("async () => { await window.jupyterapp.serviceManager.kernelspecs.refreshSpecs(); }")

        run_command(page, "launcher:create")
        launcher = page.locator(".jp-Launcher-body:visible")
        card = launcher.locator(f'.jp-LauncherCard[data-category="Notebook"][title="{DISPLAY}"]')
        card.wait_for(timeout=20000)
        assert card.locator(".jp-LauncherCard-label").inner_text().strip() == DISPLAY
        screenshot(page, "launcher-share-kernel", page.locator(".jp-Launcher:visible"))

        # first notebook: its kernel runs as a job on half of one GPU
        first = new_notebook_from_launcher(page)
        out = run_cell(page, first, 'import os; print(os.environ["GPUJOBS_GPU_SHARE"], '
                       'os.environ["CUDA_VISIBLE_DEVICES"], os.environ["GPUJOBS_JOB_ID"])')
        share, device, job_id = out.split()
        jobs = kernel_jobs(client)
        assert len(jobs) == 1, jobs
        job = jobs[0]
        assert (share, int(job_id)) == ("0.5", job["id"])
        assert (job["state"], job["kind"], job["share"]) == ("RUNNING", "kernel", 0.5)
        assert job["assigned_gpus"] == [int(device)], job

        # second notebook from the same card: the other half of the SAME GPU, at once
        second = new_notebook_from_launcher(page)
        out2 = run_cell(page, second, 'import os; print(os.environ["GPUJOBS_GPU_SHARE"], '
                        'os.environ["CUDA_VISIBLE_DEVICES"], os.environ["GPUJOBS_JOB_ID"])')
        share2, device2, job_id2 = out2.split()
        assert (share2, device2) == ("0.5", device)
        jobs = {j["id"]: j for j in kernel_jobs(client)}
        assert set(jobs) == {job["id"], int(job_id2)}, jobs
        assert all(j["share"] == 0.5 and j["assigned_gpus"] == [int(device)] for j in jobs.values()), jobs
        gpu = next(g for g in client.gpus() if g["index"] == int(device))
        assert {h["job_id"] for h in gpu["holders"]} == set(jobs), gpu

        # the panel shows that GPU card as shared by both kernels
        panel = open_panel(page)
        shared = panel.locator(".jp-GPUJobs-gpu", has=page.locator(".jp-GPUJobs-tag.jp-mod-shared"))
        shared.wait_for(timeout=15000)
        items = shared.locator(".jp-GPUJobs-shareList li")
        wait_for(lambda: items.count() == 2, 15, "the two kernels on the shared card")
        assert {int(items.nth(i).get_attribute("data-job-id") or 0) for i in range(2)} == set(jobs)
        assert all("you · 50% · " in items.nth(i).inner_text() for i in range(2))
        assert panel.locator(".jp-GPUJobs-gpu").count() == 2
        # each kernel's row in "my jobs" says what it asked for: half a GPU, not a whole one
        for jid in jobs:
            meta = panel.locator(f'.jp-GPUJobs-section-myjobs .jp-GPUJobs-job[data-job-id="{jid}"] '
                                 ".jp-GPUJobs-jobMeta")
            wait_for(lambda m=meta: m.count() == 1, 10, f"job #{jid} in my jobs")
            assert meta.inner_text().strip() == "0.5 of a GPU · kernel"
        screenshot(page, "panel-shared-launcher-kernels", panel)

        # shutting the kernels down ends their jobs and frees the card: the current notebook's
        # from the Kernel menu's command, the other through the server's API
        run_command(page, "kernelmenu:shutdown")
        dialog = page.locator(".jp-Dialog")
        try:
            dialog.wait_for(timeout=5000)
            dialog.locator("button.jp-mod-accept").click()
        except Exception:
            pass  # no confirmation asked
        wait_for(lambda: len(kernel_jobs(client)) == 1, 30, "the first kernel's job to end")
        for kernel in http.get("api/kernels").json():
            assert http.delete(f"api/kernels/{kernel['id']}").status_code == 204
        wait_for(lambda: not kernel_jobs(client), 30, "the kernels' jobs to end")
        for jid in jobs:
            assert client.job(jid)["state"] not in ("PENDING", "RUNNING")
        def free_gpu() -> dict[str, Any] | None:
            g = next(g for g in client.gpus() if g["index"] == int(device))
            return g if not g["holders"] and g["job_id"] is None else None

        wait_for(free_gpu, 15, "the GPU to be free")
        shared.wait_for(state="detached", timeout=15000)
    finally:
        for kernel in http.get("api/kernels").json():
            http.delete(f"api/kernels/{kernel['id']}")
        for name in ("Untitled.ipynb", "Untitled1.ipynb"):
            http.delete(f"api/contents/{name}")
        http.close()
        shutil.rmtree(spec_dir, ignore_errors=True)
