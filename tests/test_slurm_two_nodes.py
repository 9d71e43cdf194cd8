"""A real Slurm test cluster of two nodes on one host (issue 30, multi-node jobs): two slurmd
(`-N n1`, `-N n2`), each with its own port, spool, pid and log file (`%n`), and 2 fake GPUs
each. Measured here: Debian's Slurm build runs several slurmd on one host, and a job asking
for `-N 2 --gres=gpu:1` gets both nodes, one GPU on each, with its own CUDA_VISIBLE_DEVICES
on each (the ground the engine's `nodes` per job stands on).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from servers import free_port
from slurm_cluster import SlurmCluster, slurm_installed

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(not slurm_installed(), reason="Slurm and munge are not installed "
                                 "(scripts/install-slurm.sh)")]

NODES = ("n1", "n2")


class TwoNodeCluster(SlurmCluster):
    """SlurmCluster with nodes n1 and n2 on loopback, each its own slurmd."""

    node_names = NODES

    def _write_config(self) -> None:
        super()._write_config()
        r = self.root
        conf = self.conf.read_text()
        node_line = next(line for line in conf.splitlines() if line.startswith("NodeName=localhost"))
        nodes = "\n".join(node_line.replace("NodeName=localhost", f"NodeName={n} NodeHostname=localhost")
                          + f" Port={free_port()}" for n in NODES)
        conf = (conf.replace(node_line, nodes).replace("Nodes=localhost", "Nodes=" + ",".join(NODES))
                .replace(f"SlurmdPidFile={r / 'slurmd.pid'}", f"SlurmdPidFile={r}/slurmd-%n.pid")
                .replace(f"SlurmdSpoolDir={r / 'spool'}", f"SlurmdSpoolDir={r}/spool-%n")
                .replace(f"SlurmdLogFile={r / 'log' / 'slurmd.log'}", f"SlurmdLogFile={r}/log/slurmd-%n.log"))
        self.conf.write_text(conf)
        for n in NODES:
            (r / f"spool-{n}").mkdir(exist_ok=True)
        gres = (r / "gres.conf").read_text()
        (r / "gres.conf").write_text("".join(gres.replace("NodeName=localhost", f"NodeName={n}") for n in NODES))

    def _ready(self) -> bool:
        if not self._node_idle():
            return False
        r = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True,
                           env={**os.environ, **self.env()})
        return {line.split()[0] for line in r.stdout.splitlines() if "idle" in line} == set(NODES)  # (per partition)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[TwoNodeCluster]:
    c = TwoNodeCluster(tmp_path / "slurm", gpus=2).start()
    try:
        yield c
    finally:
        c.stop()


def test_a_two_node_job_gets_both_nodes_and_a_gpu_on_each(cluster: TwoNodeCluster, tmp_path: Path) -> None:
    env = {**os.environ, **cluster.env()}
    out = tmp_path / "out.txt"
    script = 'srun sh -c \'echo "$SLURMD_NODENAME gpus=$CUDA_VISIBLE_DEVICES"\''
    r = subprocess.run(["sbatch", "--parsable", "-N", "2", "--gres=gpu:1", "-o", str(out), "--wrap", script],
                       capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 60
    while True:
        show = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, env=env).stdout
        if "JobState=COMPLETED" in show or time.monotonic() > deadline:
            break
        assert "JobState=FAILED" not in show, show + cluster.logs()[-2000:]
        time.sleep(0.2)
    assert "JobState=COMPLETED" in show, show
    assert "NodeList=n[1-2]" in show and "NumNodes=2" in show, show
    lines = sorted(out.read_text().split("\n"))
    assert [line for line in lines if line] == ["n1 gpus=0", "n2 gpus=0"], out.read_text()


def test_a_job_with_nodes_runs_on_both_nodes_through_the_engine(cluster: TwoNodeCluster, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """`nodes: 2` through the REST API and `-N 2` through the CLI reach sbatch as --nodes=2 with
    the GPUs per node; the job shows the nodes it got."""
    from servers import live_servers, wait_job

    monkeypatch.setenv("SLURM_CONF", cluster.env()["SLURM_CONF"])  # the server's Slurm commands
    (tmp_path / "live").mkdir()
    factory = live_servers(tmp_path / "live")
    server = next(factory)(config={"runner": "slurm"}, extra_args=["--Slurm.poll_interval=0.25"])
    try:
        with server.client() as client:
            go = tmp_path / "go"
            script = (f'srun sh -c \'echo "on $SLURMD_NODENAME gpus=$CUDA_VISIBLE_DEVICES"\'; '
                      f'while [ ! -e {go} ]; do sleep 0.1; done')
            job = client.submit(["sh", "-c", script], gpus=1, nodes=2, name="two-nodes")
            assert job["nodes"] == 2
            wait_job(client, job["id"], ("RUNNING",), timeout=60)
            time.sleep(2.5)  # Slurm's times are whole seconds: a run that ends at once bills 0 GPU-hours
            go.touch()
            done = wait_job(client, job["id"], ("COMPLETED", "FAILED"), timeout=60)
            assert done["state"] == "COMPLETED", done
            assert done["host"] == "n[1-2]", done
            reasons = [e["reason"] for e in client.events(job["id"]) if e["state"] == "RUNNING"]
            assert any(r.startswith("started by Slurm on n1, GPU 0; n2, GPU 0") for r in reasons), reasons
            # its GPUs on both nodes count: the export's GPU-hours are the usage report's
            until = time.time()
            report = client.accounting(since=done["submitted_at"] - 1, until=until)
            rec = next(r for r in report["records"] if r["job_id"] == job["id"])
            assert rec["nodes"] == 2 and rec["gpu_hours"] > 0, rec
            usage = client._call("GET", "usage", params={"since": done["submitted_at"] - 1, "until": until})
            assert report["total_gpu_hours"] == pytest.approx(usage["total_gpu_hours"], abs=1e-3)
            run_s = done["ended_at"] - done["started_at"]
            assert rec["gpu_hours"] == pytest.approx(2 * run_s / 3600, rel=0.05, abs=1e-4)  # two GPUs, one a node
            log = client.log(job["id"])["data"]
            assert sorted(line for line in log.splitlines() if line.startswith("on ")) == ["on n1 gpus=0",
                                                                                           "on n2 gpus=0"], log
        out = server.cli("submit", "-N", "2", "-g", "1", "--name", "cli-two", "hostname")
        assert out.returncode == 0, out.stderr
        slurm_job = subprocess.run(["squeue", "-h", "-t", "all", "-n", "cli-two", "-o", "%D"], capture_output=True,
                                   text=True, env={**os.environ, **cluster.env()})
        assert slurm_job.stdout.split()[:1] in (["2"], []), slurm_job.stdout  # (ended jobs may be gone)
    finally:
        next(factory, None)


def test_the_local_runner_refuses_a_multi_node_job_naming_the_field(live_server: object) -> None:
    from jupyter_gpujobs.client import GPUJobsError

    server = live_server()  # type: ignore[operator]
    with server.client() as client:
        with pytest.raises(GPUJobsError) as err:
            client.submit("true", gpus=1, nodes=2)
        assert (err.value.status, err.value.field) == (400, "nodes")
        assert "need the Slurm runner" in str(err.value)
        with pytest.raises(GPUJobsError) as err:
            client.submit("true", gpus=1, nodes="two")
        assert (err.value.status, err.value.field) == (400, "nodes")
        assert client.submit("true", gpus=1, nodes=1)["nodes"] == 1
