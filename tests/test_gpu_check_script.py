"""scripts/gpu-check.sh where there is no GPU: it parses, its dry run plans every check, and it
finds the Python that has PyTorch, as on a GPU machine whose PyTorch lives in a venv (issue 26).
The checks themselves need a real GPU and run only there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu-check.sh"
CHECKS = ("inventory", "idle-memory", "torch-visible", "samples-rise", "oom", "time-limit-frees", "rogue", "fence",
          "process-memory", "mig", "over-share", "gpujob-cell", "gpu-kernel", "four-shares", "mps-share")


def test_the_dry_run_finds_the_python_with_pytorch_and_plans_every_check(tmp_path: Path) -> None:
    site = tmp_path / "torch-venv-site"
    (site / "torch" / "version").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("__version__ = '9.9.9'\nfrom . import version\n")
    (site / "torch" / "version" / "__init__.py").write_text("cuda = '13.0'\n")
    python = tmp_path / "bin" / "python3"  # a venv's python that has PyTorch, not first on PATH
    python.parent.mkdir()
    python.write_text(f"#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    (tmp_path / "bin" / "python").symlink_to("python3")

    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    env = {**os.environ, "VIRTUAL_ENV": str(tmp_path)}
    out = subprocess.run(["bash", str(SCRIPT), "--dry-run"], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert f"  PyTorch: {tmp_path}/bin/python (9.9.9 CUDA 13.0)" in out.stdout, out.stdout
    assert "then a .pth naming its site-packages" in out.stdout
    for check in CHECKS:
        assert f"  check {check} " in out.stdout, check

    given = subprocess.run(["bash", str(SCRIPT), "--dry-run", "--python", str(python)], capture_output=True,
                           text=True, timeout=120)
    assert f"  PyTorch: {python} (9.9.9 CUDA 13.0)" in given.stdout, given.stdout
    assert given.stdout.index(str(python)) < given.stdout.index("PyTorch:")  # asked first


def test_without_a_gpu_a_run_stops_at_once_saying_why() -> None:
    env = {**os.environ, "PATH": "/usr/bin:/bin"}
    if any((Path(d) / "nvidia-smi").exists() for d in env["PATH"].split(":")):
        return  # a GPU machine: this is for the others
    out = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 1
    assert out.stdout.splitlines() == ["FAIL setup nvidia-smi not found: this script needs a machine with an NVIDIA "
                                       "GPU and driver", "SUMMARY 0 passed, 1 failed, 0 skipped"]
