"""The monitor on a real Jupyter server with fake GPUs 4xA100 and real job processes:
each detector (out of memory, three failures in a row, an idle hog, a rogue process), per-job
GPU stats, the Prometheus endpoint parsed by prometheus_client, usage and the heatmap over
seeded history, and draining a GPU.

Fake GPUs are seen through the processes of the whole machine, and other test runs use fake
GPUs 0 and 1: the tests drain those two and run on GPUs 2 and 3, so exact values hold."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from servers import wait_for

from jupyter_gpujobs.engine.store import monitoring as mstore
from jupyter_gpujobs.model import GPU, JobState

PY = sys.executable
A100_MB = 40960


@pytest.fixture
def gpujobs_config(gpujobs_config: dict[str, Any]) -> dict[str, Any]:
    return {**gpujobs_config, "fake_gpus": "4xA100", "sample_interval": 0.3, "idle_hog_after": 2,
            "idle_hog_threshold": 5.0}


def py(code: str) -> list[str]:
    return [PY, "-c", code]


def in_child(code: str, **child_env: str) -> list[str]:
    """A job whose GPU work runs in a child process. The fake backend may first see a job's
    process between the supervisor's fork and exec, with the supervisor's environment, and
    then take it for a non-GPU process for a while; a child forked after the exec is always
    seen. `child_env` overrides what the child declares (GPUJOBS_FAKE_UTIL, ..._MEM_MB)."""
    return py("import os, subprocess, sys\n"
              f"env = {{**os.environ, **{child_env!r}}}\n"
              f"sys.exit(subprocess.call([sys.executable, '-c', {code!r}], env=env) & 0xFF)")


async def submit(api: Any, command: list[str], **extra: Any) -> dict[str, Any]:
    status, body = await api("POST", "jobs", {"command": command, "gpus": 1, "time_limit": "1m", **extra})
    assert status == 201, body
    return body


async def ended(api: Any, job_id: int, timeout: float = 15) -> dict[str, Any]:
    async def done() -> Any:
        status, body = await api("GET", f"jobs/{job_id}")
        return body if body["state"] not in ("PENDING", "RUNNING") else None

    return await wait_for(done, timeout=timeout)


async def finding(api: Any, timeout: float = 10, **params: Any) -> dict[str, Any]:
    async def look() -> Any:
        status, body = await api("GET", "findings", params=params)
        assert status == 200, body
        return body["findings"][0] if body["findings"] else None

    return await wait_for(look, timeout=timeout)


async def finding_events(api: Any, job_id: int) -> list[dict[str, Any]]:
    status, body = await api("GET", f"jobs/{job_id}/events")
    return [e for e in body["events"] if e["state"] == "FINDING"]


async def test_out_of_memory_in_the_log(api: Any, monitor: Any) -> None:
    job = await submit(api, py("import sys\nprint('RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB')\n"
                               "sys.exit(1)"), name="big")
    end = await ended(api, job["id"])
    assert end["state"] == "FAILED" and "out of memory" in end["reason"]
    f = await finding(api, kind="oom", job=job["id"])
    assert f["message"].startswith(f"job {job['id']} ('big' of ") and "ran out of GPU memory" in f["message"]
    events = await finding_events(api, job["id"])
    assert events and events[0]["actor"] == "monitor" and "ran out of GPU memory" in events[0]["reason"]


async def test_memory_at_the_limit_before_a_crash(api: Any, monitor: Any) -> None:
    job = await submit(api, in_child("import os, time\ntime.sleep(1.5)\nos.abort()", GPUJOBS_FAKE_MEM_MB=str(A100_MB)),
                       env={"GPUJOBS_FAKE_MEM_MB": "0"})
    end = await ended(api, job["id"])
    assert end["state"] == "FAILED"
    f = await finding(api, kind="oom", job=job["id"])
    assert "memory at the limit" in f["message"] and "40.0 of 40.0 GiB" in f["message"]
    status, stats = await api("GET", f"jobs/{job['id']}/stats")
    assert status == 200 and stats["final"] and stats["memory_max_mb"] == A100_MB
    assert stats["memory_max_fraction"] == 1.0 and stats["samples"] >= 2


async def test_three_failures_in_a_row(api: Any, monitor: Any) -> None:
    ids = []
    for _ in range(3):
        job = await submit(api, py("import sys; sys.exit(3)"), name="train")
        await ended(api, job["id"])
        ids.append(job["id"])
    f = await finding(api, kind="repeated_failure")
    user = f["user"]
    assert f["message"] == f"job 'train' of {user} failed 3 times in a row: exit code 3"
    assert f["job_id"] == ids[-1] and f["data"]["jobs"] == ids[::-1]
    assert await finding_events(api, ids[-1])
    # a success closes it
    ok = await submit(api, py("pass"), name="train")
    await ended(api, ok["id"])
    await wait_for(lambda: not mstore.list_findings(monitor.store, kind="repeated_failure", open_only=True))



async def test_failures_in_a_row_are_counted_as_they_ended_not_as_submitted(api: Any, monitor: Any) -> None:
    # submitted together, the three runs end in the opposite order
    ids = [(await submit(api, py(f"import sys, time; time.sleep({d}); sys.exit(3)"), name="sweep", gpus=0))["id"]
           for d in (2.0, 1.0, 0.0)]
    for job_id in ids:
        await ended(api, job_id)
    f = await finding(api, kind="repeated_failure")
    assert f["message"].startswith("job 'sweep' of ") and "failed 3 times in a row" in f["message"]
    assert f["job_id"] == ids[0] and f["data"]["jobs"] == ids  # the last to end first


async def test_idle_hog(api: Any, monitor: Any) -> None:
    job = await submit(api, in_child("import time; time.sleep(30)"), name="notebook-left-open")
    f = await finding(api, kind="idle_hog", job=job["id"], timeout=12)
    assert f["open"] and f["job_id"] == job["id"]
    assert "at ~0% utilization" in f["message"] and f["data"]["idle_s"] >= 2
    assert any("at ~0% utilization" in e["reason"] for e in await finding_events(api, job["id"]))
    status, _ = await api("DELETE", f"jobs/{job['id']}")
    await ended(api, job["id"])
    await wait_for(lambda: not mstore.list_findings(monitor.store, kind="idle_hog", open_only=True))


async def test_busy_job_is_no_idle_hog_and_has_stats(api: Any, monitor: Any) -> None:
    # busy until it has had 3.5 s of CPU, however long that takes on a loaded machine (a wall-clock
    # window gave it too little CPU there for enough busy readings)
    job = await submit(api, in_child("import time\nend = time.process_time() + 3.5\n"
                                     "while time.process_time() < end: pass",
                                     GPUJOBS_FAKE_MEM_MB="500"), env={"GPUJOBS_FAKE_MEM_MB": "0"})
    end = await ended(api, job["id"], timeout=55)
    assert end["state"] == "COMPLETED"
    status, stats = await api("GET", f"jobs/{job['id']}/stats")
    # a busy loop looks busy (its CPU share: less than 100 % on a loaded machine)
    assert stats["samples"] >= 5 and stats["utilization_mean"] > 10 and stats["utilization_max"] > 20
    assert stats["memory_max_mb"] == 500, "the fake backend's default per process"
    assert end["assigned_gpus"][0] in (2, 3)
    assert not mstore.list_findings(monitor.store, kind="idle_hog", job_id=job["id"])


async def test_rogue_process_is_reported_and_cleared(api: Any, monitor: Any) -> None:
    status, info = await api("GET", "info")
    # marked with this server's fake fleet: servers of other tests running meanwhile do not see it
    env = {**os.environ, "GPUJOBS_FAKE_GPU_USE": "3", "GPUJOBS_FAKE_MEM_MB": "777",
           "GPUJOBS_FAKE_FLEET": info["fake_fleet"]}
    env.pop("GPUJOBS_JOB_ID", None)
    proc = subprocess.Popen([PY, "-c", "import time; time.sleep(60)"], env=env)
    try:
        async def mine() -> Any:
            status, body = await api("GET", "findings", params={"kind": "rogue_process", "open": "1"})
            return next((f for f in body["findings"] if f["pid"] == proc.pid), None)

        f = await wait_for(mine, timeout=10)
        assert f["gpu"] == 3 and "without an allocation" in f["message"] and "777 MB" in f["message"]
        assert f["action"] == "", "the default policy only warns"
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()

    async def closed() -> Any:
        rows = mstore.list_findings(monitor.store, kind="rogue_process")
        return any(r["pid"] == proc.pid and not r["open"] for r in rows)

    await wait_for(closed, timeout=10)


async def test_job_processes_are_not_rogue(api: Any, monitor: Any) -> None:
    job = await submit(api, py("import subprocess, sys, time\n"
                               "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"
                               "time.sleep(30)"))

    async def two_processes() -> Any:
        procs = monitor.backend.processes()
        status, view = await api("GET", f"jobs/{job['id']}")
        gpus = view["assigned_gpus"]
        return gpus and len(procs.get(gpus[0], [])) >= 2

    await wait_for(two_processes, timeout=10)
    time.sleep(0.7)  # at least one monitor tick with both processes
    await wait_for(lambda: monitor.sampler.latest_at and time.time() - monitor.sampler.latest_at < 0.5)
    rows = [f for f in mstore.list_findings(monitor.store, kind="rogue_process") if f["job_id"] == job["id"]]
    assert rows == []
    await api("DELETE", f"jobs/{job['id']}")


async def test_metrics_endpoint(api: Any, monitor: Any, jp_fetch: Any) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    busy = await submit(api, in_child("import time; time.sleep(30)", GPUJOBS_FAKE_UTIL="70", GPUJOBS_FAKE_MEM_MB="1234"),
                        env={"GPUJOBS_FAKE_UTIL": "0", "GPUJOBS_FAKE_MEM_MB": "0"})
    other = await submit(api, py("import time; time.sleep(30)"))

    async def both_running() -> Any:
        views = [(await api("GET", f"jobs/{j['id']}"))[1] for j in (busy, other)]
        return views if all(v["state"] == "RUNNING" for v in views) else None

    views = await wait_for(both_running)
    # queued behind them (submitted earlier, the high one would rightly go first)
    await submit(api, py("pass"), priority="high")
    await submit(api, py("pass"), priority="low")
    await submit(api, py("pass"), priority="low")
    gpu = views[0]["assigned_gpus"][0]
    await wait_for(lambda: any(s.index == gpu and s.utilization == 70 for s in monitor.sampler.latest))
    r = await jp_fetch("gpujobs", "api", "metrics")
    assert r.headers["Content-Type"].startswith("text/plain")
    text = r.body.decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}

    def value(name: str, **labels: str) -> float:
        hits = [s.value for s in families[name].samples if all(s.labels.get(k) == v for k, v in labels.items())]
        assert len(hits) == 1, (name, labels, families[name].samples)
        return hits[0]

    util = families["DCGM_FI_DEV_GPU_UTIL"].samples
    assert {s.labels["gpu"] for s in util} == {"0", "1", "2", "3"}
    assert set(util[0].labels) == {"gpu", "UUID", "modelName", "Hostname"}
    assert value("DCGM_FI_DEV_GPU_UTIL", gpu=str(gpu)) == 70
    assert value("DCGM_FI_DEV_FB_USED", gpu=str(gpu)) == 1234
    assert value("DCGM_FI_DEV_FB_FREE", gpu=str(gpu)) == A100_MB - 1234
    assert value("DCGM_FI_DEV_GPU_TEMP", gpu=str(gpu)) > 30
    assert value("DCGM_FI_DEV_POWER_USAGE", gpu=str(gpu)) > 0
    assert value("DCGM_FI_DEV_GPU_UTIL", gpu=str(gpu), modelName="A100") == 70
    assert value("gpujobs_queue_length", priority="high") == 1
    assert value("gpujobs_queue_length", priority="low") == 2
    assert value("gpujobs_queue_length", priority="normal") == 0
    assert value("gpujobs_jobs", state="RUNNING") == 2
    assert value("gpujobs_jobs", state="PENDING") == 3
    wait = families["gpujobs_wait_seconds"]
    assert wait.type == "histogram"
    assert [s.value for s in wait.samples if s.name == "gpujobs_wait_seconds_count"] == [2]
    assert value("gpujobs_scheduler_cycle_seconds", stat="last") >= 0
    assert value("gpujobs_gpu_allocated", gpu=str(gpu)) == 1
    status, stats = await api("GET", f"jobs/{busy['id']}/stats")
    assert stats["samples"] >= 1 and stats["utilization_max"] == 70 and stats["memory_max_mb"] == 1234
    for j in (busy, other):
        await api("DELETE", f"jobs/{j['id']}")


async def test_usage_and_heatmap_api_on_seeded_history(api: Any, monitor: Any) -> None:
    store = monitor.store
    t0 = datetime(2026, 3, 2, 9, 0).timestamp()  # a Monday, local time
    mstore.record_gpus(store, [GPU(0, "GPU-seed-a", "V100", "seed-host", 16384)], t0)
    # ben's second job is a quarter of the card for 2 hours: 0.5 GPU-hours, as budgets count it
    for user, group, start, hours, share in (("ann", "vision", t0, 2.0, None), ("ben", None, t0 + 7200, 0.5, None),
                                             ("ben", None, t0 + 9000, 2.0, 0.25)):
        job = store.add_jobs([{"user": user, "group": group, "command": ["x"], "gpus": 1}], user, start)[0]
        store.start(job.id, "seed-host", [(0, "GPU-seed-a")], start, share=share)
        store.transition(job.id, JobState.COMPLETED, "runner", "completed", start + hours * 3600)
    mstore.add_samples(store, [mstore.SampleValues("seed-host", 0, "GPU-seed-a", t0 + 60 * i, utilization=float(u))
                               for i, u in enumerate([10, 30, 80])])
    rng = {"since": str(t0 - 3600), "until": "2026-03-02T18:00"}
    status, body = await api("GET", "usage", params={**rng, "by": "user"})
    assert status == 200, body
    assert [(r["key"], r["gpu_hours"]) for r in body["rows"]] == [("ann", 2.0), ("ben", 1.0)]
    status, body = await api("GET", "usage", params={**rng, "by": "model"})
    assert body["rows"] == [{"key": "V100", "gpu_hours": 3.0, "jobs": 3}]
    status, body = await api("GET", "usage", params={**rng, "by": "group"})
    assert {r["key"]: r["gpu_hours"] for r in body["rows"]} == {"vision": 2.0, "(none)": 1.0}
    status, heat = await api("GET", "usage/heatmap", params=rng)
    assert status == 200 and heat["weekdays"][0] == "Mon" and len(heat["utilization"]) == 7
    assert heat["utilization"][0][9] == 40.0 and heat["samples"][0][9] == 3
    status, err = await api("GET", "usage", params={"by": "planet"})
    assert status == 400 and err["field"] == "by"
    status, err = await api("GET", "usage", params={"since": "whenever"})
    assert status == 400 and err["field"] == "since"


async def test_chart_series_on_seeded_history(api: Any, monitor: Any) -> None:
    """The dashboard's series: GPU readings in buckets (each reading counted once, from the
    finest rows that cover it) and the queue's length and waits over time."""
    store = monitor.store
    # readings of tomorrow: the monitor's roll-up and pruning leave them as they are
    t0 = (time.time() // 3600 + 24) * 3600
    seed = [mstore.SampleValues("seed-host", 0, "GPU-seed-a", t0 + 60 * i, utilization=float(u),
                                memory_used_mb=float(m), memory_total_mb=16384)
            for i, (u, m) in enumerate([(10, 1000), (30, 2000), (80, 3000)])]
    # a minute row, and a raw reading it already covers (rolled up, not yet pruned)
    seed.append(mstore.SampleValues("seed-host", 0, "GPU-seed-a", t0 - 590, utilization=99.0))
    mstore.add_samples(store, seed)
    mstore.add_samples(store, [mstore.SampleValues("seed-host", 0, "GPU-seed-a", t0 - 600, utilization=50.0,
                                                   count=12)], resolution=60)
    status, body = await api("GET", "gpus/samples", params={"since": str(t0 - 600), "until": str(t0 + 600),
                                                             "step": "600"})
    assert status == 200, body
    rows = [r for r in body["samples"] if r["host"] == "seed-host"]
    assert [(r["time"], r["utilization"], r["count"]) for r in rows] == [(t0 - 600, 50.0, 12), (t0, 40.0, 3)]
    assert rows[1]["utilization_max"] == 80 and rows[1]["memory_used_mb"] == 2000
    assert rows[1]["memory_used_max_mb"] == 3000 and rows[1]["memory_total_mb"] == 16384
    status, body = await api("GET", "gpus/samples", params={"since": str(t0), "until": str(t0 + 240), "step": "120"})
    assert [r["utilization"] for r in body["samples"] if r["host"] == "seed-host"] == [20.0, 80.0]
    status, err = await api("GET", "gpus/samples", params={"since": "7d", "step": "1"})
    assert status == 400 and err["field"] == "step" and "at least 303s" in err["message"]
    status, err = await api("GET", "gpus/samples", params={"step": "60", "resolution": "60"})
    assert status == 400 and err["field"] == "step"

    def job(user: str, submitted: float, started: float | None, ended: float) -> None:
        j = store.add_jobs([{"user": user, "command": ["x"], "gpus": 1}], user, submitted)[0]
        if started is not None:
            store.start(j.id, "seed-host", [(0, "GPU-seed-a")], started)
            store.transition(j.id, JobState.COMPLETED, "runner", "completed", ended, ended_at=ended)
        else:
            store.transition(j.id, JobState.CANCELLED, user, "cancelled", ended, ended_at=ended)

    t0 = datetime(2026, 3, 3, 9, 0).timestamp()
    job("ann", t0, t0 + 300, t0 + 400)
    job("ben", t0, t0 + 900, t0 + 1000)
    job("cid", t0 + 100, None, t0 + 1000)
    status, body = await api("GET", "usage/queue", params={"since": str(t0), "until": str(t0 + 1200), "step": "600"})
    assert status == 200, body
    assert body["points"] == [
        {"time": t0, "queue_length": 2, "started": 1, "wait_mean_s": 300.0, "wait_p90_s": 300.0},
        {"time": t0 + 600, "queue_length": 0, "started": 1, "wait_mean_s": 900.0, "wait_p90_s": 900.0},
    ]
    status, body = await api("GET", "usage/queue", params={"since": "1h"})
    assert status == 200 and body["step"] == 60 and len(body["points"]) == 60
    status, err = await api("GET", "usage/queue", params={"since": "30d", "step": "60"})
    assert status == 400 and err["field"] == "step"


async def test_drain_a_gpu(api: Any, monitor: Any) -> None:
    status, body = await api("POST", "gpus/drain", {"gpu": 2, "reason": "fan noise"})
    assert status == 200, body
    assert [g["draining"] for g in body["gpus"]] == [True, True, True, False]
    job = await submit(api, py("import time; time.sleep(20)"))

    async def running() -> Any:
        status, view = await api("GET", f"jobs/{job['id']}")
        return view if view["state"] == "RUNNING" else None

    view = await wait_for(running)
    assert view["assigned_gpus"] == [3], "nothing new starts on a draining GPU"
    f = await finding(api, kind="gpu_drained", open="1")
    assert "fan noise" in f["message"] and f["gpu"] == 2
    # drained GPUs are stored: a monitor started on this store (after a restart) knows them
    from jupyter_gpujobs.engine.monitor import Monitor

    fresh = Monitor(monitor.service)
    fresh.load()
    assert fresh.drained == {("localhost", 0), ("localhost", 1), ("localhost", 2)}
    status, resolved = await api("POST", "findings/resolve", {"id": f["id"]})
    assert status == 200 and not resolved["open"]
    status, gpus = await api("GET", "gpus")
    assert [g["draining"] for g in gpus["gpus"]] == [True, True, False, False]
    status, err = await api("POST", "gpus/drain", {"gpu": 7})
    assert status == 404 and err["field"] == "gpu"
    await api("DELETE", f"jobs/{job['id']}")


async def test_override_of_a_gpu_nothing_else_uses_is_refused(api: Any, monitor: Any) -> None:
    status, err = await api("POST", "gpus/foreign", {"gpu": 0, "override": True, "reason": "try"})
    assert status == 409 and err["field"] == "gpu", err
    assert err["message"] == "GPU 0 on localhost is not in use outside the queue; nothing to override"
    status, err = await api("POST", "gpus/foreign", {"gpu": 9})
    assert status == 404 and err["field"] == "gpu"
    status, body = await api("POST", "gpus/foreign", {"gpu": 0, "override": False})  # nothing to take back
    assert status == 200 and body["gpus"][0]["foreign"] is None and body["gpus"][0]["foreign_override"] is None


async def test_findings_bad_input(api: Any, monitor: Any) -> None:
    status, err = await api("GET", "findings", params={"kind": "ghosts"})
    assert status == 400 and err["field"] == "kind"
    status, err = await api("POST", "findings/resolve", {"id": "x"})
    assert status == 400 and err["field"] == "id"
    status, err = await api("GET", "jobs/999999/stats")
    assert status == 404


def test_gpu_check_script_parses_and_plans() -> None:
    script = Path(__file__).resolve().parents[1] / "scripts" / "gpu-check.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    out = subprocess.run(["bash", str(script), "--dry-run", "--wheels", "/nonexistent-wheels"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    for check in ("inventory", "torch-visible", "samples-rise", "oom", "time-limit-frees", "rogue"):
        assert check in out.stdout


async def test_a_user_sees_their_findings_however_many_others_have(monitor: Any) -> None:
    """A user's findings (and rogue processes on a GPU their job holds) are found behind any
    number of newer findings of others: they were looked for among the newest five times the
    limit only, so a busy team's findings hid an older one of theirs."""
    now = time.time()
    mstore.add_finding(monitor.store, now, kind="idle_hog", key="mine-old", message="yours", user="finder-bob")
    mstore.add_finding(monitor.store, now, kind="rogue_process", key="rogue-old", message="on your GPU",
                       user="finder-eve", data={"holder_user": "finder-bob"})
    for k in range(60):
        mstore.add_finding(monitor.store, now, kind="idle_hog", key=f"others-{k}", message="not yours",
                           user="finder-carol")
    seen = monitor.findings("finder-bob", False, limit=5)
    assert sorted(f["key"] for f in seen) == ["mine-old", "rogue-old"], seen
    assert [f["key"] for f in monitor.findings("finder-bob", False, limit=1)] == ["rogue-old"]
    assert monitor.findings("finder-dan", False, limit=5) == []
    assert len(monitor.findings("finder-dan", True, limit=5)) == 5  # an admin: the newest of all
