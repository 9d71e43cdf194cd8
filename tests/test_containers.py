"""Containers (issue 29) without a container: the image field's checks, the site's settings
(default image, allow-list, runtimes found by entry points) and what the supervisor runs
for a job in an image (podman's and Apptainer's command lines). The live path is in
tests/test_containers_live.py; Apptainer's live test is skipped where it is not installed.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile

import pytest

from jupyter_gpujobs.engine.containers import (
    ContainerRun,
    Containers,
    ImageProblem,
    Runtime,
    renumbered,
    runtime_names,
    wrap,
)
from jupyter_gpujobs.engine.containers.apptainer import program
from jupyter_gpujobs.model import InvalidInput, parse_image


def test_image_field_names_what_is_wrong() -> None:
    assert parse_image(None) is None  # the site's default
    assert parse_image("") == ""  # the host's own environment
    assert parse_image(" localhost/pytorch:2.3 ") == "localhost/pytorch:2.3"
    assert parse_image("/shared/images/cuda.sif") == "/shared/images/cuda.sif"
    assert parse_image("docker.io/library/python@sha256:abc") == "docker.io/library/python@sha256:abc"
    for bad in ("two words", "a\nb", "-v/etc:/x", "x" * 600, 3):
        with pytest.raises(InvalidInput) as err:
            parse_image(bad)
        assert err.value.field == "image"


def test_allow_list_default_and_runtimes() -> None:
    assert {"podman", "apptainer"} <= set(runtime_names())
    settings = Containers(default_image="localhost/site:1", allowed_images=["localhost/*", "/shared/*.sif"])
    assert settings.image_for(None) == "localhost/site:1" and settings.image_for("") == ""
    with pytest.raises(ImageProblem, match="docker.io/x:1 is not allowed here; allowed: localhost/"):
        settings.check("docker.io/x:1")
    with pytest.raises(ImageProblem, match="no container runtime 'nope'"):
        Containers(runtime="nope").check("localhost/x:1")


def test_gpus_renumbered_inside() -> None:
    assert renumbered("3") == "0"
    assert renumbered("2,5") == "0,1"
    assert renumbered("MIG-1234,4") == "MIG-1234,0"
    assert renumbered("") == ""


def test_podman_command_runs_as_the_owner_with_only_the_jobs_gpus() -> None:
    run = ContainerRun(module="jupyter_gpujobs.engine.containers.podman", image="localhost/t:1", name="gpujobs-7-ab",
                       devices=[("/dev/gpujobs-fake/x/nvidia1", "/dev/nvidia1")],
                       mounts=[("/home/u", "/home/u", "rw")], workdir="/home/u/w", options=["--network=none"])
    env = {"PATH": "/opt/venv/bin:/usr/bin", "CUDA_VISIBLE_DEVICES": "1", "SECRET": "s3cret", "HOME": "/home/u"}
    argv, podman_env = wrap(run.as_spec(), ["python", "train.py"], env)
    assert argv[0] == "podman" and "--userns=keep-id" in argv and "--pull=never" in argv
    assert "--cap-drop=all" in argv and "--security-opt=no-new-privileges" in argv
    assert "--device=/dev/gpujobs-fake/x/nvidia1:/dev/nvidia1" in argv
    assert [a for a in argv if a.startswith("--device")] == ["--device=/dev/gpujobs-fake/x/nvidia1:/dev/nvidia1"]
    assert "--mount=type=bind,source=/home/u,destination=/home/u" in argv and "--workdir=/home/u/w" in argv
    assert argv[-3:] == ["localhost/t:1", "python", "train.py"]
    assert argv.index("--network=none") > argv.index("--network=host")  # the site's options come last
    assert "s3cret" not in " ".join(argv) and "--env=SECRET" in argv  # values by name, never on the command line
    assert "--env=PATH" not in argv  # the image's own search path
    assert podman_env["CUDA_VISIBLE_DEVICES"] == "0" and podman_env["SECRET"] == "s3cret"
    assert podman_env["NVIDIA_VISIBLE_DEVICES"] == "void"  # no GPU from a runtime hook: the engine gives them
    assert podman_env["PATH"] == "/opt/venv/bin:/usr/bin"  # podman itself is found on the host's


def test_fake_gpus_get_their_nodes_and_no_driver() -> None:
    spec = Containers().launch(7, "localhost/t:1", "/tmp", ["/dev/gpujobs-fake/x/nvidia1"], None, fake=True)
    assert spec["devices"] == [["/dev/gpujobs-fake/x/nvidia1", "/dev/nvidia1"]] and spec["cdi"] == []
    assert ["/tmp", "/tmp", "rw"] in spec["mounts"] and not any(m[2] == "ro" for m in spec["mounts"])
    assert spec["workdir"] == "/tmp" and spec["name"].startswith("gpujobs-7-")


def test_what_podman_can_pull_and_the_image_a_pulled_archive_runs_in() -> None:
    from jupyter_gpujobs.engine.containers.podman import Podman

    podman = Podman()
    for image in ("docker.io/library/python:3.12", "registry:5000/team/x:1", "docker-archive:/srv/t.tar",
                  "oci-archive:/srv/t.tar", "oci:/srv/layout:tag"):
        assert podman.pull_command(image) == ["podman", "--log-level=error", "pull", image], image
    for image in ("localhost/t:1", "python:3.12", "team/x"):  # no registry: built or loaded here only
        assert podman.pull_command(image) is None and "names no registry" in podman.missing_text(image), image
    assert podman.local_source("oci:/srv/layout:tag") == "/srv/layout"
    assert podman.exists_command("docker-archive:/srv/t.tar") is None  # podman looks up no image by it
    assert "absolute path" in podman.refusal("docker-archive:t.tar") and podman.refusal("oci:/srv/l") == ""
    settings = Containers(pulled={7: "fc47dfa15adc"})
    spec = settings.launch(7, "docker-archive:/srv/t.tar", "/tmp", [], "u", fake=True)
    assert spec["image"] == "fc47dfa15adc"  # the id its pull gave (podman runs no transport with --pull=never)
    assert settings.launch(8, "docker-archive:/srv/t.tar", "/tmp", [], "u", fake=True)["image"] != "fc47dfa15adc"


def test_apptainer_command_and_refusals() -> None:
    run = ContainerRun(module="jupyter_gpujobs.engine.containers.apptainer", image="/shared/t.sif", name="n",
                       devices=[("/dev/nvidia2", "/dev/nvidia2")], mounts=[("/home/u", "/home/u", "rw")],
                       workdir="/home/u")
    argv, env = wrap(run.as_spec(), ["python", "x.py"], {"CUDA_VISIBLE_DEVICES": "2", "HOME": "/home/u",
                                                        "PATH": "/usr/bin"})
    assert argv[1:5] == ["exec", "--cleanenv", "--contain", "--no-mount=cwd"]
    assert "--bind=/dev/nvidia2:/dev/nvidia2" in argv and argv[-3:] == ["/shared/t.sif", "python", "x.py"]
    assert env["APPTAINERENV_CUDA_VISIBLE_DEVICES"] == "0" and "APPTAINERENV_PATH" not in env
    from jupyter_gpujobs.engine.containers.apptainer import Apptainer

    assert "apptainer pull" in Apptainer().refusal("docker://python:3.12")


def test_a_path_with_dot_dot_gets_past_no_allow_list() -> None:
    """The allow-list matches an image's path as written (shell patterns: `*` matches `/..`),
    so a path not written plainly (`..`, `.`, `//`) would reach files outside the folder the
    site allows: it is refused, for podman's archives and folders and Apptainer's files."""
    from jupyter_gpujobs.engine.containers.apptainer import Apptainer
    from jupyter_gpujobs.engine.containers.podman import Podman

    for image in ("docker-archive:/shared/images/../../home/u/evil.tar", "oci:/shared/images/./x:tag",
                  "oci-archive:/shared/images//../x.tar", "docker-archive:/shared/images/..:ref"):
        assert "not written plainly" in Podman().refusal(image), image
    assert "not written plainly" in Apptainer().refusal("/shared/images/../../home/u/evil.sif")
    for image in ("docker-archive:/shared/images/t.tar", "oci:/shared/images/layout:tag"):
        assert Podman().refusal(image) == "", image
    assert Apptainer().refusal("/shared/images/t.sif") == ""
    if shutil.which("podman"):
        settings = Containers(allowed_images=["docker-archive:/shared/images/*"])
        with pytest.raises(ImageProblem, match="not written plainly"):
            settings.check("docker-archive:/shared/images/../../home/u/evil.tar")


def test_apptainer_job_live() -> None:
    if not (shutil.which("apptainer") or shutil.which("singularity")):
        pytest.skip("Apptainer is not installed: Debian 12 has no package of it and no registry is reachable "
                    "to fetch one, so scripts/install-podman.sh installs none; its command line is tested above")
    image = os.environ.get("GPUJOBS_TEST_IMAGE", "localhost/gpujobs-test:latest")
    with tempfile.TemporaryDirectory() as folder:
        os.chmod(folder, 0o755)
        archive, sif = os.path.join(folder, "t.tar"), os.path.join(folder, "t.sif")
        subprocess.run([*_as_owner(), "podman", "save", "--format", "docker-archive", "-o", archive, image],
                       check=True, cwd="/")
        subprocess.run([*_as_owner(), program(), "build", sif, f"docker-archive:{archive}"], check=True, cwd="/")
        run = ContainerRun(module="jupyter_gpujobs.engine.containers.apptainer", image=sif, name="t",
                           mounts=[(folder, folder, "rw")], workdir=folder)
        argv, env = wrap(run.as_spec(), ["/bin/sh", "-c", "id -u; echo gpus=$CUDA_VISIBLE_DEVICES; pwd"],
                         {"CUDA_VISIBLE_DEVICES": "3", "PATH": os.environ["PATH"], "HOME": folder})
        done = subprocess.run([*_as_owner(), "env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv],
                              capture_output=True, text=True, cwd="/", check=True)
    uid = str(os.getuid()) if os.geteuid() != 0 else str(pwd.getpwnam("gpujobs-u1").pw_uid)
    assert done.stdout.split() == [uid, "gpus=0", folder]


def _as_owner() -> list[str]:
    """Run as the test user when root (the engine never runs a job's runtime as root)."""
    return ["runuser", "-u", "gpujobs-u1", "--"] if os.geteuid() == 0 else []


def test_slurm_maps_an_image_to_its_container_option(tmp_path) -> None:
    from jupyter_gpujobs.engine.runners.slurm import Slurm, SlurmRunner
    from jupyter_gpujobs.model import Job

    job = Job(id=5, user="ann", gpus=1, image="localhost/pytorch:2.3")
    plain = SlurmRunner(tmp_path)
    assert not plain.runs_containers  # refused at submit (no container option configured)
    assert not any("container" in a for a in plain.sbatch_args(job))
    pyxis = SlurmRunner(tmp_path, Slurm(container_option="--container-image={image}"))
    assert pyxis.runs_containers
    assert "--container-image=localhost/pytorch:2.3" in pyxis.sbatch_args(job)
    assert not any("container" in a for a in pyxis.sbatch_args(Job(id=6, user="ann", gpus=1)))


async def test_image_refused_at_submit_naming_it(engine, api) -> None:
    """In-process: an image the runner cannot run, one off the allow-list and a missing one
    are 400s naming the image, and nothing is queued."""
    engine.state.containers = Containers(allowed_images=["localhost/*"])
    status, body = await api("POST", "jobs", body={"command": "true", "image": "docker.io/x:1"})
    assert status == 400 and body["field"] == "image" and "docker.io/x:1 is not allowed here" in body["message"]
    if shutil.which("podman"):
        status, body = await api("POST", "jobs", body={"command": "true", "image": "localhost/no-such:1"})
        assert status == 400 and "image localhost/no-such:1 is not on this machine" in body["message"], body
    engine.state.runner.runs_containers = False
    status, body = await api("POST", "jobs", body={"command": "true", "image": "localhost/x:1"})
    assert status == 400 and "image localhost/x:1: this server's local runner runs no container images" in body["message"]
    status, body = await api("POST", "jobs", body={"command": "true", "image": "two words"})
    assert status == 400 and body["field"] == "image"
    status, jobs = await api("GET", "jobs")
    assert jobs["jobs"] == []


async def test_info_and_doctor_say_what_is_in_force(engine, api) -> None:
    status, info = await api("GET", "info")
    assert status == 200
    ready = bool(shutil.which("podman"))
    assert info["containers"]["ready"] is ready and info["containers"]["default_image"] == ""
    assert ("podman, rootless as each job's owner" if ready else "podman is not installed") in info["containers"]["text"]
    if ready:
        assert info["containers"]["text"].endswith("; missing images pulled as the owner before GPUs (within 1800 s)")
    settings = Containers(runtime="nope", default_image="localhost/site:1")
    described = settings.describe(True, "local")
    assert not described["ready"] and "no container runtime 'nope'" in described["text"]
    assert Containers().describe(False, "slurm")["text"].startswith("none: the slurm runner runs no container images")


def test_an_image_found_is_not_asked_for_again_a_missing_one_is(tmp_path) -> None:
    import asyncio

    from jupyter_gpujobs.engine.containers import Runtime
    from jupyter_gpujobs.engine.containers.present import check_present

    asked = tmp_path / "asked"

    class Counting(Runtime):
        def __init__(self, code: int):
            self.code = code

        def exists_command(self, image: str) -> list[str]:
            return ["/bin/sh", "-c", f"echo . >> {asked}; exit {self.code}"]

    for _ in range(3):
        asyncio.run(check_present(Counting(0), f"localhost/found-{tmp_path.name}:1", None))
    assert asked.read_text().count(".") == 1
    for _ in range(2):
        with pytest.raises(ImageProblem, match=f"localhost/missing-{tmp_path.name}:1"):
            asyncio.run(check_present(Counting(1), f"localhost/missing-{tmp_path.name}:1", None))
    assert asked.read_text().count(".") == 3


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, as CI runs: it looks as another Unix user")
def test_an_archive_a_pull_reads_is_looked_at_as_its_owner(tmp_path, open_dir) -> None:
    """The file a pull of docker-archive: would read is looked at as the job's owner: one
    only root may read is refused for them (root could read it), one they may read passes."""
    import asyncio

    from jupyter_gpujobs.engine.containers.present import check_readable

    secret = tmp_path / "root-only.tar"  # (pytest's tmp_path is root's alone)
    secret.write_bytes(b"x")
    os.chmod(secret, 0o600)
    image = f"docker-archive:{secret}"
    with pytest.raises(ImageProblem, match=f"no file or folder {secret} that nobody may read"):
        asyncio.run(check_readable(str(secret), image, "nobody"))
    asyncio.run(check_readable(str(secret), image, None))  # the engine's own user (root) may
    shared = open_dir / "shared.tar"
    shared.write_bytes(b"x")
    os.chmod(shared, 0o644)
    asyncio.run(check_readable(str(shared), f"docker-archive:{shared}", "nobody"))


class _Loads(Runtime):
    """A runtime whose images are files of this machine (`arch:PATH`, as podman's local
    transports): each is pulled by `pull_command`, which the tests below give."""

    name = program = "sh"

    def local_source(self, image: str) -> str | None:
        return image.partition(":")[2]


async def _submit_pulled(api, tmp_path, **fields) -> tuple[object, int]:  # type: ignore[no-untyped-def]
    """A job (`true`, no GPU, `fields`) in an archive image under `tmp_path` that a pull reads:
    the archive and the job's id."""
    archive = tmp_path / "t.tar"
    archive.write_bytes(b"x")
    status, job = await api("POST", "jobs", body={"command": "true", "image": f"arch:{archive}", "gpus": 0, **fields})
    assert status in (200, 201), job
    return archive, int((job["jobs"][0] if "jobs" in job else job)["id"])


async def _out_of_pending(api, job_id: int, timeout_s: float = 30) -> dict:  # type: ignore[no-untyped-def]
    """The job's view once it is no longer PENDING (its pull ended it, or it started)."""
    import asyncio
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        status, seen = await api("GET", f"jobs/{job_id}")
        if seen["state"] != "PENDING":
            return seen
        assert time.monotonic() < deadline, seen
        await asyncio.sleep(0.05)


async def _pulled(engine, api, job_id: int, timeout_s: float = 30) -> None:  # type: ignore[no-untyped-def]
    """Once the job's pull is over (it waits for none from its acceptance on)."""
    import asyncio
    import time

    deadline = time.monotonic() + timeout_s
    while job_id in engine.state.pulling:
        assert time.monotonic() < deadline, await api("GET", f"jobs/{job_id}")
        await asyncio.sleep(0.05)


async def test_a_pull_that_names_no_image_id_fails_its_job_before_gpus(engine, api, tmp_path) -> None:
    """In-process: a pull from a local transport whose last line is no image id (a warning,
    say) fails its job naming that line, before it starts: it would otherwise be run with
    that line as its image, and fail only once it held GPUs."""

    class Loads(_Loads):
        def pull_command(self, image: str) -> list[str]:
            return ["/bin/sh", "-c", "echo Copying blob sha256:f58f; echo Writing manifest to image destination"]

    engine.state.containers = Containers(runtime="loads", _loaded={"loads": Loads()})
    archive, job_id = await _submit_pulled(api, tmp_path)
    seen = await _out_of_pending(api, job_id)
    assert seen["state"] == "FAILED" and seen["started_at"] is None, seen
    assert seen["reason"] == (f"image arch:{archive}: the pull named no image id "
                              "(its last line: 'Writing manifest to image destination')"), seen["reason"]


def test_a_pull_time_limit_must_be_more_than_nothing() -> None:
    from traitlets import TraitError

    from jupyter_gpujobs.config import GPUJobs

    for bad in (0, -5, float("nan")):
        with pytest.raises(TraitError, match="c.GPUJobs.container_pull_timeout: must be more than 0 seconds"):
            GPUJobs(container_pull_timeout=bad)
    assert GPUJobs(container_pull_timeout=2).container_pull_timeout == 2


async def test_a_pull_whose_output_cannot_be_handled_ends_and_fails_its_job(engine, api, tmp_path,
                                                                           monkeypatch) -> None:
    """In-process: when the handling of a pull's output fails (here: the job's reason cannot
    be shown, in a way nobody foresaw), the pull is stopped and its job ends FAILED naming
    why. It waited for the pull's end, past its time limit, its output unread."""
    import time

    from jupyter_gpujobs.engine.containers.pull import Pulls

    sleep = f"599.{time.monotonic_ns() % 10**6:06d}"  # (its own, to look for)

    class Slow(_Loads):
        def pull_command(self, image: str) -> list[str]:
            return ["/bin/sh", "-c", f"echo started; exec sleep {sleep}"]

    show = Pulls._show

    def broken(self: Pulls, pull: object, job_id: int) -> None:
        if getattr(pull, "last", "") == "started":
            raise ValueError("cannot show it")
        show(self, pull, job_id)  # type: ignore[arg-type]

    monkeypatch.setattr(Pulls, "_show", broken)
    engine.state.containers = Containers(runtime="slow", _loaded={"slow": Slow()}, pull_timeout_s=600)
    archive, job_id = await _submit_pulled(api, tmp_path)
    seen = await _out_of_pending(api, job_id)
    assert seen["state"] == "FAILED" and seen["started_at"] is None, seen
    assert seen["reason"] == f"image arch:{archive}: ValueError: cannot show it", seen["reason"]
    assert subprocess.run(["pgrep", "-f", f"sleep {sleep}"]).returncode == 1  # the pull was stopped


async def test_a_pulls_output_is_capped_as_the_jobs_own(engine, api, tmp_path) -> None:
    """In-process: a pull that prints without end (a chatty registry, a huge local file) fills
    its job's log no further than c.GPUJobs.log_max_bytes, as the job's own output: the head and
    the newest output kept, the cut said; its failure is still named from its last line. It
    wrote all of it to the engine's disk."""

    from jupyter_gpujobs.engine.runners.local import MIN_LOG_BYTES

    class Chatty(_Loads):
        def pull_command(self, image: str) -> list[str]:
            return ["/bin/sh", "-c", "yes 'Copying blob sha256:f58f' | head -c 4000000; "
                                     "head -c 3000000 /dev/zero | tr '\\0' x; echo; echo 'Error: disk full'; exit 1"]

    engine.state.runner.log_max_bytes = MIN_LOG_BYTES
    engine.state.containers = Containers(runtime="chatty", _loaded={"chatty": Chatty()})
    archive, job_id = await _submit_pulled(api, tmp_path)
    seen = await _out_of_pending(api, job_id, timeout_s=60)
    assert seen["state"] == "FAILED" and seen["reason"] == f"image arch:{archive}: could not be pulled: disk full", seen
    log = (engine.state_dir / "logs" / f"job-{job_id}.log").read_bytes()
    assert len(log) <= MIN_LOG_BYTES, len(log)
    assert log.startswith(b"[gpujobs] pulling image") and b"bytes of output cut here" in log
    assert log.endswith(b"Error: disk full\n"), log[-200:]


async def test_each_job_runs_the_image_its_own_pull_named(engine, api, tmp_path) -> None:
    """In-process: jobs A and B of one user name one archive, each pulled when it came (podman
    loads a transport's image each time, and the archive may have changed in between): A, still
    waiting, runs the image id A's pull named, not B's later one. An ended job's id is not kept."""

    counter = tmp_path / "pulls"

    class Counts(_Loads):
        def pull_command(self, image: str) -> list[str]:  # each pull names another image id
            return ["/bin/sh", "-c", f"n=$(( $(cat {counter} 2>/dev/null || echo 0) + 1 )); echo $n > {counter}; "
                                     "printf '%064d\\n' $n"]

    archive = tmp_path / "t.tar"
    archive.write_bytes(b"x")
    image = f"arch:{archive}"
    engine.state.containers = Containers(runtime="counts", _loaded={"counts": Counts()})

    async def pulled_job() -> int:
        """A job held (it stays pending), once its pull is over."""
        _, job_id = await _submit_pulled(api, tmp_path, hold=True)
        await _pulled(engine, api, job_id)
        return job_id

    a = await pulled_job()
    b = await pulled_job()
    launch = engine.state.containers.launch
    assert launch(a, image, "/tmp", [], None, fake=True)["image"] == "1".zfill(64)
    assert launch(b, image, "/tmp", [], None, fake=True)["image"] == "2".zfill(64)
    status, _ = await api("DELETE", f"jobs/{a}")
    assert status == 200, _
    c = await pulled_job()
    assert engine.state.containers.pulled == {b: "2".zfill(64), c: "3".zfill(64)}


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, as CI runs: it checks as another Unix user")
def test_a_users_image_checks_run_a_few_at_a_time_and_hold_up_no_one_else(open_dir) -> None:
    """A user's many image checks at once (a flood of submissions) run as them at most
    `userfiles.MAX_PER_USER` at a time, the slots of the engine's other checks of their files,
    the rest waiting their turn; another user's check goes on meanwhile. They all started at
    once, each a process of root's."""
    import asyncio

    import psutil

    from jupyter_gpujobs.engine.containers import Runtime
    from jupyter_gpujobs.engine.containers.present import check_present
    from jupyter_gpujobs.engine.userfiles import MAX_PER_USER

    release = open_dir / "release"
    mark = f"gpujobs-check-{open_dir.name}"  # (in the checks' command lines, to count them)

    class Blocking(Runtime):
        def exists_command(self, image: str) -> list[str]:
            if image.startswith("other/"):
                return ["/bin/true"]
            return ["/bin/sh", "-c", f"until [ -e {release} ]; do sleep 0.05; done # {mark}"]

    def checks() -> list[psutil.Process]:
        found = []
        for proc in psutil.process_iter(["cmdline"]):
            if mark in " ".join(proc.info["cmdline"] or ()):
                found.append(proc)
        return found

    async def flood() -> None:
        runtime = Blocking()
        mine = [asyncio.ensure_future(check_present(runtime, f"nobody/{i}:{open_dir.name}", "nobody"))
                for i in range(6)]
        try:
            while len(checks()) < MAX_PER_USER:  # (each task forks at its first step, if it may)
                await asyncio.sleep(0.02)
            await asyncio.wait_for(check_present(runtime, f"other/x:{open_dir.name}", None), 30)  # not held up
            running = checks()
            assert len(running) == MAX_PER_USER, [p.info["cmdline"] for p in running]
            assert all(p.uids().real == pwd.getpwnam("nobody").pw_uid for p in running)
        finally:
            release.touch()
        await asyncio.wait_for(asyncio.gather(*mine), 30)  # the rest had their turn

    asyncio.run(flood())


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, as CI runs: cgroups are root's")
async def test_a_pull_runs_in_a_cgroup_with_its_jobs_limits_and_leaves_nothing(engine, api, tmp_path) -> None:
    """In-process: a pull runs in a cgroup of its own, made as a job's, from its first process
    on, with the memory and CPU limits of the job it is for; what it leaves running (a process
    gone to a session of its own) is killed when it ends, and the cgroup removed. It ran in the
    engine's cgroup, unlimited, and what it left ran on."""
    import time

    if not engine.state.runner.isolation.enabled:
        pytest.skip(f"no writable cgroups here: {engine.state.runner.isolation.describe()}")
    left = f"599.{time.monotonic_ns() % 10**6:06d}"  # (its own, to look for)

    class Confined(_Loads):
        def pull_command(self, image: str) -> list[str]:
            return ["/bin/sh", "-c", "cat /proc/self/cgroup; "
                                     "for f in memory.max memory.limit_in_bytes cpu.max cpu.cfs_quota_us; do "
                                     "for c in $(sed -n 's/^[0-9]*:[^:]*:\\(.*gpujobs\\/pull-.*\\)$/\\1/p' "
                                     "/proc/self/cgroup); do for m in /sys/fs/cgroup/*; do "
                                     "[ -r $m$c/$f ] && echo \"$f=$(cat $m$c/$f)\"; done; done; done; "
                                     f"setsid sleep {left} </dev/null >/dev/null 2>&1 & printf '%064d\\n' 7"]

    engine.state.containers = Containers(runtime="confined", _loaded={"confined": Confined()})
    archive, job_id = await _submit_pulled(api, tmp_path, hold=True, mem="300M", cpus=1.5)
    await _pulled(engine, api, job_id)
    assert engine.state.containers.pulled == {job_id: "7".zfill(64)}, await api("GET", f"jobs/{job_id}")
    log = (engine.state_dir / "logs" / f"job-{job_id}.log").read_text()
    places = {line.rpartition(":")[2] for line in log.splitlines() if "/gpujobs/pull-" in line}
    assert places and all(p.startswith(f"/gpujobs/pull-{job_id}-") for p in places), log
    limits = set(line for line in log.splitlines() if "=" in line)
    assert limits & {f"memory.max={300 << 20}", f"memory.limit_in_bytes={300 << 20}"}, log
    assert limits & {"cpu.max=150000 100000", "cpu.cfs_quota_us=150000"}, log
    assert subprocess.run(["pgrep", "-f", f"sleep {left}"]).returncode == 1  # what it left was killed
    place = places.pop()
    assert not any(os.path.exists(f"{m}{place}") for m in glob.glob("/sys/fs/cgroup/*")), place


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, as CI runs: cgroups are root's")
async def test_a_pull_past_its_jobs_memory_limit_fails_it_saying_so(engine, api, tmp_path) -> None:
    """In-process: a pull that needs more memory than its job may have is killed at that limit
    (its cgroup's), and its job ends FAILED saying so, before it takes GPUs."""

    if not engine.state.runner.isolation.limits()[0]:
        pytest.skip(f"no memory limits here: {engine.state.runner.isolation.describe()}")

    class Greedy(_Loads):
        def pull_command(self, image: str) -> list[str]:
            return ["/usr/bin/python3", "-c", "b = b'x' * (400 << 20); print('%064d' % len(b))"]

    engine.state.containers = Containers(runtime="greedy", _loaded={"greedy": Greedy()})
    archive, job_id = await _submit_pulled(api, tmp_path, mem="64M")
    seen = await _out_of_pending(api, job_id, timeout_s=60)
    assert seen["state"] == "FAILED" and seen["started_at"] is None, seen
    assert seen["reason"] == f"image arch:{archive}: the pull ran out of memory at its limit of 64M (--mem)", seen
