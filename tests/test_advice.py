"""Right-sizing advice on a real server with several users (tests/identity.py) and the monitor
sampling fake GPUs: from the asking user's OWN finished jobs of the same name - what they used
(peak GPU memory, mean utilization, run time) against what is asked - in a what-if and in the
owner's `GET jobs/<id>`; another user's jobs of that name never count, and never see it.

Same setup as test_monitor_api.py: fake GPUs 4xA100 (40 GB) watched every 0.3 s, GPUs 0 and 1
drained (other test runs use them), real job processes that declare their GPU use."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
from identity import token_users_config
from servers import wait_for
from tornado.httpclient import HTTPClientError

PY = sys.executable
TOKENS = {"tok-alice": "alice", "tok-bob": "bob", "tok-carol": "carol"}


@pytest.fixture
def gpujobs_config(gpujobs_config: dict[str, Any]) -> dict[str, Any]:
    return {**gpujobs_config, "fake_gpus": "4xA100", "sample_interval": 0.3, "user_identity": "jupyter"}


@pytest.fixture
def jp_server_config(jp_server_config: dict[str, Any]) -> dict[str, Any]:
    return token_users_config(jp_server_config, TOKENS, "tok-alice")  # the fixtures' own token is alice's


@pytest.fixture
def api_as(jp_fetch: Any, engine: Any) -> Any:
    """`await api_as("tok-bob", "GET", "jobs/1")` -> (status, JSON)."""
    async def call(token: str, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None) -> Any:
        try:
            r = await jp_fetch("gpujobs", "api", *path.split("/"), method=method, params=params or {},
                               body=json.dumps(body) if body is not None else None,
                               headers={"Authorization": f"token {token}"})
        except HTTPClientError as err:
            assert err.response is not None
            return err.code, json.loads(err.response.body or b"null")
        return r.code, json.loads(r.body or b"null")

    return call


def using(mem_mb: int, util: int) -> list[str]:
    """A job whose child process declares this GPU use for 1.5 s (the parent declares none:
    see test_monitor_api.in_child)."""
    env = {"GPUJOBS_FAKE_MEM_MB": str(mem_mb), "GPUJOBS_FAKE_UTIL": str(util)}
    return [PY, "-c", "import os, subprocess, sys\n"
            f"sys.exit(subprocess.call([sys.executable, '-c', 'import time; time.sleep(1.5)'], "
            f"env={{**os.environ, **{env!r}}}))"]


async def finished_with_stats(api_as: Any, token: str, mem_mb: int, util: int) -> int:
    status, job = await api_as(token, "POST", "jobs", {"command": using(mem_mb, util), "gpus": 1, "time_limit": "4h",
                                                       "name": "train", "env": {"GPUJOBS_FAKE_MEM_MB": "0",
                                                                                "GPUJOBS_FAKE_UTIL": "0"}})
    assert status == 201, job

    async def done() -> Any:
        _, view = await api_as(token, "GET", f"jobs/{job['id']}")
        if view["state"] != "COMPLETED":
            assert view["state"] in ("PENDING", "RUNNING"), view
            return None
        _, stats = await api_as(token, "GET", f"jobs/{job['id']}/stats")
        return stats if stats.get("final") and stats.get("memory_max_mb") == mem_mb else None

    await wait_for(done, timeout=30)
    return int(job["id"])


async def test_advice_from_own_history_only(api_as: Any, monitor: Any) -> None:
    mine = [await finished_with_stats(api_as, "tok-alice", 3000, 15) for _ in range(2)]
    theirs = await finished_with_stats(api_as, "tok-bob", 30000, 90)
    ask = {"command": ["python", "train.py"], "gpus": 1, "time_limit": "4h", "name": "train"}

    status, answer = await api_as("tok-alice", "POST", "jobs", ask, params={"dry_run": "1"})
    assert status == 200, answer
    advice = answer["advice"]
    assert advice["runs"] == 2 and sorted(advice["job_ids"]) == sorted(mine), "alice's runs only"
    assert advice["peak_gpu_memory_mb"] == 3000, "bob's 30 GB run is not alice's history"
    assert 0 < advice["mean_utilization"] <= 15
    assert advice["suggest"] == {"gpus": 0.25, "time_limit_s": 600}
    assert advice["text"].startswith("2 earlier runs: used <= 2.9 GB, ran <= ")
    assert advice["text"].endswith(": a 0.25 share with 10m would start now"), advice["text"]
    assert answer["expected_start"] is not None, "the request itself is answered as asked"
    assert answer["request"]["gpus"] == 1 and answer["request"]["time_limit_s"] == 4 * 3600, "never changed"

    status, answer = await api_as("tok-bob", "POST", "jobs", ask, params={"dry_run": "1"})
    assert answer["advice"]["runs"] == 1 and answer["advice"]["job_ids"] == [theirs]
    assert answer["advice"]["suggest"] == {"time_limit_s": 600}, "30 GB fits no 0.5 share of 40 GB with room"

    status, answer = await api_as("tok-carol", "POST", "jobs", ask, params={"dry_run": "1"})
    assert status == 200 and answer["advice"] is None, "no runs of that name: no advice"

    # in show: to the owner, from their other runs; another user sees no advice
    asked = {"advice": "1"}
    status, view = await api_as("tok-alice", "GET", f"jobs/{mine[0]}", params=asked)
    assert view["advice"]["runs"] == 1 and view["advice"]["job_ids"] == [mine[1]]
    status, view = await api_as("tok-alice", "GET", f"jobs/{mine[0]}")
    assert status == 200 and "advice" not in view, "only when asked: clients poll this view"
    status, view = await api_as("tok-bob", "GET", f"jobs/{mine[0]}", params=asked)
    assert status == 200 and "advice" not in view
    status, view = await api_as("tok-bob", "GET", f"jobs/{theirs}", params=asked)
    assert view["advice"] is None, "bob's only run of the name: nothing else to learn from"
