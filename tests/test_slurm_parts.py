"""The Slurm runner's pure parts: runner choice by name, Slurm's words and numbers read."""

from __future__ import annotations

import pytest
from traitlets import TraitError

from jupyter_gpujobs.config import GPUJobs
from jupyter_gpujobs.engine.runners import LaunchRequest, make_runner, runner_names
from jupyter_gpujobs.engine.runners.slurm import (
    SlurmError,
    SlurmRunner,
    _gpu_indices,
    _in_task_string,
    _node_gpus,
    pending_reason,
)


def test_runners_are_chosen_by_name(tmp_path) -> None:
    assert {"local", "slurm"} <= set(runner_names())
    assert isinstance(make_runner("slurm", tmp_path), SlurmRunner)
    with pytest.raises(ValueError, match="no runner named 'pbs'; there are .*local.*slurm"):
        make_runner("pbs", tmp_path)
    with pytest.raises(TraitError, match="c.GPUJobs.runner: no runner named 'slrum'"):
        GPUJobs(runner="slrum")


@pytest.mark.parametrize("code, words", [
    ("Resources", "waiting for resources"), ("Dependency", "held by dependency"),
    ("QOSMaxGRESPerUser", "over the QOS GPU limit (QOSMaxGRESPerUser)"),
    ("AssocGrpGRES", "over the account's GPU limit"), ("BeginTime", "waiting for its begin time"),
    ("SomethingNew", "held by Slurm: SomethingNew"),
])
def test_pending_reasons_in_words(code: str, words: str) -> None:
    assert words in pending_reason(code)


def test_gpu_indices_and_array_tasks_and_node_gres() -> None:
    assert _gpu_indices(["gpu:a100:2(IDX:0-1)", "gpu:1(IDX:3)"]) == (0, 1, 3)
    assert _gpu_indices(["gpu:a100:0(IDX:N/A)"]) == ()
    assert _in_task_string(3, "2-3%2") and not _in_task_string(1, "2-3%2") and _in_task_string(4, "1,4,7-9")
    assert _node_gpus("gpu:a100:4,gpu:t4:2(S:0)") == [("a100", 4), ("t4", 2)]
    assert _node_gpus("gpu:2") == [("gpu", 2)]


def test_sbatch_options_of_a_job(tmp_path) -> None:
    from jupyter_gpujobs.engine.runners.slurm import Slurm
    from jupyter_gpujobs.model import Job

    runner = SlurmRunner(tmp_path, Slurm(partition="gpu", partitions={"urgent": "fast"}, qos={"low": "scavenger"},
                                         nodes=2, ntasks=8, extra_args=["--mem=1G"]))
    args = runner.sbatch_args(Job(id=5, user="ann", gpus=2, gpu_type="A100", time_limit_s=90, priority="low",
                                  requeue=False, mem_bytes=3 << 30, cpus=1.5), dependency="afterok:17")
    for expected in ("--mem=3072M", "--cpus-per-task=2", "--gres=gpu:a100:2", "--time=2", "--dependency=afterok:17", "--partition=gpu",
                     "--qos=scavenger", "--nodes=2", "--ntasks=8", "--no-requeue", "--mem=1G"):
        assert expected in args
    urgent = runner.sbatch_args(Job(id=6, user="ann", gpus=0, priority="urgent"))
    assert "--partition=fast" in urgent and not any(a.startswith("--gres") for a in urgent)


def test_a_failure_reads_as_under_the_local_runner(tmp_path) -> None:
    """Slurm's wait status of a failed job becomes the same reason the local runner gives."""
    runner = SlurmRunner(tmp_path)
    assert runner._exit(1, "11", "FAILED", "", 3 << 8, 0.0).reason == "failed (exit code 3)"
    killed = runner._exit(2, "12", "FAILED", "", 11, 0.0)
    assert (killed.outcome, killed.signal, killed.reason) == ("failed", 11, "killed by signal SIGSEGV")


def test_a_job_to_run_as_another_user_is_never_handed_to_sbatch(tmp_path) -> None:
    """sbatch would run it as the engine's user (root on a shared engine): refused before it."""
    from jupyter_gpujobs.model import Job

    runner = SlurmRunner(tmp_path)
    assert runner.runs_as_owner is False
    req = LaunchRequest(job_id=1, command=["id", "-u"], cwd=str(tmp_path), env={}, gpu_indices=[], gpu_uuids=[],
                        time_limit_s=60, grace_s=1, log_path=str(tmp_path / "job-1.log"), run_as="alice")
    with pytest.raises(SlurmError, match="cannot run jobs as alice"):
        runner.submit([Job(id=1, user="alice", command=["id", "-u"], gpus=0, time_limit_s=60)], [req])
    assert not list(tmp_path.glob("*.sh")), "no batch script was written for it"
