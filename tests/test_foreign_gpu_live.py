"""A GPU used by a process outside the queue is not handed out: `GET gpus` and the CLI show it
busy with what uses it, a waiting job says why, and the GPU is used again once it is released
or an admin overrides. The driver's own reserved memory never makes a GPU foreign (issue 26:
an idle H200 reserves 616 MiB, which NVML's v1 memory info counts as used)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import httpx
import psutil
import pytest
from servers import wait_job, wait_until

from jupyter_gpujobs.client import GPUJobsClient
from jupyter_gpujobs.engine.gpus import PIDNS_OFFSET

PY = sys.executable
ROGUE_GPU = 5


async def _gpus_message(server: Any, token: str) -> list[dict[str, Any]]:
    """The GPUs as the events websocket first sends them to `token`'s user."""
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    ws = await websocket_connect(HTTPRequest(f"ws://127.0.0.1:{server.port}/gpujobs/api/events",
                                             headers={"Authorization": f"token {token}"}))
    try:
        while True:
            message = json.loads(await ws.read_message())
            if message["type"] == "gpus":
                return message["gpus"]
    finally:
        ws.close()


def test_a_gpu_in_use_outside_the_queue_is_busy_until_released_or_overridden(live_server: Any) -> None:
    """Admins see whose process it is; a user (bob) sees how much it holds and what to do, in
    GET gpus, the events websocket and his waiting job's reason, never the process's pid, name
    or user: the engine sees every process as root, also where /proc hides them from users."""
    server = live_server(fake_gpus="6xA100", users={"tok-admin": "admin", "tok-bob": "bob"},
                         config={"admin_users": "admin"})
    admin, client = (GPUJobsClient(url=server.url, token=tok) for tok in ("tok-admin", "tok-bob"))
    rogue = server.rogue(ROGUE_GPU, GPUJOBS_FAKE_MEM_MB="7800")
    try:
        name = wait_until(lambda: psutil.Process(rogue.pid).name())
        whose = f"in use outside the queue (7.6 GiB held by pid {rogue.pid}, {name}, user root)"
        text = "in use outside the queue (7.6 GiB held by a process the queue did not start)"

        def rogue_gpu(who: GPUJobsClient = client) -> dict[str, Any]:
            return next(g for g in who.gpus() if g["index"] == ROGUE_GPU)

        def decided(job_id: int) -> Any:
            j = client.job(job_id)
            return j if j["state"] != "PENDING" or j["reason"] != "waiting for the next scheduling cycle" else None

        assert wait_until(lambda: rogue_gpu(admin)["foreign"] == whose), rogue_gpu(admin)
        assert "ask root to stop pid" in rogue_gpu(admin)["foreign_todo"]
        seen = rogue_gpu()
        assert seen["foreign"] == text and "foreign_public" not in seen, seen
        assert seen["foreign_todo"].startswith("if it is your process, stop it"), seen
        assert str(rogue.pid) not in json.dumps(client.api("GET", "info")["gpus"])
        for token, shown in (("tok-bob", text), ("tok-admin", whose)):
            ws_gpus = asyncio.run(_gpus_message(server, token))
            assert next(g for g in ws_gpus if g["index"] == ROGUE_GPU)["foreign"] == shown, ws_gpus
        out = server.cli("gpus")  # as the admin
        assert out.returncode == 0 and f"busy: {whose}" in out.stdout, out.stdout

        # jobs fill every GPU but that one; the next waits, and says why
        sleeper = [PY, "-c", "import time; time.sleep(60)"]
        waiting = None
        for _ in range(6):
            job = wait_until(lambda job_id=client.submit(sleeper, gpus=1)["id"]: decided(job_id))
            assert ROGUE_GPU not in job["assigned_gpus"]
            if job["state"] == "PENDING":
                waiting = job
                break
        assert waiting is not None and f"GPU {ROGUE_GPU} is {text}" in waiting["reason"], waiting
        assert str(rogue.pid) not in waiting["reason"] and name not in waiting["reason"], waiting
        assert waiting["reason"].startswith("waiting for 1 free GPU; ")

        # an admin overrides: the job starts there
        out = server.cli("gpus", "--override", str(ROGUE_GPU), "--reason", "the owner said it is idle")
        assert out.returncode == 0, out.stderr
        job = wait_job(client, waiting["id"], ("RUNNING",))
        assert job["assigned_gpus"] == [ROGUE_GPU]
        client.cancel(waiting["id"])
        wait_job(client, waiting["id"], ("CANCELLED",))

        # ... and takes it back: the next job waits again
        out = server.cli("gpus", "--end-override", str(ROGUE_GPU))
        assert out.returncode == 0, out.stderr
        later = client.submit(sleeper, gpus=1)["id"]
        job = wait_until(lambda: decided(later))
        assert job["state"] == "PENDING" and f"GPU {ROGUE_GPU} is {text}" in job["reason"], job
        time.sleep(1.5)
        assert client.job(later)["state"] == "PENDING"
    finally:
        rogue.kill()
        rogue.wait()
    # released: the job starts on it
    job = wait_job(client, later, ("RUNNING",), timeout=15)
    assert job["assigned_gpus"] == [ROGUE_GPU]
    assert rogue_gpu()["foreign"] is None and rogue_gpu()["foreign_override"] is None


@pytest.mark.parametrize("driver", ["", ";nvml:v1;pidns:other"], ids=["nvml-v2", "nvml-v1-container"])
def test_gpus_with_reserved_memory_run_jobs_and_a_real_foreign_process_still_blocks(
        live_server: Any, driver: str) -> None:
    """Two H200s whose driver reserves 616 MiB each (as driver 580 does): idle, they are free and
    two jobs run on them at once; a process outside the queue holding 2 GiB still blocks its GPU,
    with what holds it and what to do, also where NVML gives pids of another pid namespace."""
    server = live_server(fake_gpus=f"2xH200-141GB[reserved:616M{driver}]", config={"sample_interval": 0.5})
    client = server.client()
    gpus = wait_until(lambda: (found := client.gpus()) and all(g["memory_reserved_mb"] == 616 for g in found) and found)
    assert [(g["memory_used_mb"], g["foreign"]) for g in gpus] == [(0, None), (0, None)], gpus

    sleeper = [PY, "-c", "import time; time.sleep(60)"]
    jobs = [client.submit(sleeper, gpus=1)["id"] for _ in range(2)]
    running = [wait_job(client, j, ("RUNNING",)) for j in jobs]
    assert sorted(g for j in running for g in j["assigned_gpus"]) == [0, 1]
    assert all(client.job(j)["state"] == "RUNNING" for j in jobs)  # at once
    # a job's stats and the metrics count what its processes use (500 MiB each), the reservation apart
    stats = wait_until(lambda: (st := client.api("GET", f"jobs/{jobs[1]}/stats"))["memory_max_mb"] and st)
    assert stats["memory_max_mb"] == 500, stats
    metrics = httpx.get(f"{server.url}gpujobs/api/metrics", headers={"Authorization": f"token {server.token}"}).text
    assert 'DCGM_FI_DEV_FB_RESERVED{' in metrics and all(
        float(line.rsplit(" ", 1)[1]) == 616 for line in metrics.splitlines() if line.startswith("DCGM_FI_DEV_FB_RESERVED{"))
    freed = running[0]["assigned_gpus"][0]
    client.cancel(jobs[0])
    wait_job(client, jobs[0], ("CANCELLED",))

    rogue = server.rogue(freed, GPUJOBS_FAKE_MEM_MB="2150")
    try:
        pid = rogue.pid + (PIDNS_OFFSET if "pidns:other" in driver else 0)
        who = ("which the engine cannot see: another pid namespace, e.g. a container" if driver
               else f"{wait_until(lambda: psutil.Process(rogue.pid).name())}, user root")
        text = f"in use outside the queue (2.1 GiB held by pid {pid}, {who})"

        def on_freed() -> dict[str, Any]:
            return next(g for g in client.gpus() if g["index"] == freed)

        gpu = wait_until(lambda: (g := on_freed())["foreign"] and g, what="the GPU marked foreign")
        assert gpu["foreign"] == text and gpu["memory_used_mb"] == 2150 and gpu["memory_reserved_mb"] == 616
        assert f"--override {freed}" in gpu["foreign_todo"]
        later = client.submit(sleeper, gpus=1)["id"]
        job = wait_until(lambda: (j := client.job(later))["reason"] and "outside the queue" in j["reason"] and j,
                         what="the waiting job saying why")
        public = "in use outside the queue (2.1 GiB held by a process the queue did not start)"
        assert job["state"] == "PENDING" and f"GPU {freed} is {public}" in job["reason"], job

        doctor = server.cli("doctor")
        lines = doctor.stdout.splitlines()
        assert any(line.startswith("OK") and "GPUs" in line and line.endswith(
            "the driver keeps 616 MiB of each for itself (not counted as used)") for line in lines), lines
        row = next(i for i, line in enumerate(lines) if "GPU in use" in line)
        assert lines[row].startswith("WARN") and f"GPU {freed} is {text}: no job starts there" in lines[row], lines
        assert lines[row + 1].strip() == f"-> {gpu['foreign_todo']}"
    finally:
        rogue.kill()
        rogue.wait()
    assert wait_job(client, later, ("RUNNING",))["assigned_gpus"] == [freed]
