"""The monitor's findings pushed over the events websocket, on a real server with several
users (tests/identity.py): the owner of the job and the admins hear of a finding as it opens
and closes; another user never does.

Same setup as test_monitor_api.py: fake GPUs 4xA100 watched every 0.3 s, GPUs 0 and 1
drained (other test runs use them), real job processes."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
from identity import token_users_config

PY = sys.executable
TOKENS = {"tok-alice": "alice", "tok-bob": "bob", "tok-boss": "boss"}


@pytest.fixture
def gpujobs_config(gpujobs_config: dict[str, Any]) -> dict[str, Any]:
    return {**gpujobs_config, "fake_gpus": "4xA100", "sample_interval": 0.3, "idle_hog_after": 2,
            "idle_hog_threshold": 5.0, "user_identity": "jupyter", "admin_users": ["boss"]}


@pytest.fixture
def jp_server_config(jp_server_config: dict[str, Any]) -> dict[str, Any]:
    return token_users_config(jp_server_config, TOKENS, "tok-alice")  # the fixtures' own token is alice's


async def read_until(ws: Any, match: Callable[[dict[str, Any]], bool], timeout: float = 15,
                     seen: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The first message that matches; every message read on the way goes to `seen`."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        assert left > 0, "no matching message on the websocket"
        raw = await asyncio.wait_for(ws.read_message(), left)
        assert raw is not None, "the websocket closed"
        msg = json.loads(raw)
        if seen is not None:
            seen.append(msg)
        if match(msg):
            return msg


def is_finding(kind: str, job_id: int, open_: bool) -> Callable[[dict[str, Any]], bool]:
    def match(msg: dict[str, Any]) -> bool:
        f = msg.get("finding") or {}
        return msg["type"] == "finding" and f["kind"] == kind and f["job_id"] == job_id and f["open"] is open_

    return match


async def submit(api: Any, command: list[str], **extra: Any) -> dict[str, Any]:
    status, body = await api("POST", "jobs", {"command": command, "gpus": 1, "time_limit": "1m", **extra})
    assert status == 201, body
    return body


async def saw_no_finding(api: Any, ws: Any) -> None:
    """Messages go out in order: once this socket carries the event of a job submitted after
    the findings, it would have carried them too."""
    seen: list[dict[str, Any]] = []
    marker = await submit(api, [PY, "-c", "pass"], gpus=0, name="marker")
    await read_until(ws, lambda m: m["type"] == "job" and m["job"]["id"] == marker["id"], seen=seen)
    assert [m for m in seen if m["type"] == "finding"] == []
    assert any(m["type"] == "job" for m in seen)  # jobs are news to everyone


async def test_idle_hog_reaches_its_owner_and_admins_only(api: Any, monitor: Any, events_sockets: Any) -> None:
    alice, bob, boss = await events_sockets("tok-alice"), await events_sockets("tok-bob"), await events_sockets("tok-boss")
    code = "import time; time.sleep(30)"
    job = await submit(api, [PY, "-c", f"import subprocess, sys; subprocess.call([sys.executable, '-c', {code!r}])"],
                       name="notebook-left-open")
    assert job["user"] == "alice"

    opened = await read_until(alice, is_finding("idle_hog", job["id"], True))
    f = opened["finding"]
    assert f["user"] == "alice" and f["severity"] == "warning" and "at ~0% utilization" in f["message"]
    status, body = await api("GET", "findings", params={"job": job["id"]})
    assert status == 200 and body["findings"] == [f]  # the same item as GET findings
    assert (await read_until(boss, is_finding("idle_hog", job["id"], True)))["finding"]["id"] == f["id"]

    # the condition goes away: the owner and the admin hear that it closed
    status, _ = await api("DELETE", f"jobs/{job['id']}")
    assert status == 200
    closed = (await read_until(alice, is_finding("idle_hog", job["id"], False)))["finding"]
    assert closed["id"] == f["id"] and closed["resolved_at"] is not None
    await read_until(boss, is_finding("idle_hog", job["id"], False))

    await saw_no_finding(api, bob)


async def test_out_of_memory_reaches_its_owner_not_another_user(api: Any, monitor: Any, events_sockets: Any) -> None:
    alice, bob = await events_sockets("tok-alice"), await events_sockets("tok-bob")
    job = await submit(api, [PY, "-c", "import sys\nprint('RuntimeError: CUDA out of memory. Tried to allocate 2 GiB')\n"
                                       "sys.exit(1)"], name="big")
    seen_by_alice: list[dict[str, Any]] = []
    f = (await read_until(alice, is_finding("oom", job["id"], True), seen=seen_by_alice))["finding"]
    assert f["severity"] == "error" and "ran out of GPU memory" in f["message"] and f["user"] == "alice"
    # the GPUs drained by the fixture are admins' findings, not alice's
    assert not [m for m in seen_by_alice if m["type"] == "finding" and m["finding"]["kind"] == "gpu_drained"]
    await saw_no_finding(api, bob)


async def test_admin_hears_of_a_drain_and_its_end(api: Any, monitor: Any, events_sockets: Any) -> None:
    boss, alice = await events_sockets("tok-boss"), await events_sockets("tok-alice")
    monitor.drain("localhost", 3, True, "boss", "fan noise")
    drained = (await read_until(boss, lambda m: m["type"] == "finding" and m["finding"]["kind"] == "gpu_drained"
                                and m["finding"]["gpu"] == 3))["finding"]
    assert drained["open"] and drained["severity"] == "info" and "fan noise" in drained["message"]
    monitor.drain("localhost", 3, False, "boss")
    undrained = (await read_until(boss, lambda m: m["type"] == "finding" and m["finding"]["id"] == drained["id"]))
    assert undrained["finding"]["open"] is False
    await saw_no_finding(api, alice)  # alice is no admin
