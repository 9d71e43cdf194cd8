"""What one user of a machine can reach of the shared engine and of another user's jobs, tried
as real Unix users against a real root engine (`jupyter gpujobs engine` on its own socket,
state dir and claim dir; issue 34, part 1):

- the state dir and the database are root's alone, and an install left open (0755 / 0644 by
  an older version) is repaired at start, with a log line;
- the GPU claims: a user who planted lock files (world-writable, with a spoofed holder, held
  locked) before the engine started neither blocks nor names the holder; the claim files
  are root's 0600 in a root 0755 folder, which no user can write or open;
- a variable of the engine's environment (a fake secret) is not in a job's;
- a job holds no fd of its supervisor's, no capability and only its owner's groups, and can
  neither leave its cgroups, raise its limits there nor make a cgroup of its own;
- two users' jobs do not see each other's /tmp or /dev/shm, and a job's /tmp goes with it;
- a job writing far past the log cap leaves a log of bounded size: its head, its newest
  output and a line saying what was cut;
- `jupyter gpujobs doctor` says whether /proc hides other users' processes (hidepid);
- a job that leaves its /tmp deeper than Python's recursion limit still ends as it ended, and
  that /tmp goes with it; the retention removes such a run directory too, following no link;
- a link a user put in the MPS log folder (open to all) is not written through by the root
  MPS control daemon.
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from team import REPO, USER_PYTHON, USERS, Team, as_user, missing

from jupyter_gpujobs.doctor import OK, WARN, Context, check_hidepid, proc_mount_options
from jupyter_gpujobs.engine import retention
from jupyter_gpujobs.engine.gpus import FakeBackend
from jupyter_gpujobs.engine.runners.jobtmp import remove_tree
from jupyter_gpujobs.engine.runners.mps import MPSControl
from jupyter_gpujobs.engine.store import Store
from jupyter_gpujobs.model import parse_fake_gpus

pytestmark = pytest.mark.timeout(300)
needs_team = pytest.mark.skipif(missing() is not None, reason=str(missing()))
U1, U2 = USERS
SECRET_NAME = "SMTP_PASSWORD_OF_THE_ENGINE"
LOG_CAP = 65536
#: as a user: hold an exclusive lock on each named file (made world-writable, naming a spoofed
#: holder) in a folder, print "held", and wait
PLANT = """
import fcntl, json, os, sys, time
folder, names = sys.argv[1], sys.argv[2:]
fds = []
for name in names:
    fd = os.open(os.path.join(folder, name), os.O_RDWR | os.O_CREAT, 0o666)
    os.fchmod(fd, 0o666)
    os.write(fd, json.dumps({"pid": 1, "user": "root", "data_dir": "/spoofed"}).encode())
    fcntl.flock(fd, fcntl.LOCK_EX)
    fds.append(fd)
print("held", flush=True)
time.sleep(600)
"""


class PlantedTeam(Team):
    """A root engine (no user servers) started on a state dir and a claim dir that an older
    version left open and a user got into first."""

    planter: subprocess.Popen[str] | None = None

    def start_engine(self) -> None:
        state = self.base / "engine"
        state.mkdir(mode=0o755)
        os.chmod(state, 0o755)
        old_umask = os.umask(0o022)
        try:
            store = Store(f"sqlite:///{state / 'gpujobs.sqlite'}")
            store.migrate()  # an older version's database: 0644
            store.close()
        finally:
            os.umask(old_umask)
        claims = self.base / "claims"
        claims.mkdir()
        os.chmod(claims, 0o1777)  # as older versions made it
        fleet = hashlib.sha1(str(state.resolve()).encode()).hexdigest()[:12]
        uuids = [g.uuid for g in FakeBackend(parse_fake_gpus(self.fake_gpus), fleet=fleet).inventory()]
        names = [hashlib.sha1(u.encode()).hexdigest()[:20] + ".lock" for u in uuids]
        self.planter = subprocess.Popen(as_user(U1, [str(USER_PYTHON), "-c", PLANT, str(claims), *names]),
                                        stdout=subprocess.PIPE, text=True, start_new_session=True)
        assert self.planter.stdout is not None and self.planter.stdout.readline().strip() == "held"
        super().start_engine()
        deadline = time.monotonic() + 60
        while "gpujobs shared engine:" not in self.engine_log.read_text(errors="replace"):
            assert time.monotonic() < deadline, self.engine_log.read_text()[-3000:]
            time.sleep(0.1)

    def __exit__(self, *exc: object) -> None:
        if self.planter is not None:
            self.planter.kill()
            self.planter.wait()
        super().__exit__(*exc)


@pytest.fixture(scope="module")
def team() -> Iterator[PlantedTeam]:
    os.environ[SECRET_NAME] = "hunter2-of-the-engine"  # the engine inherits it, as an SMTP password would come
    try:
        with PlantedTeam(fake_gpus="2xA100", users=(),
                         engine_args=[f"--GPUJobs.log_max_bytes={LOG_CAP}"]) as t:
            yield t
    finally:
        os.environ.pop(SECRET_NAME, None)


def submit(team: Team, user: str, script: str, **options: Any) -> int:
    """A job of `user` running `sh -c script` in their home (not under /tmp), through the socket."""
    home = pwd.getpwnam(user).pw_dir
    body = json.dumps({"command": ["sh", "-c", script], "gpus": 0, "time_limit": "2m", "cwd": home, **options})
    code = ("import json; from jupyter_gpujobs.client import GPUJobsClient as C; "
            f"print(json.dumps(C().submit(**json.loads({body!r}))['id']))")
    return int(team.run_as(user, code))


def log_of(team: Team, job_id: int) -> bytes:
    return (team.base / "engine" / "logs" / f"job-{job_id}.log").read_bytes()


def wait_log(team: Team, job_id: int, text: bytes, timeout: float = 60) -> bytes:
    deadline = time.monotonic() + timeout
    while True:
        try:
            data = log_of(team, job_id)
        except FileNotFoundError:
            data = b""
        if text in data:
            return data
        assert time.monotonic() < deadline, f"{text!r} not in the log of job {job_id}: {data[-500:]!r}"
        time.sleep(0.1)


def can_open(team: Team, user: str, path: Path, mode: str) -> str:
    """What `user` gets opening `path` ("ok" or the error's name)."""
    code = (f"import json\ntry:\n    open({str(path)!r}, {mode!r}).close(); print(json.dumps('ok'))\n"
            "except OSError as e:\n    print(json.dumps(type(e).__name__))")
    return str(team.run_as(user, code))


@needs_team
def test_state_dir_and_store_are_private_and_an_old_install_is_repaired(team: PlantedTeam) -> None:
    state = team.base / "engine"
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    files = [p for p in state.iterdir() if p.name.startswith("gpujobs.sqlite")]
    assert files, list(state.iterdir())
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert can_open(team, U2, state / "gpujobs.sqlite", "rb") == "PermissionError"
    log = team.engine_log.read_text()
    assert f"the state dir {state} (was 0755) was readable by other users" in log, log[-3000:]
    assert f"{state / 'gpujobs.sqlite'} (was 0644) was readable by other users" in log


@needs_team
def test_claims_cannot_be_taken_spoofed_or_blocked_by_a_user(team: PlantedTeam) -> None:
    log = team.engine_log.read_text()
    assert "NOT claimed" not in log and "/spoofed" not in log, log[-3000:]
    with team.socket_client() as c:
        assert "notice" not in c.get("whoami").json()
    job = team.wait_state(submit(team, U2, "true", gpus=1), ("COMPLETED", "FAILED"))
    assert job["state"] == "COMPLETED", job
    claims = team.base / "claims"
    st = claims.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o755)
    locks = list(claims.iterdir())
    assert len(locks) == 2
    for lock in locks:
        lst = lock.stat()
        assert (lst.st_uid, stat.S_IMODE(lst.st_mode)) == (0, 0o600), lock
        assert can_open(team, U1, lock, "rb") == "PermissionError"  # no fd: nothing to flock
        assert team.engine is not None and json.loads(lock.read_text())["pid"] == team.engine.pid
    assert can_open(team, U1, claims / "planted.lock", "wb") == "PermissionError"


@needs_team
def test_a_job_gets_no_variable_of_the_engine_environment(team: PlantedTeam) -> None:
    job_id = submit(team, U1, "env; echo END", env={"MY_OWN": "kept"})
    assert team.wait_state(job_id, ("COMPLETED", "FAILED"))["state"] == "COMPLETED"
    env = log_of(team, job_id).decode()
    assert "END" in env
    assert SECRET_NAME not in env and "hunter2" not in env, env
    assert "MY_OWN=kept" in env and "PATH=" in env and f"HOME={pwd.getpwnam(U1).pw_dir}" in env


#: as a job: what it holds (its shell's open fds, capabilities, groups) and whether it can
#: leave its cgroups, raise its limits or make a cgroup of its own
INHERITS = r"""
python3 -c '
import os
def is_open(fd):
    try:
        return bool(os.fstat(fd))
    except OSError:
        return False
print("fds:", *[fd for fd in range(1024) if is_open(fd)])'  # (no listing: it would open one)
grep -E '^Cap(Prm|Eff|Amb):' /proc/$$/status
echo "groups: $(id -G)"
before=$(cat /proc/$$/cgroup)
for top in /sys/fs/cgroup/unified /sys/fs/cgroup /sys/fs/cgroup/memory /sys/fs/cgroup/devices /sys/fs/cgroup/freezer; do
  [ -e $top/cgroup.procs ] && { echo $$ > $top/cgroup.procs && echo "LEFT via $top"; }
done
while IFS=: read -r _ ctl path; do
  for dir in /sys/fs/cgroup/unified$path /sys/fs/cgroup/$ctl$path; do
    for set in memory.max=max memory.limit_in_bytes=-1 devices.allow=a; do
      (echo "${set#*=}" > "$dir/${set%%=*}") 2>&1 && echo "RAISED $dir/${set%%=*}"
    done
    mkdir "$dir/mine" && echo "MADE $dir/mine"
  done
done < /proc/$$/cgroup
[ "$before" = "$(cat /proc/$$/cgroup)" ] && echo "cgroups kept"
echo END
"""


@needs_team
def test_a_job_holds_no_fd_capability_or_group_of_the_engine_and_cannot_leave_its_cgroups(
        team: PlantedTeam) -> None:
    job_id = submit(team, U1, INHERITS, gpus=1, mem="256M")
    job = team.wait_state(job_id, ("COMPLETED", "FAILED"))
    out = log_of(team, job_id).decode()
    assert job["state"] == "COMPLETED" and "END" in out, (job, out)
    assert "fds: 0 1 2\n" in out, out  # nothing of its supervisor's (the log pipe, the runner's pipes)
    for cap in ("CapPrm", "CapEff", "CapAmb"):
        assert f"{cap}:\t0000000000000000" in out, out
    entry = pwd.getpwnam(U1)
    assert f"groups: {' '.join(str(g) for g in os.getgrouplist(U1, entry.pw_gid))}\n" in out, out
    assert "LEFT" not in out and "RAISED" not in out and "MADE" not in out, out
    assert "cgroups kept" in out, out
    assert "memory.limit_in_bytes: Permission denied" in out or "memory.max: Permission denied" in out, out


@needs_team
def test_jobs_of_two_users_do_not_share_tmp_or_shm(team: PlantedTeam) -> None:
    first = submit(team, U1, "echo u1 > /tmp/left-by-u1 && echo u1 > /dev/shm/left-by-u1 && echo written "
                             "&& sleep 100")
    wait_log(team, first, b"written")
    second = submit(team, U2, "ls -a /tmp /dev/shm; echo LISTED")
    assert team.wait_state(second, ("COMPLETED", "FAILED"))["state"] == "COMPLETED"
    listing = log_of(team, second).decode()
    assert "LISTED" in listing and "left-by-u1" not in listing, listing
    assert not Path("/tmp/left-by-u1").exists() and not Path("/dev/shm/left-by-u1").exists()
    job_tmps = list((team.base / "engine" / "run").glob(f"job-{first}-*/tmp"))
    assert len(job_tmps) == 1 and (job_tmps[0] / "left-by-u1").exists()  # where the job's /tmp is
    with team.socket_client() as c:
        c.delete(f"jobs/{first}")
    team.wait_state(first, ("CANCELLED",))
    deadline = time.monotonic() + 30
    while job_tmps[0].exists():  # the supervisor removes it once the job's processes are gone
        assert time.monotonic() < deadline, "the job's /tmp was not removed"
        time.sleep(0.1)
    with team.socket_client() as c:
        assert "private /tmp and /dev/shm per job" in c.get("gpus").json().get("isolation", "")


@needs_team
def test_a_log_past_its_cap_keeps_head_and_tail(team: PlantedTeam) -> None:
    lines = 100_000  # about 6 MB
    job_id = submit(team, U1, f"seq -f 'line %07g {'x' * 48}' 1 {lines}")
    assert team.wait_state(job_id, ("COMPLETED", "FAILED"))["state"] == "COMPLETED"
    data = log_of(team, job_id)
    assert len(data) <= LOG_CAP, len(data)
    text = data.decode()
    assert text.startswith("line 0000001 ")
    assert text.endswith(f"line {lines:07d} {'x' * 48}\n")
    assert "bytes of output cut here" in text
    cut = int(text.split("[gpujobs: ")[1].split(" bytes")[0])
    written = lines * len(f"line 0000001 {'x' * 48}\n")
    kept = len(data) - len(text.split("[gpujobs: ")[1].split("]\n")[0]) - len("\n[gpujobs: ]\n")
    assert cut + kept == written, (cut, kept, written)


def test_doctor_reads_hidepid_from_the_proc_mount(tmp_path: Path) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text("sysfs /sys sysfs rw 0 0\nproc /proc proc rw,nosuid,relatime 0 0\n"
                      "proc /proc proc rw,relatime,hidepid=invisible,gid=27 0 0\n")
    assert proc_mount_options(str(mounts)) == {"rw": "", "relatime": "", "hidepid": "invisible", "gid": "27"}
    mounts.write_text("proc /proc proc rw,nosuid,relatime 0 0\n")
    assert "hidepid" not in (proc_mount_options(str(mounts)) or {})
    # this machine's own /proc: the row says what is in force, a warning only against a shared engine
    on_host = (proc_mount_options() or {}).get("hidepid", "0")
    rows = check_hidepid(Context(url=None, token=None))
    assert len(rows) == 1 and rows[0].status == OK
    assert (f"hidepid={on_host}" if on_host not in ("0", "off") else "without hidepid") in rows[0].found

    class Shared:
        url = "unix:///run/jupyter-gpujobs/engine.sock"

    shared = check_hidepid(Context(url=None, token=None, client=Shared()))  # type: ignore[arg-type]
    if "without hidepid" in shared[0].found:
        assert shared[0].status == WARN and "hidepid=invisible" in shared[0].todo


@needs_team
def test_an_embedded_engine_gives_a_job_run_as_another_user_neither_its_env_nor_its_token(
        live_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A root Jupyter server hosting the engine, with named users who are Unix users: their jobs
    run as them and get nothing of the server's environment, its token least of all."""
    monkeypatch.setenv(SECRET_NAME, "hunter2-of-the-server")
    server = live_server(fake_gpus="2xA100", users={"tok-u1": U1, "tok-u2": U2})
    from jupyter_gpujobs.client import GPUJobsClient

    u1 = GPUJobsClient(url=server.url, token="tok-u1")
    job = u1.submit(["sh", "-c", "env; echo END"], gpus=0, cwd=pwd.getpwnam(U1).pw_dir, time_limit="1m")
    deadline = time.monotonic() + 60
    while (done := u1.job(job["id"]))["state"] not in ("COMPLETED", "FAILED"):
        assert time.monotonic() < deadline, done
        time.sleep(0.1)
    env = u1.log(job["id"])["data"]
    assert done["state"] == "COMPLETED" and "END" in env, (done["reason"], env)
    assert f"USER={U1}" in env and f"GPUJOBS_URL={server.url}" in env
    assert "hunter2" not in env and "GPUJOBS_TOKEN=" not in env and "test-token-" not in env, env


@needs_team
def test_doctor_as_a_user_of_the_shared_engine_reports_private_tmp_and_hidepid(team: PlantedTeam) -> None:
    code = ("import json; from dataclasses import asdict; from jupyter_gpujobs.doctor import run_checks; "
            "print(json.dumps([asdict(r) for r in run_checks()]))")
    rows = {r["name"]: r for r in team.run_as(U2, code, timeout=120, PYTHONPATH=str(REPO))}  # this checkout's doctor
    assert "private /tmp and /dev/shm per job" in rows["isolation"]["found"] and rows["isolation"]["status"] == OK
    hidden = (proc_mount_options() or {}).get("hidepid", "0") in ("1", "2", "4", "noaccess", "invisible", "ptraceable")
    assert rows["/proc"]["status"] == (OK if hidden else WARN), rows["/proc"]


#: a folder tree deeper than Python's recursion limit (1000 frames), made by a shell loop
DEEP = 1500


@needs_team
def test_a_job_whose_tmp_is_deeper_than_the_recursion_limit_ends_as_it_did_and_its_tmp_goes(
        team: PlantedTeam) -> None:
    job_id = submit(team, U1, f"cd /tmp && i=0; while [ $i -lt {DEEP} ]; do mkdir d && cd d || exit 1; "
                              "i=$((i+1)); done; echo depth $i")
    job = team.wait_state(job_id, ("COMPLETED", "FAILED"))
    assert f"depth {DEEP}".encode() in log_of(team, job_id)
    assert (job["state"], job["reason"]) == ("COMPLETED", "completed"), job  # not "supervisor error"
    assert not list((team.base / "engine" / "run").glob(f"job-{job_id}-*/tmp"))  # removed before the result


def test_the_retention_removes_a_run_dir_of_any_depth_and_follows_no_link(tmp_path: Path) -> None:
    run_root, outside = tmp_path / "run", tmp_path / "outside"
    outside.mkdir()
    (outside / "kept").write_text("not the run's")
    job_dir = run_root / "job-7-abc1"
    (job_dir / "tmp").mkdir(parents=True)
    (job_dir / "result.json").write_text("{}")
    (job_dir / "tmp" / "to-outside").symlink_to(outside)
    fd = os.open(job_dir / "tmp", os.O_RDONLY)
    for _ in range(DEEP):
        os.mkdir("d", dir_fd=fd)
        os.symlink(str(outside), "link", dir_fd=fd)
        below = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = below
    os.close(fd)
    try:
        removed = retention.remove({7: retention.JobFiles(run_dirs=[job_dir])}, run_root, None)
        assert (removed.jobs, removed.run_dirs) == ([7], 1)
        assert not job_dir.exists() and (outside / "kept").read_text() == "not the run's"
    finally:
        remove_tree(str(job_dir))  # (pytest's own clean-up of tmp_path recurses: it would fail on it)


#: a stand-in for nvidia-cuda-mps-control -d (not on this machine): it appends to its log, as
#: the real daemon does, and makes its control pipe
FAKE_MPS_CONTROL = """#!/bin/sh
echo "daemon started" >> "$CUDA_MPS_LOG_DIRECTORY/control.log"
touch "$CUDA_MPS_PIPE_DIRECTORY/control"
"""


@needs_team
def test_root_mps_daemon_does_not_write_through_a_link_a_user_put_in_its_log_folder() -> None:
    base = Path(tempfile.mkdtemp(prefix="gpujobs-mps-", dir="/tmp"))
    try:
        base.chmod(0o755)
        fake = base / "fake-mps-control"
        fake.write_text(FAKE_MPS_CONTROL)
        fake.chmod(0o755)
        victim = base / "roots-file"
        victim.write_text("root's own\n")
        mps = MPSControl(base / "pipe", base / "log", binary=str(fake))
        _pipe, logs = mps.dirs("GPU-1")
        logs.mkdir(parents=True)  # the folder as the engine opens it to all, before its daemon starts
        logs.chmod(0o1777)
        logs.parent.chmod(0o755)
        planted = logs / "control.log"
        subprocess.run(as_user(U1, ["ln", "-s", str(victim), str(planted)]), check=True)
        assert planted.is_symlink()
        assert mps.ensure("GPU-1") is not None, mps.failed
        assert victim.read_text() == "root's own\n"
        st = os.lstat(planted)
        assert stat.S_ISREG(st.st_mode) and st.st_uid == 0 and planted.read_text() == "daemon started\n"
        assert stat.S_IMODE(logs.stat().st_mode) == 0o1777
    finally:
        shutil.rmtree(base, ignore_errors=True)
