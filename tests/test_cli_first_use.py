"""The CLI as a new user meets it, against a live server: `doctor` says what is in force and
what to do, and `list | head` ends quietly."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from servers import free_port


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from test_magics import shared_server

    yield from shared_server(tmp_path_factory, "2xA100")


def rows(out: str) -> dict[str, list[str]]:
    """doctor's table: check name -> its lines (what was found, then `-> what to do`)."""
    found: dict[str, list[str]] = {}
    name = ""
    for line in out.splitlines():
        if line[:4] in ("OK  ", "WARN", "FAIL"):
            name = line[6:].split("  ")[0].strip()
            found.setdefault(name, []).append(line[:4].strip() + " " + line[6 + len(name):].strip())
        elif line.strip().startswith("->"):
            found[name].append(line.strip())
    return found


def test_doctor_says_what_is_in_force(server: Any) -> None:
    done = server.cli("doctor")
    assert done.returncode == 0, done.stdout + done.stderr
    found = rows(done.stdout)
    assert found["engine"][0].startswith(f"OK {server.url} (found from --url), version ")
    assert "(admin)" in found["engine"][0]  # the Unix user running a personal server
    assert found["GPUs"] == ["OK 2 fake GPUs (2xA100): scheduled like real ones, for demos and tests"]
    assert found["store"][0].startswith(f"OK sqlite at sqlite:///{server.state_dir}")
    assert found["store"][0].endswith("KiB")
    assert "isolation" in found and "GPU kernels" in found and "lab extension" in found
    assert found["GPU kernels"][0] == "OK no GPU kernelspecs (optional)"

    # a GPU kernelspec asking for a GPU model the server does not have: a warning saying so
    install = server.cli("kernelspec", "install", "--name", "h100", "--type", "H100", "--user")
    assert install.returncode == 0, install.stderr
    kernels = rows(server.cli("doctor").stdout)["GPU kernels"]
    assert kernels[0].startswith("WARN h100 (1xH100, time limit 4h)") and "no H100 on this server" in kernels[0]
    assert kernels[1].startswith("-> its kernels would wait forever")

    as_json = json.loads(server.cli("doctor", "--json").stdout)
    assert {"name": "GPUs", "status": "ok"}.items() <= as_json[2].items()


def test_doctor_says_what_to_do_without_an_engine(server: Any) -> None:
    done = subprocess.run([sys.executable, "-m", "jupyter_gpujobs.cli", "--url", f"http://127.0.0.1:{free_port()}/",
                           "doctor"], capture_output=True, text=True, env=server.env, timeout=60)
    assert done.returncode == 1
    engine = rows(done.stdout)["engine"]
    assert engine[0].startswith("FAIL not reachable (--url)")
    assert engine[1].startswith("-> start JupyterLab with the extension")
    assert "Traceback" not in done.stderr


def test_engine_info_api(server: Any) -> None:
    with server.client() as client:
        info = client.api("GET", "info")
    assert info["backend"] == "fake" and info["gpus"] == 2 and info["gpu_models"] == ["A100"]
    assert info["store"]["kind"] == "sqlite" and info["store"]["size_bytes"] > 0
    assert info["admin"] is True and info["identity"] == "unix"


@pytest.mark.parametrize("args", [["list", "--all"], ["gpus"]])
def test_a_reader_that_stops_early_gets_no_traceback(server: Any, args: list[str]) -> None:
    """`jupyter gpujobs list | head`: the reader has gone before the CLI writes."""
    cmd = [sys.executable, "-m", "jupyter_gpujobs.cli", "--url", server.url, "--token", server.token, *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=server.env)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the interpreter has even started: every write finds no reader
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141, err
    assert err == ""


@pytest.mark.parametrize("disabled", [{"jupyter-gpujobs": True}, ["jupyter-gpujobs"]])
def test_doctor_finds_the_panel_disabled(tmp_path: Any, monkeypatch: pytest.MonkeyPatch, disabled: Any) -> None:
    """A lab extension disabled in a page config, in JupyterLab's form or the older list form."""
    from jupyter_gpujobs.doctor import Context, check_lab_extension

    (tmp_path / "data" / "labextensions" / "jupyter-gpujobs").mkdir(parents=True)
    (tmp_path / "data" / "labextensions" / "jupyter-gpujobs" / "package.json").write_text("{}")
    (tmp_path / "config" / "labconfig").mkdir(parents=True)
    page_config = tmp_path / "config" / "labconfig" / "page_config.json"
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "data"))
    monkeypatch.setenv("JUPYTER_CONFIG_PATH", str(tmp_path / "config"))
    page_config.write_text(json.dumps({"disabledExtensions": {}}))
    assert [c.status for c in check_lab_extension(Context(None, None))] == ["ok"]
    page_config.write_text(json.dumps({"disabledExtensions": disabled}))
    [check] = check_lab_extension(Context(None, None))
    assert check.status == "fail" and check.found == f"jupyter-gpujobs is disabled in {page_config}"
    assert check.todo == "jupyter labextension enable jupyter-gpujobs"


def test_a_bad_setting_is_named_by_the_api_the_cli_and_doctor(live_server: Any) -> None:
    """A server started with a setting the extension cannot take still answers its API routes:
    503 with the setting, the value and the fix (doctor once sent the user to `jupyter server
    extension list`, which said all was well)."""
    import time

    import httpx

    server = live_server(start=False, extra_args=["--GPUJobs.default_time_limit=banana"])
    server.proc = subprocess.Popen([sys.executable, "-m", "jupyter_server", *server.args], cwd=server.root,
                                   env=server.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   start_new_session=True)
    auth = {"Authorization": f"token {server.token}"}
    deadline = time.monotonic() + 60
    while True:
        assert server.proc.poll() is None and time.monotonic() < deadline, "the server did not come up"
        try:
            r = httpx.get(server.url + "gpujobs/api/jobs", headers=auth, timeout=2)
            break
        except httpx.HTTPError:
            time.sleep(0.2)
    assert r.status_code == 503, r.text
    said = r.json()["message"]
    assert "c.GPUJobs.default_time_limit" in said and "banana" in said and "restart the server" in said
    assert httpx.get(server.url + "gpujobs/api/jobs", timeout=2).status_code == 403  # only to its users

    listed = server.cli("list")
    assert listed.returncode == 1 and "default_time_limit" in listed.stderr and "Traceback" not in listed.stderr
    engine = rows(server.cli("doctor").stdout)["engine"]
    assert engine[0].startswith("FAIL found (--url), but jupyter-gpujobs did not start"), engine
    assert "banana" in engine[0] and "extension list" not in " ".join(engine)
