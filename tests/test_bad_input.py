"""Bad input over HTTP gets a 4xx whose message names the field, and nothing stored changes."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

GOOD = {"command": ["python", "-c", "pass"], "gpus": 1}

CASES = [
    ({**GOOD, "gpus": -1}, 400, "gpus", "negative"),
    ({**GOOD, "gpus": 2.5}, 400, "gpus", "whole number"),
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
    assert got == 400 and reply["field"] == "offset" and "between 0 and" in reply["message"]
    got, reply = await api("GET", "jobs", params={"limit": "many"})
    assert got == 400 and reply["field"] == "limit"


# --------------------------------------------------------------------- values out of range

HUGE = str(1 << 63)  # one past the largest id a database column holds

OUT_OF_RANGE = [
    ({**GOOD, "begin": 1e20}, "begin", "between 1970"),
    ({**GOOD, "begin": -1e20}, "begin", "between 1970"),
    ({**GOOD, "begin": "+99999999999999999999d"}, "begin", "longer than the maximum"),
    ({**GOOD, "begin": "+400d"}, "begin", "ahead"),
    ({**GOOD, "begin": "9999-12-31T00:00"}, "begin", "between 1970"),
    ({**GOOD, "time_limit": 1e30}, "time_limit", "longer than the maximum"),
    ({**GOOD, "time_limit": "99999999999999999999h"}, "time_limit", "longer than the maximum"),
    ({**GOOD, "gpus": 1e30}, "gpus", "more than"),
    ({**GOOD, "array": "0-100000000"}, "array", "largest allowed"),
    ({**GOOD, "array": "0-99999,0-5"}, "array", "array tasks allowed"),
    ({**GOOD, "array": "99999999999999999999-99999999999999999999"}, "array", "cannot read"),
    ({**GOOD, "array": "0-3%" + "9" * 5000}, "array", "characters"),
    ({**GOOD, "depends": [1 << 63]}, "depends", "between 1 and"),
    ({**GOOD, "depends": f"afterok:{HUGE}"}, "depends", "between 1 and"),
    ({**GOOD, "depends": list(range(1, 2002))}, "depends", "dependencies"),
    ({**GOOD, "name": "evil\x1b[2J\x1b[31mname"}, "name", "control character"),
    ({**GOOD, "name": "a\x00b"}, "name", "control character"),
    ({**GOOD, "name": "txt.\u202egnp"}, "name", "control character"),
    ({**GOOD, "command": ["echo", "a\x00b"]}, "command", "NUL"),
    ({**GOOD, "cwd": "../../../etc"}, "cwd", "outside the server's root"),
    ({**GOOD, "kind": ["script"]}, "kind", "unknown kind"),
]


@pytest.mark.parametrize("body,field,words", OUT_OF_RANGE, ids=[f"{c[1]}-{i}" for i, c in enumerate(OUT_OF_RANGE)])
async def test_out_of_range_submission(api: Any, engine: Any, body: Any, field: str, words: str) -> None:
    """A value that parses but is out of range is refused before anything is stored, and the
    queue goes on scheduling (a begin of 1e20 used to stop every cycle)."""
    got, reply = await api("POST", "jobs", body)
    assert got == 400, reply
    assert reply["field"] == field and words in reply["message"], reply
    assert engine.store.list_jobs()[0] == []
    status, job = await api("POST", "jobs", {"command": ["true"], "gpus": 0})
    assert status == 201


@pytest.mark.parametrize("raw,field", [
    (b'{"command": "true", "begin": Infinity}', "begin"),
    (b'{"command": "true", "begin": NaN}', "begin"),
    (b'{"command": "true", "time_limit": 1e400}', "time_limit"),
    (b'{"command": "true", "time_limit": -Infinity}', "time_limit"),
    (b'{"command": "true", "payload": {"x": [1, 2, NaN]}}', "payload.x[2]"),
    (b'{"command": "true", "gpus": 1' + b"0" * 5000 + b"}", "body"),
])
async def test_non_finite_numbers(api: Any, engine: Any, raw: bytes, field: str) -> None:
    got, reply = await api("POST", "jobs", raw=raw)
    assert got == 400 and reply["field"] == field, reply
    assert engine.store.list_jobs()[0] == []


@pytest.mark.parametrize("depth", [33, 1000, 200_000])
async def test_deeply_nested_body(api: Any, engine: Any, depth: int) -> None:
    raw = b'{"command": "true", "payload": {"x": ' + b"[" * depth + b"]" * depth + b"}}"
    got, reply = await api("POST", "jobs", raw=raw)
    assert got == 400 and reply["field"] == "body" and "deeper than 32" in reply["message"], reply
    assert engine.store.list_jobs()[0] == []


async def test_a_huge_array_is_refused_at_once(api: Any, engine: Any) -> None:
    """The size of an array is checked before it is expanded: no stall, no gigabytes."""
    started = time.perf_counter()
    got, reply = await api("POST", "jobs", {**GOOD, "array": "0-1000000"})
    assert got == 400 and reply["field"] == "array"
    assert time.perf_counter() - started < 2.0
    got, reply = await api("POST", "jobs", {**GOOD, "array": "0-9999:1000%2", "begin": "+1d"})
    assert got == 201 and len(reply["array_tasks"]) == 10


async def test_a_huge_command_is_refused_before_it_is_split(api: Any, engine: Any) -> None:
    """A 1 MB command string once held the server for everyone for ~40 s while it was split (a
    word grew a character at a time): its size is checked first, and a long one that is allowed
    is split in one pass, to the same words as a shell."""
    got, reply = await api("POST", "jobs", {**GOOD, "command": "echo " + "x" * 1_000_000})
    assert got == 400 and reply["field"] == "command" and "65,536 allowed" in reply["message"], reply
    got, reply = await api("POST", "jobs", {**GOOD, "command": ["echo"] * 5000})
    assert got == 400 and reply["field"] == "command" and "4,096 words" in reply["message"], reply
    assert engine.store.list_jobs()[0] == []
    long_word = "y" * 60_000
    got, reply = await api("POST", "jobs", {**GOOD, "begin": "+1d",
                                            "command": f"echo 'a b' \"{long_word}\" c\\ d"})
    assert got == 201, reply
    assert reply["command"] == ["echo", "a b", long_word, "c d"]


ID_ROUTES = [("GET", "jobs/{}"), ("DELETE", "jobs/{}"), ("GET", "jobs/{}/log"), ("GET", "jobs/{}/events"),
             ("POST", "jobs/{}/end"), ("GET", "jobs/{}/stats")]


async def test_bad_ids_on_every_route(api: Any) -> None:
    for method, route in ID_ROUTES:
        for bad in (HUGE, "9" * 30, "0", "-1", "1e3", "\u0661\u0662"):
            got, reply = await api(method, route.format(bad))
            assert got == 400 and reply["field"] == "id", (method, route, bad, got, reply)


@pytest.mark.parametrize("path,params,field", [
    ("jobs", {"cursor": HUGE}, "cursor"),
    ("jobs", {"cursor": "9" * 5000}, "cursor"),
    ("jobs", {"kind": "nope"}, "kind"),
    ("jobs", {"user": "x" * 300}, "user"),
    ("queue", {"offset": HUGE}, "offset"),
    ("queue", {"limit": "0"}, "limit"),
    ("findings", {"job": HUGE}, "job"),
    ("usage", {"since": "NaN"}, "since"),
    ("usage", {"since": "inf"}, "since"),
    ("usage", {"until": "1e400"}, "until"),
    ("usage/heatmap", {"since": "-Infinity"}, "since"),
    ("gpus/samples", {"since": "nan"}, "since"),
])
async def test_bad_query_arguments(api: Any, path: str, params: dict[str, str], field: str) -> None:
    got, reply = await api("GET", path, params=params)
    assert got == 400 and reply["field"] == field, (got, reply)


async def test_log_offset_past_2_63(api: Any) -> None:
    status, job = await api("POST", "jobs", {**GOOD, "begin": "+1d"})
    got, reply = await api("GET", f"jobs/{job['id']}/log", params={"offset": HUGE})
    assert got == 400 and reply["field"] == "offset"


@pytest.mark.parametrize("quota,words", [
    ({"max_gpus": -5}, "between 0 and"),
    ({"guaranteed_gpus": 1e30}, "between 0 and"),
    ({"max_gpus": "lots"}, "whole number"),
    ({"max_running_jobs": [1]}, "whole number"),
    ({"max_gpus": 1.5}, "whole number"),
    ({"elastic": "no"}, "true or false"),
    ({"max_time_limit": "99999999999999999999d"}, "longer than the maximum"),
])
async def test_bad_quota_values(api: Any, engine: Any, quota: dict[str, Any], words: str) -> None:
    got, reply = await api("PUT", "quota", {"scope": "users", "name": "alice", "quota": quota})
    assert got == 400 and reply["field"] == "quota" and words in reply["message"], reply
    assert "alice" not in engine.current_policy().user_quotas


async def test_replies_are_strict_json(api: Any) -> None:
    """No answer holds NaN or Infinity (which JSON parsers other than Python's refuse)."""
    await api("POST", "jobs", {**GOOD, "begin": "+1d"})

    for path in ("jobs", "queue", "gpus", "quota", "whoami"):
        got, reply = await api("GET", path)
        assert got == 200
        json.dumps(reply, allow_nan=False)


async def test_cwd_is_normalised(api: Any, engine: Any, jp_root_dir: Path) -> None:
    """A relative cwd is taken from the server's root and stays in it; an absolute one (the
    CLI sends the shell's directory) is kept, normalised."""
    (jp_root_dir / "proj" / "sub").mkdir(parents=True)
    status, job = await api("POST", "jobs", {**GOOD, "begin": "+1d", "cwd": "proj/sub/../sub/."})
    assert status == 201 and job["cwd"] == str(jp_root_dir / "proj" / "sub")
    status, job = await api("POST", "jobs", {**GOOD, "begin": "+1d", "cwd": str(jp_root_dir / "proj") + "//sub/.."})
    assert status == 201 and job["cwd"] == str(jp_root_dir / "proj")
    (jp_root_dir / "out").symlink_to("/etc")
    got, reply = await api("POST", "jobs", {**GOOD, "cwd": "out"})
    assert got == 400 and reply["field"] == "cwd" and "outside" in reply["message"]
