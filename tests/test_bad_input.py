"""Bad input over HTTP gets a 4xx whose message names the field, and nothing stored changes."""

from __future__ import annotations

import json
from typing import Any

import pytest

GOOD = {"command": ["python", "-c", "pass"], "gpus": 1}

CASES = [
    ({**GOOD, "gpus": -1}, 400, "gpus", "negative"),
    ({**GOOD, "gpus": 0.5}, 400, "gpus", "whole number"),
    ({**GOOD, "gpus": 3}, 400, "gpus", "only 2"),
    ({**GOOD, "gpu_type": "H100"}, 400, "gpu_type", "no H100 GPUs"),
    ({**GOOD, "time_limit": "ten minutes"}, 400, "time_limit", "cannot read duration"),
    ({**GOOD, "time_limit": -5}, 400, "time_limit", "positive"),
    ({**GOOD, "priority": "asap"}, 400, "priority", "unknown priority"),
    ({**GOOD, "gpu": 1}, 400, "gpu", "unknown field"),
    ({**GOOD, "depends": "afterok:999"}, 400, "depends", "no job 999"),
    ({**GOOD, "cwd": "/no/such/dir"}, 400, "cwd", "no such directory"),
    ([1, 2], 400, "body", "JSON object"),
]


@pytest.mark.parametrize("body,status,field,words", CASES, ids=[c[2] + "-" + c[3].split()[0] for c in CASES])
async def test_bad_submission(api: Any, engine: Any, body: Any, status: int, field: str, words: str) -> None:
    await api("POST", "jobs", {**GOOD, "begin": "+1d"})  # something already stored, kept waiting
    before = engine.store.list_jobs(limit=1000)[0]
    got, reply = await api("POST", "jobs", body)
    assert got == status, reply
    assert reply["field"] == field
    assert words in reply["message"]
    after = engine.store.list_jobs(limit=1000)[0]
    assert [(j.id, j.state) for j in after] == [(j.id, j.state) for j in before]


async def test_non_json_body(api: Any, engine: Any) -> None:
    got, reply = await api("POST", "jobs", raw=b"{not json")
    assert got == 400 and reply["field"] == "body" and "not valid JSON" in reply["message"]
    assert engine.store.list_jobs()[0] == []


async def test_oversized_body(api: Any, engine: Any) -> None:
    big = json.dumps({**GOOD, "name": "x" * (2 << 20)}).encode()
    got, reply = await api("POST", "jobs", raw=big)
    assert got == 413 and reply["field"] == "body" and "over the limit" in reply["message"]
    assert engine.store.list_jobs()[0] == []


async def test_bad_ids_and_unknown_jobs(api: Any) -> None:
    assert (await api("GET", "jobs/abc"))[0] == 400
    got, reply = await api("GET", "jobs/4242")
    assert got == 404 and "no job 4242" in reply["message"]
    assert (await api("DELETE", "jobs/4242"))[0] == 404
    status, job = await api("POST", "jobs", {**GOOD, "begin": "+1d"})
    got, reply = await api("GET", f"jobs/{job['id']}/log", params={"offset": "-3"})
    assert got == 400 and reply["field"] == "offset" and "at least 0" in reply["message"]
    got, reply = await api("GET", "jobs", params={"limit": "many"})
    assert got == 400 and reply["field"] == "limit"
