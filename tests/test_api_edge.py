"""The edge of the API as users meet it: the queue a page at a time, hostile text shown escaped
in terminals, and list settings given on the command line read as people write them."""

from __future__ import annotations

import json
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from traitlets import TraitError

GOOD = {"command": ["python", "-c", "pass"], "gpus": 1, "begin": "+1d"}


async def test_queue_is_paged(api: Any) -> None:
    ids = []
    for i in range(5):
        status, job = await api("POST", "jobs", {**GOOD, "name": f"q{i}"})
        assert status == 201
        ids.append(job["id"])
    status, page = await api("GET", "queue", params={"limit": "2"})
    assert status == 200 and page["total"] == 5 and page["offset"] == 0 and page["next"] == 2
    assert [j["id"] for j in page["jobs"]] == ids[:2]
    status, last = await api("GET", "queue", params={"limit": "2", "offset": "4"})
    assert [j["id"] for j in last["jobs"]] == ids[4:] and last["next"] is None
    status, past = await api("GET", "queue", params={"offset": "50"})
    assert past["jobs"] == [] and past["total"] == 5
    status, far = await api("GET", "queue", params={"offset": str(2**63 - 2)})  # the largest offsets too
    assert status == 200 and far["jobs"] == [] and far["total"] == 5
    status, whole = await api("GET", "queue")
    assert [j["id"] for j in whole["jobs"]] == ids and whole["next"] is None
    status, nobody = await api("GET", "queue", params={"user": "nobody-else"})
    assert nobody == {"jobs": [], "total": 0, "held": 0, "offset": 0, "next": None}
    # a cancel shows in the next answer, whatever was served before
    assert (await api("DELETE", f"jobs/{ids[0]}"))[0] == 200
    status, page = await api("GET", "queue", params={"limit": "2"})
    assert page["total"] == 4 and [j["id"] for j in page["jobs"]] == ids[1:3]


def _db(server: Any) -> Path:
    found = list((Path(server.env["JUPYTER_DATA_DIR"])).rglob("*.sqlite")) + list(server.state_dir.rglob("*.sqlite"))
    assert found, "the server's SQLite store"
    return found[0]


def test_cli_shows_hostile_text_escaped(live_server: Any) -> None:
    """Names stored before names were checked, and commands (which may hold anything), reach
    other users' terminals escaped: no escape sequence, NUL or bidi control is printed raw."""
    server = live_server(fake_gpus="1xA100")
    client = server.client()
    evil = "\x1b]0;pwned\x07\x1b[2J\u202egnp.txt"
    refused = server.cli("submit", "--name", "a\x1b[31mb", "--", "true")
    assert refused.returncode == 1 and "control character" in refused.stderr and "\x1b" not in refused.stderr
    job = client.submit([sys.executable, "-c", "pass", evil], gpus=1, name="plain")
    client.wait(job["id"], timeout=30)
    with sqlite3.connect(_db(server)) as db:  # as a row written by an older version
        db.execute("UPDATE jobs SET name = ? WHERE id = ?", (evil, job["id"]))
    for args in (["list", "--all"], ["show", str(job["id"])]):
        out = server.cli(*args)
        assert out.returncode == 0, out.stderr
        for raw in ("\x1b", "\x07", "\u202e"):
            assert raw not in out.stdout, (args, out.stdout)
        assert "\\x1b" in out.stdout and "\\u202e" in out.stdout, out.stdout


def test_cli_queue_pages(live_server: Any) -> None:
    server = live_server(fake_gpus="1xA100")
    client = server.client()
    ids = [client.submit(["true"], gpus=1, begin="+1d")["id"] for _ in range(3)]
    time.sleep(0.5)
    out = server.cli("queue", "-n", "2")
    assert out.returncode == 0, out.stderr
    assert "jobs 1-2 of 3 pending; next page: --offset 2" in out.stdout
    out = server.cli("queue", "--offset", "2", "--json")
    page = json.loads(out.stdout)
    assert [j["id"] for j in page["jobs"]] == ids[2:] and page["total"] == 3 and page["next"] is None


def _settings(*argv: str) -> Any:
    """c.GPUJobs as a Jupyter server reads it from its command line: the server does not
    know the GPUJobs class when it parses, so each value arrives as text."""
    from jupyter_server.serverapp import ServerApp

    from jupyter_gpujobs.config import GPUJobs

    app = ServerApp()
    app.parse_command_line(list(argv))
    return GPUJobs(parent=app)


@pytest.mark.parametrize("arg,expected", [
    ('--GPUJobs.admin_users=["admin"]', ["admin"]),
    ("--GPUJobs.admin_users=['admin', 'root']", ["admin", "root"]),
    ("--GPUJobs.admin_users=admin,root", ["admin", "root"]),
    ("--GPUJobs.admin_users=admin", ["admin"]),
])
def test_admin_users_on_the_command_line(arg: str, expected: list[str]) -> None:
    assert _settings(arg).admin_users == expected


def test_list_and_dict_settings_on_the_command_line() -> None:
    s = _settings("--GPUJobs.rogue_ignore=Xorg,nvtop", "--GPUJobs.group_members=vision=alice,bob",
                  "--GPUJobs.user_shares=alice=2", "--GPUJobs.offpeak_windows=sat-sun,mon 20:00-23:00",
                  '--GPUJobs.user_quotas={"alice": {"max_gpus": 2}}')
    assert s.rogue_ignore == ["Xorg", "nvtop"]
    assert s.group_members == {"vision": ["alice", "bob"]}
    assert s.user_shares == {"alice": 2.0}
    assert s.offpeak_windows == ["sat-sun", "mon 20:00-23:00"]
    assert s.policy().user_quotas["alice"].max_gpus == 2


@pytest.mark.parametrize("arg,words", [
    ("--GPUJobs.admin_users=[admin", "cannot read"),
    ("--GPUJobs.user_shares=alice=lots", "expected a share"),
    ('--GPUJobs.user_quotas={"alice": {"max_gpus": -5}}', "between 0 and"),
    ('--GPUJobs.user_quotas={"alice": {"guaranteed_gpus": 1e30}}', "between 0 and"),
    ('--GPUJobs.default_user_quota={"max_gpus": "many"}', "whole number"),
])
def test_bad_settings_are_refused_by_name(arg: str, words: str) -> None:
    with pytest.raises(TraitError, match=words):
        _settings(arg)


async def test_gpu_samples_answer_a_bounded_number_of_readings(api: Any, monitor: Any) -> None:
    """`GET gpus/samples` without `step` answers at most MAX_SAMPLES readings, 400 naming `since`
    past that: `since=0` on a year of 8 GPUs' readings built an 80 MB answer on the engine's
    loop for 10 s, every user's request waiting."""
    from sqlalchemy import insert

    from jupyter_gpujobs.engine.api.monitor import MAX_SAMPLES
    from jupyter_gpujobs.engine.store.tables import GPUSampleRow

    now = time.time()
    per_gpu = MAX_SAMPLES // 4 + 1  # 5 GPUs' together are over the bound, one GPU's within it
    rows = [{"host": "elsewhere", "gpu_index": 100 + gpu, "resolution": 60, "time": now - 80000 + k * 10, "count": 1,
             "utilization": 50.0} for gpu in range(5) for k in range(per_gpu)]
    with monitor.store.session() as s:
        s.execute(insert(GPUSampleRow), rows)
        s.commit()
    status, out = await api("GET", "gpus/samples", params={"since": "1d"})
    assert status == 400 and out["field"] == "since" and f"more than {MAX_SAMPLES} readings" in out["message"], out
    status, out = await api("GET", "gpus/samples", params={"since": "1d", "gpu": "100", "resolution": "60"})
    assert status == 200 and len(out["samples"]) == per_gpu
    status, out = await api("GET", "gpus/samples", params={"since": "1d", "step": "3600"})
    assert status == 200 and out["step"] == 3600


async def test_a_report_over_history_leaves_the_engine_answering(api: Any, monitor: Any,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Reports that read a range of history (usage, heatmap, queue history, GPU readings,
    accounting) run off the engine's loop: over a year of history one took 1 to 3 s on it,
    every user's request and the scheduler waiting, and anyone may ask for them."""
    import asyncio
    import threading

    from jupyter_gpujobs.engine.api import monitor as handlers

    real = handlers.usage_report
    entered, go_on = threading.Event(), threading.Event()
    released: list[bool] = []

    def long_report(*args: Any, **kwargs: Any) -> Any:  # a report that lasts until the test says
        entered.set()
        released.append(go_on.wait(30))  # (on the engine's loop nothing answers meanwhile: it times out)
        return real(*args, **kwargs)

    monkeypatch.setattr(handlers, "usage_report", long_report)
    usage = asyncio.ensure_future(api("GET", "usage", params={"since": "30d"}))
    while not entered.is_set():
        await asyncio.sleep(0.01)
    assert (await api("GET", "whoami"))[0] == 200  # answered while the report runs
    go_on.set()
    status, out = await usage
    assert status == 200 and "rows" in out
    assert released == [True], "the report held the engine's loop: nothing was answered until it ended"
