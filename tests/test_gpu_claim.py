"""No GPU is handed out by two engines on one machine: an engine claims its GPUs machine-wide
(a lock per GPU UUID, dropped when its process dies); a second engine on the same GPUs
allocates nothing and says which engine owns them, until that one is gone."""

from __future__ import annotations

import json
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


def test_an_engine_that_is_not_root_claims_in_its_own_users_folder_and_says_so() -> None:
    """A root-owned claim dir is the root engine's: another user's engine neither writes there
    nor fails; it claims in its own folder (its Jupyter runtime dir) and says whom that keeps out."""
    import pwd

    import pytest

    user = "gpujobs-u1"
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        pytest.skip(f"no user {user}: run scripts/install-multiuser.sh")
    if os.geteuid() != 0:
        pytest.skip("needs root (to run a claim as another user)")
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="gpujobs-claims-", dir="/tmp"))  # the user reaches it (tmp_path: root's)
    os.chmod(base, 0o755)
    root_claims = base / "claims"
    root_claim = GPUClaim(["GPU-x"], root_claims, {})
    assert root_claim.acquire()  # root's: made root's 0755, a 0600 lock file
    runtime = base / "runtime"
    runtime.mkdir()
    os.chown(runtime, entry.pw_uid, entry.pw_gid)
    code = ("import json; from jupyter_gpujobs.engine.claim import GPUClaim; "
            f"c = GPUClaim(['GPU-y'], {str(root_claims)!r}, {{}}); "
            "print(json.dumps([c.acquire(), str(c.directory), c.scope]))")
    out = subprocess.run(["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--init-groups",
                          sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "HOME": str(runtime), "JUPYTER_RUNTIME_DIR": str(runtime),
                              "PYTHONPATH": str(Path(__file__).parent.parent)})
    assert out.returncode == 0, out.stderr
    held, directory, scope = json.loads(out.stdout)
    assert held and directory == str(runtime / "gpujobs-claims")
    assert "this user's engines only" in scope
    assert [p.name for p in root_claims.iterdir()] == [next(iter(root_claims.iterdir())).name]  # nothing added
    lock = next(iter(root_claims.iterdir())).stat()
    assert (lock.st_uid, lock.st_mode & 0o777) == (0, 0o600)
    root_claim.release()
    shutil.rmtree(base)
