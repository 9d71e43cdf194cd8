"""Isolation through a real Jupyter server run as root with two named users who are real Unix
users (scripts/install-multiuser.sh): jobs run as their owners, cannot read or signal each
other's, are fenced to their own fake GPUs' device nodes, say which isolation is in force, and
the fallback without cgroups says so and behaves as before. Needs root, as CI runs it.
"""

from __future__ import annotations

import glob
import json
import os
import pwd
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from runner_waits import wait_file, wait_pids
from servers import wait_job

from jupyter_gpujobs.client import GPUJobsClient, GPUJobsError

ROOT = Path(__file__).resolve().parents[1]
U1, U2 = "gpujobs-u1", "gpujobs-u2"
TOKENS = {"tok-u1": U1, "tok-u2": U2}

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (users, cgroups, device nodes)")


@pytest.fixture(scope="module", autouse=True)
def users() -> None:
    subprocess.run([str(ROOT / "scripts" / "install-multiuser.sh"), "--users"], check=True)


def _two_user_server(live_server: Any, **config: Any) -> Any:
    return live_server(fake_gpus="2xA100", config=config, users=TOKENS)


def _nodes(server: Any) -> Path:
    """Where a root server makes its fake GPUs' device nodes."""
    return Path("/dev/gpujobs-fake") / server.client().api("GET", "info")["fake_fleet"]


ENDED = ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "LOST")


def _cgroup_of(pid: int) -> str:
    """A cgroup folder of the engine's that holds `pid` (the job's own, under gpujobs/)."""
    for folder in sorted(glob.glob("/sys/fs/cgroup/gpujobs/*") + glob.glob("/sys/fs/cgroup/*/gpujobs/*")):
        try:
            if str(pid) in Path(folder, "cgroup.procs").read_text().split():
                return folder
        except OSError:
            continue
    raise AssertionError(f"no cgroup of the engine's holds pid {pid}")


def test_jobs_run_as_their_owners_and_cannot_reach_each_other(live_server: Any, open_dir: Path) -> None:
    server = _two_user_server(live_server)
    u1 = GPUJobsClient(url=server.url, token="tok-u1")
    u2 = GPUJobsClient(url=server.url, token="tok-u2")
    assert server.client().gpu_report()["isolation"].startswith("GPU fence: device cgroup")

    pid_file = open_dir / "u2.pid"
    theirs = u2.submit(["/bin/sh", "-c", f"id -un; echo $$ > {pid_file}; echo secret-of-u2; exec sleep 60"],
                       gpus=1, cwd=str(open_dir), time_limit="2m")
    u2_pid = int(wait_file(pid_file))
    running = wait_job(u2, theirs["id"], ("RUNNING",))
    u2_log = server.state_dir / "logs" / f"job-{theirs['id']}.log"
    nodes = _nodes(server)
    u2_cgroup = _cgroup_of(u2_pid)
    mine_probe = (f"id -un; cat {u2_log} 2>&1; kill -TERM {u2_pid} 2>&1; kill -9 $PPID 2>&1; "
                  f"for i in 0 1; do (exec 3<{nodes}/nvidia$i) 2>&1 | sed \"s/^/gpu$i: /\"; done; "
                  f"cat {u2_cgroup}/cgroup.procs 2>&1 | sed \"s/^/cgroup: /\"; echo gpus=$CUDA_VISIBLE_DEVICES")
    mine = u1.submit(["/bin/sh", "-c", mine_probe], gpus=1, cwd=str(open_dir), time_limit="1m")
    done = wait_job(u1, mine["id"], ENDED)
    assert done["state"] == "COMPLETED", done["reason"]
    log = u1.log(mine["id"])["data"]
    lines = [line for line in log.splitlines() if line]
    assert lines[0] == U1
    assert "secret-of-u2" not in log and "Permission denied" in lines[1]  # the other's log: EACCES
    assert "Operation not permitted" in lines[2] and "Operation not permitted" in lines[3], log  # job, supervisor: EPERM
    given = done["assigned_gpus"][0]
    other = running["assigned_gpus"][0]
    assert {given, other} == {0, 1}
    gpu_lines = {line.split(": ", 1)[0]: line for line in lines if line.startswith("gpu")}
    assert "No such device or address" in gpu_lines[f"gpu{given}"]  # its own GPU (ENXIO: no driver)
    assert "Operation not permitted" in gpu_lines[f"gpu{other}"]  # the other's GPU: fenced
    # the other's cgroup: no listing of its processes (a shared engine's jobs' cgroups are root's alone)
    cgroup_lines = [line for line in lines if line.startswith("cgroup: ")]
    assert cgroup_lines and "Permission denied" in cgroup_lines[0] and str(u2_pid) not in log, cgroup_lines
    assert lines[-1] == f"gpus={given}"

    assert u2.job(theirs["id"])["state"] == "RUNNING"  # untouched by the other user
    assert u2.log(theirs["id"])["data"].splitlines()[0] == U2
    assert pwd.getpwuid(u2_log.stat().st_uid).pw_name == U2 and u2_log.stat().st_mode & 0o077 == 0
    u2.cancel(theirs["id"])


def test_cwd_the_owner_cannot_enter_is_refused_at_submit(live_server: Any) -> None:
    server = _two_user_server(live_server)
    u1 = GPUJobsClient(url=server.url, token="tok-u1")
    home = pwd.getpwnam(U2).pw_dir
    with pytest.raises(GPUJobsError) as err:
        u1.submit(["/bin/true"], gpus=0, cwd=home)
    assert f"no such directory, or {U1} may not enter it: {home}" in str(err.value)


def test_job_killing_its_supervisor_keeps_its_gpu_until_its_time_limit(live_server: Any, open_dir: Path) -> None:
    """As its owner, `kill -9 $PPID` fails and the job's setsid grandchild is stopped with it at
    the time limit; the GPU is not handed out while any of its processes lives."""
    server = _two_user_server(live_server)
    u1 = GPUJobsClient(url=server.url, token="tok-u1")
    pids = open_dir / "pids"
    script = (f"setsid sh -c 'sleep 300 & echo $! >> {pids}; wait' & "
              f"sleep 0.2; kill -9 $PPID; echo $$ >> {pids}; sleep 300")
    job = u1.submit(["/bin/sh", "-c", script], gpus=2, cwd=str(open_dir), time_limit="4s")
    wait_job(u1, job["id"], ("RUNNING",))
    # submitted once the job holds both GPUs: it can start only on a GPU the job gave back
    waiting = u1.submit(["/bin/true"], gpus=1, cwd=str(open_dir))
    job_pids = wait_pids(pids, 2, timeout=20)
    deadline = time.monotonic() + 20
    while True:
        other = u1.job(waiting["id"])["state"]  # read first: the job was running then if it is after
        if u1.job(job["id"])["state"] != "RUNNING":
            break
        assert other == "PENDING", "a GPU of a running job was handed out"
        assert time.monotonic() < deadline + 20
        time.sleep(0.1)
    assert u1.job(job["id"])["state"] == "TIMEOUT"
    for pid in job_pids:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
    assert wait_job(u1, waiting["id"], ENDED)["state"] == "COMPLETED"


def test_without_cgroups_the_plain_message_and_todays_behaviour(live_server: Any, tmp_path: Path) -> None:
    """cgroups=off: the engine says "GPU fence: none" (log, GET gpus, CLI), a job can open any
    GPU node, and a planted log link is still not followed."""
    server = live_server(fake_gpus="2xA100", config={"cgroups": "off"})
    client = server.client()
    report = client.gpu_report()
    assert report["isolation"].startswith("GPU fence: none, CUDA_VISIBLE_DEVICES only")
    assert "GPU fence: none, CUDA_VISIBLE_DEVICES only" in server.cli("gpus").stdout
    assert server.server_log().count("isolation: GPU fence: none, CUDA_VISIBLE_DEVICES only") == 1

    nodes = _nodes(server)
    target = tmp_path / "victim"
    target.write_text("precious\n")
    first = client.submit(["/bin/sh", "-c", f"(exec 3<{nodes}/nvidia1) 2>&1; echo gpus=$CUDA_VISIBLE_DEVICES; "
                                            f"ln -s {target} {server.state_dir}/logs/job-$((GPUJOBS_JOB_ID + 1)).log"],
                          gpus=1)
    assert wait_job(client, first["id"], ENDED)["state"] == "COMPLETED"
    log = client.log(first["id"])["data"]
    assert "No such device or address" in log and "gpus=0" in log  # no fence: every node opens
    second = client.submit(["/bin/sh", "-c", "echo output-of-the-next-job"], gpus=0)
    assert second["id"] == first["id"] + 1
    assert wait_job(client, second["id"], ENDED)["state"] == "COMPLETED"
    assert target.read_text() == "precious\n"
    assert client.log(second["id"])["data"] == "output-of-the-next-job\n"


def test_fake_gpus_device_nodes_go_with_the_server_that_held_them(live_server: Any) -> None:
    """A stopped server removes the device nodes it made; a second server of the same data
    dir, refused the store (one store, one engine), leaves them to the first."""
    first = live_server(fake_gpus="2xA100")
    nodes = _nodes(first)
    assert sorted(p.name for p in nodes.iterdir()) == ["nvidia0", "nvidia1"]
    second = live_server(fake_gpus="2xA100", start=False)
    second.args = [f"--GPUJobs.state_dir={first.state_dir}" if a.startswith("--GPUJobs.state_dir=") else a
                   for a in second.args]
    second.start(status=503)
    assert first.proc is not None and f"pid {first.proc.pid} on host" in second.server_log()
    for server in (second, first):  # SIGTERM, as JupyterHub and systemd stop a server
        assert server.proc is not None
        server.proc.terminate()
        assert server.proc.wait(30) == 0
        if server is second:
            assert sorted(p.name for p in nodes.iterdir()) == ["nvidia0", "nvidia1"]
    assert not nodes.exists()


def test_mem_limit_through_the_cli_stops_the_job_with_the_reason(live_server: Any) -> None:
    server = live_server(fake_gpus="1xA100")
    code = "import time; b = bytearray(400 << 20); b[::4096] = b'x' * len(b[::4096]); time.sleep(5)"
    out = server.cli("submit", "--gpus", "0", "--mem", "128M", "--cpus", "1", "--json", "--",
                     "/usr/bin/python3", "-c", code)
    assert out.returncode == 0, out.stderr
    job = json.loads(out.stdout)
    assert job["mem_bytes"] == 128 << 20 and job["cpus"] == 1.0
    done = wait_job(server.client(), job["id"], ENDED)
    assert done["state"] == "FAILED"
    assert done["reason"].startswith("host memory limit of 128M reached"), done["reason"]
    bad = server.cli("submit", "--gpus", "0", "--mem", "lots", "--", "/bin/true")
    assert bad.returncode != 0 and "mem" in bad.stderr and "32G" in bad.stderr


def test_mem_limit_is_refused_where_it_cannot_be_enforced(live_server: Any) -> None:
    server = live_server(fake_gpus="1xA100", config={"cgroups": "off"})
    with pytest.raises(GPUJobsError) as err:
        server.client().submit(["/bin/true"], gpus=0, mem="1G")
    assert "cannot enforce a --mem limit" in str(err.value)


VENV_PYTHON = Path(os.environ.get("GPUJOBS_TEST_VENV", "/opt/gpujobs-test")) / "bin" / "python"


def test_notebook_job_reads_and_writes_with_its_owners_rights_only(live_server: Any) -> None:
    """A notebook job of u1 runs as u1: its output is u1's and private; u2's notebook (in u2's
    private home) is refused at submit, as u1 sees it, even though the engine, root, could
    read it: the same answer as a missing notebook."""
    if not VENV_PYTHON.exists():  # a Python every user can run, with this package
        subprocess.run([str(ROOT / "scripts" / "install-multiuser.sh")], check=True)
    import nbformat

    server = _two_user_server(live_server, job_python=str(VENV_PYTHON))
    u1 = GPUJobsClient(url=server.url, token="tok-u1")
    folders = []
    for user in (U1, U2):
        entry = pwd.getpwnam(user)
        folder = Path(entry.pw_dir) / f"nb-{os.getpid()}-{time.monotonic_ns()}"
        folder.mkdir()
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
            "import os, pwd; print('ran as', pwd.getpwuid(os.getuid()).pw_name)")])
        nbformat.write(nb, str(folder / "in.ipynb"))
        os.chmod(folder / "in.ipynb", 0o600)
        for path in (folder, folder / "in.ipynb"):
            os.chown(path, entry.pw_uid, entry.pw_gid)
        folders.append(folder)
    mine, theirs = folders
    try:
        job = u1.submit_notebook(str(mine / "in.ipynb"), gpus=0, cwd=str(mine))
        done = wait_job(u1, job["id"], ENDED, timeout=120)
        assert done["state"] == "COMPLETED", (done["reason"], u1.log(job["id"])["data"][-2000:])
        out = mine / f"in-job{job['id']}.ipynb"
        assert f"ran as {U1}" in out.read_text()
        st = out.stat()
        assert pwd.getpwuid(st.st_uid).pw_name == U1 and st.st_mode & 0o077 == 0

        # refused at submit, looked at as u1: the answer of a missing notebook, and no job
        answers = []
        for path in (theirs / "in.ipynb", theirs / "no-such.ipynb"):
            with pytest.raises(GPUJobsError) as err:
                u1.submit_notebook(str(path), gpus=0, cwd="/tmp")
            answers.append(str(err.value).replace(str(path), "X"))
        assert answers[0] == answers[1] and f"no such notebook, or {U1} may not read it: X" in answers[0], answers
        assert [j["id"] for j in u1.jobs()["jobs"]] == [job["id"]]
        assert not list(theirs.glob("in-job*.ipynb"))
    finally:
        for folder in folders:
            subprocess.run(["rm", "-rf", str(folder)], check=False)


def test_a_job_on_a_mig_instance_cannot_open_the_cards_other_instances(live_server: Any, open_dir: Path) -> None:
    """The MIG instances of one card share its node (/dev/nvidiaN); what opens each is its own
    capability device (/dev/nvidia-caps/nvidia-capN; the fake backend makes one per instance).
    A job is given its instance's and fenced off the others': without that, a job could name
    another's instance by its UUID and run on it."""
    server = live_server(fake_gpus="H200-141GB[mig:1g.18gb*2]", users=TOKENS)
    u1 = GPUJobsClient(url=server.url, token="tok-u1")
    nodes = _nodes(server)
    assert sorted(p.name for p in nodes.iterdir()) == ["nvidia-cap0", "nvidia-cap1", "nvidia0"]
    probe = (f"(exec 3<{nodes}/nvidia0) 2>&1 | sed 's/^/card: /'; "
             f"for i in 0 1; do (exec 3<{nodes}/nvidia-cap$i) 2>&1 | sed \"s/^/cap$i: /\"; done; echo done")
    job = u1.submit(["/bin/sh", "-c", probe], gpus=1, cwd=str(open_dir), time_limit="1m")
    done = wait_job(u1, job["id"], ENDED)
    assert done["state"] == "COMPLETED", done["reason"]
    log = u1.log(job["id"])["data"]
    lines = {line.split(": ", 1)[0]: line for line in log.splitlines() if ": " in line}
    given = done["assigned_gpus"][0]
    assert "No such device or address" in lines["card"], log  # the card's node: its own too (ENXIO: no driver)
    assert "No such device or address" in lines[f"cap{given}"], log  # its instance
    assert "Operation not permitted" in lines[f"cap{1 - given}"], log  # the card's other instance: fenced
