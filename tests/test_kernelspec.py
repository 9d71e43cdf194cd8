"""`jupyter gpujobs kernelspec install|list`: GPU kernelspecs land where Jupyter finds them,
carry the request for the provisioner, copy the wrapped kernel, and bad input is one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from jupyter_gpujobs.jupyter.kernelspec import build_spec
from jupyter_gpujobs.model import InvalidInput


def gpujobs(env: dict[str, str], *args: str, python: str = sys.executable) -> subprocess.CompletedProcess[str]:
    return subprocess.run([python, "-m", "jupyter_gpujobs.cli", "kernelspec", *args],
                          capture_output=True, text=True, env=env, timeout=60)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "JUPYTER_DATA_DIR": str(tmp_path / "data"), "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg")}


def test_install_user_writes_a_launcher_kernelspec(env: dict[str, str], tmp_path: Path) -> None:
    done = gpujobs(env, "install", "--name", "python3-gpu", "--display-name", "Python 3 (1 GPU, 4h)",
                   "--gpus", "1", "--time", "4h", "--type", "A100", "--idle-timeout", "30m", "--max-wait", "1h",
                   "--user")
    assert done.returncode == 0, done.stderr
    folder = tmp_path / "data" / "kernels" / "python3-gpu"
    spec = json.loads((folder / "kernel.json").read_text())
    assert spec["display_name"] == "Python 3 (1 GPU, 4h)"
    assert spec["language"] == "python"
    assert spec["argv"][1:3] == ["-m", "ipykernel_launcher"] and "{connection_file}" in spec["argv"]
    assert spec["metadata"]["kernel_provisioner"] == {
        "provisioner_name": "gpujobs-provisioner",
        "config": {"gpus": 1, "time_limit": "4h", "priority": "normal", "gpu_type": "A100",
                   "idle_timeout": "30m", "max_wait": "1h"},
    }
    assert spec["metadata"].get("debugger") is True  # the wrapped kernel's metadata is kept
    assert (folder / "logo-64x64.png").exists()

    # Jupyter (and so the Lab launcher) sees it
    listed = subprocess.run([sys.executable, "-m", "jupyter_client.kernelspecapp", "list", "--json"],
                            capture_output=True, text=True, env=env, timeout=60)
    names = json.loads(listed.stdout)["kernelspecs"] if listed.returncode == 0 else {}
    if listed.returncode == 0:
        assert "python3-gpu" in names

    ours = gpujobs(env, "list")
    assert ours.returncode == 0
    lines = ours.stdout.splitlines()
    assert lines[0].split()[:3] == ["NAME", "DISPLAY", "NAME"]
    row = next(line for line in lines if line.startswith("python3-gpu"))
    assert "1xA100" in row and "4h" in row and "30m" in row and "1h" in row
    assert not any(line.startswith("python3 ") for line in lines)  # only GPU kernelspecs


def test_install_prefix_and_default_display_name(env: dict[str, str], tmp_path: Path) -> None:
    done = gpujobs(env, "install", "--name", "gpu2", "--gpus", "2", "--time", "90m", "--prefix",
                   str(tmp_path / "pfx"))
    assert done.returncode == 0, done.stderr
    spec = json.loads((tmp_path / "pfx" / "share" / "jupyter" / "kernels" / "gpu2" / "kernel.json").read_text())
    assert spec["display_name"] == "Python 3 (2 GPUs, 1h30m)"
    assert spec["metadata"]["kernel_provisioner"]["config"]["time_limit"] == "1h30m"
    assert "max_wait" not in spec["metadata"]["kernel_provisioner"]["config"]  # the provisioner's default


def test_reinstall_replaces(env: dict[str, str], tmp_path: Path) -> None:
    assert gpujobs(env, "install", "--name", "g", "--time", "1h", "--user").returncode == 0
    assert gpujobs(env, "install", "--name", "g", "--time", "2h", "--user").returncode == 0
    spec = json.loads((tmp_path / "data" / "kernels" / "g" / "kernel.json").read_text())
    assert spec["metadata"]["kernel_provisioner"]["config"]["time_limit"] == "2h"


@pytest.mark.parametrize(("args", "message"), [
    (["--name", "g", "--time", "4q"], "error: time_limit: cannot read duration '4q'"),
    (["--name", "g", "--idle-timeout", "soon"], "error: idle_timeout: cannot read duration 'soon'"),
    (["--name", "g", "--max-wait", "-1"], "error: max_wait:"),
    (["--name", "g", "--gpus", "0"], "error: gpus: a GPU kernel needs at least 1 GPU"),
    (["--name", "g", "--priority", "asap"], "error: priority: unknown priority 'asap'"),
    (["--name", "a b"], "error: name: 'a b' is not a valid kernelspec name"),
    (["--name", "g", "--kernel", "nope"], "error: kernel: no kernelspec 'nope' to wrap"),
    (["--name", "g", "--gpus", "two"], "error: gpus: expected a whole number of GPUs, got 'two'"),
    (["--name", "g", "--gpus", "1.5"], "error: gpus: cannot ask for 1.5 GPUs: ask for a whole number of GPUs"),
    (["--name", "g", "--gpus", "2", "--gpu-mem", "16G"], "error: gpu_memory: asks for memory on one shared GPU"),
])
def test_bad_input_is_one_clear_line(env: dict[str, str], args: list[str], message: str) -> None:
    done = gpujobs(env, "install", "--user", *args)
    assert done.returncode == 2, done
    assert message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_cannot_wrap_a_gpu_kernelspec(env: dict[str, str]) -> None:
    assert gpujobs(env, "install", "--name", "g", "--user").returncode == 0
    done = gpujobs(env, "install", "--name", "g2", "--kernel", "g", "--user")
    assert done.returncode == 2 and "already a GPU kernelspec" in done.stderr


def test_list_without_gpu_kernelspecs(env: dict[str, str], clean_prefix_python: str) -> None:
    done = gpujobs(env, "list", python=clean_prefix_python)
    assert done.returncode == 0 and "no GPU kernelspecs" in done.stdout


def test_build_spec() -> None:
    wrapped: dict[str, Any] = {"argv": ["python", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                               "display_name": "Python 3 (ipykernel)", "language": "python", "metadata": {}}
    spec = build_spec(wrapped, gpus=1, time_limit="4h", gpu_type="A100")
    assert spec["display_name"] == "Python 3 (1xA100, 4h)"
    assert wrapped["metadata"] == {}  # not changed in place
    with pytest.raises(InvalidInput) as err:
        build_spec(wrapped, gpus=1, time_limit="4h", gpu_type=" ")
    assert err.value.field == "gpu_type"
    half = build_spec(wrapped, gpus="0.5", time_limit="8h")
    assert half["display_name"] == "Python 3 (0.5 of a GPU, 8h)"
    assert half["metadata"]["kernel_provisioner"]["config"]["gpus"] == 0.5
    mem = build_spec(wrapped, gpus=1, time_limit="8h", gpu_memory="16G", gpu_type="A100")
    assert mem["display_name"] == "Python 3 (16G of A100, 8h)"
    assert mem["metadata"]["kernel_provisioner"]["config"]["gpu_memory"] == "16G"
    with pytest.raises(InvalidInput, match="whole number of GPUs"):
        build_spec(wrapped, gpus=1.5, time_limit="4h")
    with pytest.raises(InvalidInput, match="cannot go with 2 GPUs"):
        build_spec(wrapped, gpus=2, time_limit="4h", gpu_memory="16G")


def test_list_shows_the_values_in_force(env: dict[str, str], tmp_path: Path) -> None:
    """What the kernelspec leaves out comes from the server's config, else the provisioner's
    defaults (max wait 1h): `list` shows those, not "-"."""
    assert gpujobs(env, "install", "--name", "g", "--time", "2h", "--user").returncode == 0

    def row() -> list[str]:
        done = gpujobs(env, "list")
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        headers = lines[0].split("  ")
        assert [h.strip() for h in headers if h.strip()][2:6] == ["GPUS", "TIME", "IDLE", "MAX WAIT"]
        start = lines[0].index("GPUS")
        return next(line for line in lines if line.startswith("g ")).__getitem__(slice(start, None)).split()[:5]

    assert row()[:5] == ["1", "2h", "never", "1h", str(tmp_path / "data" / "kernels" / "g")]
    (tmp_path / "cfg").mkdir(exist_ok=True)
    (tmp_path / "cfg" / "jupyter_server_config.json").write_text(
        json.dumps({"GPUKernelProvisioner": {"max_wait": "20m", "idle_timeout": "45m"}}))
    assert row()[:4] == ["1", "2h", "45m", "20m"]
    (tmp_path / "cfg" / "jupyter_server_config.json").write_text(
        json.dumps({"GPUKernelProvisioner": {"max_wait": "banana"}}))
    assert "max_wait: cannot read duration 'banana'" in gpujobs(env, "list").stdout
