"""Long jobs keep their work (issue 27, items 1-3): a signal before the end (`signal:
"USR1@10s"`), the checkpoint helpers (jupyter_gpujobs.checkpoint), and requeue at a time
limit, on live servers with fake GPUs; bad values are refused naming the field."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from servers import wait_for, wait_job

from jupyter_gpujobs.client import GPUJobsClient
from jupyter_gpujobs.model import InvalidInput, Job, Policy, parse_warn_signal, preempt_grace

PY = sys.executable


@pytest.fixture
def gpujobs_config(tmp_path: Path) -> dict[str, Any]:
    """The in-process server's settings (its other tests need none): a short job retention."""
    return {"fake_gpus": "2xA100", "state_dir": str(tmp_path / "gpujobs-state"), "kill_grace": 1,
            "tick_interval": 0.5, "job_retention": "3s", "job_cleanup_interval": 0.2}

#: Saves at the signal; a requeued run finds what the first one saved.
TRAINER = """
import json, os, sys, time
from jupyter_gpujobs import checkpoint

state = checkpoint.folder() / "state.json"
if state.exists():
    print("found checkpoint", state.read_text(), "restarts", checkpoint.restarts(), flush=True)
    sys.exit(0)

def save():
    checkpoint.write_atomic(state, json.dumps({"step": 7, "signal_at": time.time(),
                                               "left": checkpoint.time_left()}).encode())
    print("saved at the signal", flush=True)

checkpoint.on_signal(save)
print("first run, signal", checkpoint.signal_name(), "before", checkpoint.signal_before(), flush=True)
while True:
    time.sleep(0.2)
"""


def test_signal_before_the_limit_saves_and_the_requeued_run_finds_it(live_server: Any) -> None:
    server = live_server(fake_gpus="1xA100", config={"kill_grace": 2})
    client = GPUJobsClient(url=server.url, token=server.token)
    job = client.submit([PY, "-c", TRAINER], gpus=1, time_limit=20, signal="USR1@10s", requeue=True,
                        name="trainer")
    assert job["warn_signal"] == "USR1@10" and job["max_requeues"] == 3 and job["requeue"] is True

    done = wait_job(client, job["id"], lambda j: j["state"] not in ("PENDING", "RUNNING"), timeout=90)
    assert done["state"] == "COMPLETED", done
    assert done["requeues"] == 1 and done["restarts"] == 1
    log = client.log(job["id"])["data"]
    assert "first run, signal USR1 before 10.0" in log and "saved at the signal" in log, log
    assert "found checkpoint" in log and "restarts 1" in log, log

    saved = json.loads(log.split("found checkpoint", 1)[1].split("restarts", 1)[0])
    events = client.events(job["id"])
    first_start = [e for e in events if e["state"] == "RUNNING"][0]["time"]
    limit_at = first_start + 20
    assert 8 <= limit_at - saved["signal_at"] <= 12, f"USR1 came {limit_at - saved['signal_at']:.1f}s before the limit"
    assert 8 <= saved["left"] <= 12, saved  # what time_left() said at the signal
    requeued = [e for e in events if e["state"] == "PENDING"][1]
    assert requeued["reason"].startswith("requeued (time limit of 20s reached): requeue 1 of at most 3"), requeued
    states = [e["state"] for e in events if e["state"] in ("PENDING", "RUNNING", "COMPLETED", "TIMEOUT")]
    assert states == ["PENDING", "RUNNING", "PENDING", "RUNNING", "COMPLETED"], states


FIRST_ONLY = """
import os, signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import signal, sys, time\\n"
    "signal.signal(signal.SIGUSR1, lambda *_: print('child got USR1', flush=True))\\n"
    "time.sleep(30)"])
signal.signal(signal.SIGUSR1, lambda *_: print('parent got USR1', flush=True))
time.sleep(30)
"""


def test_b_prefix_signals_the_first_process_only_and_no_requeue_without_asking(live_server: Any) -> None:
    server = live_server(fake_gpus="1xA100", config={"kill_grace": 1})
    client = GPUJobsClient(url=server.url, token=server.token)
    first = client.submit([PY, "-c", FIRST_ONLY], gpus=1, time_limit=6, signal="B:USR1@3s")
    whole = client.submit([PY, "-c", FIRST_ONLY], gpus=1, time_limit=6, signal="USR1@3s")
    for job_id in (first["id"], whole["id"]):
        done = wait_job(client, job_id, lambda j: j["state"] not in ("PENDING", "RUNNING"), timeout=60)
        assert done["state"] == "TIMEOUT" and done["requeues"] == 0 and done["max_requeues"] is None, done
    first_log, whole_log = client.log(first["id"])["data"], client.log(whole["id"])["data"]
    assert "parent got USR1" in first_log and "child got USR1" not in first_log, first_log
    assert "parent got USR1" in whole_log and "child got USR1" in whole_log, whole_log


def test_requeues_stop_at_the_maximum(live_server: Any) -> None:
    server = live_server(fake_gpus="1xA100", config={"kill_grace": 1, "max_requeues": 5})
    client = GPUJobsClient(url=server.url, token=server.token)
    job = client.submit([PY, "-c", "import time; time.sleep(30)"], gpus=1, time_limit=2, max_requeues=1)
    assert job["max_requeues"] == 1  # the job's own count over the server's 5
    done = wait_job(client, job["id"], lambda j: j["state"] not in ("PENDING", "RUNNING"), timeout=60)
    assert done["state"] == "TIMEOUT" and done["requeues"] == 1, done
    events = client.events(job["id"])
    assert [e["state"] for e in events if e["state"] in ("RUNNING", "TIMEOUT")] == ["RUNNING", "RUNNING", "TIMEOUT"]
    assert any("requeued 1 time(s), its maximum" in e["reason"] for e in events), events


def test_preempted_job_gets_its_signal_and_at_least_its_time(live_server: Any, tmp_path: Path) -> None:
    """A borrowed job asking for USR1@4s is preempted under a 1 s preemption grace: USR1 at
    once, SIGTERM 4 s later (not the 1 s the grace alone gives); a job asking for more than
    preempt_grace_max is told so in its events."""
    victim_code = """
import signal, sys, time
t0 = None
def usr1(*_):
    global t0
    t0 = time.time(); print('USR1', flush=True)
def term(*_):
    print('TERM after %.1f' % (time.time() - t0), flush=True); sys.exit(143)
signal.signal(signal.SIGUSR1, usr1)
signal.signal(signal.SIGTERM, term)
print('running', flush=True)
time.sleep(120)
"""
    server = live_server(fake_gpus="2xA100", config={
        "user_quotas": json.dumps({"alice": {"guaranteed_gpus": 2}}), "preempt_grace": 1,
        "preempt_grace_max": "6s", "kill_grace": 1, "preempt_min_runtime": 0},
        users={"tok-bob": "bob", "tok-alice": "alice"})
    alice = GPUJobsClient(url=server.url, token="tok-alice")
    bob = GPUJobsClient(url=server.url, token="tok-bob")
    asks = bob.submit([PY, "-c", victim_code], gpus=1, signal="USR1@4s", requeue=False, name="asks")
    greedy = bob.submit([PY, "-c", victim_code], gpus=1, signal="USR1@30s", requeue=False, name="greedy")
    for v in (asks, greedy):
        wait_job(bob, v["id"], lambda j: j["state"] == "RUNNING" and "running" in bob.log(j["id"])["data"])
    mine = alice.submit([PY, "-c", "pass"], gpus=2, name="guaranteed")
    for v in (asks, greedy):
        wait_job(bob, v["id"], ("CANCELLED",), timeout=60)
    # (the handlers read the clock when Python runs them, which a loaded machine may delay a
    # little for one signal and not the other: 0.5 s of slack, never a whole second)
    asks_log = bob.log(asks["id"])["data"]
    after = float(asks_log.split("TERM after ", 1)[1].split()[0])
    assert after >= 3.5, asks_log
    greedy_log = bob.log(greedy["id"])["data"]
    assert float(greedy_log.split("TERM after ", 1)[1].split()[0]) >= 4.5, greedy_log  # 6 s less the kill grace
    warned = [e["reason"] for e in bob.events(greedy["id"]) if e["state"] == "WARNING"]
    assert any("preempted with a shorter grace" in w and "preempt_grace_max" in w for w in warned), warned
    assert not [e for e in bob.events(asks["id"]) if e["state"] == "WARNING"]
    wait_job(alice, mine["id"], ("COMPLETED",), timeout=60)


BAD = [
    ({"signal": "USR1@banana"}, "signal", "cannot read duration"),
    ({"signal": "KILL@5"}, "signal", "unknown signal 'KILL'"),
    ({"signal": "USR1@30m", "time_limit": "20m"}, "signal", "ask for less than the limit"),
    ({"signal": 5}, "signal", "expected a signal"),
    ({"max_requeues": "many"}, "max_requeues", "whole number"),
    ({"max_requeues": 2, "requeue": False}, "max_requeues", "requeue: true"),
]


@pytest.mark.parametrize("extra,field,words", BAD, ids=[f"{b[1]}-{b[2].split()[0]}" for b in BAD])
async def test_bad_values_are_refused_naming_the_field(api: Any, extra: dict[str, Any], field: str,
                                                       words: str) -> None:
    got, reply = await api("POST", "jobs", {"command": ["python", "-c", "pass"], "gpus": 1, **extra})
    assert got == 400, reply
    assert reply["field"] == field and words in reply["message"], reply


def test_parse_and_grace() -> None:
    assert parse_warn_signal("b:sigusr2@1m").text() == "B:USR2@60"
    assert parse_warn_signal("USR1").before_s == 60  # Slurm's default
    with pytest.raises(InvalidInput):
        parse_warn_signal("USR1@", 100)
    policy = Policy(preempt_grace_s=30, preempt_grace_max_s=120, kill_grace_s=10)
    assert preempt_grace(Job(1, "a"), policy) == (30, "")
    assert preempt_grace(Job(1, "a", warn_signal="USR1@5"), policy) == (30, "")
    assert preempt_grace(Job(1, "a", warn_signal="USR1@60"), policy) == (70, "")
    grace, why = preempt_grace(Job(1, "a", warn_signal="USR1@600"), policy)
    assert grace == 120 and "preempt_grace_max" in why


def test_preempted_notebook_job_resumes_after_its_last_completed_cell(live_server: Any) -> None:
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    server = live_server(fake_gpus="1xA100", config={
        "user_quotas": json.dumps({"alice": {"guaranteed_gpus": 1}}), "preempt_grace": 2, "kill_grace": 1,
        "preempt_min_runtime": 0}, users={"tok-bob": "bob", "tok-alice": "alice"})
    alice = GPUJobsClient(url=server.url, token="tok-alice")
    bob = GPUJobsClient(url=server.url, token="tok-bob")
    cells = [
        new_code_cell("import os, time\nbase = 10\nprint('setup ran')", metadata={"tags": ["setup"]}),
        new_code_cell("print('cell A')"),
        new_code_cell("print('cell B')"),
        new_code_cell("print('long cell', flush=True)\n"
                      "time.sleep(120 if os.environ['GPUJOBS_RESTARTS'] == '0' else 0)"),
        new_code_cell("print('after', base)"),
    ]
    nbformat.write(new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                                      "language": "python"}}),
                   str(server.root / "long.ipynb"))
    job = bob.submit_notebook(str(server.root / "long.ipynb"), gpus=1, time_limit="10m")
    wait_job(bob, job["id"], lambda j: "long cell" in bob.log(j["id"])["data"], timeout=90)
    mine = alice.submit([PY, "-c", "pass"], gpus=1, name="guaranteed")
    done = wait_job(bob, job["id"], lambda j: j["state"] not in ("PENDING", "RUNNING"), timeout=120)
    assert done["state"] == "COMPLETED" and done["restarts"] == 1, done
    assert alice.job(mine["id"])["state"] == "COMPLETED"
    log = bob.log(job["id"])["data"]
    assert f"preempted by job {mine['id']}" in [e["reason"] for e in bob.events(job["id"])
                                                 if e["state"] == "PENDING"][1]
    assert "run 2 of this job resumes after cell 3/5, the last one completed" in log, log
    assert "(cells 1)" in log and log.count("setup ran") == 2, log
    assert log.count("cell A") == 1 and log.count("cell B") == 1 and log.count("long cell") == 2, log
    assert "after 10" in log, log
    nb = nbformat.read(str(server.root / done["output_notebook"]), as_version=4)
    texts = ["".join(o.get("text", "") for o in c.get("outputs", [])) for c in nb.cells]
    assert "cell A" in texts[1] and "cell B" in texts[2] and "after 10" in texts[4], texts


async def test_checkpoint_folder_is_the_jobs_own_and_goes_with_its_files(api: Any, engine: Any) -> None:
    code = ("from jupyter_gpujobs import checkpoint\n"
            "p = checkpoint.folder(); (p / 'state').write_text('1'); print(p, flush=True)")
    status, job = await api("POST", "jobs", {"command": [PY, "-c", code], "gpus": 0, "time_limit": "1m"})
    assert status == 201, job

    async def ended() -> Any:
        got, body = await api("GET", f"jobs/{job['id']}")
        return body if body["state"] not in ("PENDING", "RUNNING") else None

    done = await wait_for(ended, timeout=30)
    assert done["state"] == "COMPLETED", done
    folder = Path(engine.root_for(done["user"])) / ".gpujobs" / "checkpoints" / f"job-{job['id']}"
    _, log = await api("GET", f"jobs/{job['id']}/log")
    assert log["data"].strip() == str(folder)
    assert (folder / "state").read_text() == "1" and folder.stat().st_mode & 0o777 == 0o700
    await wait_for(lambda: not folder.exists(), timeout=20)  # removed with the job's files
    assert folder.parent.is_dir()  # only the job's own folder


def test_slurm_gets_the_signal_and_requeue_in_its_own_form(tmp_path: Path) -> None:
    from jupyter_gpujobs.engine.runners.slurm import SlurmRunner

    runner = SlurmRunner(tmp_path)
    args = runner.sbatch_args(Job(id=5, user="ann", time_limit_s=600, warn_signal="B:USR1@300", max_requeues=3))
    assert "--signal=B:USR1@300" in args and "--requeue" in args
    plain = runner.sbatch_args(Job(id=6, user="ann", time_limit_s=600))
    assert not any(a.startswith(("--signal", "--requeue")) for a in plain)


def test_gpujob_checkpoint_saves_at_the_signal_and_the_requeued_cell_starts_with_it(live_server: Any,
                                                                                     tmp_path: Path) -> None:
    from test_magics import Kernel

    server = live_server(fake_gpus="1xA100", config={"kill_grace": 1})
    kernel = Kernel(server, tmp_path)
    try:
        code = ("%%gpujob -t 8s --signal USR1@4s --checkpoint --pull step,runs\n"
                "import time\n"
                "runs = globals().get('runs', 0) + 1\n"
                "step = globals().get('step', 0)\n"
                "print('run', runs, 'from step', step, flush=True)\n"
                "while runs == 1:  # the first run works until its limit stops it\n"
                "    step += 1\n"
                "    time.sleep(0.05)\n"
                "step += 1000\n")
        result = kernel.execute(code, timeout=90)
        assert result["error"] is None, result
        assert kernel.value("runs") == "2"
        step = int(kernel.value("step"))
        assert step > 1000, step  # the requeued run started from the saved step, not 0
        with server.client() as client:
            job = client.jobs()["jobs"][0]
            log = client.log(job["id"])["data"]
        assert job["state"] == "COMPLETED" and job["requeues"] == 1, job
        assert "gpujobs: saved runs, step at SIGUSR1" in log, log
        assert "run 2 of this cell starts with the variables the run before saved at its signal: runs, step" in log
        assert f"run 2 from step {step - 1000}" in log and "run 1 from step 0" in log, log
    finally:
        kernel.close()


def test_kernelspec_and_cli_carry_the_signal() -> None:
    from jupyter_gpujobs.cli import _job_body, build_parser
    from jupyter_gpujobs.jupyter.kernelspec import build_spec

    wrapped = {"argv": ["python", "-m", "ipykernel_launcher", "-f", "{connection_file}"], "display_name": "Python 3"}
    spec = build_spec(wrapped, gpus=1, time_limit="4h", signal="USR1@10m")
    assert spec["metadata"]["kernel_provisioner"]["config"]["signal"] == "USR1@600"
    with pytest.raises(InvalidInput, match="ask for less than the limit"):
        build_spec(wrapped, gpus=1, time_limit="5m", signal="USR1@10m")
    args = build_parser().parse_args(["submit", "--signal", "B:USR1@5m", "--max-requeues", "2", "--requeue",
                                      "--", "python", "train.py"])
    body = _job_body(args)
    assert body["signal"] == "B:USR1@5m" and body["requeue"] is True and body["max_requeues"] == 2


def test_a_lost_run_is_requeued_with_its_checkpoint(live_server: Any) -> None:
    """Its supervisor killed (as a node or the machine failing would): the run is lost, and a
    job with requeue goes back to the queue and its next run finds what the first saved."""
    import os
    import signal as signals

    server = live_server(fake_gpus="1xA100", config={"kill_grace": 1})
    client = GPUJobsClient(url=server.url, token=server.token)
    code = ("import sys, time\nfrom jupyter_gpujobs import checkpoint\n"
            "state = checkpoint.folder() / 'state'\n"
            "if state.exists():\n    print('found', state.read_text(), flush=True); sys.exit(0)\n"
            "state.write_text('first run'); print('saved', flush=True); time.sleep(120)\n")
    job = client.submit([PY, "-c", code], gpus=1, time_limit="5m", requeue=True)
    wait_job(client, job["id"], lambda j: "saved" in client.log(j["id"])["data"])
    (state,) = list(Path(server.state_dir).rglob(f"job-{job['id']}-*/state.json"))
    os.kill(json.loads(state.read_text())["shim_pid"], signals.SIGKILL)
    done = wait_job(client, job["id"], lambda j: j["state"] not in ("PENDING", "RUNNING") or j["requeues"], timeout=60)
    assert done["requeues"] == 1, done
    done = wait_job(client, job["id"], lambda j: j["state"] not in ("PENDING", "RUNNING"), timeout=60)
    assert done["state"] == "COMPLETED", done
    assert "found first run" in client.log(job["id"])["data"]
    requeued = [e["reason"] for e in client.events(job["id"]) if e["state"] == "PENDING"][1]
    assert requeued.startswith("requeued (") and "requeue 1 of at most 3" in requeued, requeued


@pytest.fixture
def gpu_kernels() -> Iterator[Any]:
    """GPU kernels through a live server's REST API (test_provisioner's Kernels), closed after."""
    from test_provisioner import Kernels

    made: list[Any] = []
    yield lambda server: made.append(Kernels(server)) or made[-1]
    for k in made:
        k.close()


def test_a_gpu_kernelspecs_signal_reaches_the_kernel_before_its_limit(live_server: Any, gpu_kernels: Any,
                                                                      tmp_path: Path) -> None:
    """`kernelspec install --signal USR1@5s`: the kernel learns its signal (GPUJOBS_SIGNAL), and
    a handler it registered with jupyter_gpujobs.checkpoint runs about 5 s before its limit."""
    from servers import wait_until
    from test_provisioner import LEAN, install_spec, kernel_jobs

    server = live_server(fake_gpus="1xA100", start=False, extra_args=LEAN)
    install_spec(server, "gpu-signal", "--time", "20s", "--signal", "USR1@5s")
    server.start()
    client = server.client()
    k = gpu_kernels(server)
    kernel = k.start_ok("gpu-signal")
    marker = tmp_path / "signalled"
    k.run_cell(kernel, "import time\nfrom jupyter_gpujobs import checkpoint\n"
                       f"checkpoint.on_signal(lambda: open({str(marker)!r}, 'w').write(repr(time.time())))\n"
                       "print(checkpoint.signal_name(), checkpoint.signal_before())")
    job = kernel_jobs(client)[0]
    assert job["warn_signal"] == "USR1@5"
    wait_until(marker.exists, 30, "the kernel's handler ran")
    early = job["ends_at"] - float(marker.read_text())
    assert 3 <= early <= 7, f"USR1 came {early:.1f}s before the limit"
    assert kernel in k.ids(), "the kernel handled the signal and runs on to its limit"
