"""The release path: a wheel built from a clean clone carries the prebuilt labextension and
works with no node on PATH; the binder/ files set up a server whose tour notebook runs.

Slow (a JS build and a fresh venv from PyPI: minutes). The binder replay shares the venv.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from labtools import (
    REPO,
    isolated_env,
    open_lab,
    open_panel,
    run_command,
    screenshot,
    screenshot_on_failure,
    start_lab,
    stop_lab,
    wait_for_kernel,
)

pytestmark = [pytest.mark.slow]


NODE_TOOLS = ("node", "nodejs", "npm", "npx", "yarn", "corepack")


def path_without_node(shadow: Path) -> str:
    """PATH with no node: folders holding node are replaced by one folder of links to
    everything else in them (so bash, cp, grep... are still there), made at `shadow` (under
    the test's own temporary folder, so nothing is left in /tmp)."""
    keep: list[str] = []
    for d in os.environ.get("PATH", "").split(os.pathsep):
        if not d:
            continue
        if not any(Path(d, exe).exists() for exe in NODE_TOOLS):
            keep.append(d)
            continue
        shadow.mkdir(exist_ok=True)
        for entry in Path(d).iterdir():
            link = shadow / entry.name
            if entry.name in NODE_TOOLS or link.exists() or link.is_symlink():
                continue
            link.symlink_to(entry)
        if str(shadow) not in keep:
            keep.append(str(shadow))
    return os.pathsep.join(keep)


def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert out.returncode == 0, f"{cmd} failed ({out.returncode}):\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
    return out


@dataclass
class Installed:
    clone: Path
    wheel: Path
    venv: Path
    tmp: Path

    def bin(self, name: str) -> str:
        return str(self.venv / "bin" / name)

    def env(self, sub: str, **extra: str) -> dict[str, str]:
        env = isolated_env(self.tmp / sub, **extra)
        env["PATH"] = os.pathsep.join([str(self.venv / "bin"), path_without_node(self.tmp / "no-node")])
        env.pop("VIRTUAL_ENV", None)
        env.pop("PYTHONPATH", None)
        return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    tmp = tmp_path_factory.mktemp("wheel")
    clone = tmp / "clone"
    run(["git", "clone", "--quiet", "--no-hardlinks", str(REPO), str(clone)])
    assert not (clone / "jupyter_gpujobs" / "labextension").exists()
    dist = tmp / "dist"
    # pip's isolated build env gets hatchling, hatch-jupyter-builder and jupyter-builder (jlpm).
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(dist), str(clone)], timeout=900)
    wheel = next(dist.glob("jupyter_gpujobs-*.whl"))
    venv = tmp / "venv"
    run([sys.executable, "-m", "venv", str(venv)])
    env = dict(os.environ, PATH=os.pathsep.join([str(venv / "bin"), path_without_node(tmp / "no-node")]))
    env.pop("VIRTUAL_ENV", None)
    run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)], env=env, timeout=900)
    yield Installed(clone=clone, wheel=wheel, venv=venv, tmp=tmp)


def test_wheel_ships_the_prebuilt_labextension(installed: Installed) -> None:
    names = zipfile.ZipFile(installed.wheel).namelist()
    ext = "jupyter_gpujobs-0.1.0.data/data/share/jupyter/labextensions/jupyter-gpujobs/"
    assert ext + "package.json" in names
    assert ext + "static/style.js" in names
    assert ext + "schemas/jupyter-gpujobs/plugin.json" in names
    assert any(n.startswith(ext + "static/remoteEntry.") for n in names)
    assert not [n for n in names if n.endswith(".js.map")], "a release wheel carries a production build"
    assert not [n for n in names if "node_modules" in n or n.endswith(".ts")]


def test_installed_wheel_is_enabled_without_node(installed: Installed) -> None:
    env = installed.env("list")
    assert shutil.which("node", path=env["PATH"]) is None
    out = run([installed.bin("jupyter"), "labextension", "list"], env=env)
    text = out.stdout + out.stderr
    line = next((ln for ln in text.splitlines() if "jupyter-gpujobs" in ln), "")
    assert "enabled" in line and "OK" in line, text
    out = run([installed.bin("jupyter"), "server", "extension", "list"], env=env)
    text = out.stdout + out.stderr
    assert "jupyter_gpujobs" in text and "enabled" in text.split("jupyter_gpujobs", 1)[1][:200], text


@pytest.mark.ui
def test_binder_replay_runs_the_tour(installed: Installed, browser: Any) -> None:
    """requirements.txt (its `.` is the wheel just built) + postBuild + start, then the tour."""
    clone = installed.clone
    reqs = [ln.strip() for ln in (clone / "binder" / "requirements.txt").read_text().splitlines()
            if ln.strip() and not ln.startswith("#")]
    assert "." in reqs
    reqs = [str(installed.wheel) if r == "." else r for r in reqs]
    env = installed.env("binder")
    env.pop("GPUJOBS_FAKE_GPUS")  # the binder config must provide them
    run([installed.bin("python"), "-m", "pip", "install", "-q", *reqs], env=env, timeout=900)
    run(["bash", str(clone / "binder" / "postBuild")], env=env, cwd=clone, timeout=300)
    assert (Path(env["JUPYTER_CONFIG_DIR"]) / "jupyter_server_config.py").exists()

    lab = start_lab(installed.tmp / "binder", jupyter=installed.bin("jupyter"), env=env, root=clone,
                    wrapper=[str(clone / "binder" / "start")])
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    try:
        with screenshot_on_failure(page, "binder-tour"):
            open_lab(page, lab.url)
            panel = open_panel(page)
            panel.locator(".jp-GPUJobs-gpu").first.wait_for(timeout=15000)
            names = panel.locator(".jp-GPUJobs-gpuModel").all_inner_texts()
            assert sorted(names) == ["A100-80GB", "A100-80GB", "T4", "T4"], names
            run_command(page, "docmanager:open", {"path": "binder/tour.ipynb"})
            nb = page.locator(".jp-NotebookPanel:visible")
            nb.locator(".jp-Cell").first.wait_for(timeout=30000)
            wait_for_kernel(page)
            run_command(page, "notebook:run-all-cells")
            page.wait_for_function(
                """() => {
                    const cells = [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell')];
                    return cells.length > 0 && cells.every(c => /\\[\\d+\\]/.test(c.querySelector('.jp-InputPrompt').textContent));
                }""",
                timeout=120000,
            )
            text = nb.inner_text()
            assert "running on GPU" in text, text[-3000:]
            errors = nb.locator(".jp-RenderedText[data-mime-type='application/vnd.jupyter.error']")
            assert errors.count() == 0, errors.all_inner_texts()
            screenshot(page, "binder-tour")
    finally:
        context.close()
        stop_lab(lab)
