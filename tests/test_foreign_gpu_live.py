"""A GPU used by a process outside the queue is not handed out: `GET gpus` and the CLI show it
busy with what uses it, a waiting job says why, and the GPU is used again once it is released
or an admin overrides."""

from __future__ import annotations

import sys
import time
from typing import Any

from servers import wait_job, wait_until

PY = sys.executable
ROGUE_GPU = 5


def test_a_gpu_in_use_outside_the_queue_is_busy_until_released_or_overridden(live_server: Any) -> None:
    server = live_server(fake_gpus="6xA100")
    client = server.client()
    rogue = server.rogue(ROGUE_GPU, GPUJOBS_FAKE_MEM_MB="7800")
    try:
        text = f"in use by a process outside the queue (7.6 GB, pid {rogue.pid}, user root)"

        def rogue_gpu() -> dict[str, Any]:
            return next(g for g in client.gpus() if g["index"] == ROGUE_GPU)

        def decided(job_id: int) -> Any:
            j = client.job(job_id)
            return j if j["state"] != "PENDING" or j["reason"] != "waiting for the next scheduling cycle" else None

        assert wait_until(lambda: rogue_gpu()["foreign"] == text), rogue_gpu()
        out = server.cli("gpus")
        assert out.returncode == 0 and f"busy: {text}" in out.stdout, out.stdout

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
