"""scripts/run-lab.sh as the README has a new user run it: it says what it does step by step,
starts as root on a headless box, and the README's tour works in a terminal of that Lab (the
venv's bin is on the PATH of Lab's terminals and kernels)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from servers import free_port

ROOT = Path(__file__).parent.parent


def fake_venv(path: Path) -> Path:
    """A venv as run-lab.sh leaves it, installed: this Python and its jupyter commands in bin/
    (links to the test venv's), and the install mark, so the script does not install again."""
    bin_dir = path / "bin"
    bin_dir.mkdir(parents=True)
    real = Path(sys.executable).parent
    for name in ("python", "jupyter", "jupyter-lab", "jupyter-server", "jupyter-gpujobs"):
        (bin_dir / name).symlink_to(real / name if name != "python" else sys.executable)
    (path / ".jupyter-gpujobs-installed").touch()
    os.utime(path / ".jupyter-gpujobs-installed", (time.time() + 60, time.time() + 60))  # newer than pyproject
    return path


async def terminal_output(url: str, token: str, command: str, until: re.Pattern[str], timeout: float) -> str:
    """Open a Lab terminal through Jupyter's terminals API, type `command`, and return what it
    printed once `until` matches."""
    from tornado.websocket import websocket_connect

    async with httpx.AsyncClient() as http:
        r = await http.post(f"{url}api/terminals", headers={"Authorization": f"token {token}"})
        r.raise_for_status()
        name = r.json()["name"]
    ws = await websocket_connect(f"{url.replace('http', 'ws', 1)}terminals/websocket/{name}?token={token}")
    await ws.write_message(json.dumps(["stdin", command + "\r"]))
    out = ""
    deadline = time.monotonic() + timeout
    while not until.search(out):
        left = deadline - time.monotonic()
        assert left > 0, f"the terminal did not print {until.pattern!r}:\n{out}"
        msg = await asyncio.wait_for(ws.read_message(), left)
        assert msg is not None, f"the terminal closed:\n{out}"
        kind, *rest = json.loads(msg)
        if kind == "stdout":
            out += rest[0]
    ws.close()
    return out


def test_run_lab_then_the_tour_in_a_lab_terminal(tmp_path: Path) -> None:
    venv = fake_venv(tmp_path / "venv")
    port, token = free_port(), "run-lab-test"
    env = {k: v for k, v in os.environ.items()
           if k not in ("DISPLAY", "WAYLAND_DISPLAY", "VIRTUAL_ENV", "GPUJOBS_FAKE_GPUS")}
    env.update(GPUJOBS_VENV=str(venv), PATH="/usr/bin:/bin", JUPYTER_DATA_DIR=str(tmp_path / "data"),
               JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"), PYTHONUNBUFFERED="1")
    log = tmp_path / "run-lab.log"
    (tmp_path / "root").mkdir()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            ["bash", str(ROOT / "scripts" / "run-lab.sh"), "--ip=127.0.0.1", f"--port={port}", "--port-retries=0",
             f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={tmp_path / 'root'}"],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, f"run-lab.sh exited {proc.returncode}:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"Lab did not answer:\n{log.read_text()}"
            try:
                if httpx.get(url + "gpujobs/api/whoami", headers={"Authorization": f"token {token}"},
                             timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        text = log.read_text()
        steps = re.findall(r"^==> (\d)/4 ", text, re.M)
        assert steps == ["1", "2", "3", "4"], text  # says what it does, step by step
        assert "no NVIDIA GPU found: using fake GPUs 2xA100-80GB,2xT4" in text
        assert "adding --no-browser" in text  # no display
        if os.geteuid() == 0:
            assert "running as root: adding --allow-root" in text

        # the README's tour, exactly as written, in a terminal of that Lab
        shown = asyncio.run(terminal_output(url, token, "jupyter gpujobs gpus", re.compile(r"3\s+T4\s|command not found"), 60))
        assert "command not found" not in shown
        assert re.search(r"GPU\s+MODEL\s+UTIL\s+MEMORY\s+HELD BY", shown), shown
        # the fake GPUs of run-lab.sh (a process of another test on this machine may show on one)
        assert len(re.findall(r"\d\s+A100-80GB\s+\d+%\s+[\d.]+/80 GiB", shown)) == 2, shown
        assert len(re.findall(r"\d\s+T4\s+\d+%\s+[\d.]+/15 GiB", shown)) == 2, shown
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.parametrize("given", ["--allow-root --no-browser", ""])
def test_run_lab_flags_are_not_doubled(tmp_path: Path, given: str) -> None:
    """What the user passes is passed once: `jupyter lab --help-all`-free check through bash -x."""
    venv = fake_venv(tmp_path / "venv")
    (venv / "bin" / "jupyter").unlink()
    (venv / "bin" / "jupyter").write_text('#!/bin/sh\necho "ARGS: $*"\n')
    (venv / "bin" / "jupyter").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    env["GPUJOBS_VENV"] = str(venv)
    done = subprocess.run(["bash", str(ROOT / "scripts" / "run-lab.sh"), *given.split()], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    args = done.stdout.split("ARGS: ", 1)[1].split()
    assert args.count("--no-browser") == 1
    assert args.count("--allow-root") == (1 if os.geteuid() == 0 or given else 0)


def test_run_lab_serves_a_working_folder_not_the_clone(tmp_path: Path) -> None:
    """The tour's notebooks and job outputs must not land in the source tree, where the test
    command's lint and the tests would trip on them: Lab serves ~/gpujobs-work (made if missing),
    or GPUJOBS_WORKDIR, or the root dir the user names, once."""
    venv = fake_venv(tmp_path / "venv")
    (venv / "bin" / "jupyter").unlink()
    (venv / "bin" / "jupyter").write_text('#!/bin/sh\necho "ARGS: $*"\n')
    (venv / "bin" / "jupyter").chmod(0o755)

    def served(*given: str, **env: str) -> list[str]:
        done = subprocess.run(["bash", str(ROOT / "scripts" / "run-lab.sh"), *given],
                              env={**os.environ, "GPUJOBS_VENV": str(venv), "HOME": str(tmp_path / "home"), **env},
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        args = done.stdout.split("ARGS: ", 1)[1].split()
        return [a.split("=", 1)[1] for a in args if a.startswith("--ServerApp.root_dir=")]

    work = tmp_path / "home" / "gpujobs-work"
    assert served() == [str(work)] and work.is_dir()
    assert str(ROOT) not in served()[0]
    assert served(GPUJOBS_WORKDIR=str(tmp_path / "mine")) == [str(tmp_path / "mine")]
    assert served(f"--ServerApp.root_dir={tmp_path}") == [str(tmp_path)]


def test_lint_checks_the_project_not_what_a_user_saved(tmp_path: Path) -> None:
    """A notebook or script a user saved at the top of the clone is not the project's code: the
    test command's lint step passes over it, and still fails on the project's own code."""
    clone = tmp_path / "clone"
    for part in ("jupyter_gpujobs", "tests", "benchmarks", "binder", "scripts"):
        (clone / part).mkdir(parents=True)
    (clone / "scripts" / "lint.sh").write_text((ROOT / "scripts" / "lint.sh").read_text())
    (clone / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    (clone / "jupyter_gpujobs" / "ok.py").write_text("VALUE = 1\n")
    (clone / "tour.py").write_text("print(losses)\n")  # what a tour leaves: a name from another cell
    ruff = str(Path(sys.executable).parent / "ruff")
    lint = subprocess.run(["bash", str(clone / "scripts" / "lint.sh"), ruff], capture_output=True, text=True,
                          timeout=120)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    (clone / "jupyter_gpujobs" / "bad.py").write_text("print(losses)\n")
    lint = subprocess.run(["bash", str(clone / "scripts" / "lint.sh"), ruff], capture_output=True, text=True,
                          timeout=120)
    assert lint.returncode == 1 and "F821" in lint.stdout and "tour.py" not in lint.stdout


def test_the_tests_do_not_see_what_a_user_installs_into_labs_venv() -> None:
    """Following the README (a GPU kernelspec installed with --sys-prefix into the venv Lab runs
    from) made a doctor test fail every time: the tests ran from that same venv and saw it. The
    tests run from a venv of their own (scripts/test.sh: .venv-test), so nothing of Lab's venv is
    on their Jupyter paths."""
    from jupyter_core.paths import jupyter_path

    lab_venv = (ROOT / ".venv").resolve()
    seen = [p for p in jupyter_path() if Path(p).resolve().is_relative_to(lab_venv)]
    assert not seen, (f"the tests see Lab's venv {lab_venv} ({seen}); run them with scripts/test.sh, "
                      "which uses .venv-test")
