"""Images pulled before a job takes GPUs (issue 29 item 3), live: a real Jupyter server run as
root with real Unix users, rootless podman as those users, fake GPUs. No registry is reachable
here, so the pulls are of podman's local transport (a `docker-archive:` tar the test saves
with `podman save` of the test image under another tag), or of a registry on this machine that
refuses (a failed pull) or never answers (a pull that lasts: its job holds no GPU meanwhile,
and its cancel stops the pull). Needs root, podman and the test image (scripts/test.sh).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from servers import wait_job
from test_containers_live import ENDED, IMAGE, TOKENS, U1, _as_u1, _missing

from jupyter_gpujobs.client import GPUJobsClient, GPUJobsError

pytestmark = pytest.mark.skipif(_missing() is not None, reason=_missing() or "")


def _server(live_server: Any, **config: Any) -> Any:
    allowed = ["localhost/*", "docker-archive:/tmp/*", "127.0.0.1:*"]
    return live_server(fake_gpus="2xA100", config=config, users=TOKENS,
                       extra_args=[f"--GPUJobs.allowed_images={a}" for a in allowed])


def _pulls_of(image: str) -> list[psutil.Process]:
    """The podman pulls of `image` running now (as the test user)."""
    found = []
    for p in psutil.process_iter(["cmdline", "username"]):
        line = p.info["cmdline"] or []
        if "pull" in line and image in line and p.info["username"] == U1:
            found.append(p)
    return found


def _pull_trees(image: str) -> list[int]:
    """The pids of the pulls of `image` that no other pull of it started (rootless podman
    starts itself again in its user namespace): one per pull."""
    pulls = _pulls_of(image)
    pids = {p.pid for p in pulls}
    return sorted(p.pid for p in pulls if p.ppid() not in pids)


@pytest.fixture
def slow_image() -> Iterator[str]:
    """An image of a registry on this machine that never answers (its pull lasts)."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    yield f"127.0.0.1:{silent.getsockname()[1]}/gpujobs/slow:1"
    silent.close()


def _wait(condition: Any, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_image_from_an_archive_is_pulled_as_the_owner_then_the_job_runs_in_it(live_server: Any,
                                                                               open_dir: Path) -> None:
    tag = f"localhost/gpujobs-pull-{os.getpid()}-{time.monotonic_ns()}:1"
    tar = open_dir / "image.tar"
    assert _as_u1("podman", "tag", IMAGE, tag).returncode == 0
    saved = _as_u1("podman", "save", "-o", str(tar), tag)
    assert saved.returncode == 0, saved.stderr
    _as_u1("podman", "rmi", tag)
    assert _as_u1("podman", "image", "exists", tag).returncode == 1  # not there: it must be pulled
    server = _server(live_server)
    u1 = GPUJobsClient(url=server.url, token="tok-u1")
    image = f"docker-archive:{tar}"
    probe = "test -e /etc/debian_version && echo host-root || echo image-root; echo gpus=$CUDA_VISIBLE_DEVICES; id -u"
    job = u1.submit(["/bin/sh", "-c", probe], gpus=1, cwd=str(open_dir), time_limit="1m", image=image)
    assert job["image"] == image
    try:
        done = wait_job(u1, job["id"], ENDED, timeout=90)
        log = u1.log(job["id"])["data"]
        assert done["state"] == "COMPLETED", (done["reason"], log)
        lines = log.splitlines()
        # the pull's output first (as its owner), then the job's own, in the image
        assert lines[0] == f"[gpujobs] pulling image {image} as {U1}, before the job takes GPUs", log
        assert any(line.startswith("Copying blob") for line in lines), log
        assert lines[-3:] == ["image-root", "gpus=0", str(os.stat(tar).st_uid)], log
        states = [e["state"] for e in u1.events(job["id"])]
        assert states[:3] == ["PENDING", "PULLING", "PULLED"] and "RUNNING" in states[3:], states
        assert _as_u1("podman", "image", "exists", tag).returncode == 0  # in the owner's own storage
    finally:
        _as_u1("podman", "rmi", "--force", tag)


def test_a_pulling_job_holds_no_gpu_and_its_cancel_stops_the_pull(live_server: Any, open_dir: Path, slow_image: str) -> None:
    image = slow_image
    server = _server(live_server)
    u1 = GPUJobsClient(url=server.url, token="tok-u1")
    pulled = u1.submit(["/bin/true"], gpus=2, cwd=str(open_dir), time_limit="1m", image=image)
    wait_job(u1, pulled["id"], lambda j: (j["reason"] or "").startswith("pulling image") or j["state"] != "PENDING",
             timeout=30)
    _wait(lambda: _pull_trees(image), "no podman pull of the image as its owner")
    seen = u1.job(pulled["id"])
    assert seen["state"] == "PENDING" and seen["reason"].startswith(f"pulling image {image}"), seen
    # a second job of the same user in the same image waits for the same pull
    second = u1.submit(["/bin/true"], gpus=1, cwd=str(open_dir), time_limit="1m", image=image)
    assert u1.job(second["id"])["reason"].startswith(f"pulling image {image}")
    assert len(_pull_trees(image)) == 1, _pull_trees(image)
    # a job that depends on a pulling one waits for it (the scheduler sees it held, not gone)
    after = u1.submit(["/bin/true"], gpus=0, cwd=str(open_dir), time_limit="1m", depends=f"afterok:{pulled['id']}")
    waits = wait_job(u1, after["id"], lambda j: j["state"] != "PENDING" or "waiting for job" in (j["reason"] or ""),
                     timeout=30)
    assert waits["state"] == "PENDING" and waits["reason"] == f"waiting for job {pulled['id']} (afterok)", waits
    # both GPUs are free while it pulls: a 2-GPU job without an image starts past it
    other = u1.submit(["/bin/sh", "-c", "sleep 30"], gpus=2, cwd=str(open_dir), time_limit="1m")
    running = wait_job(u1, other["id"], ("RUNNING",) + ENDED, timeout=30)
    assert running["state"] == "RUNNING", running["reason"]
    assert u1.job(pulled["id"])["state"] == "PENDING"
    # the cancel of one job leaves the pull to the other; the cancel of both stops it
    pids = _pull_trees(image)
    assert u1.cancel(pulled["id"])["state"] == "CANCELLED"
    wait_job(u1, after["id"], ENDED, timeout=30)  # (its dependent is cancelled with it)
    time.sleep(1.5)  # (three of the engine's looks at whether a job still waits: it must go on)
    assert _pull_trees(image) == pids and u1.job(second["id"])["state"] == "PENDING"
    assert u1.cancel(second["id"])["state"] == "CANCELLED"
    _wait(lambda: not _pulls_of(image), "the pull still runs after its jobs' cancel", timeout=30)
    u1.cancel(other["id"])


def test_an_engine_restart_during_a_pull_pulls_again(live_server: Any, open_dir: Path, slow_image: str) -> None:
    image = slow_image
    server = _server(live_server)
    u1 = GPUJobsClient(url=server.url, token="tok-u1")
    job = u1.submit(["/bin/true"], gpus=1, cwd=str(open_dir), time_limit="1m", image=image)
    _wait(lambda: _pull_trees(image), "no podman pull of the image as its owner")
    server.stop()
    _wait(lambda: not _pulls_of(image), "the pull outlived its engine", timeout=30)  # stopped with it
    server.start()
    u1 = GPUJobsClient(url=server.url, token="tok-u1")
    _wait(lambda: _pull_trees(image), "no pull again after the restart")
    seen = u1.job(job["id"])
    assert seen["state"] == "PENDING" and seen["reason"].startswith(f"pulling image {image}"), seen
    u1.cancel(job["id"])
    _wait(lambda: not _pulls_of(image), "the pull still runs after its job's cancel", timeout=30)


def test_a_failed_pull_ends_the_job_failed_naming_the_image(live_server: Any, open_dir: Path) -> None:
    closed = socket.socket()  # a registry port where nobody listens: podman's pull fails
    closed.bind(("127.0.0.1", 0))
    image = f"127.0.0.1:{closed.getsockname()[1]}/gpujobs/none:1"
    closed.close()
    server = _server(live_server)
    u1 = GPUJobsClient(url=server.url, token="tok-u1")
    job = u1.submit(["/bin/true"], gpus=1, cwd=str(open_dir), time_limit="1m", image=image)
    done = wait_job(u1, job["id"], ENDED, timeout=90)
    assert done["state"] == "FAILED" and done["started_at"] is None, done
    assert done["reason"].startswith(f"image {image}: could not be pulled: "), done["reason"]
    assert "connection refused" in done["reason"], done["reason"]  # podman's own message
    assert "Error:" in u1.log(job["id"])["data"]


def test_a_pull_past_its_time_limit_ends_the_job_failed(live_server: Any, open_dir: Path, slow_image: str) -> None:
    image = slow_image
    server = _server(live_server, container_pull_timeout=2)
    u1 = GPUJobsClient(url=server.url, token="tok-u1")
    job = u1.submit(["/bin/true"], gpus=1, cwd=str(open_dir), time_limit="1m", image=image)
    done = wait_job(u1, job["id"], ENDED, timeout=60)
    assert done["state"] == "FAILED", done
    assert done["reason"] == (f"image {image}: the pull gave no image within 2s "
                              "(c.GPUJobs.container_pull_timeout)"), done["reason"]
    _wait(lambda: not _pulls_of(image), "the pull still runs past its time limit", timeout=30)


def test_a_reference_no_pull_can_fetch_is_refused_at_submit(live_server: Any, open_dir: Path) -> None:
    server = _server(live_server)
    u1 = GPUJobsClient(url=server.url, token="tok-u1")
    missing = f"docker-archive:{open_dir}/no-such.tar"
    for image, words in ((missing, f"no file or folder {open_dir}/no-such.tar that {U1} may read"),
                         ("localhost/no-such-image:1", "names no registry to pull it from")):
        with pytest.raises(GPUJobsError) as err:
            u1.submit(["/bin/true"], gpus=1, cwd=str(open_dir), image=image)
        assert err.value.status == 400 and image in str(err.value) and words in str(err.value), str(err.value)
    assert u1.jobs()["jobs"] == []
    off = _server(live_server, container_pull=False)
    with pytest.raises(GPUJobsError) as err:
        GPUJobsClient(url=off.url, token="tok-u1").submit(["/bin/true"], gpus=1, cwd=str(open_dir),
                                                          image="127.0.0.1:1/gpujobs/x:1")
    assert err.value.status == 400 and "c.GPUJobs.container_pull" in str(err.value), str(err.value)
