"""The monitor's pure parts and store queries on seeded history with known answers:
runtime prediction, the detectors, GPU-hours by user/group/model, the weekday x hour
heatmap, rollup and retention of samples."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

from jupyter_gpujobs.engine.monitor.diagnosis import (
    GPUErrorState,
    ProcessInfo,
    detect_gpu_errors,
    detect_idle_hog,
    detect_oom,
    detect_repeated_failures,
    detect_rogues,
    update_gpu_errors,
)
from jupyter_gpujobs.engine.monitor.predict import RuntimePredictor, command_signature, predict_runtime
from jupyter_gpujobs.engine.monitor.text import format_heatmap, format_usage
from jupyter_gpujobs.engine.monitor.usage import heatmap_report, parse_time, usage_report
from jupyter_gpujobs.engine.store import Store
from jupyter_gpujobs.engine.store import monitoring as mstore
from jupyter_gpujobs.model import GPU, Job, JobState

# ----------------------------------------------------------------------------- prediction


def test_prediction_falls_back_from_fine_to_coarse_keys() -> None:
    history = [(("alice", "train", "a100"), 100.0), (("alice", "train", "a100"), 110.0),
               (("alice", "eval", ""), 10.0), (("bob", "x", ""), 1000.0)]
    seconds, confidence = predict_runtime(history, ("alice", "train", "a100"))
    assert seconds == 105.0 and confidence > 0.6
    p = RuntimePredictor()
    for key, runtime in history:
        p.add(key, runtime)
    assert p.predict(("alice", "train", "t4")).level == "user+name"
    user_level = p.predict(("alice", "new", ""))
    assert user_level.level == "user" and user_level.seconds == 100.0
    assert user_level.confidence < 0.6, "another job of the user is not a confident guess"
    assert p.predict(("carol", "x", "")).level == "global"
    assert RuntimePredictor().predict(("a", "b", "")).seconds is None


def test_spread_goes_to_the_range_not_the_confidence() -> None:
    # a spread history is as sure as a steady one of as many runs (issue 28: expected starts use
    # its spread themselves); the spread is its 10th-90th percentiles
    steady = RuntimePredictor()
    noisy = RuntimePredictor()
    for i in range(6):
        steady.add(("u", "j", ""), 600.0 + i)
        noisy.add(("u", "j", ""), [10.0, 5000.0, 60.0, 3000.0, 20.0, 900.0][i])
    s, n = steady.predict(("u", "j", "")), noisy.predict(("u", "j", ""))
    assert s.confidence == n.confidence == round(6 / 7, 3)
    assert n.low_s is not None and n.high_s is not None and n.low_s < 20.0 and n.high_s > 3000.0


def test_command_signature() -> None:
    assert command_signature(["python", "train.py", "--lr", "0.1"]) == "python train.py"
    assert command_signature(["/usr/bin/python3", "-u", "exp_12.py", "x=1"]) == "python# exp_#.py"


# ----------------------------------------------------------------------------- detectors


def _job(i: int, state: JobState = JobState.FAILED, reason: str = "failed (exit code 1)", **kw: object) -> Job:
    base = dict(id=i, user="alice", name="train", command=["python", "train.py"], state=state, reason=reason,
                started_at=100.0 + i, ended_at=200.0 + i, exit_code=1)
    base.update(kw)
    return Job(**base)  # type: ignore[arg-type]


def test_oom_from_log_and_from_memory_at_the_limit() -> None:
    f = detect_oom(_job(1), "Traceback...\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB")
    assert f is not None and f.kind == "oom" and "ran out of GPU memory" in f.message
    g = detect_oom(_job(2), "Segmentation fault", memory_max_fraction=0.99, memory_max_mb=40500,
                   memory_total_mb=40960)
    assert g is not None and "at the limit" in g.message and "39.6 of 40.0 GiB" in g.message
    assert detect_oom(_job(3), "all fine", memory_max_fraction=0.5) is None
    assert detect_oom(_job(4, JobState.COMPLETED, "completed"), "CUDA out of memory") is None


def test_three_failures_in_a_row() -> None:
    latest = [_job(5, reason="out of memory (CUDA out of memory in the log; exit code 1)"),
              _job(4, reason="out of memory (CUDA out of memory in the log; exit code 1)"),
              _job(3, reason="out of memory (CUDA out of memory in the log; exit code 1)"),
              _job(2, JobState.COMPLETED, "completed")]
    f = detect_repeated_failures(latest, threshold=3)
    assert f is not None
    assert f.message == "job 'train' of alice failed 3 times in a row: out of memory"
    assert f.data["jobs"] == [5, 4, 3]
    assert detect_repeated_failures(latest[1:], threshold=3) is None
    mixed = detect_repeated_failures([_job(3, reason="failed (exit code 2)"), _job(2), _job(1)], threshold=3)
    assert mixed is not None and mixed.message.endswith("failed 3 times in a row: last: exit code 2")


def test_idle_hog_after_the_configured_time() -> None:
    job = _job(7, JobState.RUNNING, "", assigned_gpus=(1,), host="localhost")
    assert detect_idle_hog(job, None, 100.0, 2.0, 1.0) is None
    assert detect_idle_hog(job, 99.0, 100.0, 2.0, 1.0) is None
    f = detect_idle_hog(job, 97.0, 100.0, 2.0, 1.0)
    assert f is not None and f.key == "idle:7" and "GPU 1 at ~0% utilization" in f.message


def test_gpu_errors_and_drain_policy() -> None:
    state = GPUErrorState()
    assert not update_gpu_errors(state, 0, None, True)
    assert detect_gpu_errors("h", 2, "GPU-x", "A100", state, drain_after=3) is None
    assert update_gpu_errors(state, 1, None, True)
    assert update_gpu_errors(state, 1, 79, True)
    f = detect_gpu_errors("h", 2, "GPU-x", "A100", state, drain_after=3)
    assert f is not None and not f.data["drain"] and "Xid 79" in f.message
    update_gpu_errors(state, 1, 79, False)
    f = detect_gpu_errors("h", 2, "GPU-x", "A100", state, drain_after=3)
    assert f is not None and f.data["drain"] and "draining it" in f.message


def test_rogue_processes() -> None:
    holder = _job(9, JobState.RUNNING, "", assigned_gpus=(0,), host="h")
    procs = [ProcessInfo(pid=10, gpu_index=0, owner_job=9), ProcessInfo(pid=11, gpu_index=0, owner_job=None, user="bob"),
             ProcessInfo(pid=12, gpu_index=1, owner_job=None, name="python"),
             ProcessInfo(pid=13, gpu_index=1, owner_job=9), ProcessInfo(pid=14, gpu_index=1, owner_job=None, ignored=True)]
    found = {f.pid: f for f in detect_rogues("h", procs, {0: holder}, {0: "A100", 1: "A100"})}
    assert set(found) == {11, 12, 13}
    assert "allocated to job 9 ('train' of alice)" in found[11].message
    assert "which no job holds" in found[12].message
    assert "of job 9 uses GPU 1" in found[13].message


# ----------------------------------------------------------------------------- seeded history


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    s.migrate()
    return s


def _run(store: Store, user: str, group: str | None, gpus: list[tuple[int, str]], start: float, end: float | None) -> int:
    job = store.add_jobs([{"user": user, "group": group, "command": ["x"], "gpus": len(gpus)}], user, start - 60)[0]
    assert store.start(job.id, "node-a", gpus, start) is not None
    if end is not None:
        store.transition(job.id, JobState.COMPLETED, "runner", "completed", end)
    return job.id


def test_gpu_hours_by_user_group_and_model(store: Store) -> None:
    t0 = 1_000_000.0
    mstore.record_gpus(store, [GPU(0, "GPU-a", "A100", "node-a", 40960), GPU(1, "GPU-b", "T4", "node-a", 15360)], t0)
    _run(store, "alice", "vision", [(0, "GPU-a")], t0, t0 + 2 * 3600)  # 2 GPU-h
    _run(store, "bob", None, [(1, "GPU-b")], t0 + 3600, t0 + 2 * 3600)  # 1 GPU-h
    _run(store, "alice", "nlp", [(0, "GPU-a"), (1, "GPU-b")], t0 + 3 * 3600, t0 + 5 * 3600)  # 2 x 2h, half in range
    _run(store, "carol", None, [(1, "GPU-b")], t0 + 5 * 3600, None)  # still running: counts up to `until`/now
    since, until = t0, t0 + 4 * 3600
    now = t0 + 10 * 3600
    by_user = usage_report(store, since, until, "user", now)
    assert [(r["key"], r["gpu_hours"], r["jobs"]) for r in by_user["rows"]] == [("alice", 4.0, 2), ("bob", 1.0, 1)]
    assert by_user["total_gpu_hours"] == 5.0
    by_group = {r["key"]: r["gpu_hours"] for r in usage_report(store, since, until, "group", now)["rows"]}
    assert by_group == {"vision": 2.0, "nlp": 2.0, "(none)": 1.0}
    by_model = {r["key"]: r["gpu_hours"] for r in usage_report(store, since, until, "model", now)["rows"]}
    assert by_model == {"A100": 3.0, "T4": 2.0}
    later = {r["key"]: r["gpu_hours"] for r in usage_report(store, t0 + 5 * 3600, t0 + 8 * 3600, "user",
                                                             t0 + 6 * 3600)["rows"]}
    assert later == {"carol": 1.0}, "a GPU still held counts up to now"
    assert "alice" in format_usage(by_user) and "80.0%" in format_usage(by_user)


def _sample(gpu: int, t: float, util: float) -> mstore.SampleValues:
    return mstore.SampleValues(host="node-a", gpu_index=gpu, gpu_uuid=f"GPU-{gpu}", time=t, utilization=util,
                               memory_used_mb=100, memory_total_mb=1000)


def test_heatmap_by_weekday_and_local_hour(store: Store) -> None:
    monday_10 = datetime(2026, 3, 2, 10, 0).timestamp()  # local time
    tuesday_23 = datetime(2026, 3, 3, 23, 0).timestamp()
    mstore.add_samples(store, [_sample(0, monday_10 + 900, 50.0), _sample(1, monday_10 + 2700, 100.0),
                               _sample(0, tuesday_23 + 1800, 20.0)])
    report = heatmap_report(store, monday_10 - 86400, tuesday_23 + 86400)
    cells = report["utilization"]
    assert cells[0][10] == 75.0 and report["samples"][0][10] == 2
    assert cells[1][23] == 20.0
    assert sum(v is not None for row in cells for v in row) == 2
    grid = format_heatmap(report)
    assert grid.splitlines()[2].startswith("Mon") and "▓" in grid.splitlines()[2]


def test_rollup_keeps_means_and_prunes_by_retention(store: Store) -> None:
    start = datetime(2026, 3, 2, 10, 0).timestamp()
    start -= start % 3600
    values = [_sample(0, start + i * 10, 100.0 if i % 2 else 0.0) for i in range(2 * 360)]  # 2 h every 10 s
    mstore.add_samples(store, values)
    now = start + 2 * 3600 + 30
    done = mstore.rollup(store, now, raw_keep_s=600, minute_keep_s=7200, hour_keep_s=86400)
    assert done["minutes"] == 120 and done["hours"] == 2
    counts = mstore.count_samples(store)
    assert counts[mstore.RAW] == 57, "raw rows only of the last 10 minutes (7190 - 6630 s, every 10 s)"
    assert counts[mstore.HOUR] == 2
    again = mstore.rollup(store, now + 5, raw_keep_s=600, minute_keep_s=7200, hour_keep_s=86400)
    assert again["minutes"] == 0 and again["hours"] == 0, "a bucket is rolled up once"
    report = heatmap_report(store, start - 10, now)
    assert report["utilization"][0][10] == 50.0 and report["samples"][0][10] == 360
    assert report["utilization"][0][11] == 50.0
    hourly = mstore.samples(store, start, now, resolution=mstore.HOUR)
    assert hourly[0]["utilization_max"] == 100.0 and hourly[0]["count"] == 360


def test_parse_time() -> None:
    now = 1_000_000.0
    assert parse_time("7d", now, "since", 0) == now - 7 * 86400
    assert parse_time("12345", now, "since", 0) == 12345.0
    assert parse_time(None, now, "since", 5.0) == 5.0
    assert parse_time("2026-03-02", now, "since", 0) == datetime(2026, 3, 2).timestamp()
    from jupyter_gpujobs.model import InvalidInput

    with pytest.raises(InvalidInput) as err:
        parse_time("yesterday-ish", now, "since", 0)
    assert err.value.field == "since"


def test_rollup_of_a_gpu_back_after_a_long_absence(store: Store) -> None:
    old = datetime(2026, 3, 2, 10, 0).timestamp()
    now = old + 30 * 86400
    mstore.add_samples(store, [_sample(1, now - 7200 + i * 10, 40.0) for i in range(360)])  # GPU 1: recent
    mstore.rollup(store, now, raw_keep_s=600, minute_keep_s=7200, hour_keep_s=400 * 86400)
    mstore.add_samples(store, [_sample(0, old + 60, 90.0)])  # GPU 0: a month-old reading arrives
    mstore.rollup(store, now + 60, raw_keep_s=600, minute_keep_s=7200, hour_keep_s=400 * 86400)
    report = heatmap_report(store, old - 3600, old + 3600)
    assert report["utilization"][0][10] == 90.0, "rolled up into an hour row before the raw row was pruned"


def test_rollup_keeps_readings_committed_while_it_runs(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another writer (a second host, imported history, a test seeding a live server) commits
    old readings after the roll-ups have read the table but before the prune: they are not
    rolled up this time, so they must stay for the next rollup, not be pruned unrolled."""
    old = datetime(2026, 3, 4, 14, 0).timestamp()
    now = old + 30 * 86400 + 30
    mstore.add_samples(store, [_sample(1, now - 1, 40.0)])  # the live GPU: its minute is not complete yet,
    other = Store(store.url)  # so this rollup writes nothing before the prune and holds no write lock
    roll = mstore._roll

    def roll_then_commit(s: object, source: int, target: int, at: float) -> int:
        done = roll(s, source, target, at)
        if target == mstore.HOUR:  # both roll-ups have read the table; the prune comes next
            mstore.add_samples(other, [_sample(0, old + 600, 95.0)])
        return done

    monkeypatch.setattr(mstore, "_roll", roll_then_commit)
    mstore.rollup(store, now, raw_keep_s=600, minute_keep_s=7200, hour_keep_s=400 * 86400)
    monkeypatch.setattr(mstore, "_roll", roll)
    other.close()
    assert heatmap_report(store, old - 3600, old + 3600)["utilization"][2][14] == 95.0, "kept, not pruned"
    done = mstore.rollup(store, now + 60, raw_keep_s=600, minute_keep_s=7200, hour_keep_s=400 * 86400)
    assert done["minutes"] >= 1 and done["hours"] >= 1
    assert mstore.samples(store, old, old + 3600, resolution=mstore.RAW) == [], "pruned once rolled up"
    report = heatmap_report(store, old - 3600, old + 3600)
    assert report["utilization"][2][14] == 95.0 and report["samples"][2][14] == 1


def test_the_cli_formats_monitor_reports_without_loading_the_database_library() -> None:
    """`jupyter gpujobs usage` and `findings` format their replies with monitor/text.py;
    importing it (and so the monitor package) must not load SQLAlchemy, which would double
    the start-up time of every such command."""
    probe = ("import sys, jupyter_gpujobs.cli, jupyter_gpujobs.engine.monitor.text; "
             "print('sqlalchemy' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "False", (r.stdout, r.stderr)
