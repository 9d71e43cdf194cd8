"""Expected starts that say what they are, on a real server with the monitor and fake GPUs.

With no history an expected start is a bound from the time limits of the jobs ahead ("by
14:05 at the latest"); once the monitor has seen jobs like the one running, it is a
prediction from their runtimes ("about 13:40"), and the API says which (`expected_start_kind`)."""

from __future__ import annotations

import sys
import time
from typing import Any

import pytest
from servers import wait_for

PY = sys.executable


@pytest.fixture
def gpujobs_config(gpujobs_config: dict[str, Any]) -> dict[str, Any]:
    # the monitor fixture drains GPUs 0 and 1 (other test runs use them): GPU 2 is the one left
    return {**gpujobs_config, "fake_gpus": "3xA100", "estimate_interval": 0.5}


async def submit(api: Any, seconds: float, **spec: Any) -> dict[str, Any]:
    body = {"command": [PY, "-c", f"import time; time.sleep({seconds})"], "gpus": 1, "time_limit": "10m", **spec}
    status, job = await api("POST", "jobs", body)
    assert status == 201, job
    return job


async def view(api: Any, job_id: int) -> dict[str, Any]:
    status, job = await api("GET", f"jobs/{job_id}")
    assert status == 200, job
    return job


async def test_an_expected_start_is_a_bound_until_history_makes_it_a_prediction(api: Any, engine: Any,
                                                                                 monitor: Any) -> None:
    # no history: the waiting job is expected when the blocker's time limit ends, at the latest
    blocker = await submit(api, 30, name="blocker")

    async def running(job_id: int) -> Any:
        job = await view(api, job_id)
        return job if job["state"] == "RUNNING" else None

    b = await wait_for(lambda: running(blocker["id"]), timeout=20)
    waiting = await submit(api, 1, name="next")

    async def estimated() -> Any:
        job = await view(api, waiting["id"])
        return job if job["expected_start"] is not None else None

    w = await wait_for(estimated, timeout=10)
    assert w["expected_start_kind"] == "bound"
    assert abs(w["expected_start"] - (b["started_at"] + 600)) < 2
    await api("DELETE", f"jobs/{blocker['id']}")
    await api("DELETE", f"jobs/{waiting['id']}")

    # three quick runs of "quick" teach the monitor that it takes about a second
    for _ in range(3):
        job = await submit(api, 0.5, name="quick")

        async def done(job_id: int = job["id"]) -> Any:
            j = await view(api, job_id)
            return j if j["state"] == "COMPLETED" else None

        await wait_for(done, timeout=30)

    # a "quick" one that runs long: the job behind it is predicted to start about when
    # "quick" runs end, long before the bound its time limit gives
    slow = await submit(api, 30, name="quick")
    s = await wait_for(lambda: running(slow["id"]), timeout=20)
    behind = await submit(api, 1, name="next")

    async def predicted() -> Any:
        job = await view(api, behind["id"])
        return job if job["expected_start_kind"] == "prediction" else None

    p = await wait_for(predicted, timeout=10)
    assert p["state"] == "PENDING" and p["expected_start"] < s["started_at"] + 600 - 60
    assert p["expected_start"] < time.time() + 60
    status, queue = await api("GET", "queue")
    assert status == 200
    assert [j["expected_start_kind"] for j in queue["jobs"] if j["id"] == behind["id"]] == ["prediction"]
    for i in (slow["id"], behind["id"]):
        await api("DELETE", f"jobs/{i}")
