"""The files of ended jobs (run directories under STATE_DIR/run, logs under STATE_DIR/logs) are
removed after c.GPUJobs.job_retention by the engine's background pass; active jobs' files,
runs whose processes may be alive and anything outside the state dir stay, and the job's
record, events and a clear 404 for its log remain."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from servers import wait_for
from traitlets import TraitError
from traitlets.config import Config

from jupyter_gpujobs.config import GPUJobs, retention_seconds
from jupyter_gpujobs.engine.retention import run_may_be_alive

PY = sys.executable


@pytest.fixture
def gpujobs_config(tmp_path: Path) -> dict[str, Any]:
    return {
        "fake_gpus": "2xA100",
        "state_dir": str(tmp_path / "gpujobs-state"),
        "kill_grace": 1,
        "preempt_grace": 1,
        "tick_interval": 0.5,
        "job_retention": "3s",
        "job_cleanup_interval": 0.2,
    }


def run_dirs(engine: Any, job_id: int) -> list[Path]:
    return sorted(Path(engine.runner.state_dir).glob(f"job-{job_id}-*"))


async def submit(api: Any, code: str) -> int:
    status, body = await api("POST", "jobs", {"command": [PY, "-c", code], "gpus": 0, "time_limit": "1m"})
    assert status == 201, body
    return int(body["id"])


async def wait_state(api: Any, job_id: int, states: tuple[str, ...], timeout: float = 15) -> dict[str, Any]:
    async def check() -> Any:
        status, body = await api("GET", f"jobs/{job_id}")
        return body if body["state"] in states else None

    return await wait_for(check, timeout=timeout)


async def test_ended_jobs_files_go_after_the_retention(api: Any, engine: Any, tmp_path: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="jupyter_gpujobs")
    assert engine.job_retention_s == 3 and engine.cleanup_interval == 0.2
    done_id = await submit(api, "print('hello from the past', flush=True)")
    running_id = await submit(api, "import time; print('still here', flush=True); time.sleep(60)")
    guarded_id = await submit(api, "print('guarded', flush=True)")

    # a run whose recorded process is alive is kept even though its job ended
    holder = subprocess.Popen([PY, "-c", "import time; time.sleep(60)"])
    try:
        await wait_state(api, guarded_id, ("COMPLETED",))
        (guarded_dir,) = run_dirs(engine, guarded_id)
        (guarded_dir / "state.json").write_text(json.dumps({"pid": holder.pid, "started_at": time.time()}))
        done = await wait_state(api, done_id, ("COMPLETED",))
        await wait_state(api, running_id, ("RUNNING",))
        # within the retention the log of an ended job reads as before
        status, body = await api("GET", f"jobs/{done_id}/log")
        assert status == 200 and body["data"] == "hello from the past\n" and body["done"] is True
        (done_dir,) = run_dirs(engine, done_id)
        done_log = Path(engine.store.log_path(done_id))
        assert done_log.is_file() and done_log.parent == engine.state_dir / "logs"

        # the pass never follows a symlink out of the state dir, even one named like a run
        outside = tmp_path / "outside"
        outside.mkdir()
        (outside / "precious.txt").write_text("keep me")
        decoy = Path(engine.runner.state_dir) / f"job-{done_id}-ffff"
        decoy.symlink_to(outside, target_is_directory=True)
        decoy_log = engine.state_dir / "logs" / f"job-{running_id + 1000}.log"
        decoy_log.symlink_to(outside / "precious.txt")

        await wait_for(lambda: not done_dir.exists() and not done_log.exists(), timeout=15)
        assert time.time() >= done["ended_at"] + 3
        assert (outside / "precious.txt").read_text() == "keep me"
        assert decoy.is_symlink() and decoy_log.is_symlink()
        assert guarded_dir.is_dir(), "a run with a live process stays"
        assert Path(engine.store.log_path(guarded_id)).is_file()
        # the running job's run and log are untouched, and it still runs
        assert len(run_dirs(engine, running_id)) == 1
        status, body = await api("GET", f"jobs/{running_id}/log")
        assert status == 200 and body["data"] == "still here\n"
        assert (await wait_state(api, running_id, ("RUNNING",)))["state"] == "RUNNING"
    finally:
        holder.kill()
        holder.wait()
    # once the process is gone, the guarded run goes too
    await wait_for(lambda: not guarded_dir.exists(), timeout=15)
    removals = [r.getMessage() for r in caplog.records if "removed the files of" in r.getMessage()]
    assert removals and all("(c.GPUJobs.job_retention)" in m and " freed" in m for m in removals), removals

    # the removed log answers a clear 404, not a 500 and not an empty success
    status, body = await api("GET", f"jobs/{done_id}/log")
    assert status == 404, body
    assert body["message"] == (f"the log of job {done_id} was removed after the 3s retention "
                               "(c.GPUJobs.job_retention); the job's record and events are kept")
    # the job itself, its events and its place in the list stay
    status, body = await api("GET", f"jobs/{done_id}")
    assert status == 200 and body["state"] == "COMPLETED" and body["exit_code"] == 0
    status, listing = await api("GET", "jobs")
    assert done_id in [j["id"] for j in listing["jobs"]]
    status, events = await api("GET", f"jobs/{done_id}/events")
    assert [e["state"] for e in events["events"]][-1] == "COMPLETED"

    status, body = await api("DELETE", f"jobs/{running_id}")
    assert status == 200


def test_bad_job_retention_names_the_setting() -> None:
    with pytest.raises(TraitError, match=r"c\.GPUJobs\.job_retention: cannot read duration 'soon'"):
        GPUJobs(config=Config({"GPUJobs": {"job_retention": "soon"}}))
    with pytest.raises(TraitError, match=r"c\.GPUJobs\.job_retention: duration must be positive"):
        GPUJobs(job_retention=-5)
    with pytest.raises(TraitError, match=r"c\.GPUJobs\.job_cleanup_interval: must be positive"):
        GPUJobs(job_cleanup_interval=0)
    assert GPUJobs().job_retention == "7d" and retention_seconds(GPUJobs().job_retention) == 7 * 86400
    for forever in (0, "0", " 0 ", "0d"):
        assert retention_seconds(GPUJobs(job_retention=forever).job_retention) == 0
    assert retention_seconds(GPUJobs(job_retention="1d12h").job_retention) == 36 * 3600


def test_run_may_be_alive_reads_the_recorded_pids(tmp_path: Path) -> None:
    run = tmp_path / "job-1-abc"
    run.mkdir()
    assert not run_may_be_alive(run)
    (run / "state.json").write_text(json.dumps({"pid": os.getpid(), "started_at": time.time()}))
    assert run_may_be_alive(run)
    # a process younger than the record has a recycled pid: not this run's
    (run / "state.json").write_text(json.dumps({"pid": os.getpid(), "started_at": time.time() - 10 ** 7}))
    assert not run_may_be_alive(run)
    proc = subprocess.Popen([PY, "-c", "pass"])
    proc.wait()
    (run / "state.json").write_text(json.dumps({"pid": proc.pid, "shim_pid": proc.pid, "started_at": time.time()}))
    assert not run_may_be_alive(run)
