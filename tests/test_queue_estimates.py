"""Estimates and order between estimating cycles, on a real server with fake GPUs 2xA100.

The engine decides in every cycle but recalculates priorities and estimates every job's start
only every `estimate_interval` (here an hour), or within a second of new jobs that have none:
a user never sees a waiting job without an expected start for long, and a new urgent job goes
to the front of the queue at once."""

from __future__ import annotations

import sys
import time
from typing import Any

import pytest
from servers import wait_for

PY = sys.executable


@pytest.fixture
def gpujobs_config(gpujobs_config: dict[str, Any]) -> dict[str, Any]:
    # two reservations; everything behind them is "deep" and only estimated in estimating cycles
    return {**gpujobs_config, "fake_gpus": "2xA100", "reservation_depth": 2, "estimate_interval": 3600.0}


async def submit(api: Any, **spec: Any) -> dict[str, Any]:
    body = {"command": [PY, "-c", "import time; time.sleep(20)"], "gpus": 1, "time_limit": "1m", **spec}
    status, job = await api("POST", "jobs", body)
    assert status == 201, job
    return job


async def views(api: Any, ids: list[int]) -> list[dict[str, Any]]:
    out = []
    for i in ids:
        status, job = await api("GET", f"jobs/{i}")
        assert status == 200, job
        out.append(job)
    return out


async def test_deep_jobs_get_estimates_and_new_urgent_jobs_their_place(api: Any, engine: Any) -> None:
    running = [(await submit(api, name=f"r{i}"))["id"] for i in range(2)]

    async def both_running() -> Any:
        jobs = await views(api, running)
        return jobs if all(j["state"] == "RUNNING" for j in jobs) else None

    await wait_for(both_running, timeout=10)
    t0 = time.time()
    waiting = [(await submit(api, name=f"w{i}", time_limit=f"{2 + i}m"))["id"] for i in range(6)]

    async def all_estimated() -> Any:
        jobs = await views(api, waiting)
        return jobs if all(j["expected_start"] is not None for j in jobs) else None

    jobs = await wait_for(all_estimated, timeout=5)
    assert time.time() - t0 < 4, "estimates for new jobs within about a second, not an hour"
    assert [j["position"] for j in jobs] == [1, 2, 3, 4, 5, 6]
    # one job ends at a time on 2 GPUs: each waits for an earlier one's limit, in queue order
    starts = [j["expected_start"] for j in jobs]
    assert starts == sorted(starts) and starts[0] > t0 and starts[-1] > starts[1]
    assert [j["reason"] for j in jobs] == ["waiting for 1 free GPU"] * 6, [j["reason"] for j in jobs]
    # no history: every estimate is a bound from time limits, in reserved and deep jobs alike
    assert [j["expected_start_kind"] for j in jobs] == ["bound"] * 6

    # decide-only cycles run in between, and keep what the estimating cycle showed
    cycles = len(engine.cycle_seconds)
    engine.wake()
    await wait_for(lambda: len(engine.cycle_seconds) > cycles + 1 or None, timeout=5)
    assert [j["expected_start"] for j in await views(api, waiting)] == starts

    # a new urgent job is first in line at once, with its own estimate
    urgent = await submit(api, name="u", priority="urgent")

    async def urgent_first() -> Any:
        (u,) = await views(api, [urgent["id"]])
        return u if u["position"] == 1 and u["expected_start"] is not None else None

    u = await wait_for(urgent_first, timeout=5)
    assert u["expected_start"] <= starts[0] + 1
    assert [j["position"] for j in await views(api, waiting)] == [2, 3, 4, 5, 6, 7]
    for i in running + waiting + [urgent["id"]]:
        await api("DELETE", f"jobs/{i}")


async def test_a_job_ending_when_an_estimate_is_due_starts_the_next_at_once_and_the_estimate_follows(
        api: Any, engine: Any) -> None:
    """The cycle a job's end wakes only decides when an estimate is also due (an estimating
    cycle over a deep queue takes a hundred milliseconds and more); the estimate comes in the
    cycle right after, not never, however often jobs end."""
    running = [(await submit(api, name=f"r{i}"))["id"] for i in range(2)]
    waiting = [(await submit(api, name=f"w{i}"))["id"] for i in range(3)]

    async def started(job_id: int) -> Any:
        return (await views(api, [job_id]))[0]["state"] == "RUNNING"

    await wait_for(lambda: started(running[1]), timeout=10)
    await wait_for(lambda: started(running[0]), timeout=10)
    engine.scheduling.estimated_at -= 2 * engine.estimate_interval  # the hour has passed: an estimate is due
    due_since = engine.scheduling.estimated_at
    status, _ = await api("DELETE", f"jobs/{running[0]}")
    assert status == 200
    await wait_for(lambda: started(waiting[0]), timeout=10)

    async def estimated() -> bool:
        return engine.scheduling.estimated_at > due_since

    await wait_for(estimated, timeout=5)
    # the estimate that followed gives every job still waiting a start
    jobs = await views(api, waiting[1:])
    assert all(j["expected_start"] is not None for j in jobs), jobs
