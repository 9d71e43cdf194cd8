"""`jupyter gpujobs ...` against a live server: tables, JSON, following logs, clear errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from servers import free_port

PY = sys.executable


def test_cli_round_trip(live_server: Any) -> None:
    server = live_server(fake_gpus="2xA100")
    gpus = server.cli("gpus")
    assert gpus.returncode == 0, gpus.stderr
    assert gpus.stdout.splitlines()[0].split() == ["GPU", "MODEL", "UTIL", "MEMORY", "HELD", "BY"]
    assert gpus.stdout.count("A100") == 2 and gpus.stdout.count("free") == 2

    go = server.root / "go"  # big holds both GPUs until the test has seen small wait (no race with a busy machine)
    out = server.cli("submit", "-g", "2", "-t", "30s", "--name", "big", "--json", "--",
                     PY, "-c", "import os, time; print(os.environ['CUDA_VISIBLE_DEVICES'])\n"
                     f"while not os.path.exists({str(go)!r}): time.sleep(0.05)")
    assert out.returncode == 0, out.stderr
    big = json.loads(out.stdout)
    assert big["name"] == "big" and big["gpus"] == 2 and big["time_limit_s"] == 30

    out = server.cli("submit", "-g", "1", "--name", "small", "--", PY, "-c", "print('small')")
    assert out.returncode == 0 and out.stdout.startswith("job ")
    small_id = int(out.stdout.split()[1])

    time.sleep(0.5)
    queue = server.cli("queue")
    assert "small" in queue.stdout and "waiting for" in queue.stdout, queue.stdout
    go.touch()

    follow = server.cli("log", "-f", str(big["id"]))
    assert follow.returncode == 0
    assert follow.stdout.strip() == "0,1"

    show = server.cli("show", str(big["id"]))
    assert "COMPLETED" in show.stdout and "RUNNING" in show.stdout and "PENDING" in show.stdout

    listing = server.cli("list")
    assert "big" in listing.stdout and "small" in listing.stdout

    deadline = time.monotonic() + 10
    while "COMPLETED" not in server.cli("show", str(small_id)).stdout:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert server.cli("log", str(small_id)).stdout == "small\n"

    long = server.cli("submit", "--", PY, "-c", "import time; time.sleep(60)")
    long_id = long.stdout.split()[1]
    cancel = server.cli("cancel", long_id)
    assert cancel.returncode == 0 and "CANCELLED" in cancel.stdout


def test_cli_errors_are_one_line(live_server: Any) -> None:
    server = live_server(fake_gpus="2xA100")
    cases = [
        (["submit", "-g", "-1", "--", "x"], 1, "gpus"),
        (["submit", "-g", "1.5", "--", "x"], 1, "ask for a whole number of GPUs (e.g. 2) or a share of one GPU"),
        (["submit", "-g", "half", "--", "x"], 2, "--gpus"),
        (["submit", "-t", "soon", "--", "x"], 1, "time_limit"),
        (["submit", "--type", "H100", "--", "x"], 1, "no H100"),
        (["submit", "-g", "1"], 2, "give the command after --"),
        (["show", "999"], 1, "no job 999"),
        (["cancel", "999"], 1, "no job 999"),
        (["frobnicate"], 2, "invalid choice"),
    ]
    for args, code, words in cases:
        r = server.cli(*args)
        assert r.returncode == code, (args, r.stdout, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert words in r.stderr, (args, r.stderr)
    assert json.loads(server.cli("list", "--all", "--json").stdout) == []


def test_cli_finds_the_running_server(live_server: Any) -> None:
    server = live_server(fake_gpus="1xT4")
    env = dict(server.env)
    r = subprocess.run([PY, "-m", "jupyter_gpujobs.cli", "gpus"], env=env, capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    assert "T4" in r.stdout
    env["JUPYTER_RUNTIME_DIR"] = os.path.join(str(server.root), "empty-runtime")
    r = subprocess.run([PY, "-m", "jupyter_gpujobs.cli", "gpus"], env=env, capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 1 and "no running Jupyter server" in r.stderr


def test_cli_skips_servers_that_are_gone_or_without_the_engine(live_server: Any, tmp_path: Any) -> None:
    """Newer info files in the runtime dir, one left by a server whose process is gone and one
    of a live process with no jupyter-gpujobs behind its URL, do not hide the engine; of two
    engines, the newest file's is used; with only the non-engine one the CLI says what it
    found. Finding the engine does not load the Jupyter server application, whose imports
    alone took two seconds of every CLI call."""
    server = live_server(fake_gpus="1xT4")
    runtime = Path(server.env["JUPYTER_RUNTIME_DIR"])
    [own_file] = runtime.glob("jpserver-*.json")
    own = json.loads(own_file.read_text())
    dead = subprocess.run([PY, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout
    nowhere = f"http://127.0.0.1:{free_port()}/"
    stale = {"pid": int(dead), "url": nowhere, "token": "x"}
    other = {"pid": os.getpid(), "url": nowhere, "token": "x"}
    for name, info in (("jpserver-1.json", stale), ("jpserver-2.json", other)):
        (runtime / name).write_text(json.dumps(info))
    later = time.time() + 60
    for name in ("jpserver-1.json", "jpserver-2.json"):
        os.utime(runtime / name, (later, later))
    (runtime / "jpserver-3.json").write_text("{half written")
    probe = ("import sys; from jupyter_gpujobs.cli import run; run(['gpus']); "
             "print('server app loaded' if 'jupyter_server.serverapp' in sys.modules else 'lean')")
    r = subprocess.run([PY, "-c", probe], env=server.env, capture_output=True, text=True, timeout=30)
    assert "T4" in r.stdout and r.stdout.splitlines()[-1] == "lean", (r.stdout, r.stderr)

    # two engines answer: the newest info file wins (here the same server under another name)
    alias = own["url"].replace("127.0.0.1", "localhost") if "127.0.0.1" in own["url"] \
        else own["url"].replace("localhost", "127.0.0.1")
    assert alias != own["url"], own
    (runtime / "jpserver-4.json").write_text(json.dumps({**own, "pid": os.getpid(), "url": alias}))
    where = "from jupyter_gpujobs.client import find_server; print(find_server()[0])"
    for stamp, chosen in ((later + 60, alias), (0, own["url"])):
        os.utime(runtime / "jpserver-4.json", (stamp, stamp))
        r = subprocess.run([PY, "-c", where], env=server.env, capture_output=True, text=True, timeout=30)
        assert r.stdout.strip() == chosen.rstrip("/") + "/", (stamp, r.stdout, r.stderr)

    env = {**server.env, "JUPYTER_RUNTIME_DIR": str(tmp_path)}
    (tmp_path / "jpserver-2.json").write_text(json.dumps(other))
    r = subprocess.run([PY, "-m", "jupyter_gpujobs.cli", "gpus"], env=env, capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 1 and "none hosts jupyter-gpujobs" in r.stderr, r.stderr


def test_every_command_the_product_tells_users_to_run_exists() -> None:
    """Error messages, hints and docs that say `jupyter gpujobs CMD` name a command the CLI has."""
    import re

    from jupyter_gpujobs.cli import build_parser

    root = Path(__file__).resolve().parent.parent
    commands = next(a for a in build_parser()._actions if a.dest == "cmd").choices
    named: dict[str, set[str]] = {}
    for path in [*(root / "jupyter_gpujobs").rglob("*.py"), *(root / "docs").rglob("*.md"), root / "README.md"]:
        for word in re.findall(r"jupyter gpujobs ([a-z][a-z-]*)", path.read_text(encoding="utf-8")):
            named.setdefault(word, set()).add(str(path.relative_to(root)))
    assert "log" in named and "doctor" in named
    assert {w: where for w, where in named.items() if w not in commands} == {}
