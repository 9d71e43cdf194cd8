"""A job of the shared engine runs as its owner or not at all: an owner whose Unix account is
gone when the job starts (deleted while the job waited, or the directory service down) fails
the job naming the owner; the job never runs as the engine's user, root.

Tried as a real Unix user made for the test, against a real root engine (`jupyter gpujobs
engine` on its own socket), restarted after the account went so that nothing remembered of
it (the engine's lookups are kept a minute) decides where the job runs.
"""

from __future__ import annotations

import json
import pwd
import subprocess
from collections.abc import Iterator

import pytest
from team import USER_PYTHON, Team, as_user, missing

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(missing() is not None, reason=str(missing()))]
GONE = "gpujobs-gone"


def _remove_user() -> None:
    subprocess.run(["userdel", GONE], capture_output=True)


@pytest.fixture
def gone_user() -> Iterator[str]:
    """A Unix user of this machine for the test alone, removed at its end whatever happened."""
    _remove_user()  # (one a killed run left)
    subprocess.run(["useradd", "-M", "-d", "/nonexistent", "-s", "/bin/sh", GONE], check=True)
    try:
        yield GONE
    finally:
        _remove_user()


def test_a_job_whose_owner_is_gone_when_it_starts_fails_and_never_runs_as_root(gone_user: str) -> None:
    with Team(fake_gpus="1xA100", users=()) as team:
        body = json.dumps({"command": ["sh", "-c", "echo uid=$(id -u)"], "gpus": 0, "time_limit": "1m",
                           "cwd": "/", "hold": True})
        code = ("import json; from jupyter_gpujobs.client import GPUJobsClient as C; "
                f"print(C().submit(**json.loads({body!r}))['id'])")
        uid = pwd.getpwnam(gone_user).pw_uid
        done = subprocess.run(as_user(gone_user, [str(USER_PYTHON), "-c", code]), capture_output=True, text=True,
                              timeout=60, cwd="/", env={"PATH": "/usr/bin:/bin", "GPUJOBS_SOCKET": str(team.socket)})
        assert done.returncode == 0, done.stderr
        job_id = int(done.stdout.strip().splitlines()[-1])
        _remove_user()
        assert team.engine is not None
        team.engine.terminate()  # a new engine: its own look at who the owner is
        team.engine.wait(60)
        team.start_engine()
        with team.socket_client() as c:
            assert c.post(f"jobs/{job_id}/release").status_code == 200
        job = team.wait_state(job_id, ("COMPLETED", "FAILED"))
        with team.socket_client() as c:
            log = c.get(f"jobs/{job_id}/log").json().get("data", "")
        assert "uid=0" not in log, log
        assert job["state"] == "FAILED" and gone_user in job["reason"] and "not a Unix user" in job["reason"], (
            job, log)
        assert f"uid={uid}" not in log
