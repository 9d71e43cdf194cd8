"""The Slurm runner against a real single-node Slurm (munged, slurmctld, slurmd on loopback,
4 fake GPUs as character devices; tests/slurm_cluster.py), behind a live Jupyter server with
`c.GPUJobs.runner = "slurm"`, through the unchanged front ends: the CLI, the REST client,
`%%gpujob` in a real kernel and notebook jobs.

One cluster and one server serve the whole module; jobs are short. The time-limit job is
submitted first and checked last, because Slurm checks limits only every 30 s.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from slurm_cluster import SlurmCluster

from jupyter_gpujobs.client import GPUJobsError

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm")).start()
    saved = os.environ.get("SLURM_CONF")
    os.environ.update(cluster.env())  # the server (and the tests' own squeue) use this cluster
    try:
        yield cluster
    finally:
        cluster.stop()
        if saved is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved


@pytest.fixture(scope="module")
def server(slurm: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from servers import live_servers

    factory = live_servers(tmp_path_factory.mktemp("live"))
    make = next(factory)
    try:
        yield make(config={"runner": "slurm", "backfill": False},
                   extra_args=["--Slurm.poll_interval=0.25", "--Slurm.partitions=urgent=urgent"])
    finally:
        next(factory, None)


@pytest.fixture(scope="module")
def time_limit_job(server: Any) -> dict[str, Any]:
    """A job over its 1-minute limit, submitted when the module starts (checked at its end)."""
    with server.client() as client:
        return client.submit(["sleep", "600"], gpus=1, time_limit="1m", name="overtime")


def squeue(*args: str) -> str:
    return subprocess.run(["squeue", "-h", *args], capture_output=True, text=True, check=True).stdout


def wait_state(client: Any, job_id: int, states: tuple[str, ...], timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        job = client.job(job_id)
        if job["state"] in states or time.monotonic() > deadline:
            return job
        time.sleep(0.1)


def slurm_id(client: Any, job_id: int) -> str:
    for e in client.events(job_id):
        if e["state"] == "SUBMITTED":
            return str(e["data"]["slurm_id"])
    raise AssertionError(f"job {job_id} was not submitted to Slurm: {client.events(job_id)}")


def test_script_job_runs_on_slurm_gpus_and_show_names_the_slurm_job(server: Any, time_limit_job: Any) -> None:
    r = server.cli("submit", "--gpus", "2", "--time", "5m", "--name", "hello", "--",
                   "sh", "-c", "echo gpus=$CUDA_VISIBLE_DEVICES job=$GPUJOBS_JOB_ID; echo done")
    assert r.returncode == 0, r.stderr
    job_id = int(r.stdout.split()[1])
    with server.client() as client:
        job = client.wait(job_id, timeout=30)
        log = client.log(job_id)["data"]
    assert job["state"] == "COMPLETED", job
    assert job["host"] == "localhost" and len(job["assigned_gpus"]) == 2
    assert f"gpus={','.join(map(str, job['assigned_gpus']))} job={job_id}" in log and "done" in log
    shown = server.cli("show", str(job_id)).stdout
    assert "submitted to Slurm as job" in shown and "started by Slurm on localhost" in shown


def test_failed_job_shows_its_exit_code(server: Any) -> None:
    with server.client() as client:
        job = client.submit(["sh", "-c", "echo bad; exit 3"], gpus=1, time_limit="5m")
        done = client.wait(job["id"], timeout=30)
    assert done["state"] == "FAILED" and done["exit_code"] == 3
    assert done["reason"] == "failed (exit code 3)"


def test_pending_job_shows_slurms_reason_and_expected_start_then_cancels(server: Any, time_limit_job: Any) -> None:
    with server.client() as client:
        assert wait_state(client, time_limit_job["id"], ("RUNNING",))["state"] == "RUNNING"  # holds 1 GPU
        big = client.submit(["sleep", "60"], gpus=3, time_limit="2m")
        wait_state(client, big["id"], ("RUNNING",))
        small = client.submit(["true"], gpus=1, time_limit="1m")
        deadline = time.monotonic() + 20
        while True:
            job = client.job(small["id"])
            if "waiting for resources" in (job["reason"] or "") and job["expected_start"]:
                break
            assert time.monotonic() < deadline, (job["state"], job["reason"], job["expected_start"])
            time.sleep(0.2)
        assert job["state"] == "PENDING"
        # expected start: when the 4-GPU job reaches its limit, as Slurm's backfill estimates it
        assert big["submitted_at"] < job["expected_start"] <= time.time() + 130
        gpus = client.gpus()
        held = [g for g in gpus if g["job_id"] == big["id"]]
        assert len(gpus) == 4 and len(held) == 3 and {g["host"] for g in gpus} == {"localhost"}
        assert all(g["job_id"] is not None for g in gpus)
        assert all(g["user"] == big["user"] for g in held)
        listed = server.cli("gpus").stdout
        assert "localhost" in listed and f"job {big['id']}" in listed

        cancelled = client.cancel(small["id"])  # pending: gone from Slurm at once
        assert cancelled["state"] == "CANCELLED"
        sid = slurm_id(client, small["id"])
        assert sid not in squeue("-t", "PD", "-o", "%i").split()
        stopped = client.cancel(big["id"])  # running: scancel, then Slurm reports it
        stopped = client.wait(big["id"], timeout=20)
    assert stopped["state"] == "CANCELLED" and "cancelled by" in stopped["reason"]


def test_array_runs_at_most_two_tasks_at_once(server: Any) -> None:
    with server.client() as client:
        first = client.submit(["sh", "-c", "echo task $GPUJOBS_ARRAY_INDEX; sleep 1"], gpus=1, time_limit="5m",
                              array="0-3%2")
        jobs = [client.job(i) for i in first["array_tasks"]]
        assert len(jobs) == 4
        done = [client.wait(j["id"], timeout=60) for j in jobs]
        logs = {j["array_index"]: client.log(j["id"])["data"] for j in done}
        sids = {slurm_id(client, j["id"]) for j in jobs}
    assert all(j["state"] == "COMPLETED" for j in done), done
    assert {f"task {i}" for i in range(4)} == {logs[i].strip() for i in range(4)}
    assert len({s.split("_")[0] for s in sids}) == 1  # one Slurm array job
    for j in done:  # never three at once
        overlapping = [k for k in done if k["started_at"] < j["ended_at"] and k["ended_at"] > j["started_at"]]
        assert len(overlapping) <= 2, done


def test_afterok_dependency_waits_and_a_failed_one_cancels(server: Any) -> None:
    with server.client() as client:
        first = client.submit(["sleep", "2"], gpus=1, time_limit="5m")
        after = client.submit(["true"], gpus=1, time_limit="5m", depends=f"afterok:{first['id']}")
        held = wait_state(client, after["id"], ("RUNNING", "COMPLETED"), timeout=1.5)
        assert held["state"] == "PENDING"
        bad = client.submit(["sh", "-c", "sleep 1; exit 1"], gpus=1, time_limit="5m")
        never = client.submit(["true"], gpus=1, time_limit="5m", depends=f"afterok:{bad['id']}")
        seen = wait_state(client, never["id"], ("CANCELLED",), timeout=0.6)
        if seen["state"] == "PENDING":
            assert "held by dependency" in seen["reason"]
        first_done = client.wait(first["id"], timeout=30)
        after_done = client.wait(after["id"], timeout=30)
        never_done = client.wait(never["id"], timeout=30)
    assert first_done["state"] == after_done["state"] == "COMPLETED"
    assert after_done["started_at"] >= first_done["ended_at"] - 0.01
    assert never_done["state"] == "CANCELLED" and "dependency" in never_done["reason"], never_done


def test_a_job_cancelled_in_slurm_shows_why(server: Any) -> None:
    with server.client() as client:
        job = client.submit(["sleep", "60"], gpus=1, time_limit="5m")
        wait_state(client, job["id"], ("RUNNING",))
        subprocess.run(["scancel", slurm_id(client, job["id"])], check=True)
        done = client.wait(job["id"], timeout=20)
    assert done["state"] == "CANCELLED" and "cancelled in Slurm" in done["reason"]


def test_gpus_show_slurm_jobs_from_outside_the_engine(server: Any) -> None:
    sid = subprocess.run(["sbatch", "--parsable", "--gres=gpu:1", "--time=1", "--output=/dev/null",
                          "--wrap", "sleep 30"], capture_output=True, text=True, check=True).stdout.strip()
    try:
        with server.client() as client:
            deadline = time.monotonic() + 20
            while not (held := [g for g in client.gpus() if g.get("slurm_job_id") == sid]):
                assert time.monotonic() < deadline, client.gpus()
                time.sleep(0.2)
        assert held[0]["job_id"] is None and held[0]["user"] == "root" and held[0]["host"] == "localhost"
        assert f"Slurm job {sid} (root)" in server.cli("gpus").stdout
    finally:
        subprocess.run(["scancel", sid], check=True)


def test_priority_class_goes_to_its_partition_with_its_memory_and_cpus(server: Any) -> None:
    with server.client() as client:
        job = client.submit(["true"], gpus=1, gpu_type="A100", time_limit="5m",
                            env={"X": "1"}, priority="urgent", mem="512M", cpus=2)
        done = client.wait(job["id"], timeout=30)
        sid = slurm_id(client, job["id"])
    assert done["state"] == "COMPLETED", done  # the urgent class went to the 'urgent' partition
    out = subprocess.run(["scontrol", "-o", "show", "job", sid], capture_output=True, text=True).stdout
    assert "Partition=urgent" in out and "MinMemoryNode=512M" in out and "MinCPUsNode=2" in out


def test_cell_job_streams_and_pushes_and_pulls_through_slurm(server: Any, tmp_path: Path) -> None:
    from test_magics import Kernel

    kernel = Kernel(server, tmp_path)
    try:
        kernel.execute("scale = 3")
        msg_id = kernel.send("%%gpujob -g 1 -t 2m --push scale --pull total,gpus\n"
                             "import os, time\ngpus = os.environ['CUDA_VISIBLE_DEVICES']\n"
                             "print('first line', flush=True)\ntime.sleep(2)\ntotal = scale * 2 + 1\n"
                             "print('second line')\n")
        first_at = None
        stdout = ""
        for at, msg in kernel.messages(msg_id, timeout=60):
            if msg["msg_type"] == "stream":
                stdout += msg["content"]["text"]
                if "first line" in stdout and first_at is None:
                    first_at = at
        assert kernel.reply(msg_id)["status"] == "ok", stdout
        assert first_at is not None and time.monotonic() - first_at > 1  # streamed while it ran
        assert "second line" in stdout
        assert kernel.value("total") == "7"
        with server.client() as client:
            job = [j for j in client.jobs(limit=50)["jobs"] if j["kind"] == "cell"][0]
        assert kernel.value("gpus") == repr(",".join(map(str, job["assigned_gpus"])))
    finally:
        kernel.close()


def test_notebook_job_with_parameters(server: Any) -> None:
    import nbformat
    from test_notebooks import _outputs_text, param_notebook

    param_notebook(server.root / "exp" / "train.ipynb")
    with server.client() as client:
        job = client.submit_notebook("exp/train.ipynb", parameters={"alpha": 0.5, "epochs": 3, "name": "r1"},
                                     gpus=1, time_limit="5m")
        done = client.wait(job["id"], timeout=90)
        log = client.log(job["id"])["data"]
    assert done["state"] == "COMPLETED", (done, log)
    nb = nbformat.read(str(server.root / done["output_notebook"]), as_version=4)
    assert "alpha 0.5 epochs 3 name r1" in _outputs_text(nb.cells[3])
    assert f"gpus {done['assigned_gpus'][0]}" in _outputs_text(nb.cells[3])


def test_a_kernel_job_without_its_launch_command_is_refused(server: Any) -> None:
    from jupyter_gpujobs.client import GPUJobsError

    with server.client() as client, pytest.raises(GPUJobsError) as err:
        client.submit(kind="kernel", gpus=1, time_limit="5m")
    assert err.value.field == "command" and "Slurm" in err.value.message


def _kernel_job(client: Any, name: str) -> dict[str, Any]:
    return next(j for j in client.jobs(limit=100)["jobs"] if j["kind"] == "kernel" and j["name"] == f"kernel {name}")


def test_gpu_kernel_runs_as_a_slurm_job_is_interrupted_and_shut_down(server: Any) -> None:
    from test_provisioner import Kernels, install_spec, wait_until

    install_spec(server, "python3-slurm", "--gpus", "1", "--time", "10m", "--max-wait", "1m")
    k = Kernels(server)
    try:
        t0 = time.monotonic()
        kernel = k.start_ok("python3-slurm")
        print(f"GPU kernel started on Slurm in {time.monotonic() - t0:.2f}s")
        with server.client() as client:
            job = _kernel_job(client, "python3-slurm")
            sid = slurm_id(client, job["id"])
            assert job["state"] == "RUNNING" and len(job["assigned_gpus"]) == 1, job
            assert sid in squeue("-t", "R", "-o", "%i").split()
            assert f"Slurm job {sid}" in server.cli("show", str(job["id"])).stdout
            # the kernel runs in the Slurm job, on the GPU Slurm gave it
            assert k.evaluate(kernel, "os.environ['SLURM_JOB_ID']") == sid
            assert k.evaluate(kernel, "os.environ['CUDA_VISIBLE_DEVICES']") == str(job["assigned_gpus"][0])
            # the cluster's GPU view reads Slurm's holders at most every 2 s
            wait_until(lambda: [g["job_id"] for g in client.gpus() if g["index"] == job["assigned_gpus"][0]]
                       == [job["id"]], 5, "the kernel's GPU shown as its job's")

            kc = k.by_kernel[kernel]
            # stop_on_error=False: ipykernel otherwise aborts requests that reach it just after the
            # interrupted cell's error, and the check below would race with that window
            msg_id = kc.execute("import time\nprint('sleeping', flush=True)\ntime.sleep(120)", stop_on_error=False)
            wait_until(lambda: k.server_state(kernel) == "busy", 10, "cell running")
            time.sleep(0.5)
            assert k.http.post(f"api/kernels/{kernel}/interrupt").status_code == 204
            while True:
                reply = kc.get_shell_msg(timeout=15)
                if reply["parent_header"].get("msg_id") == msg_id:
                    break
            assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
            assert k.evaluate(kernel, "1 + 1") == "2"  # still alive after the interrupt

            assert k.http.delete(f"api/kernels/{kernel}").status_code == 204
            done = client.wait(job["id"], timeout=20)
            assert done["state"] == "COMPLETED", done
            wait_until(lambda: sid not in squeue("-o", "%i").split(), 15, "Slurm job ended")
            assert all(g["job_id"] != job["id"] for g in client.gpus())
    finally:
        k.close()


@pytest.mark.parametrize(("spec", "limits", "state", "reason"), [
    ("python3-slurm-short", ("--time", "6s", "--max-wait", "1m"), "TIMEOUT", "time limit of 6s reached"),
    ("python3-slurm-idle", ("--time", "10m", "--idle-timeout", "3s"), "CANCELLED", "idle for 3 s"),
])
def test_gpu_kernel_past_its_time_limit_or_idle_is_stopped(server: Any, spec: str, limits: tuple[str, ...],
                                                           state: str, reason: str) -> None:
    """The kernel is shut down, its job ends with the reason, and its Slurm job and GPU go."""
    from test_provisioner import Kernels, install_spec, wait_until

    install_spec(server, spec, "--gpus", "1", *limits)
    k = Kernels(server)
    try:
        kernel = k.start_ok(spec)
        with server.client() as client:
            job = _kernel_job(client, spec)
            sid = slurm_id(client, job["id"])
            assert job["state"] == "RUNNING" and kernel in k.ids(), job
            wait_until(lambda: kernel not in k.ids(), 30, "kernel shut down")
            final = client.wait(job["id"], timeout=10)
            assert (final["state"], final["reason"]) == (state, reason), final
            wait_until(lambda: sid not in squeue("-o", "%i").split(), 15, "Slurm job ended")
            assert all(g["job_id"] != job["id"] for g in client.gpus())
    finally:
        k.close()


def test_a_restarted_engine_picks_up_its_slurm_jobs(server: Any) -> None:
    with server.client() as client:
        running = client.submit(["sh", "-c", "sleep 4; echo survived"], gpus=1, time_limit="5m")
        wait_state(client, running["id"], ("RUNNING",))
    server.kill()  # SIGKILL: Slurm keeps running the job
    server.start()
    with server.client() as client:
        pending = client.submit(["true"], gpus=1, time_limit="5m")
        done = client.wait(running["id"], timeout=30)
        assert client.wait(pending["id"], timeout=30)["state"] == "COMPLETED"
        log = client.log(running["id"])["data"]
    assert done["state"] == "COMPLETED" and "survived" in log, done


def test_time_limit_ends_the_job_as_timeout(server: Any, time_limit_job: dict[str, Any]) -> None:
    with server.client() as client:
        done = client.wait(time_limit_job["id"], timeout=150)
        events = client.events(time_limit_job["id"])
    assert done["state"] == "TIMEOUT", done
    assert "time limit" in done["reason"]
    assert 55 <= done["ended_at"] - done["started_at"] <= 130
    assert any(e["state"] == "WARNING" and "time limit in" in e["reason"] for e in events), events


def test_a_root_engine_refuses_jobs_it_would_run_as_root_instead_of_their_owner(slurm: SlurmCluster,
                                                                                   tmp_path: Path) -> None:
    """A Unix user's job on a root engine would run as root through sbatch: refused, naming why."""
    import pwd

    from servers import live_servers

    if os.geteuid() != 0:
        pytest.skip("needs a root engine")
    try:
        pwd.getpwnam("gpujobs-u1")
    except KeyError:
        pytest.skip("needs the test user gpujobs-u1 (scripts/install-multiuser.sh)")
    factory = live_servers(tmp_path)
    make = next(factory)
    try:
        server = make(config={"runner": "slurm"}, users={"tok-u1": "gpujobs-u1"},
                      extra_args=["--Slurm.poll_interval=0.25"])
        with server.client() as client:
            with pytest.raises(GPUJobsError) as refused:
                client.submit(["id", "-u"], gpus=1, cwd="/tmp")
            assert refused.value.status == 400 and refused.value.field == "user"
            assert "would run the job as root, not as gpujobs-u1" in refused.value.message
            assert client.jobs()["jobs"] == [], "nothing was queued"
    finally:
        next(factory, None)


def test_ignored_settings_are_logged_once(server: Any) -> None:
    text = server.server_log()
    assert text.count("these c.GPUJobs settings are ignored") == server.server_log().count("Serving notebooks from")
    assert "c.GPUJobs.backfill" in text and "c.GPUJobs.kill_grace" not in text


def test_switching_a_server_to_slurm_reports_its_local_runs_as_lost(slurm: SlurmCluster,
                                                                    tmp_path: Path) -> None:
    from servers import live_servers

    factory = live_servers(tmp_path)
    make = next(factory)
    try:
        server = make(fake_gpus="1xA100")  # the local runner
        with server.client() as client:
            running = client.submit(["sleep", "60"], gpus=1, time_limit="5m")
            waiting = client.submit(["true"], gpus=1, time_limit="5m")
            assert wait_state(client, running["id"], ("RUNNING",))["state"] == "RUNNING"
        server.kill()
        server.args.append("--GPUJobs.runner=slurm")
        server.start()
        with server.client() as client:
            lost = client.wait(running["id"], timeout=10)
            moved = client.wait(waiting["id"], timeout=30)  # still pending: handed to Slurm
            shown = server.cli("show", str(waiting["id"])).stdout
    finally:
        next(factory, None)
    assert lost["state"] == "LOST" and "started by the local runner" in lost["reason"], lost
    assert moved["state"] == "COMPLETED" and "submitted to Slurm as job" in shown
