"""Jobs in their owners' images (issue 29), live: a real Jupyter server run as root with real
Unix users (scripts/install-multiuser.sh), rootless podman as those users and the test image
scripts/install-podman.sh builds from the host's files (busybox and Debian's python3.11; no
registry is reachable), on fake GPUs whose device nodes the containers get. Needs root, podman
and that image, as CI has them (scripts/test.sh).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from servers import wait_job

from jupyter_gpujobs.client import GPUJobsClient, GPUJobsError

ROOT = Path(__file__).resolve().parents[1]
U1 = "gpujobs-u1"
TOKENS = {"tok-u1": U1}
IMAGE = os.environ.get("GPUJOBS_TEST_IMAGE", "localhost/gpujobs-test:latest")
ENDED = ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "LOST")
#: the test venv, mounted read-only into the containers: jupyter_gpujobs for a cell job
VENV = os.environ.get("GPUJOBS_TEST_VENV", "/opt/gpujobs-test")


def _as_u1(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["runuser", "-u", U1, "--", *argv], cwd="/", capture_output=True, text=True, timeout=60)


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root (users, cgroups, device nodes)"
    if not shutil.which("podman"):
        return "podman is not installed (scripts/install-podman.sh installs it)"
    try:
        pwd.getpwnam(U1)
    except KeyError:
        return f"no test user {U1} (scripts/install-multiuser.sh)"
    if _as_u1("podman", "image", "exists", IMAGE).returncode != 0:
        return f"no test image {IMAGE} for {U1} (scripts/install-podman.sh builds it)"
    return None


pytestmark = pytest.mark.skipif(_missing() is not None, reason=_missing() or "")


def _server(live_server: Any, **config: Any) -> Any:
    lists = ["--GPUJobs.allowed_images=localhost/*",
             f"--GPUJobs.container_options=--mount=type=bind,source={VENV},destination={VENV},ro"]
    return live_server(fake_gpus="2xA100", config=config, users=TOKENS, extra_args=lists)


def _left_of(marker: str) -> list[str]:
    """Processes whose command line holds `marker` (a job's container name, its command)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        line = " ".join(p.info["cmdline"] or ())
        if marker in line:
            found.append(f"{p.pid}: {line[:200]}")
    return found


def test_one_gpu_job_in_an_image_sees_only_its_gpu_as_its_owner(live_server: Any, open_dir: Path) -> None:
    server = _server(live_server)
    u1 = GPUJobsClient(url=server.url, token="tok-u1")
    marker = f"gpujobs-probe-{os.getpid()}-{time.monotonic_ns()}"
    probe = ("id -u; id -g; echo devices=$(ls /dev | grep nvidia | tr '\\n' ' '); echo gpus=$CUDA_VISIBLE_DEVICES; "
             "(exec 3</dev/$(ls /dev | grep nvidia | head -1)) 2>&1 | sed 's/^/open: /'; "
             "grep devices /proc/self/cgroup; echo pwd=$(pwd); echo home=$HOME; test -e /etc/debian_version "
             f"&& echo host-root || echo image-root; echo x > /tmp/{marker}; echo x > /dev/shm/{marker}")
    job = u1.submit(["/bin/sh", "-c", probe], gpus=1, cwd=str(open_dir), time_limit="1m", image=IMAGE)
    assert job["image"] == IMAGE
    done = wait_job(u1, job["id"], ENDED, timeout=60)
    log = u1.log(job["id"])["data"]
    assert done["state"] == "COMPLETED", (done["reason"], log)
    lines = log.splitlines()
    owner = pwd.getpwnam(U1)
    assert lines[0] == str(owner.pw_uid) != "0" and lines[1] == str(owner.pw_gid), log  # its owner, never root
    given = done["assigned_gpus"][0]
    # exactly its GPU's node (the fake card's, as /dev/nvidiaN), renumbered to 0 for CUDA
    assert lines[2].split() == [f"devices=nvidia{given}"], log
    assert lines[3] == "gpus=0", log
    assert "No such device or address" in lines[4], log  # its own GPU opens (ENXIO: no driver), not EPERM
    assert f"job-{job['id']}-" in lines[5], log  # the container runs in the job's own (device) cgroup
    assert lines[6] == f"pwd={open_dir}" and lines[7] == f"home={owner.pw_dir}", log
    assert lines[8] == "image-root", log  # the image's files, not the host's
    # the container's own /tmp and /dev/shm, not the machine's
    assert not Path("/tmp", marker).exists() and not Path("/dev/shm", marker).exists()
    assert not _left_of(f"gpujobs-{job['id']}-"), "podman or conmon of the job left running"


def test_time_limit_stops_the_whole_container_and_its_output_streams(live_server: Any, open_dir: Path) -> None:
    server = _server(live_server)
    u1 = GPUJobsClient(url=server.url, token="tok-u1")
    marker = f"{300 + os.getpid() % 600}"  # a sleep of its own, to find what is left of it
    before = set(_as_u1("podman", "ps", "--all", "--format", "{{.Names}}").stdout.split())
    job = u1.submit(["/bin/sh", "-c", f"echo started; sleep {marker}"], gpus=1, cwd=str(open_dir),
                    time_limit="6s", image=IMAGE)
    running = wait_job(u1, job["id"], ("RUNNING",) + ENDED, timeout=60)
    assert running["state"] == "RUNNING", running["reason"]
    wait_job(u1, job["id"], lambda j: "started" in u1.log(j["id"])["data"] or j["state"] != "RUNNING", timeout=30)
    assert u1.job(job["id"])["state"] == "RUNNING"  # its output is in the log while it runs
    done = wait_job(u1, job["id"], ENDED, timeout=60)
    assert done["state"] == "TIMEOUT", done["reason"]
    assert not _left_of(f"gpujobs-{job['id']}-"), "podman or conmon of the job left running"
    assert not _left_of(f"sleep {marker}"), "the container's process left running"
    listed = set(_as_u1("podman", "ps", "--all", "--format", "{{.Names}}").stdout.split())
    assert listed <= before, listed - before  # nor its record (podman keeps one of a killed container)


@pytest.mark.parametrize("where", ["tmp", "home"])
def test_two_jobs_of_one_user_in_images_at_once_each_on_its_gpu(live_server: Any, open_dir: Path, where: str) -> None:
    """Two containers of one owner at the same time (one podman storage, two runs): each sees
    only its own GPU's node, numbered 0, and both complete; in a folder under /tmp and in the
    owner's home (where a job without an image gets a private /tmp: one in an image has the
    container's, and podman one run state for all jobs of its user: with one each, a second
    container failed now and then, "failed to connect to container's attach socket")."""
    if where == "home":
        entry = pwd.getpwnam(U1)
        open_dir = Path(entry.pw_dir) / f"two-{os.getpid()}-{time.monotonic_ns()}"
        open_dir.mkdir()
        os.chown(open_dir, entry.pw_uid, entry.pw_gid)
    server = _server(live_server)
    u1 = GPUJobsClient(url=server.url, token="tok-u1")
    go = open_dir / "go"
    probe = (f"while [ ! -e {go} ]; do sleep 0.05; done; "  # both run at once before either looks
             "echo $(ls /dev | grep nvidia) gpus=$CUDA_VISIBLE_DEVICES")
    jobs = [u1.submit(["/bin/sh", "-c", probe], gpus=1, cwd=str(open_dir), time_limit="2m", image=IMAGE)
            for _ in range(2)]
    for job in jobs:
        running = wait_job(u1, job["id"], ("RUNNING",) + ENDED, timeout=60)
        assert running["state"] == "RUNNING", (running["reason"], u1.log(job["id"])["data"])
    go.touch()
    seen = set()
    for job in jobs:
        done = wait_job(u1, job["id"], ENDED, timeout=60)
        assert done["state"] == "COMPLETED", (done["reason"], u1.log(job["id"])["data"])
        log = u1.log(job["id"])["data"]
        assert log.split() == [f"nvidia{done['assigned_gpus'][0]}", "gpus=0"], log
        seen.add(done["assigned_gpus"][0])
    assert seen == {0, 1}
    if where == "home":
        subprocess.run(["rm", "-rf", str(open_dir)], check=False)


def test_missing_or_unlisted_image_is_refused_at_submit_naming_it(live_server: Any, open_dir: Path) -> None:
    server = _server(live_server)
    u1 = GPUJobsClient(url=server.url, token="tok-u1")
    with pytest.raises(GPUJobsError) as err:
        u1.submit(["/bin/true"], gpus=1, cwd=str(open_dir), image="localhost/no-such-image:1")
    assert err.value.status == 400
    assert "localhost/no-such-image:1" in str(err.value) and "podman pull" in str(err.value)
    with pytest.raises(GPUJobsError) as err:
        u1.submit(["/bin/true"], gpus=1, cwd=str(open_dir), image="docker.io/library/python:3.12")
    assert err.value.status == 400 and "docker.io/library/python:3.12 is not allowed here" in str(err.value)
    with pytest.raises(GPUJobsError) as err:
        u1.submit(["/bin/true"], gpus=1, cwd=str(open_dir), image="bad image")
    assert err.value.status == 400 and "image" in str(err.value)
    assert u1.jobs()["jobs"] == []  # nothing was queued


def test_site_default_image_and_the_host_on_request(live_server: Any, open_dir: Path) -> None:
    server = _server(live_server, default_image=IMAGE)
    u1 = GPUJobsClient(url=server.url, token="tok-u1")
    probe = ["/bin/sh", "-c", "test -e /etc/debian_version && echo host-root || echo image-root"]
    in_image = u1.submit(probe, gpus=0, cwd=str(open_dir))
    on_host = u1.submit(probe, gpus=0, cwd=str(open_dir), image="")
    assert in_image["image"] == IMAGE and on_host["image"] is None
    for job, where in ((in_image, "image-root"), (on_host, "host-root")):
        done = wait_job(u1, job["id"], ENDED, timeout=60)
        assert done["state"] == "COMPLETED", done["reason"]
        assert u1.log(job["id"])["data"].strip() == where


def test_notebook_job_runs_in_an_image(live_server: Any) -> None:
    """A notebook job in an image: its runner (the test venv's Python, mounted) and the
    notebook's kernel run in the image as the owner, and its output notebook is written."""
    import nbformat

    server = live_server(fake_gpus="2xA100", config={"job_python": f"{VENV}/bin/python"}, users=TOKENS,
                         extra_args=["--GPUJobs.allowed_images=localhost/*",
                                     f"--GPUJobs.container_options=--mount=type=bind,source={VENV},"
                                     f"destination={VENV},ro"])
    u1 = GPUJobsClient(url=server.url, token="tok-u1")
    entry = pwd.getpwnam(U1)
    folder = Path(entry.pw_dir) / f"nb-image-{os.getpid()}-{time.monotonic_ns()}"
    folder.mkdir()
    try:
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
            "import os; print('in', 'host' if os.path.exists('/etc/debian_version') else 'image', os.getuid(), "
            "os.environ['CUDA_VISIBLE_DEVICES'])")])
        nbformat.write(nb, str(folder / "in.ipynb"))
        for path in (folder, folder / "in.ipynb"):
            os.chown(path, entry.pw_uid, entry.pw_gid)
        job = u1.submit_notebook(str(folder / "in.ipynb"), gpus=1, cwd=str(folder), image=IMAGE)
        done = wait_job(u1, job["id"], ENDED, timeout=120)
        assert done["state"] == "COMPLETED", (done["reason"], u1.log(job["id"])["data"][-2000:])
        assert f"in image {entry.pw_uid} 0" in (folder / f"in-job{job['id']}.ipynb").read_text()
    finally:
        subprocess.run(["rm", "-rf", str(folder)], check=False)


def test_cell_job_runs_in_an_image(tmp_path: Path) -> None:
    """`%%gpujob --image` from a user's kernel (a shared engine, the user's own Jupyter server):
    the cell runs in the image with the kernel's Python (the test venv, mounted read-only: the
    image has Debian's python3.11 and not jupyter_gpujobs), on its one GPU numbered 0."""
    from team import Team, evaluate

    engine_args = ["--GPUJobs.allowed_images=localhost/*",
                   f"--GPUJobs.container_options=--mount=type=bind,source={VENV},destination={VENV},ro"]
    with Team(fake_gpus="2xA100", users=(U1,), engine_args=engine_args) as team:
        server = team.servers[U1]
        kc = server.start_kernel()
        try:
            evaluate(kc, "%load_ext jupyter_gpujobs\nprint(1)")
            code = (f"%%gpujob -g 1 -t 1m --image {IMAGE}\nimport json, os\n"
                    "print(json.dumps([os.environ['CUDA_VISIBLE_DEVICES'], os.path.exists('/etc/debian_version'), "
                    "os.getuid(), sorted(d for d in os.listdir('/dev') if d.startswith('nvidia'))]))\n")
            try:
                gpus, host_root, uid, nodes = evaluate(kc, code, timeout=120)
            except AssertionError as err:
                with team.socket_client() as c:
                    raise AssertionError(f"{err}\n{c.get('jobs/1/log').json().get('data')}") from None
        finally:
            server.shutdown_kernel(kc)
    assert (gpus, host_root, uid) == ("0", False, pwd.getpwnam(U1).pw_uid)
    assert len(nodes) == 1 and nodes[0].startswith("nvidia")


def test_gpu_kernel_runs_in_an_image(tmp_path: Path) -> None:
    """A GPU kernelspec with an image (`kernelspec install --image`): the kernel runs in the
    image (ipykernel from the test venv, mounted read-only), as its user, on its one GPU
    numbered 0, confined in its job's cgroup; nothing of it is left once it is shut down."""
    from team import Team, evaluate

    engine_args = ["--GPUJobs.allowed_images=localhost/*",
                   f"--GPUJobs.container_options=--mount=type=bind,source={VENV},destination={VENV},ro"]
    with Team(fake_gpus="2xA100", users=(U1,), engine_args=engine_args) as team:
        r = team.cli(U1, "kernelspec", "install", "--name", "py-image", "--image", IMAGE, "--gpus", "1",
                     "--time", "5m", "--user")
        assert r.returncode == 0, r.stderr
        before = set(_as_u1("podman", "ps", "--all", "--format", "{{.Names}}").stdout.split())
        server = team.servers[U1]
        try:
            kc = server.start_kernel("py-image")
        except AssertionError as err:
            raise AssertionError(f"{err}\n{team.logs()}") from None
        try:
            code = ("import json, os\nprint(json.dumps([os.environ['CUDA_VISIBLE_DEVICES'], "
                    "os.path.exists('/etc/debian_version'), os.getuid(), int(os.environ['GPUJOBS_JOB_ID']), "
                    "sorted(d for d in os.listdir('/dev') if d.startswith('nvidia')), "
                    "[line for line in open('/proc/self/cgroup') if 'devices' in line]]))")
            gpus, host_root, uid, job_id, nodes, cgroup = evaluate(kc, code, timeout=120)
        finally:
            server.shutdown_kernel(kc)
        assert (gpus, host_root, uid) == ("0", False, pwd.getpwnam(U1).pw_uid)
        assert len(nodes) == 1 and nodes[0].startswith("nvidia")
        assert "/gpujobs/" in cgroup[0], cgroup  # in its job's (device) cgroup: the fence holds
        done = team.wait_state(job_id, ENDED, timeout=60)
        assert done["state"] == "COMPLETED", done["reason"]
        assert not _left_of(f"gpujobs-{job_id}-"), "podman or conmon of the kernel left running"
        listed = set(_as_u1("podman", "ps", "--all", "--format", "{{.Names}}").stdout.split())
        assert listed <= before, listed - before  # nor its record


def test_doctor_says_whether_jobs_can_run_in_images(live_server: Any) -> None:
    from test_cli_first_use import rows

    ok = _server(live_server, default_image=IMAGE)
    broken = _server(live_server, default_image=IMAGE, container_runtime="nope")
    found = {}
    for name, server in (("ok", ok), ("broken", broken)):
        done = subprocess.run([sys.executable, "-m", "jupyter_gpujobs.cli", "--url", server.url, "--token",
                               server.token, "doctor"], capture_output=True, text=True, timeout=120)
        found[name] = rows(done.stdout).get("containers") or [done.stdout + done.stderr]
    assert found["ok"][0].startswith(f"OK podman, rootless as each job's owner, on its GPUs alone; default image {IMAGE}")
    assert found["broken"][0].startswith("FAIL none: no container runtime 'nope'"), found
    assert found["broken"][1].startswith("-> install podman"), found
