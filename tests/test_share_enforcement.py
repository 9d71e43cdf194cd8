"""Enforcement of GPU shares, on fake GPUs: a job over its memory share is warned and stopped
with the reason, one within it is not; share jobs get framework hints in their environment;
MIG instances of the fake spec are GPUs of their own, asked for by type and addressed by
their MIG UUID; `jupyter gpujobs gpus` shows who holds how much of each card and the
enforcement mode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest
from servers import wait_job, wait_until

from jupyter_gpujobs.engine.gpus import FakeBackend
from jupyter_gpujobs.engine.monitor.diagnosis import ProcessInfo
from jupyter_gpujobs.engine.monitor.shares import ShareWatcher
from jupyter_gpujobs.engine.runners.shim import visible_devices
from jupyter_gpujobs.engine.shares import Shares, over_share_reason, share_environment
from jupyter_gpujobs.model import GPU, InvalidInput, Job, JobState, gpu_matches_type, parse_fake_gpus

PY = sys.executable
GIB = 1 << 30
ALLOC = [PY, "-m", "jupyter_gpujobs.gpualloc"]
# short graces, a fast watcher
FAST = {"share_grace": 1, "sample_interval": 0.3, "kill_grace": 1}


# ---------------------------------------------------------------- the parts, without a server


def test_fake_spec_with_mig_instances() -> None:
    spec = parse_fake_gpus("1xH200-141GB[mig:1g.18gb*7],2xT4")
    assert spec[0].mig == ("1g.18gb",) * 7 and spec[1].mig == ()
    mixed = parse_fake_gpus("A100-80GB[mig:3g.40gb,2g.20gb,1g.10gb*2]")[0]
    assert mixed.mig == ("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb")
    for bad, says in (("H200-141GB[mig:1g.18gb*8]", "1 to 7"), ("A100-40GB[mig:3g.40gb*2]", "the card has 40 GB"),
                      ("H200[mig:4g.71gb*2]", "8 compute slices"), ("H200[nope]", "write e.g."),
                      ("H200[mig:big]", "cannot read the MIG profile 'big'")):
        with pytest.raises(InvalidInput, match="fake_gpus") as err:
            parse_fake_gpus(bad)
        assert says in str(err.value), (bad, str(err.value))


def test_mig_instances_are_gpus_of_their_own() -> None:
    backend = FakeBackend(parse_fake_gpus("1xH200-141GB[mig:1g.18gb*7],1xH200-141GB"), fleet="mig-test")
    gpus = backend.inventory()
    migs = gpus[:7]
    assert [g.index for g in gpus] == list(range(8))
    assert {g.name for g in migs} == {"H200 1g.18gb"} and all(g.memory_total_mb == 18 * 1024 for g in migs)
    assert all(g.uuid.startswith("MIG-") for g in migs) and len({g.uuid for g in migs}) == 7
    assert gpus[7].name == "H200-141GB" and gpus[7].uuid.startswith("GPU-")
    # a MIG instance is asked for by its profile; "H200" means a whole card
    assert [g.index for g in gpus if gpu_matches_type(g.name, "1g.18gb")] == list(range(7))
    assert [g.index for g in gpus if gpu_matches_type(g.name, "H200 1g.18gb")] == list(range(7))
    assert [g.index for g in gpus if gpu_matches_type(g.name, "H200")] == [7]
    # CUDA addresses a MIG instance by its UUID, a whole GPU by its index
    assert visible_devices([2, 7], [migs[2].uuid, gpus[7].uuid]) == f"{migs[2].uuid},7"


def test_fake_per_process_memory_from_gpualloc() -> None:
    """`python -m jupyter_gpujobs.gpualloc 3G` on a fake GPU: the backend reports 3 GiB for
    that process, as NVML reports a process's used memory."""
    backend = FakeBackend(parse_fake_gpus("1xA100-80GB[mig:3g.40gb],1xA100-80GB"), fleet="alloc-test")
    mig = backend.inventory()[0]
    env = {**os.environ, "GPUJOBS_FAKE": "1", "CUDA_VISIBLE_DEVICES": mig.uuid, "GPUJOBS_FAKE_FLEET": "alloc-test"}
    proc = subprocess.Popen([*ALLOC, "3G", "--seconds", "30"], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().startswith("gpualloc: holding 3.0 GiB")
        seen = wait_until(lambda: [p for p in backend.processes()[0] if p.pid == proc.pid], 5, "the process on GPU 0")
        assert seen[0].used_memory_mb == 3072
        assert proc.pid not in [p.pid for p in backend.processes()[1]]
        assert backend.inventory()[0].memory_used_mb >= 3072
    finally:
        proc.kill()
        proc.wait()
    bad = subprocess.run([*ALLOC, "lots"], env=env, capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "cannot read the size 'lots'" in bad.stderr


def test_share_environment_keeps_frameworks_inside() -> None:
    hints, facts = share_environment(20 * GIB, 80 * GIB, 0.25)
    assert hints == {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.25", "TF_FORCE_GPU_ALLOW_GROWTH": "true"}
    assert facts == {"GPUJOBS_GPU_MEMORY": str(20 * GIB), "GPUJOBS_GPU_MEMORY_FRACTION": "0.250",
                     "GPUJOBS_GPU_SHARE": "0.25"}
    hints, facts = share_environment(10 * GIB, 15 * GIB, None)  # an amount: 0.666.. of the card, rounded down
    assert hints["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.66" and facts["GPUJOBS_GPU_MEMORY_FRACTION"] == "0.666"
    assert "GPUJOBS_GPU_SHARE" not in facts
    assert over_share_reason(int(23.1 * GIB), 20 * GIB, 1) == "used 23.1 GB of its 20 GB share on GPU 1"


def test_watcher_stops_only_after_the_grace_and_forgives_a_job_back_inside() -> None:
    gpu = GPU(index=1, uuid="GPU-x", name="A100-80GB", memory_total_mb=80 * 1024)
    job = Job(id=7, user="ann", share=0.25, state=JobState.RUNNING, assigned_gpus=(1,))  # type: ignore[call-arg]
    whole = Job(id=8, user="bob", state=JobState.RUNNING, assigned_gpus=(1,))
    watcher = ShareWatcher(grace_s=10)

    def reading(mb: int) -> list[ProcessInfo]:
        return [ProcessInfo(pid=100, gpu_index=1, owner_job=7, used_memory_mb=mb // 2),
                ProcessInfo(pid=101, gpu_index=1, owner_job=7, used_memory_mb=mb - mb // 2),
                ProcessInfo(pid=200, gpu_index=1, owner_job=8, used_memory_mb=70_000)]

    assert watcher.check(0, [job, whole], {1: gpu}, reading(20 * 1024)) == []  # at its share: fine
    first = watcher.check(1, [job, whole], {1: gpu}, reading(23_655))
    assert [(o.job.id, o.stop) for o in first] == [(7, False)]
    assert first[0].reason == "used 23.1 GB of its 20 GB share on GPU 1"
    assert [o.stop for o in watcher.check(10.5, [job], {1: gpu}, reading(23_655))] == [False]
    assert watcher.check(11, [job], {1: gpu}, reading(10_000)) == []  # gave it back: grace starts afresh
    assert [o.stop for o in watcher.check(12, [job], {1: gpu}, reading(30_000))] == [False]
    assert [o.stop for o in watcher.check(22, [job], {1: gpu}, reading(30_000))] == [True]
    assert watcher.used_mb == {(7, 1): 30_000}


def test_enforcement_mode_line() -> None:
    assert Shares(grace_s=10).describe() == ("GPU shares: stopped by the engine when over their memory share "
                                             "for 10s (MPS off)")
    assert Shares(mps_wanted=True, backend="fake").mode() == "watcher"
    assert "MPS is not used on fake GPUs" in Shares(mps_wanted=True, backend="fake").describe()
    from jupyter_gpujobs.engine.runners.mps import MPSControl

    missing = Shares(mps_wanted=True, backend="nvml", mps=MPSControl("/nonexistent", "/nonexistent",
                                                                      binary="no-such-mps-control"))
    assert missing.mode() == "watcher"
    assert ("MPS asked for but no-such-mps-control is not found on the engine's PATH, so the watcher alone "
            "enforces them") in missing.describe()
    assert Shares(runner_schedules_itself=True).mode() == "off"


def test_mps_limits_of_a_share_job(tmp_path: Any) -> None:
    """What the driver is told for a 0.25 share of an 80 GB card under MPS; without the MPS
    binary no daemon is started and the job gets no MPS variables."""
    from pathlib import Path

    from jupyter_gpujobs.engine.runners.mps import MPSControl, mps_job_env

    env = mps_job_env(Path("/run/mps/GPU-1"), Path("/var/log/mps/GPU-1"), 20 * GIB, 0.25)
    assert env == {"CUDA_MPS_PIPE_DIRECTORY": "/run/mps/GPU-1", "CUDA_MPS_LOG_DIRECTORY": "/var/log/mps/GPU-1",
                   "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20480M", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"}
    missing = MPSControl(tmp_path / "pipe", tmp_path / "log", binary="no-such-mps-control")
    assert missing.ensure("GPU-1") is None and not (tmp_path / "pipe").exists()
    shares = Shares(mps_wanted=True, backend="nvml", mps=missing)
    job = Job(id=1, user="ann", share=0.25)  # type: ignore[call-arg]
    hints, facts = shares.environment(job, [GPU(index=0, uuid="GPU-1", name="A100", memory_total_mb=80 * 1024)])
    assert facts["GPUJOBS_GPU_MEMORY"] == str(20 * GIB) and not any(k.startswith("CUDA_MPS") for k in facts)


# ---------------------------------------------------------------- a real engine on fake GPUs


def _submit(client: Any, command: list[str], **body: Any) -> dict[str, Any]:
    return client.submit(command, time_limit="2m", **body)


def test_job_over_its_share_is_stopped_with_the_reason(live_server: Any) -> None:
    server = live_server(fake_gpus="2xA100-80GB", config=FAST)
    client = server.client()
    over = _submit(client, [*ALLOC, "23G"], gpus=0.25, name="greedy")
    within = _submit(client, [*ALLOC, "5G", "--seconds", "6"], gpus=0.25, name="modest")
    ended = wait_job(client, over["id"], ("FAILED", "COMPLETED", "CANCELLED", "TIMEOUT", "LOST"), 60)
    assert ended["state"] == "FAILED", ended
    assert ended["reason"] == f"used 23 GB of its 20 GB share on GPU {ended['assigned_gpus'][0]}", ended["reason"]
    events = client.events(over["id"])
    warned = [e for e in events if e["state"] == "WARNING" and "over its GPU share" in e["reason"]]
    assert warned and "stopped in 1s unless it gives the memory back" in warned[0]["reason"]
    # the job within its share runs to its end, unwarned
    done = wait_job(client, within["id"], ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "LOST"), 60)
    assert done["state"] == "COMPLETED", done
    assert not [e for e in client.events(within["id"]) if e["state"] == "WARNING"]


def test_share_job_environment_and_gpus_command(live_server: Any) -> None:
    server = live_server(fake_gpus="3xA100-80GB", config=FAST)
    client = server.client()
    go = server.root / "go"
    show_env = ("import json, os, time\n"
                "keys = ['GPUJOBS_GPU_MEMORY', 'GPUJOBS_GPU_MEMORY_FRACTION', 'GPUJOBS_GPU_SHARE',\n"
                "        'XLA_PYTHON_CLIENT_MEM_FRACTION', 'TF_FORCE_GPU_ALLOW_GROWTH', 'CUDA_MPS_PIPE_DIRECTORY']\n"
                "print(json.dumps({k: os.environ.get(k) for k in keys}), flush=True)\n"
                f"while not os.path.exists({str(go)!r}): time.sleep(0.05)\n")
    a = _submit(client, [PY, "-c", show_env], gpus=0.25, name="a")
    b = _submit(client, [PY, "-c", show_env], gpus=0.5, name="b", env={"TF_FORCE_GPU_ALLOW_GROWTH": "false"})
    whole = _submit(client, [PY, "-c", show_env], gpus=1, name="whole")
    for job in (a, b, whole):
        wait_job(client, job["id"], lambda j: j["state"] == "RUNNING" and client.log(j["id"])["data"], 30)
    env_a = json.loads(client.log(a["id"])["data"].splitlines()[0])
    assert env_a == {"GPUJOBS_GPU_MEMORY": str(20 * GIB), "GPUJOBS_GPU_MEMORY_FRACTION": "0.250",
                     "GPUJOBS_GPU_SHARE": "0.25", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.25",
                     "TF_FORCE_GPU_ALLOW_GROWTH": "true", "CUDA_MPS_PIPE_DIRECTORY": None}
    env_b = json.loads(client.log(b["id"])["data"].splitlines()[0])
    assert env_b["GPUJOBS_GPU_MEMORY"] == str(40 * GIB) and env_b["TF_FORCE_GPU_ALLOW_GROWTH"] == "false"
    env_whole = json.loads(client.log(whole["id"])["data"].splitlines()[0])
    assert set(env_whole.values()) == {None}  # a whole card: no share, no hints

    report = client.gpu_report()
    assert report["share_mode"] == "watcher"
    placed = {job["id"]: client.job(job["id"])["assigned_gpus"][0] for job in (a, b, whole)}
    cards = {g["index"]: g for g in report["gpus"]}
    assert [h["share"] for h in cards[placed[whole["id"]]]["holders"]] == [None]  # the whole card is its alone
    for job, share, gib in ((a, 0.25, 20), (b, 0.5, 40)):
        holder = next(h for h in cards[placed[job["id"]]]["holders"] if h["job_id"] == job["id"])
        assert holder["share"] == share and holder["memory_mb"] == gib * 1024
    # `jupyter gpujobs gpus`: who holds how much of each card, with what the watcher read (a fake
    # GPU process that declares nothing holds 500 MB), and the enforcement mode
    out = wait_until(lambda: (r := server.cli("gpus")).returncode == 0 and r.stdout.count("using") >= 2 and r.stdout,
                     30, "the watcher's readings in `jupyter gpujobs gpus`")
    lines = {int(x.split()[0]): x for x in out.splitlines() if x[:1].isdigit()}
    assert f"job {a['id']} (" in lines[placed[a["id"]]] and "0.25 = 20 GiB, using 0.5" in lines[placed[a["id"]]]
    assert f"job {b['id']} (" in lines[placed[b["id"]]] and "0.5 = 40 GiB, using 0.5" in lines[placed[b["id"]]]
    assert f"job {whole['id']} (" in lines[placed[whole["id"]]]
    if placed[a["id"]] == placed[b["id"]]:  # packed on one card
        assert "0.25 free" in lines[placed[a["id"]]]
    else:
        assert "0.75 free" in lines[placed[a["id"]]] and "0.5 free" in lines[placed[b["id"]]]
    assert "GPU shares: stopped by the engine when over their memory share for 1s (MPS off)" in out
    info = client.api("GET", "info")
    assert info["share_mode"] == "watcher" and info["share_enforcement"].startswith("GPU shares:")
    go.touch()
    for job in (a, b, whole):
        assert wait_job(client, job["id"], ("COMPLETED", "FAILED"), 30)["state"] == "COMPLETED"


def test_mig_instance_is_asked_for_by_type_and_addressed_by_uuid(live_server: Any) -> None:
    server = live_server(fake_gpus="1xH200-141GB[mig:1g.18gb*7],1xH200-141GB", config=FAST)
    client = server.client()
    gpus = client.gpu_report()["gpus"]
    migs = [g for g in gpus if g["mig"]]
    assert len(migs) == 7 and {g["name"] for g in migs} == {"H200 1g.18gb"}
    code = "import os; print(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['NVIDIA_VISIBLE_DEVICES'])"
    out = server.cli("submit", "--type", "1g.18gb", "--json", "--", PY, "-c", code)
    assert out.returncode == 0, out.stderr
    mig_job = wait_job(client, json.loads(out.stdout)["id"], ("COMPLETED", "FAILED"), 30)
    whole_job = wait_job(client, _submit(client, [PY, "-c", code], gpu_type="H200")["id"], ("COMPLETED", "FAILED"), 30)
    assert mig_job["state"] == whole_job["state"] == "COMPLETED"
    given = next(g for g in gpus if g["index"] == mig_job["assigned_gpus"][0])
    assert given["mig"] and client.log(mig_job["id"])["data"].split() == [given["uuid"], given["uuid"]]
    assert given["uuid"].startswith("MIG-")
    assert whole_job["assigned_gpus"] == [7] and client.log(whole_job["id"])["data"].split() == ["7", "7"]
    listing = server.cli("gpus").stdout
    assert listing.count("H200 1g.18gb") == 7 and "MIG: 7 instance(s), isolated by the hardware" in listing


def test_watcher_runs_with_monitoring_off(live_server: Any) -> None:
    """`c.GPUJobs.monitor = False` turns off samples and findings, not the enforcement of shares."""
    server = live_server(fake_gpus="1xT4", config={**FAST, "monitor": False})
    client = server.client()
    over = client.submit([*ALLOC, "6G"], gpu_memory="4G", time_limit="2m")
    ended = wait_job(client, over["id"], ("FAILED", "COMPLETED", "CANCELLED", "TIMEOUT", "LOST"), 60)
    assert (ended["state"], ended["reason"]) == ("FAILED", "used 6 GB of its 4 GB share on GPU 0")
    doctor = server.cli("doctor")
    assert "GPU shares" in doctor.stdout and "for 1s (MPS off)" in doctor.stdout, doctor.stdout


def test_jobs_sharing_a_card_are_not_rogues_to_each_other(live_server: Any) -> None:
    server = live_server(fake_gpus="1xA100-80GB", config=FAST)
    client = server.client()
    jobs = [client.submit([*ALLOC, "2G", "--seconds", "90"], gpus=share, time_limit="2m") for share in (0.25, 0.5)]
    for job in jobs:
        wait_job(client, job["id"], ("RUNNING",), 30)

    def both_read() -> bool:
        holders = client.gpu_report()["gpus"][0]["holders"]
        return len(holders) == 2 and all(h["used_mb"] == 2048 for h in holders)

    wait_until(both_read, 30, "the watcher's reading of both jobs on GPU 0")
    time.sleep(1.0)  # a few more monitor ticks
    rogues = client.api("GET", "findings", params={"kind": "rogue_process"})["findings"]
    assert rogues == [], rogues
    for job in jobs:
        client.cancel(job["id"])
