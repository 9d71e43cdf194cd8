"""The engine through its REST API on a real Jupyter server with fake GPUs 2xA100:
jobs wait, run on their own GPUs, stream logs, are cancelled and stopped at their limits."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import psutil
from servers import wait_for

PY = sys.executable


def sleeper(seconds: float, tag: str = "") -> list[str]:
    code = (
        "import os, sys, time\n"
        f"print('{tag}gpu=' + os.environ['CUDA_VISIBLE_DEVICES'], flush=True)\n"
        f"time.sleep({seconds})\n"
        f"print('{tag}done', flush=True)\n"
    )
    return [PY, "-c", code]


async def job(api: Any, job_id: int) -> dict[str, Any]:
    status, body = await api("GET", f"jobs/{job_id}")
    assert status == 200, body
    return body


async def test_three_jobs_on_two_gpus(api: Any) -> None:
    ids = []
    for i in range(3):
        status, body = await api("POST", "jobs", {"command": sleeper(2.5, f"j{i} "), "gpus": 1, "gpu_type": "A100",
                                                  "time_limit": "1m", "name": f"j{i}"})
        assert status == 201, body
        assert body["state"] == "PENDING"
        ids.append(body["id"])

    async def two_running() -> Any:
        jobs = [await job(api, i) for i in ids]
        return jobs if [j["state"] for j in jobs[:2]] == ["RUNNING", "RUNNING"] else None

    jobs = await wait_for(two_running, timeout=10)
    first_gpus = {tuple(j["assigned_gpus"]) for j in jobs[:2]}
    assert first_gpus == {(0,), (1,)}, "two jobs at once on distinct GPUs"
    third = jobs[2]
    assert third["state"] == "PENDING"
    assert "waiting for 1 free A100" in third["reason"]
    assert third["position"] == 1
    assert third["expected_start"] is not None and third["expected_start"] > time.time()

    status, queue = await api("GET", "queue")
    assert [j["id"] for j in queue["jobs"]] == [ids[2]]

    # the log is readable while the job runs
    async def log_line() -> Any:
        status, body = await api("GET", f"jobs/{ids[0]}/log", params={"offset": 0})
        return body if "gpu=" in body["data"] else None

    log = await wait_for(log_line, timeout=5)
    assert log["done"] is False
    assert log["data"].strip() == f"j0 gpu={jobs[0]['assigned_gpus'][0]}"
    status, more = await api("GET", f"jobs/{ids[0]}/log", params={"offset": log["offset"]})
    assert more["data"] in ("", "j0 done\n")

    # the third runs on the GPU freed first, and all complete
    done = await wait_for(lambda: _all_final(api, ids), timeout=20)
    assert [j["state"] for j in done] == ["COMPLETED"] * 3
    assert done[2]["assigned_gpus"][0] in (0, 1)
    assert done[2]["started_at"] >= min(d["ended_at"] for d in done[:2]) - 0.01
    status, full = await api("GET", f"jobs/{ids[2]}/log")
    assert full["data"] == f"j2 gpu={done[2]['assigned_gpus'][0]}\nj2 done\n"
    assert full["done"] is True
    assert done[0]["exit_code"] == 0 and done[0]["reason"] == "completed"


async def _all_final(api: Any, ids: list[int]) -> Any:
    jobs = [await job(api, i) for i in ids]
    return jobs if all(j["state"] not in ("PENDING", "RUNNING") for j in jobs) else None


async def test_cancel_pending_and_running(api: Any) -> None:
    running = []
    for _ in range(2):
        status, body = await api("POST", "jobs", {"command": sleeper(30), "gpus": 1})
        running.append(body["id"])
    status, pending = await api("POST", "jobs", {"command": sleeper(30), "gpus": 1})
    await wait_for(lambda: _states(api, running, "RUNNING"), timeout=10)

    status, body = await api("DELETE", f"jobs/{pending['id']}")
    assert status == 200
    assert body["state"] == "CANCELLED"
    assert body["reason"].startswith("cancelled by ")

    status, body = await api("DELETE", f"jobs/{running[0]}")
    assert status == 200
    assert body["state"] == "CANCELLED", body
    assert body["reason"].startswith("cancelled by ")
    status, events = await api("GET", f"jobs/{running[0]}/events")
    assert [e["state"] for e in events["events"]][0] == "PENDING"
    assert events["events"][-1]["state"] == "CANCELLED"

    # the freed GPU goes to nobody twice: only one job holds each GPU
    status, gpus = await api("GET", "gpus")
    holders = [g["job_id"] for g in gpus["gpus"] if g["job_id"]]
    assert holders == [running[1]]

    status, again = await api("DELETE", f"jobs/{running[0]}")
    assert status == 200 and again["state"] == "CANCELLED"


async def _states(api: Any, ids: list[int], state: str) -> bool:
    states = [(await job(api, i))["state"] for i in ids]
    return all(s == state for s in states)


async def test_time_limit_kills_whole_tree(api: Any, tmp_path: Any) -> None:
    pidfile = tmp_path / "child.pid"
    code = (
        "import os, signal, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', "
        "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(child.pid))\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('started', flush=True)\n"
        "time.sleep(600)\n"
    )
    status, body = await api("POST", "jobs", {"command": [PY, "-c", code], "gpus": 1, "time_limit": 2})
    assert status == 201
    final = await wait_for(lambda: _final(api, body["id"]), timeout=20)
    assert final["state"] == "TIMEOUT"
    assert "time limit" in final["reason"]
    child = int(pidfile.read_text())
    await wait_for(lambda: not psutil.pid_exists(child) or psutil.Process(child).status() == "zombie", timeout=5)


async def _final(api: Any, job_id: int) -> Any:
    j = await job(api, job_id)
    return j if j["state"] not in ("PENDING", "RUNNING") else None


async def test_failure_and_oom_reasons(api: Any) -> None:
    status, fail = await api("POST", "jobs", {"command": [PY, "-c", "import sys; sys.exit(3)"], "gpus": 1})
    status, oom = await api("POST", "jobs", {"command": [
        PY, "-c", "import sys; print('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB');"
        " sys.exit(1)"], "gpus": 1})
    f = await wait_for(lambda: _final(api, fail["id"]), timeout=10)
    o = await wait_for(lambda: _final(api, oom["id"]), timeout=10)
    assert (f["state"], f["exit_code"], f["reason"]) == ("FAILED", 3, "failed (exit code 3)")
    assert o["state"] == "FAILED" and "out of memory" in o["reason"]


async def test_zero_gpu_job_sees_no_gpu(api: Any) -> None:
    status, body = await api("POST", "jobs", {"command": [PY, "-c", "import os; print(repr(os.environ['CUDA_VISIBLE_DEVICES']))"],
                                              "gpus": 0})
    final = await wait_for(lambda: _final(api, body["id"]), timeout=10)
    assert final["state"] == "COMPLETED"
    status, log = await api("GET", f"jobs/{body['id']}/log")
    assert log["data"].strip() == "''"


async def test_websocket_streams_state_changes(api: Any, jp_ws_fetch: Any) -> None:
    ws = await jp_ws_fetch("gpujobs", "api", "events")
    status, body = await api("POST", "jobs", {"command": [PY, "-c", "print('hi')"], "gpus": 1, "name": "ws"})
    seen: list[str] = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and "COMPLETED" not in seen:
        msg = json.loads(await ws.read_message())
        if msg["type"] == "job" and msg["job"]["id"] == body["id"]:
            seen.append(msg["event"]["state"])
    ws.close()
    assert seen[:1] == ["PENDING"] or seen[0] == "RUNNING"
    assert "RUNNING" in seen and seen[-1] == "COMPLETED"


async def test_listing_and_paging(api: Any) -> None:
    ids = []
    for i in range(5):
        status, body = await api("POST", "jobs", {"command": [PY, "-c", "pass"], "gpus": 0, "name": f"p{i}"})
        ids.append(body["id"])
    status, page = await api("GET", "jobs", params={"limit": 2})
    assert [j["id"] for j in page["jobs"]] == ids[::-1][:2]
    status, page2 = await api("GET", "jobs", params={"limit": 2, "cursor": page["next"]})
    assert [j["id"] for j in page2["jobs"]] == ids[::-1][2:4]
    status, body = await api("GET", "jobs", params={"state": "bogus"})
    assert status == 400 and body["field"] == "state"
