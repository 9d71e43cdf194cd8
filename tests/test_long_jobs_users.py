"""Checkpoint folders on a shared engine (issue 27, item 2): a job run as its Unix user gets a
folder of that user's own, made with the user's rights, and the root engine removes it with
the job's files after the retention as that user, never following a link a user planted."""

from __future__ import annotations

import os
import pwd
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from team import USER_PYTHON, USERS, Team, missing

pytestmark = pytest.mark.skipif(missing() is not None, reason=missing() or "")

U1 = USERS[0]


@pytest.fixture(scope="module")
def team() -> Iterator[Team]:
    with Team(fake_gpus="1xA100", users=(U1,), engine_args=[
            "--GPUJobs.job_retention=3s", "--GPUJobs.job_cleanup_interval=0.2"]) as t:
        yield t


def wait_gone(path: Path, team: Team, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while os.path.lexists(path):
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} is still there\n{team.logs()}")
        time.sleep(0.1)


def test_a_users_checkpoint_folder_is_theirs_and_goes_as_them(team: Team, tmp_path: Path) -> None:
    pw = pwd.getpwnam(U1)
    code = ("from jupyter_gpujobs import checkpoint; p = checkpoint.folder(); "
            "(p / 'state').write_text('1'); print(p, flush=True)")
    job = team.run_as(U1, "import json, subprocess; from jupyter_gpujobs.client import GPUJobsClient; "
                          f"print(json.dumps(GPUJobsClient().submit([{str(USER_PYTHON)!r}, '-c', {code!r}], "
                          "gpus=0, time_limit='1m')))")
    done = team.wait_state(job["id"], ("COMPLETED", "FAILED"))
    folder = Path(pw.pw_dir) / ".gpujobs" / "checkpoints" / f"job-{job['id']}"
    assert done["state"] == "COMPLETED", (done, team.logs())
    st = folder.stat()
    assert (st.st_uid, st.st_mode & 0o777) == (pw.pw_uid, 0o700)  # made by the job, as its user
    assert (folder / "state").stat().st_uid == pw.pw_uid

    # a second job whose folder the user swapped for a link to a folder of root's
    precious = tmp_path / "roots"
    precious.mkdir()
    (precious / "keep").write_text("root's")
    other = team.run_as(U1, "import json; from jupyter_gpujobs.client import GPUJobsClient; "
                            f"print(json.dumps(GPUJobsClient().submit([{str(USER_PYTHON)!r}, '-c', 'pass'], "
                            "gpus=0, time_limit='1m')))")
    team.wait_state(other["id"], ("COMPLETED",))
    planted = folder.parent / f"job-{other['id']}"
    team.run_as(U1, f"import os, json; os.symlink({str(precious)!r}, {str(planted)!r}); print(1)")

    wait_gone(folder, team)  # removed with the job's files after the retention
    wait_gone(planted, team)  # (the link alone: its target is not followed)
    assert (precious / "keep").read_text() == "root's"
    assert folder.parent.is_dir()
    shutil.rmtree(folder.parent, ignore_errors=True)
