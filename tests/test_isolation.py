"""Jobs as their owners, in their own cgroups, behind a GPU device fence: the local runner and
its shim with real Unix users (scripts/install-multiuser.sh), real cgroups and real character
devices made by the fake GPU backend (major 195, no driver: an allowed node opens with ENXIO,
a denied one fails with EPERM). Needs root, as CI runs it; elsewhere these tests are skipped.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from runner_waits import wait_exit, wait_file, wait_pids

from jupyter_gpujobs.engine.gpus import FakeBackend
from jupyter_gpujobs.engine.runners import LaunchRequest, LocalRunner, cgroups
from jupyter_gpujobs.model import parse_fake_gpus

ROOT = Path(__file__).resolve().parents[1]
U1, U2 = "gpujobs-u1", "gpujobs-u2"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (users, cgroups, device nodes)")


@pytest.fixture(scope="module", autouse=True)
def users() -> None:
    subprocess.run([str(ROOT / "scripts" / "install-multiuser.sh"), "--users"], check=True)


@pytest.fixture
def runner(tmp_path: Path) -> Iterator[LocalRunner]:
    r = LocalRunner(tmp_path / "run")
    yield r
    r.close()


@pytest.fixture
def gpus(open_dir: Path) -> FakeBackend:
    return FakeBackend(parse_fake_gpus("4xA100"), device_dir=str(open_dir / "dev"))


def _req(tmp_path: Path, job_id: int, script: str, **kw: Any) -> LaunchRequest:
    fields: dict[str, Any] = {"cwd": "/tmp", "log_path": str(tmp_path / "logs" / f"job-{job_id}.log"),
                              "grace_s": 1, "time_limit_s": 60}
    fields.update(kw)
    return LaunchRequest(job_id=job_id, command=["/bin/sh", "-c", script], **fields)


def _log(tmp_path: Path, job_id: int) -> str:
    return (tmp_path / "logs" / f"job-{job_id}.log").read_text()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# ------------------------------------------------------------------ jobs as their owners


def test_job_runs_as_its_owner_with_a_private_umask(runner: LocalRunner, tmp_path: Path, open_dir: Path) -> None:
    entry = pwd.getpwnam(U1)
    handle = runner.start(_req(tmp_path, 1, 'id -u; id -g; id -G; echo "$HOME $USER $LOGNAME"; umask; pwd; '
                                            'touch made-by-job', cwd=str(open_dir), run_as=U1))
    exit_ = wait_exit(runner, 1, handle)
    assert exit_.outcome == "completed", _log(tmp_path, 1)
    uid, gid, groups, names, umask, cwd = _log(tmp_path, 1).splitlines()
    assert (int(uid), int(gid)) == (entry.pw_uid, entry.pw_gid)
    assert set(groups.split()) == {str(g) for g in os.getgrouplist(U1, entry.pw_gid)}  # initgroups, not root's
    assert names == f"{entry.pw_dir} {U1} {U1}"
    assert umask == "0077"
    assert cwd == str(open_dir)
    made = (open_dir / "made-by-job").stat()
    assert made.st_uid == entry.pw_uid and made.st_mode & 0o077 == 0
    log = (tmp_path / "logs" / "job-1.log").stat()
    assert log.st_uid == entry.pw_uid and log.st_mode & 0o777 == 0o600


def test_cwd_the_owner_cannot_enter_fails_with_the_reason(runner: LocalRunner, tmp_path: Path) -> None:
    private = Path(pwd.getpwnam(U2).pw_dir)  # 0750, gpujobs-u2's
    handle = runner.start(_req(tmp_path, 2, "echo ran", cwd=str(private), run_as=U1))
    exit_ = wait_exit(runner, 2, handle)
    assert exit_.outcome == "failed"
    assert exit_.reason == f"cwd {private} is not accessible to {U1}"
    assert "ran" not in _log(tmp_path, 2)


def test_owner_who_is_not_a_unix_user_is_a_clear_failure(runner: LocalRunner, tmp_path: Path) -> None:
    handle = runner.start(_req(tmp_path, 3, "echo ran", run_as="nobody-here-xyz"))
    exit_ = wait_exit(runner, 3, handle)
    assert exit_.outcome == "failed"
    assert exit_.reason == "the job's owner 'nobody-here-xyz' is not a Unix user on this machine"


def test_one_users_job_cannot_touch_anothers(runner: LocalRunner, tmp_path: Path, open_dir: Path) -> None:
    """u2's job runs; u1's job tries to read u2's log and run directory and to signal u2's
    job and its supervisor: EACCES and EPERM."""
    out = open_dir / "u2.pid"
    h2 = runner.start(_req(tmp_path, 10, f"echo $$ > {out}; echo secret-of-u2; exec sleep 60",
                           cwd=str(open_dir), run_as=U2))
    u2_pid = int(wait_file(out))
    u2_log = tmp_path / "logs" / "job-10.log"
    os.chmod(tmp_path, 0o755)  # as the engine's state dir may be: the fence is each file's own mode
    os.chmod(tmp_path / "logs", 0o755)
    probe = (f"cat {u2_log} 2>&1; echo; ls {h2['job_dir']} 2>&1; echo; "
             f"kill -TERM {u2_pid} 2>&1; echo; kill -TERM {h2['pid']} 2>&1; echo done")
    h1 = runner.start(_req(tmp_path, 11, probe, cwd=str(open_dir), run_as=U1))
    assert wait_exit(runner, 11, h1).outcome == "completed"
    log = _log(tmp_path, 11)
    assert "secret-of-u2" not in log
    assert log.count("Permission denied") == 2, log  # the log (EACCES) and the run directory
    assert log.count("Operation not permitted") == 2, log  # the job and its supervisor (EPERM)
    assert _alive(u2_pid) and runner.alive(h2)
    runner.terminate(10, h2, "done")
    assert wait_exit(runner, 10, h2).outcome == "cancelled"


def test_kill_of_its_supervisor_is_refused_and_the_job_stays_held(runner: LocalRunner, tmp_path: Path,
                                                                  open_dir: Path) -> None:
    """`kill -9 $PPID` from a job run as its owner: EPERM; the run goes on and ends whole at its
    time limit, its setsid grandchild included."""
    pids = open_dir / "pids"
    script = (f"setsid sh -c 'sleep 300 & echo $! >> {pids}; wait' & "
              f"kill -9 $PPID; echo kill=$?; echo $$ >> {pids}; sleep 300")
    handle = runner.start(_req(tmp_path, 20, script, cwd=str(open_dir), run_as=U1, time_limit_s=3))
    time.sleep(1.0)
    assert runner.alive(handle) and not runner.poll({20: handle})
    exit_ = wait_exit(runner, 20, handle)
    assert exit_.outcome == "timeout"
    assert "kill=1" in _log(tmp_path, 20)
    for pid in wait_pids(pids, 2):
        assert not _alive(pid)


# ------------------------------------------------------------------ cgroups: the whole tree


def _daemon_job(pids: Path) -> str:
    """A job that double-forks a setsid daemon, then kills its own supervisor."""
    return (f"setsid sh -c 'sh -c \"sleep 300 & echo \\$! >> {pids}\" & wait' ; "
            f"sleep 0.3; echo $$ >> {pids}; kill -9 $PPID; sleep 300")


def test_job_that_kills_its_supervisor_holds_its_gpu_until_all_its_processes_are_gone(
        runner: LocalRunner, tmp_path: Path) -> None:
    assert runner.isolation.enabled
    pids = tmp_path / "pids"
    handle = runner.start(_req(tmp_path, 30, _daemon_job(pids), cwd=str(tmp_path)))
    job_pids = wait_pids(pids, 2)
    deadline = time.monotonic() + 10
    # the supervisor is gone: every poll until the last process of the job is dead says "running"
    while True:
        exits = runner.poll({30: handle})
        if exits:
            break
        assert time.monotonic() < deadline + 10
        time.sleep(0.01)
    assert exits[0].outcome == "lost"
    for pid in job_pids:
        assert not _alive(pid), "the GPU was given back while a process of the job lived"
    assert not os.path.exists(handle["cgroups"]["freezer"])  # and its cgroups are removed


@pytest.mark.parametrize("mode", ["auto", "v2"])
def test_daemonized_processes_are_stopped_at_the_time_limit(mode: str, tmp_path: Path) -> None:
    """auto: v2 and v1 cgroups here; v2: the v2 hierarchy alone, as on a v2-only host."""
    runner = LocalRunner(tmp_path / "run", cgroups_mode=mode)
    if mode == "v2":
        assert set(runner.isolation.paths("x")) == {"v2"}
    pids = tmp_path / "pids"
    script = (f"setsid sh -c 'sh -c \"sleep 300 & echo \\$! >> {pids}\" & wait' ; "
              f"echo $$ >> {pids}; sleep 300")
    try:
        handle = runner.start(_req(tmp_path, 31, script, cwd=str(tmp_path), time_limit_s=2))
        assert wait_exit(runner, 31, handle).outcome == "timeout"
        for pid in wait_pids(pids, 2):
            assert not _alive(pid)
    finally:
        runner.close()


def test_restarted_runner_reattaches_by_cgroup(tmp_path: Path) -> None:
    """A new runner (an engine restart) given the stored handle of a job whose supervisor died
    still finds and stops the job's processes through its cgroup."""
    first = LocalRunner(tmp_path / "run")
    pids = tmp_path / "pids"
    handle = first.start(_req(tmp_path, 32, _daemon_job(pids), cwd=str(tmp_path)))
    job_pids = wait_pids(pids, 2)
    first.close()
    second = LocalRunner(tmp_path / "run")
    assert cgroups.populated(handle["cgroups"])
    exit_ = wait_exit(second, 32, handle)
    assert exit_.outcome == "lost"
    assert not any(_alive(p) for p in job_pids)


# ------------------------------------------------------------------ the GPU fence


@pytest.mark.parametrize("mode", ["auto", "v2"])
def test_job_opens_only_its_own_gpus(mode: str, tmp_path: Path, gpus: FakeBackend, open_dir: Path) -> None:
    """auto: the v1 devices controller here; v2: a BPF device program on the job's v2 cgroup,
    as on a v2-only host."""
    runner = LocalRunner(tmp_path / "run", cgroups_mode=mode)
    assert runner.isolation.describe().startswith(
        "GPU fence: device cgroup (BPF)" if mode == "v2" else "GPU fence: device cgroup;")
    nodes = gpus.device_nodes()
    assert sorted(nodes) == [0, 1, 2, 3]
    probe = "; ".join(f"(exec 3<{nodes[i]}) 2>&1 | sed 's/^/gpu{i}: /'" for i in range(4))
    deny = [nodes[i] for i in (0, 2, 3)]
    handle = runner.start(_req(tmp_path, 40, probe, cwd=str(open_dir), run_as=U1, gpu_indices=[1],
                               deny_devices=deny, fake=True))
    assert wait_exit(runner, 40, handle).outcome == "completed"
    lines = dict(line.split(": ", 1) for line in _log(tmp_path, 40).splitlines() if line.startswith("gpu"))
    assert "No such device or address" in lines["gpu1"]  # allowed: no driver behind it (ENXIO)
    for i in (0, 2, 3):
        assert "Operation not permitted" in lines[f"gpu{i}"], lines  # denied by the cgroup (EPERM)
    runner.close()


def test_fallback_without_cgroups_says_so_and_keeps_todays_behaviour(tmp_path: Path, gpus: FakeBackend) -> None:
    plain = LocalRunner(tmp_path / "run", cgroups_mode="off")
    try:
        assert plain.isolation.describe().startswith("GPU fence: none, CUDA_VISIBLE_DEVICES only")
        nodes = gpus.device_nodes()
        handle = plain.start(_req(tmp_path, 41, f"(exec 3<{nodes[2]}) 2>&1; echo CVD=$CUDA_VISIBLE_DEVICES",
                                  gpu_indices=[1], deny_devices=[nodes[2]], fake=True))
        assert wait_exit(plain, 41, handle).outcome == "completed"
        log = _log(tmp_path, 41)
        assert "No such device or address" in log and "CVD=1" in log  # no fence: only the variable
        assert "cgroups" not in handle
    finally:
        plain.close()


# ------------------------------------------------------------------ host memory and CPU


def test_memory_limit_stops_a_job_with_the_reason(runner: LocalRunner, tmp_path: Path) -> None:
    code = "import time; b = bytearray(400 << 20); b[::4096] = b'x' * len(b[::4096]); time.sleep(5)"
    handle = runner.start(LaunchRequest(job_id=50, command=["/usr/bin/python3", "-c", code], cwd="/tmp",
                                        log_path=str(tmp_path / "logs" / "job-50.log"), mem_bytes=128 << 20))
    exit_ = wait_exit(runner, 50, handle)
    assert exit_.outcome == "oom"
    assert exit_.reason.startswith("host memory limit of 128M reached"), exit_.reason


def test_cpu_limit_is_enforced(runner: LocalRunner, tmp_path: Path) -> None:
    code = "import time; end = time.time() + 2\nwhile time.time() < end: pass\nprint(time.process_time())"
    handle = runner.start(LaunchRequest(job_id=51, command=["/usr/bin/python3", "-c", code], cwd="/tmp",
                                        log_path=str(tmp_path / "logs" / "job-51.log"), cpus=0.25))
    assert wait_exit(runner, 51, handle).outcome == "completed"
    cpu_s = float(_log(tmp_path, 51).split()[-1])
    assert cpu_s < 1.0, f"a quarter of a CPU for 2 s used {cpu_s:.2f} CPU seconds"


# ------------------------------------------------------------------ the log


def test_a_planted_log_symlink_is_not_followed(runner: LocalRunner, tmp_path: Path) -> None:
    """A job that could write the log folder plants `job-<next id>.log` as a link to a file
    of its choosing: the next job's output goes to its own log, the target is untouched."""
    (tmp_path / "logs").mkdir()
    target = tmp_path / "victim"
    target.write_text("precious\n")
    first = runner.start(_req(tmp_path, 60, f"ln -s {target} {tmp_path}/logs/job-61.log", cwd=str(tmp_path)))
    assert wait_exit(runner, 60, first).outcome == "completed"
    assert (tmp_path / "logs" / "job-61.log").is_symlink()
    second = runner.start(_req(tmp_path, 61, "echo output-of-61", cwd=str(tmp_path)))
    assert wait_exit(runner, 61, second).outcome == "completed"
    assert target.read_text() == "precious\n"
    assert not (tmp_path / "logs" / "job-61.log").is_symlink()
    assert _log(tmp_path, 61) == "output-of-61\n"


def test_isolation_is_said_in_one_line(runner: LocalRunner) -> None:
    text = runner.isolation.describe()
    assert text.startswith("GPU fence: device cgroup; each job in its own cgroup (")


def test_who_a_job_runs_as() -> None:
    from jupyter_gpujobs.engine.runners.users import NotAUnixUser, run_as

    assert run_as(U1, "auto") == U1 and run_as(U1, "always") == U1
    assert run_as(U1, "never") is None
    assert run_as("root", "auto") is None  # the engine's own user: nothing changes
    assert run_as("no-such-user-xyz", "auto") is None  # a Jupyter name only: as the engine, as before
    with pytest.raises(NotAUnixUser, match="'no-such-user-xyz' is not a Unix user on this machine"):
        run_as("no-such-user-xyz", "always")
