"""GPU kernels are confined like any job: a real shared engine as root on fake GPUs (with device
nodes), a real Jupyter server running as a real Unix user, and a GPU kernel started by it.

The engine puts the kernel's processes in the job's own cgroup with the device fence, so the
kernel opens its own GPU and not another; when the user's server is SIGKILLed, the kernel's
time limit still stops everything the kernel started (a `setsid` child included) and only
then is its GPU given back. Nobody can confine a stranger's process, nor one their caller did
not start, nor pull one out of another job.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from team import USERS, Team, evaluate, missing

pytestmark = [pytest.mark.skipif(missing() is not None, reason=str(missing())), pytest.mark.timeout(300)]
U1, U2 = USERS

#: Kernel code: wait until the engine confined this kernel, start a child in its own session
#: (as a training script would), try both fake GPUs' device nodes, print what happened.
PROBE = """
import errno, json, os, subprocess, time
deadline = time.monotonic() + 20
while 'kernel-' not in open('/proc/self/cgroup').read() and time.monotonic() < deadline:
    time.sleep(0.05)
child = subprocess.Popen(['sleep', '600'], start_new_session=True)
opened = {}
for i in (0, 1):
    try:
        os.close(os.open(f'{NODES}/nvidia{i}', os.O_RDWR))
        opened[i] = 'opened'
    except OSError as err:
        opened[i] = errno.errorcode[err.errno]
print(json.dumps({'job': os.environ['GPUJOBS_JOB_ID'], 'gpu': os.environ['CUDA_VISIBLE_DEVICES'],
                  'child': child.pid, 'confined': 'kernel-' in open('/proc/self/cgroup').read(),
                  'opened': opened}))
"""


@pytest.fixture(scope="module")
def team() -> Iterator[Team]:
    with Team(fake_gpus="2xA100") as t:
        yield t


def _job(team: Team, job_id: int) -> dict[str, Any]:
    with team.socket_client() as c:
        return c.get(f"jobs/{job_id}").json()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _in_cgroup(run: str, name: str) -> int:
    """The pid of the live process `name` whose cgroup path has `/gpujobs/<run>...`."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or not _alive(int(entry)):
                continue
            try:
                with open(f"/proc/{entry}/comm") as f:
                    comm = f.read().strip()
                with open(f"/proc/{entry}/cgroup") as f:
                    cgroup = f.read()
            except OSError:
                continue
            if comm == name and f"/gpujobs/{run}" in cgroup:
                return int(entry)
        time.sleep(0.1)
    raise AssertionError(f"no process {name} in a cgroup of {run}")


def test_a_kernel_outlives_its_server_only_until_its_time_limit(team: Team) -> None:
    r = team.cli(U1, "kernelspec", "install", "--name", "gpu-short", "--user", "-g", "1", "-t", "25s")
    assert r.returncode == 0, r.stderr
    with team.socket_client() as c:
        nodes = f"/dev/gpujobs-fake/{c.get('info').json()['fake_fleet']}"
    server = team.servers[U1]
    kc = server.start_kernel("gpu-short")
    got = evaluate(kc, PROBE.replace("{NODES}", nodes))
    kc.stop_channels()
    job_id, gpu, child = int(got["job"]), int(got["gpu"]), int(got["child"])
    assert got["confined"], "the engine did not put the kernel in its job's cgroup"
    other = 1 - gpu
    assert got["opened"] == {str(gpu): "ENXIO", str(other): "EPERM"}, got  # fenced to its own GPU
    job = _job(team, job_id)
    assert job["state"] == "RUNNING" and job["kind"] == "kernel"

    os.kill(server.proc.pid, signal.SIGKILL)  # nobody is left to shut the kernel down
    server.proc.wait()
    deadline = time.monotonic() + 90
    while (job := _job(team, job_id))["state"] == "RUNNING":
        assert time.monotonic() < deadline, f"kernel job {job_id} outlived its time limit\n{team.logs()}"
        time.sleep(0.2)
    assert job["state"] == "TIMEOUT", job
    assert "time limit" in job["reason"]
    assert not _alive(child), "a process the kernel started outlived the kernel's job"
    # its GPU is free again: a job asking for both GPUs starts
    both = team.run_as(U2, "from jupyter_gpujobs.client import GPUJobsClient as C; import json; "
                           "print(json.dumps(C().submit('true', gpus=2, time_limit='1m')['id']))")
    deadline = time.monotonic() + 30
    while _job(team, both)["state"] == "PENDING":
        assert time.monotonic() < deadline, _job(team, both)
        time.sleep(0.2)


def test_an_idle_kernel_whose_server_is_gone_is_reclaimed(team: Team) -> None:
    """Idle reclaim needs the server (it knows when a cell runs) until the server is gone; then
    the engine reclaims the kernel once its GPUs have been unused for its idle timeout."""
    r = team.cli(U2, "kernelspec", "install", "--name", "gpu-idle", "--user", "-g", "1", "-t", "10m",
                 "--idle-timeout", "3s")
    assert r.returncode == 0, r.stderr
    server = team.servers[U2]
    kc = server.start_kernel("gpu-idle")
    got = evaluate(kc, PROBE.replace("{NODES}", "/nonexistent"))
    kc.stop_channels()
    job_id, child = int(got["job"]), int(got["child"])
    assert got["confined"]
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait()
    deadline = time.monotonic() + 60
    while (job := _job(team, job_id))["state"] == "RUNNING":
        assert time.monotonic() < deadline, f"idle kernel job {job_id} was not reclaimed\n{team.logs()}"
        time.sleep(0.2)
    assert job["state"] == "CANCELLED" and "idle for 3s" in job["reason"], job
    assert not _alive(child)


def test_nobody_confines_a_strangers_process_or_steals_one_from_a_job(team: Team) -> None:
    # a kernel job of U2's, as a provisioner makes it, and a script job of U2's that runs
    code = ("from jupyter_gpujobs.client import GPUJobsClient as C; import json; c = C(); "
            "k = c.submit(None, kind='kernel', gpus=1, time_limit='2m'); "
            "s = c.submit(['sleep', '120'], gpus=0, time_limit='2m'); print(json.dumps([k['id'], s['id']]))")
    kernel_job, script_job = team.run_as(U2, code)
    deadline = time.monotonic() + 30
    while _job(team, kernel_job)["state"] != "RUNNING" or _job(team, script_job)["state"] != "RUNNING":
        assert time.monotonic() < deadline, (_job(team, kernel_job), _job(team, script_job))
        time.sleep(0.1)
    stranger = subprocess.Popen(["sleep", "120"])  # root's, not U2's
    try:
        script_pid = _in_cgroup(f"job-{script_job}-", "sleep")
        adopt = ("from jupyter_gpujobs.client import GPUJobsClient as C, GPUJobsError; import json, sys; c = C(); "
                 "out = []\n"
                 "for pid in sys.argv[2:]:\n"
                 "    try: out.append(c.adopt(int(sys.argv[1]), int(pid)))\n"
                 "    except GPUJobsError as e: out.append([e.status, e.message])\n"
                 "print(json.dumps(out))")
        answers = team.run_as(U2, adopt.replace("sys.argv[1]", str(kernel_job)).replace(
            "sys.argv[2:]", json.dumps([stranger.pid, script_pid, 999_999_999])))
        assert answers[0][0] == 403 and "not yours" in answers[0][1], answers
        # U2's own process, but one of a script job's (and not started by this caller)
        assert answers[1][0] == 403 and "not started by the caller" in answers[1][1], answers
        assert answers[2][0] == 400, answers
        assert _job(team, script_job)["state"] == "RUNNING"  # its process stayed in its own job
    finally:
        stranger.kill()
        stranger.wait()
        with team.socket_client() as c:
            for job_id in (kernel_job, script_job):
                c.delete(f"jobs/{job_id}")
