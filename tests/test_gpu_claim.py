"""No GPU is handed out by two engines on one machine: an engine claims its GPUs machine-wide
(a lock per GPU UUID, dropped when its process dies); a second engine on the same GPUs
allocates nothing and says which engine owns them, until that one is gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from servers import LiveServer

from jupyter_gpujobs.engine.claim import GPUClaim
from jupyter_gpujobs.engine.gpus import FakeBackend
from jupyter_gpujobs.model import parse_fake_gpus


def test_fake_gpus_of_one_fleet_are_the_same_gpus() -> None:
    def uuids(fleet: str) -> list[str]:
        return [g.uuid for g in FakeBackend(parse_fake_gpus("2xA100"), fleet=fleet).inventory()]

    assert uuids("lab-a") == uuids("lab-a")
    assert not set(uuids("lab-a")) & set(uuids("lab-b"))


def test_a_claim_is_held_until_its_process_dies(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from jupyter_gpujobs.engine.claim import GPUClaim; "
         f"c = GPUClaim(['GPU-a', 'GPU-b'], {str(tmp_path)!r}, {{'data_dir': '/srv/first'}}); "
         "print(c.acquire(), flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)})
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "True"
        second = GPUClaim(["GPU-b", "GPU-c"], tmp_path, {"data_dir": "/srv/second"})
        assert not second.acquire() and not second.held
        assert second.other is not None and second.other["pid"] == holder.pid
        assert f"another engine (pid {holder.pid}, user root, data dir /srv/first)" in second.refusal()
        free = GPUClaim(["GPU-c"], tmp_path, {})
        assert free.acquire()  # a GPU nobody holds: no refusal
        free.release()
        holder.send_signal(signal.SIGKILL)  # however the first engine dies, its claim goes with it
        holder.wait()
        assert second.acquire() and second.held
        second.release()
    finally:
        holder.kill()
        holder.wait()


def test_a_second_embedded_engine_on_the_same_data_dir_starts_none_and_says_why(
        live_server: Any, tmp_path: Path) -> None:
    """Two Jupyter servers on one data dir (so one store and one fake fleet: the same GPUs), as
    when a user starts `jupyter lab` twice: one store has one engine (issue 32), so the second
    hosts none and names the first; once the first is gone, the next server runs the jobs."""
    def on_one_data_dir(status: int = 200) -> LiveServer:
        server: LiveServer = live_server(config={"claim_dir": tmp_path / "claims"}, start=False)
        server.args = [a for a in server.args if not a.startswith("--GPUJobs.state_dir=")]
        server.args.append(f"--GPUJobs.state_dir={tmp_path / 'gpujobs'}")
        return server.start(status=status)

    first = on_one_data_dir()
    second = on_one_data_dir(status=503)
    c1 = first.client()
    assert "notice" not in c1.whoami()
    assert first.proc is not None and f"pid {first.proc.pid} on host" in second.server_log()
    waiting = c1.submit("true", gpus=2, time_limit="1m")
    assert c1.wait(waiting["id"], timeout=30)["state"] == "COMPLETED"
    first.stop()
    second.stop()
    third = on_one_data_dir()
    c3 = third.client()
    assert c3.job(waiting["id"])["state"] == "COMPLETED"
    assert c3.wait(c3.submit("true", gpus=2, time_limit="1m")["id"], timeout=30)["state"] == "COMPLETED"
    assert "notice" not in c3.whoami()
