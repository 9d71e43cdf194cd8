"""A job survives a SIGKILLed server: the next server on the same database reattaches to it,
records its end and full log, and never hands its GPU to another job meanwhile."""

from __future__ import annotations

import sys
import time
from typing import Any

from servers import supervisors_under, wait_job, wait_until

PY = sys.executable


def test_job_survives_server_sigkill(live_server: Any, tmp_path: Any) -> None:
    server = live_server(fake_gpus="2xA100")
    client = server.client()
    release = tmp_path / "release"
    code = (
        "import os, time\ni = 0\n"
        f"while not os.path.exists({str(release)!r}):\n"
        "    print('line', i, flush=True)\n    i += 1\n    time.sleep(0.2)\n"
        "print('done', flush=True)\n"
    )
    job = client.submit([PY, "-c", code], gpus=1, time_limit="5m")
    running = wait_job(client, job["id"], ("RUNNING",))
    held = running["assigned_gpus"]
    time.sleep(0.6)

    server.kill()
    time.sleep(0.5)
    server.start()
    client = server.client()

    again = client.job(job["id"])
    assert again["state"] == "RUNNING", again
    assert again["assigned_gpus"] == held

    # while it runs, its GPU is not handed out again
    # (long enough that the first to start is still running while the test looks)
    others = [client.submit([PY, "-c", "import time; time.sleep(60)"], gpus=1) for _ in range(2)]

    def started() -> list[dict[str, Any]]:  # the one free GPU is taken (however long that takes)
        return [j for o in others if (j := client.job(o["id"]))["state"] != "PENDING"]

    running_others = wait_until(started, 30, "one of the others to start")
    assert len(running_others) == 1
    assert running_others[0]["assigned_gpus"] != held

    release.write_text("go")
    for o in others:
        client.cancel(o["id"])
    final = wait_job(client, job["id"], ("COMPLETED", "FAILED", "LOST"))
    assert final["state"] == "COMPLETED", final
    lines = client.log(job["id"])["data"].splitlines()
    assert lines[-1] == "done"
    assert lines[:-1] == [f"line {i}" for i in range(len(lines) - 1)], "the whole log, nothing lost"
    assert len(lines) > 10
    events = [e["state"] for e in client.events(job["id"]) if e["state"] in ("PENDING", "RUNNING", "COMPLETED")]
    assert events == ["PENDING", "RUNNING", "COMPLETED"]


def test_vanished_supervisor_is_lost(live_server: Any) -> None:
    import psutil

    server = live_server(fake_gpus="1xA100")
    client = server.client()
    job = client.submit([PY, "-c", "import time; time.sleep(60)"], gpus=1)
    wait_job(client, job["id"], ("RUNNING",))
    server.kill()
    # the machine "reboots": every process of the job is gone, its supervisor first (one taken
    # from the standby pool names no run on its command line: found by its working directory)
    for p in supervisors_under(server.state_dir / "run"):
        p.kill()
    for p in psutil.process_iter(["cmdline"]):
        if "time.sleep(60)" in " ".join(p.info["cmdline"] or []):
            p.kill()
    time.sleep(0.3)
    server.start()
    client = server.client()
    lost = client.job(job["id"])
    assert lost["state"] == "LOST"
    assert "vanished" in lost["reason"] or "supervisor" in lost["reason"]
    nxt = client.submit([PY, "-c", "pass"], gpus=1)
    assert wait_job(client, nxt["id"], ("COMPLETED",))["assigned_gpus"] == [0]


def test_a_job_that_ended_while_the_server_was_down_is_accounted_to_its_end(live_server: Any, tmp_path: Any) -> None:
    """GPU-hours of a job that ended while no server ran end at its exit (its supervisor's
    record), not at the next server's start: three 30 s jobs once counted 2.07 GPU-hours."""
    server = live_server(fake_gpus="2xA100")
    client = server.client()
    release = tmp_path / "release"
    code = f"import os, time\nwhile not os.path.exists({str(release)!r}):\n    time.sleep(0.05)\n"
    job = client.submit([PY, "-c", code], gpus=1, time_limit="5m")
    wait_job(client, job["id"], ("RUNNING",))
    server.kill()
    release.write_text("go")  # the job ends while no server runs
    deadline = time.monotonic() + 30
    while supervisors_under(server.state_dir / "run"):
        assert time.monotonic() < deadline, "the job's supervisor did not end"
        time.sleep(0.1)
    down_from = time.time()
    time.sleep(3)  # the server stays down a while after the job's end
    server.start()
    client = server.client()
    final = wait_job(client, job["id"], ("COMPLETED", "FAILED", "LOST"))
    assert final["state"] == "COMPLETED", final
    assert final["ended_at"] <= down_from, final
    used_s = client.api("GET", "usage", params={"by": "user", "since": "1d"})["total_gpu_hours"] * 3600
    ran_s = final["ended_at"] - final["started_at"]
    assert used_s <= ran_s + 0.5, (used_s, ran_s)  # (usage is rounded to 0.0001 h, 0.36 s)
