"""The events websocket under many listeners (issue 32): a message is encoded once for all the
websockets that see it whole and once for those that see its job's queue view only, and the
GPUs' message is made once for all of them; each viewer still gets what they may see. On the
in-process server with several users (tests/identity.py) and private data."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import pytest
from identity import token_users_config

PY = sys.executable
TOKENS = {"tok-alice": "alice", "tok-bob": "bob", "tok-boss": "boss"}


@pytest.fixture
def gpujobs_config(gpujobs_config: dict[str, Any]) -> dict[str, Any]:
    return {**gpujobs_config, "user_identity": "jupyter", "admin_users": ["boss"], "private_data": True}


@pytest.fixture
def jp_server_config(jp_server_config: dict[str, Any]) -> dict[str, Any]:
    return token_users_config(jp_server_config, TOKENS, "tok-alice")  # the fixtures' own token is alice's


async def job_messages(ws: Any, job_id: int, state: str, timeout: float = 20) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        assert left > 0, f"no {state} message of job {job_id} on the websocket"
        raw = await asyncio.wait_for(ws.read_message(), left)
        assert raw is not None, "the websocket closed"
        msg = json.loads(raw)
        if msg["type"] == "job" and msg["job"]["id"] == job_id and msg["event"]["state"] == state:
            return msg


async def test_each_viewer_gets_their_view_of_one_message(api: Any, events_sockets: Any) -> None:
    # sockets of others before and after the owner's: the whole message and the queue view
    # are encoded once each, whatever order the websockets are served in
    order = ["tok-bob", "tok-alice", "tok-bob", "tok-boss", "tok-alice", "tok-bob"]
    feeds = [await events_sockets(token) for token in order]
    status, job = await api("POST", "jobs", {"command": [PY, "-c", "print('secret-arg')", "secret-arg"],
                                             "gpus": 0, "name": "secret-name"})
    assert status == 201, job
    for token, ws in zip(order, feeds):
        msg = await job_messages(ws, job["id"], "COMPLETED")
        whole = token in ("tok-alice", "tok-boss")  # its owner and an admin
        assert msg["job"]["state"] == "COMPLETED"
        assert ("secret-arg" in json.dumps(msg)) is whole, (token, msg)
        assert msg["job"].get("private", False) is not whole, (token, msg)


async def test_the_gpus_message_is_shared(api: Any, events_sockets: Any) -> None:
    a, b = await events_sockets("tok-bob"), await events_sockets("tok-alice")
    first = [json.loads(await asyncio.wait_for(ws.read_message(), 10)) for ws in (a, b)]
    assert [m["type"] for m in first] == ["gpus", "gpus"] and first[0] == first[1]
    assert len(first[0]["gpus"]) > 0


async def test_a_cached_queue_page_carries_its_own_etag(api: Any, jp_fetch: Any) -> None:
    # the page's ETag is made with the page (not hashed again for every poll): it is the hash
    # of what is served, and a client that has the page gets 304
    import hashlib

    from tornado.httpclient import HTTPClientError

    later = {"command": [PY, "-c", "pass"], "gpus": 1, "begin": "+1h"}
    for _ in range(3):
        assert (await api("POST", "jobs", later))[0] == 201
    first = await jp_fetch("gpujobs", "api", "queue")
    while True:  # until the first cycle has given the jobs their reasons: the page stays the same
        again = await jp_fetch("gpujobs", "api", "queue")
        assert again.headers["Etag"] == f'"{hashlib.sha1(again.body).hexdigest()}"'
        if again.body == first.body:
            break
        first = again
    etag = again.headers["Etag"]
    assert first.headers["Etag"] == etag and len(json.loads(first.body)["jobs"]) == 3
    for _ in range(20):  # (a cycle may change the page between two requests: then ask again)
        try:
            changed = await jp_fetch("gpujobs", "api", "queue", headers={"If-None-Match": etag})
        except HTTPClientError as err:
            assert err.code == 304
            break
        assert changed.body != again.body, "a 200 for the very page the client has, not a 304"
        again, etag = changed, changed.headers["Etag"]
    else:
        raise AssertionError("the queue page changed at every request")
    # a new job: a new page, with its own ETag
    assert (await api("POST", "jobs", later))[0] == 201
    fresh = await jp_fetch("gpujobs", "api", "queue")
    assert len(json.loads(fresh.body)["jobs"]) == 4
    assert fresh.headers["Etag"] == f'"{hashlib.sha1(fresh.body).hexdigest()}"' != etag
