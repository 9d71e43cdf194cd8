"""The local runner and its shim with real processes: the job environment, the log, exit
codes and reasons, time limits and cancellation over whole process trees (also children
that ignore SIGTERM or leave the group), OOM detection, lost supervisors, and runs that
outlive the process that started them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from runner_waits import wait_exit, wait_file
from servers import wait_until

from jupyter_gpujobs.engine.runners import LOST_REASON, LaunchRequest, LocalRunner

PY = sys.executable


@pytest.fixture
def runner(tmp_path: Path) -> Iterator[LocalRunner]:
    runner = LocalRunner(tmp_path / "run")
    yield runner
    runner.close()


def _req(tmp_path: Path, job_id: int, code: str | list[str], **kw: Any) -> LaunchRequest:
    command = [PY, "-c", textwrap.dedent(code)] if isinstance(code, str) else code
    fields: dict[str, Any] = {"cwd": str(tmp_path), "log_path": str(tmp_path / f"job-{job_id}.log"),
                              "grace_s": 1, "time_limit_s": 60}
    fields.update(kw)
    return LaunchRequest(job_id=job_id, command=command, **fields)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


# ------------------------------------------------------------------ environment and log


def test_job_sees_exactly_its_gpus(runner: LocalRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")  # the server's own view must not leak
    monkeypatch.setenv("GPUJOBS_FAKE_GPU_USE", "0")
    monkeypatch.delenv("PYTHONPATH", raising=False)
    code = """
        import json, os, sys
        keys = ["CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "GPUJOBS_JOB_ID",
                "GPUJOBS_GPU_UUIDS", "GPUJOBS_TIME_LIMIT", "GPUJOBS_PREEMPT_GRACE", "GPUJOBS_FAKE",
                "GPUJOBS_FAKE_GPU_USE", "PYTHONUNBUFFERED", "PYTHONPATH", "EXTRA"]
        json.dump({k: os.environ.get(k) for k in keys} | {"cwd": os.getcwd()}, open(sys.argv[1], "w"))
    """
    out = tmp_path / "env.json"
    req = _req(tmp_path, 7, [PY, "-c", textwrap.dedent(code), str(out)], gpu_indices=[1, 3],
               gpu_uuids=["GPU-a", "GPU-b"], time_limit_s=1800, grace_s=30, fake=True,
               env={"EXTRA": "yes", "CUDA_VISIBLE_DEVICES": "0"})
    assert wait_exit(runner, 7, runner.start(req)).outcome == "completed"
    env = json.loads(out.read_text())
    assert env == {
        "CUDA_VISIBLE_DEVICES": "1,3", "NVIDIA_VISIBLE_DEVICES": "1,3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "GPUJOBS_JOB_ID": "7", "GPUJOBS_GPU_UUIDS": "GPU-a,GPU-b", "GPUJOBS_TIME_LIMIT": "1800",
        "GPUJOBS_PREEMPT_GRACE": "30", "GPUJOBS_FAKE": "1", "GPUJOBS_FAKE_GPU_USE": None,
        "PYTHONUNBUFFERED": "1", "PYTHONPATH": None, "EXTRA": "yes", "cwd": str(tmp_path),
    }

    out0 = tmp_path / "env0.json"
    req0 = _req(tmp_path, 8, [PY, "-c", textwrap.dedent(code), str(out0)], gpu_indices=[], fake=False)
    assert wait_exit(runner, 8, runner.start(req0)).outcome == "completed"
    env0 = json.loads(out0.read_text())
    assert env0["CUDA_VISIBLE_DEVICES"] == "" and env0["NVIDIA_VISIBLE_DEVICES"] == ""
    assert env0["GPUJOBS_FAKE"] is None



def test_a_job_starts_inside_every_cgroup_of_its_run(runner: LocalRunner, tmp_path: Path) -> None:
    """The job's first process is in its run's cgroup in each hierarchy (v2, and every v1
    controller used) before it runs any of its own code, with its children."""
    iso = runner.isolation
    if not iso.enabled:
        pytest.skip(f"no writable cgroups here: {iso.describe()}")
    out = tmp_path / "cgroups"
    handle = runner.start(_req(tmp_path, 9, ["sh", "-c", f"cat /proc/self/cgroup > {out}; cat /proc/$$/cgroup >> {out}"]))
    assert wait_exit(runner, 9, handle).outcome == "completed"
    run = Path(handle["job_dir"]).name
    lines = out.read_text().splitlines()
    for key in ("v2", *iso.v1):
        # /proc/PID/cgroup: "0::/path" for v2, "N:controller[,…]:/path" for v1
        mine = [ln.split(":", 2)[2] for ln in lines
                if (ln.startswith("0::") if key == "v2" else key in ln.split(":", 2)[1].split(","))]
        assert len(mine) == 2 and all(path.endswith(f"/gpujobs/{run}") for path in mine), (key, lines)


def test_log_is_written_while_running(runner: LocalRunner, tmp_path: Path) -> None:
    code = """
        import sys, time
        print("first line")
        print("to stderr", file=sys.stderr)
        time.sleep(1.0)
        print("last line")
    """
    req = _req(tmp_path, 1, code)
    handle = runner.start(req)
    log = Path(req.log_path)
    text = wait_file(log, timeout=5)
    assert runner.poll({1: handle}) == [] and runner.alive(handle)
    assert "first line" in text and "to stderr" in text and "last line" not in text
    assert wait_exit(runner, 1, handle).outcome == "completed"
    assert log.read_text().splitlines() == ["first line", "to stderr", "last line"]
    assert not runner.alive(handle)


@pytest.mark.parametrize(("code", "outcome", "exit_code", "sig", "reason"), [
    ("pass", "completed", 0, None, "completed"),
    ("import sys; sys.exit(3)", "failed", 3, None, "failed (exit code 3)"),
    ("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", "failed", None, 11, "killed by signal SIGSEGV"),
])
def test_exit_codes_and_reasons(runner: LocalRunner, tmp_path: Path, code: str, outcome: str,
                                exit_code: int | None, sig: int | None, reason: str) -> None:
    exit_ = wait_exit(runner, 2, runner.start(_req(tmp_path, 2, code)))
    assert (exit_.outcome, exit_.exit_code, exit_.signal, exit_.reason) == (outcome, exit_code, sig, reason)
    assert abs(exit_.ended_at - time.time()) < 10


def test_missing_command_and_bad_cwd(runner: LocalRunner, tmp_path: Path) -> None:
    exit_ = wait_exit(runner, 3, runner.start(_req(tmp_path, 3, ["no-such-program-xyz", "--flag"])))
    assert (exit_.outcome, exit_.reason) == ("failed", "command not found: no-such-program-xyz")
    assert "command not found: no-such-program-xyz" in (tmp_path / "job-3.log").read_text()
    exit_ = wait_exit(runner, 4, runner.start(_req(tmp_path, 4, "pass", cwd=str(tmp_path / "missing"))))
    assert exit_.outcome == "failed" and exit_.reason == f"working directory not found: {tmp_path / 'missing'}"


def test_oom_is_detected_from_the_log(runner: LocalRunner, tmp_path: Path) -> None:
    code = """
        import sys
        print("step 1")
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", file=sys.stderr)
        sys.exit(1)
    """
    exit_ = wait_exit(runner, 5, runner.start(_req(tmp_path, 5, code)))
    assert exit_.outcome == "oom" and exit_.exit_code == 1
    assert "out of memory" in exit_.reason and "exit code 1" in exit_.reason
    # the same words in the log of a successful run are not an OOM
    exit_ = wait_exit(runner, 6, runner.start(_req(tmp_path, 6, "print('retrying after CUDA out of memory')")))
    assert exit_.outcome == "completed"


# ------------------------------------------------------------------ stopping process trees

STUBBORN_TREE = """
    import os, signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    out = sys.argv[1]
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    # a child that leaves the process group and ignores SIGTERM
    child = subprocess.Popen([sys.executable, "-c", stubborn], start_new_session=True)
    # a daemon: its parent exits, so it is re-parented away from the job
    if os.fork() == 0:
        os.setsid()
        d = subprocess.Popen([sys.executable, "-c", stubborn])
        open(out + ".tmp", "w").write(str(d.pid))
        os.rename(out + ".tmp", out + ".daemon")
        os._exit(0)
    while not os.path.exists(out + ".daemon"):
        time.sleep(0.01)
    open(out + ".tmp2", "w").write(f"{os.getpid()} {child.pid} {open(out + '.daemon').read()}")
    os.rename(out + ".tmp2", out)
    print("tree up", flush=True)
    time.sleep(600)
"""


def _start_tree(runner: LocalRunner, tmp_path: Path, job_id: int, **kw: Any) -> tuple[dict[str, Any], list[int]]:
    pids_file = tmp_path / f"pids-{job_id}"
    req = _req(tmp_path, job_id, [PY, "-c", textwrap.dedent(STUBBORN_TREE), str(pids_file)], **kw)
    handle = runner.start(req)
    pids = [int(p) for p in wait_file(pids_file).split()]
    assert len(pids) == 3 and all(psutil.pid_exists(p) for p in pids)
    return handle, pids


def test_time_limit_kills_the_whole_tree(runner: LocalRunner, tmp_path: Path) -> None:
    handle, pids = _start_tree(runner, tmp_path, 10, time_limit_s=2, grace_s=0.5)
    try:
        t0 = time.monotonic()
        exit_ = wait_exit(runner, 10, handle)
        assert exit_.outcome == "timeout"
        assert exit_.reason == "time limit of 2s reached"
        assert exit_.signal == signal.SIGKILL  # it ignored SIGTERM
        assert time.monotonic() - t0 < 5
        assert all(_gone(p) for p in pids), [p for p in pids if not _gone(p)]
    finally:
        _kill_all(pids)


@pytest.mark.parametrize("outcome", ["cancelled", "preempted"])
def test_terminate_with_reason(runner: LocalRunner, tmp_path: Path, outcome: str) -> None:
    handle, pids = _start_tree(runner, tmp_path, 11, grace_s=30)
    try:
        t0 = time.monotonic()
        reason = "cancelled by alice" if outcome == "cancelled" else "preempted by job 42"
        runner.terminate(11, handle, reason, outcome, grace_s=0.5)
        assert time.monotonic() - t0 < 0.1  # non-blocking
        exit_ = wait_exit(runner, 11, handle)
        assert (exit_.outcome, exit_.reason) == (outcome, reason)
        assert time.monotonic() - t0 < 4
        assert all(_gone(p) for p in pids)
    finally:
        _kill_all(pids)


def test_terminate_honours_sigterm_quickly(runner: LocalRunner, tmp_path: Path) -> None:
    code = """
        import signal, sys, time
        def bye(*a):
            print("saving checkpoint", flush=True)
            sys.exit(0)
        signal.signal(signal.SIGTERM, bye)
        print("ready", flush=True)
        time.sleep(600)
    """
    req = _req(tmp_path, 12, code)
    handle = runner.start(req)
    wait_file(Path(req.log_path))
    t0 = time.monotonic()
    runner.terminate(12, handle, "cancelled by bob", "cancelled", grace_s=30)
    exit_ = wait_exit(runner, 12, handle)
    assert (exit_.outcome, exit_.reason, exit_.exit_code) == ("cancelled", "cancelled by bob", 0)
    assert time.monotonic() - t0 < 1.5
    assert "saving checkpoint" in Path(req.log_path).read_text()


def test_cancel_right_after_start(runner: LocalRunner, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    req = _req(tmp_path, 13, [PY, "-c", f"import time; time.sleep(600); open({str(marker)!r}, 'w')"])
    handle = runner.start(req)
    runner.terminate(13, handle, "cancelled by carol", "cancelled", grace_s=0.5)
    exit_ = wait_exit(runner, 13, handle)
    assert (exit_.outcome, exit_.reason) == ("cancelled", "cancelled by carol")
    assert not marker.exists()


def test_processes_left_behind_are_stopped(runner: LocalRunner, tmp_path: Path) -> None:
    pid_file = tmp_path / "bg.pid"
    code = f"""
        import subprocess, sys
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
        open({str(pid_file)!r}, "w").write(str(p.pid))
    """
    exit_ = wait_exit(runner, 14, runner.start(_req(tmp_path, 14, code)))
    bg = int(pid_file.read_text())
    try:
        assert exit_.outcome == "completed"
        assert _gone(bg)
    finally:
        _kill_all([bg])


# ------------------------------------------------------------------ lost and surviving runs


def test_vanished_supervisor_is_lost(runner: LocalRunner, tmp_path: Path) -> None:
    req = _req(tmp_path, 20, "import time; print('up', flush=True); time.sleep(600)")
    handle = runner.start(req)
    wait_file(Path(req.log_path))
    shim = psutil.Process(handle["pid"])
    job = shim.children()
    assert len(job) == 1
    for p in [shim, *job]:
        p.kill()
    exit_ = wait_exit(runner, 20, handle)
    assert (exit_.outcome, exit_.reason) == ("lost", LOST_REASON)
    assert not runner.alive(handle)


def test_job_of_a_vanished_supervisor_is_not_left_running(runner: LocalRunner, tmp_path: Path) -> None:
    req = _req(tmp_path, 21, "import time; print('up', flush=True); time.sleep(600)")
    handle = runner.start(req)
    wait_file(Path(req.log_path))
    job = psutil.Process(handle["pid"]).children()[0]
    os.kill(handle["pid"], signal.SIGKILL)
    try:
        assert wait_exit(runner, 21, handle).outcome == "lost"
        job.wait(timeout=5)  # killed by the runner, so its GPU is really free
    finally:
        _kill_all([job.pid])


def test_recycled_pid_is_not_taken_for_the_shim(runner: LocalRunner, tmp_path: Path) -> None:
    handle = runner.start(_req(tmp_path, 22, "pass"))
    wait_exit(runner, 22, handle)
    me = {**handle, "pid": os.getpid()}  # a live process, but not the one started
    assert not LocalRunner(tmp_path / "run").alive(me)


SURVIVOR = """
    import json, sys
    from pathlib import Path
    from jupyter_gpujobs.engine.runners import LaunchRequest, LocalRunner
    state, log = sys.argv[1], sys.argv[2]
    code = "import time\\nfor i in range(4):\\n    print('line', i)\\n    time.sleep(0.3)\\n"
    handle = LocalRunner(Path(state)).start(LaunchRequest(
        job_id=30, command=[sys.executable, "-c", code], cwd=state, log_path=log, time_limit_s=60, grace_s=1))
    print(json.dumps(handle))
"""


def test_job_survives_the_process_that_started_it(tmp_path: Path) -> None:
    log = tmp_path / "job-30.log"
    done = subprocess.run([PY, "-c", textwrap.dedent(SURVIVOR), str(tmp_path / "run"), str(log)],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    handle = json.loads(done.stdout)
    runner = LocalRunner(tmp_path / "run")  # a new "server" reattaches from the stored handle
    assert runner.alive(handle)
    assert runner.poll({30: handle}) == []
    exit_ = wait_exit(runner, 30, handle)
    assert exit_.outcome == "completed"
    assert log.read_text().splitlines() == [f"line {i}" for i in range(4)]


# ------------------------------------------------------------------ supervisors started ahead


def _waiting_supervisors(runner: LocalRunner) -> dict[int, float]:
    """pid -> create time of the runner's supervisors that wait for a job (in its state dir:
    one given a job works in the job's directory)."""
    found = {}
    for child in psutil.Process().children():
        try:
            if ("--standby" in child.cmdline() and child.status() != psutil.STATUS_ZOMBIE
                    and os.path.samefile(child.cwd(), runner.state_dir)):
                found[child.pid] = child.create_time()
        except (psutil.Error, OSError):
            pass
    return found


def _four_waiting(runner: LocalRunner) -> dict[int, float]:
    """The four supervisors waiting. (Once, in CI, a fill showed three: polling again refills
    what is missing, as the engine's next poll would, and the start path copes with a dead one.)"""
    def four() -> dict[int, float] | None:
        assert runner.poll({}) == []
        waiting = _waiting_supervisors(runner)
        return waiting if len(waiting) == 4 else None

    return wait_until(four, 10, "four supervisors waiting")


def test_a_wave_of_starts_finds_a_supervisor_started_ahead_for_each(tmp_path: Path) -> None:
    """GPUs that free at once: each of their next jobs starts under a supervisor that was
    already running, not one that must start its interpreter first."""
    runner = LocalRunner(tmp_path / "run", standbys=4)
    try:
        assert runner.poll({}) == []  # a poll with nothing ended fills the supervisors in
        waiting = _four_waiting(runner)
        handles = {300 + i: runner.start(_req(tmp_path, 300 + i, [PY, "-S", "-c", f"print({i})"]))
                   for i in range(4)}
        assert {h["pid"] for h in handles.values()} == set(waiting)
        assert all(h["create_time"] == waiting[h["pid"]] for h in handles.values())
        for job_id, handle in handles.items():
            exit_ = wait_exit(runner, job_id, handle)
            assert exit_.outcome == "completed"
            assert (tmp_path / f"job-{job_id}.log").read_text() == f"{job_id - 300}\n"
        runner.poll({})
        refilled = _four_waiting(runner)
        assert not set(refilled) & set(waiting)  # new ones, ready for the next wave
    finally:
        runner.close()
    assert _waiting_supervisors(runner) == {}  # none left behind


def test_a_supervisor_started_with_another_pythonpath_is_not_used(
        runner: LocalRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "before"))
    runner.poll({})
    before = _waiting_supervisors(runner)
    assert before
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "after"))
    code = "import os; print(os.environ.get('PYTHONPATH'))"
    handle = runner.start(_req(tmp_path, 310, [PY, "-S", "-c", code]))
    assert handle["pid"] not in before
    assert wait_exit(runner, 310, handle).outcome == "completed"
    assert (tmp_path / "job-310.log").read_text() == f"{tmp_path / 'after'}\n"
    assert not set(before) & set(_waiting_supervisors(runner))  # they were stopped


# ------------------------------------------------------------------ costs


def test_start_is_fast_and_poll_is_cheap(runner: LocalRunner, tmp_path: Path) -> None:
    handles: dict[int, dict[str, Any]] = {}
    starts = []
    for i in range(20):
        t0 = time.perf_counter()
        handles[100 + i] = runner.start(_req(tmp_path, 100 + i, ["sleep", "30"]))
        starts.append(time.perf_counter() - t0)
    try:
        starts.sort()
        assert starts[len(starts) // 2] < 0.1, starts  # median seconds per start() (~5 ms when idle)
        runner.poll(handles)
        polls = []
        for _ in range(20):
            t0 = time.perf_counter()
            assert runner.poll(handles) == []
            polls.append(time.perf_counter() - t0)
        polls.sort()
        assert polls[len(polls) // 2] < 0.01, polls  # 20 running jobs
    finally:
        for job_id, handle in handles.items():
            runner.terminate(job_id, handle, "test over", "cancelled", grace_s=0.2)
        deadline = time.monotonic() + 15
        while handles and time.monotonic() < deadline:
            for exit_ in runner.poll(handles):
                handles.pop(exit_.job_id)
            time.sleep(0.05)
        assert not handles


def test_dispatch_latency(runner: LocalRunner, tmp_path: Path) -> None:
    """From start() to the job's own code running."""
    marker = tmp_path / "t"
    code = f"import time; open({str(marker)!r}, 'w').write(repr(time.time()))"
    times = []
    for i in range(5):
        marker.unlink(missing_ok=True)
        t0 = time.time()
        handle = runner.start(_req(tmp_path, 200 + i, [PY, "-S", "-c", code]))
        wait_exit(runner, 200 + i, handle)
        times.append(float(marker.read_text()) - t0)
    times.sort()
    assert times[len(times) // 2] < 0.5, times


def test_a_supervisor_exit_is_reported_on_the_event_loop_at_once(runner: LocalRunner, tmp_path: Path) -> None:
    """The engine learns of an ended run when its supervisor exits, not at its next poll."""
    import asyncio

    async def run() -> tuple[float, float]:
        woke = asyncio.Event()
        runner.on_exit = woke.set
        runner.fill_standbys()  # one started ahead, as the engine keeps them, and one not
        ends = []
        for job_id in (300, 301):
            handle = runner.start(_req(tmp_path, job_id, ["sh", "-c", f"sleep 0.3; date +%s.%N > {tmp_path}/end"]))
            woke.clear()
            await asyncio.wait_for(woke.wait(), 10)
            noticed = time.time()
            assert [e.outcome for e in runner.poll({job_id: handle})] == ["completed"]
            ends.append(noticed - float((tmp_path / "end").read_text()))
        return ends[0], ends[1]

    try:
        lags = asyncio.run(run())
    finally:
        runner.on_exit = None
    assert max(lags) < 1.0, lags  # the engine polls every 50 ms; told at once, it need not


# ------------------------------------------------------------------ adopted GPU kernels


def test_two_engines_kernels_of_the_same_job_id_are_confined_apart(tmp_path: Path) -> None:
    """Job ids are one engine's, cgroups are the machine's: ending one engine's kernel job 1
    must not kill another engine's kernel job 1 on the same host."""
    one, two = LocalRunner(tmp_path / "one"), LocalRunner(tmp_path / "two")
    if not one.isolation.enabled:
        pytest.skip(f"no writable cgroups here: {one.isolation.describe()}")
    kernels = [subprocess.Popen(["sleep", "60"]) for _ in range(2)]
    handles: list[dict[str, Any]] = []
    try:
        for runner, proc in zip((one, two), kernels):
            handle = runner.adopt(LaunchRequest(job_id=1, command=[], cwd=""), [proc.pid])
            assert handle is not None
            handles.append(handle)
        one.stop_adopted(handles[0])
        kernels[0].wait(timeout=10)  # SIGKILLed through its cgroup
        time.sleep(0.2)
        assert kernels[1].poll() is None, "the other engine's kernel was killed"
        assert two.adopted_alive(handles[1])
        assert one.adopted_run(handles[0]) != two.adopted_run(handles[1])
        # a kernel restart joins its job's cgroups again
        again = subprocess.Popen(["sleep", "60"])
        kernels.append(again)
        assert one.adopt(LaunchRequest(job_id=1, command=[], cwd=""), [again.pid], handles[0]) == handles[0]
        assert one.adopted_alive(handles[0])
    finally:
        for runner, handle in zip((one, two), handles):
            runner.stop_adopted(handle)
            runner.release_adopted(handle)
        _kill_all([p.pid for p in kernels])
        for p in kernels:
            p.wait(timeout=10)
