"""One shared engine for a team: a real `jupyter gpujobs engine` as root on fake GPUs, and a real
Jupyter server per Unix user (each running as its user) forwarding to it.

Who a caller is comes from the socket's peer credentials: through a user's server, from the
CLI, from a kernel, nothing a caller sends names anyone else. Another user's job shows only
its queue view. A burst of jobs from both users through every front end never puts one GPU
under two running jobs, and fair-share orders the users' jobs across both servers.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from team import ADMIN, USER_PYTHON, USERS, Team, evaluate, missing

from jupyter_gpujobs.engine.runners import LaunchRequest

pytestmark = [pytest.mark.skipif(missing() is not None, reason=str(missing())), pytest.mark.timeout(600)]
U1, U2 = USERS
RUNS_AS_OWNER = "run_as" in LaunchRequest.__dataclass_fields__
#: Python that makes `c`, an HTTP client on the engine's socket, as whoever runs it.
ON_SOCKET = ("import httpx, json; "
             "c = httpx.Client(transport=httpx.HTTPTransport(uds={sock!r}), base_url='http://x/gpujobs/api/'); ")
WHOAMI = "from jupyter_gpujobs.client import GPUJobsClient as C; import json; print(json.dumps(C().whoami()))"


@pytest.fixture(scope="module")
def team() -> Iterator[Team]:
    # priorities recalculated every half second (default 10 s), for fair-share to show on 1.5 s jobs
    with Team(fake_gpus="4xA100", engine_args=["--GPUJobs.estimate_interval=0.5"]) as t:
        yield t


# ------------------------------------------------------------------------------- identity


def test_every_caller_is_its_unix_user(team: Team) -> None:
    for user in USERS:
        assert team.servers[user].api("GET", "whoami").json() == {"user": user, "admin": False}
        assert team.run_as(user, WHOAMI) == {"user": user, "admin": False}  # the client on the socket
    assert team.run_as(ADMIN, WHOAMI) == {"user": ADMIN, "admin": True}  # a member of the admin group
    with team.socket_client() as c:
        assert c.get("whoami").json() == {"user": "root", "admin": True}
    # a process whose uid has no account on this machine is nobody: nothing answers it
    nobody = subprocess.run(
        ["setpriv", "--reuid=54321", "--regid=54321", "--clear-groups", str(USER_PYTHON), "-c",
         ON_SOCKET.format(sock=str(team.socket)) + "print(json.dumps([c.get(p).status_code for p in "
         "['whoami', 'jobs', 'queue', 'gpus']] + [c.post('jobs', json={'command': 'true', 'gpus': 0}).status_code]))"],
        capture_output=True, text=True, timeout=60, cwd="/", env={"PATH": "/usr/bin:/bin", "HOME": "/"})
    assert json.loads(nobody.stdout) == [403] * 5, nobody.stderr
    log = team.engine_log.read_text()
    assert "gpujobs shared engine: 4 GPU(s) via fake (A100), claimed" in log
    assert f"socket {team.socket}" in log


def test_doctor_says_which_engine_a_user_reaches(team: Team) -> None:
    out = team.cli(U2, "doctor").stdout
    engine = next(line for line in out.splitlines() if " engine " in line)
    assert engine.startswith("OK") and f"unix://{team.socket} (found from GPUJOBS_SOCKET), version " in engine, out
    assert engine.endswith(f"; you are {U2} (user)"), out


def test_no_header_name_or_token_makes_a_caller_someone_else(team: Team) -> None:
    s1, s2 = team.servers[U1], team.servers[U2]
    claims = {"X-Forwarded-User": U2, "X-Jupyterhub-User": U2, "Remote-User": U2, "X-Remote-User": U2,
              "X-Gpujobs-User": U2}
    # through the forwarded routes
    assert s1.api("GET", "whoami?user=" + U2, headers=claims).json()["user"] == U1
    r = s1.api("POST", "jobs", headers=claims, json={"command": "true", "gpus": 0})
    assert r.status_code == 201 and r.json()["user"] == U1
    r = s1.api("POST", "jobs", json={"command": "true", "gpus": 0, "user": U2})
    assert r.status_code == 400 and r.json()["field"] == "user"
    # another user's token is not accepted by this user's server
    assert s1.api("GET", "whoami", token=s2.token).status_code == 403
    # nothing but the gpujobs API is reachable through the forwarded routes
    r = s1.api("GET", "..%2F..%2Fapi%2Fstatus")
    assert r.status_code == 404
    # straight on the socket, as U1, claiming to be U2 in every way a client could
    code = (ON_SOCKET.format(sock=str(team.socket))
            + f"h = {{'X-Forwarded-User': {U2!r}, 'Authorization': 'token token-of-{U2}'}}; "
            + f"print(json.dumps([c.get('whoami?user={U2}', headers=h).json()['user'], "
            + "c.post('jobs', json={'command': 'true', 'gpus': 0}, headers=h).json()['user']]))")
    assert team.run_as(U1, code, GPUJOBS_USER=U2) == [U1, U1]


def test_jobs_and_kernels_carry_no_credential(team: Team) -> None:
    """A job and a kernel find the engine by its socket; no token that could act as anyone."""
    s1 = team.servers[U1]
    job = s1.api("POST", "jobs", json={"command": ["sh", "-c", "env"], "gpus": 0}).json()
    team.wait_state(job["id"], ("COMPLETED",))
    log = s1.api("GET", f"jobs/{job['id']}/log").json()["data"]
    assert f"GPUJOBS_URL=unix://{team.socket}" in log
    assert "GPUJOBS_TOKEN" not in log
    kc = s1.start_kernel()
    try:
        env = evaluate(kc, "import os, json; print(json.dumps([os.environ.get('GPUJOBS_URL'), "
                            "os.environ.get('GPUJOBS_TOKEN'), os.getuid()]))")
        assert env[0] == f"unix://{team.socket}" and env[1] is None and env[2] == _uid(U1)
        assert evaluate(kc, WHOAMI)["user"] == U1
    finally:
        s1.shutdown_kernel(kc)


def test_a_gpu_kernel_of_a_users_server_is_that_users_job(team: Team) -> None:
    """The kernel provisioner, in the user's server, queues the kernel on the shared engine."""
    r = team.cli(U2, "kernelspec", "install", "--name", "gpu-test", "--user", "-g", "1", "-t", "10m")
    assert r.returncode == 0, r.stderr
    s2 = team.servers[U2]
    kc = s2.start_kernel("gpu-test")
    try:
        env = evaluate(kc, "import os, json; print(json.dumps([os.environ.get('GPUJOBS_JOB_ID'), "
                            "os.environ.get('CUDA_VISIBLE_DEVICES'), os.getuid(), os.environ.get('GPUJOBS_FAKE_FLEET')]))")
        assert env[0] and env[1] and env[2] == _uid(U2)
        # on the engine's fake GPUs alone: not a stranger's process on every fake GPU N of the machine
        with team.socket_client() as c:
            assert env[3] == c.get("info").json()["fake_fleet"]
        job = s2.api("GET", f"jobs/{env[0]}").json()
        assert job["kind"] == "kernel" and job["user"] == U2 and job["state"] == "RUNNING"
        other = team.servers[U1].api("GET", f"jobs/{env[0]}").json()
        assert other["private"] is True and other["user"] == U2
    finally:
        s2.shutdown_kernel(kc)
    team.wait_state(int(env[0]), ("COMPLETED", "CANCELLED"))  # shutting the kernel down frees its GPU


@pytest.mark.skipif(not RUNS_AS_OWNER, reason="jobs do not run as their owners yet (runner has no run_as)")
def test_a_job_submitted_from_a_job_belongs_to_the_same_user(team: Team) -> None:
    code = ("from jupyter_gpujobs.client import GPUJobsClient as C; c = C(); "
            "print(c.whoami()['user'], c.submit('true', gpus=0)['user'])")
    s1 = team.servers[U1]
    job = s1.api("POST", "jobs", json={"command": [str(USER_PYTHON), "-c", code], "gpus": 0,
                                       "env": {"GPUJOBS_USER": U2, "GPUJOBS_TOKEN": "token-of-" + U2}}).json()
    team.wait_state(job["id"], ("COMPLETED", "FAILED"))
    assert s1.api("GET", f"jobs/{job['id']}/log").json()["data"].split() == [U1, U1]


# ------------------------------------------------------------------------------- private data

PRIVATE = ("name", "command", "cwd", "payload")


def test_another_users_job_shows_only_its_queue_view(team: Team) -> None:
    s1, s2 = team.servers[U1], team.servers[U2]
    secret = {"name": "secret-name", "command": ["sleep", "60"], "gpus": 1, "env": {"API_KEY": "s3cret"}}
    job = s1.api("POST", "jobs", json=secret).json()
    jid = job["id"]
    team.wait_state(jid, ("RUNNING",))
    with team.socket_client() as root:
        paths = [f"jobs/{jid}", f"jobs/{jid}/log", f"jobs/{jid}/events", f"jobs/{jid}/stats"]
        code = (ON_SOCKET.format(sock=str(team.socket))
                + f"print(json.dumps({{p: [c.get(p).status_code, c.get(p).json()] for p in {paths!r}}}))")
        as_other_on_socket = team.run_as(U2, code)
        admin_on_socket = team.run_as(ADMIN, code)

        def through(server: Any, token: str | None = None) -> dict[str, list[Any]]:
            out = {}
            for p in (f"jobs/{jid}", f"jobs/{jid}/log", f"jobs/{jid}/events", f"jobs/{jid}/stats"):
                r = server.api("GET", p, token=token)
                out[p] = [r.status_code, r.json() if r.headers.get("Content-Type", "").startswith("application/json")
                          else None]
            return out

        owner, other, unauth = through(s1), through(s2), through(s1, token="")
        root_view = {p: [r.status_code, r.json()] for p in owner for r in [root.get(p)]}

        for who, seen in (("owner", owner), ("admin", admin_on_socket), ("root", root_view)):
            assert all(status == 200 for status, _ in seen.values()), (who, seen)
            assert seen[f"jobs/{jid}"][1]["name"] == "secret-name" and seen[f"jobs/{jid}"][1]["command"] == ["sleep", "60"]
        for who, seen in (("other via server", other), ("other on socket", as_other_on_socket)):
            view = seen[f"jobs/{jid}"][1]
            assert seen[f"jobs/{jid}"][0] == 200 and view["private"] is True, who
            assert all(view[k] is None for k in PRIVATE), (who, view)
            assert view["user"] == U1 and view["state"] == "RUNNING" and view["gpus"] == 1 and view["assigned_gpus"]
            for p in (f"jobs/{jid}/log", f"jobs/{jid}/events", f"jobs/{jid}/stats"):
                assert seen[p][0] == 403, (who, p, seen[p])
                assert "private" in seen[p][1]["message"]
        assert all(status == 403 for status, _ in unauth.values()), unauth

        # lists: the whole queue, others' jobs as queue views
        listed = {j["id"]: j for j in s2.api("GET", "jobs?state=RUNNING").json()["jobs"]}
        assert listed[jid]["command"] is None and listed[jid]["private"] is True
        assert {j["id"]: j for j in s1.api("GET", "jobs?state=RUNNING").json()["jobs"]}[jid]["command"] == ["sleep", "60"]
        waiting = [s1.api("POST", "jobs", json={"command": ["sleep", "60"], "gpus": 4, "name": "big"}).json()["id"]]
        team.wait_state(waiting[0], ("PENDING",))
        queued = {j["id"]: j for j in s2.api("GET", "queue").json()["jobs"]}
        assert queued[waiting[0]]["position"] == 1 and queued[waiting[0]]["reason"]
        assert queued[waiting[0]]["name"] is None and queued[waiting[0]]["user"] == U1

        # commands on another's job: refused; admins may
        assert s2.api("DELETE", f"jobs/{waiting[0]}").status_code == 403
        assert s2.api("POST", f"jobs/{jid}/end", json={"state": "COMPLETED"}).status_code == 403
        assert s2.api("GET", f"quota?user={U1}").status_code == 403
        assert s2.api("PUT", "quota", json={"scope": "users", "name": U2, "quota": None}).status_code == 403
        assert s2.api("POST", "gpus/drain", json={"gpu": 0, "draining": True}).status_code == 403
        assert s1.api("DELETE", f"jobs/{waiting[0]}", token="").status_code == 403
        assert root.put("quota", json={"scope": "users", "name": U2, "quota": None}).status_code == 200
        assert root.delete(f"jobs/{waiting[0]}").status_code == 200

        # the websocket: the owner sees everything, the other user the queue view, nobody else anything
        seen_by = asyncio.run(_events_of(team, jid))
        assert seen_by["owner"]["command"] == ["sleep", "60"] and seen_by["owner"]["name"] == "secret-name"
        assert seen_by["other"]["private"] is True and seen_by["other"]["command"] is None
        assert seen_by["other"]["state"] == "CANCELLED" and seen_by["other"]["user"] == U1
        assert seen_by["unauthenticated"] == 403
        assert root.delete(f"jobs/{jid}").status_code == 200


async def _events_of(team: Team, jid: int) -> dict[str, Any]:
    """What the owner's and the other user's event websockets show of job `jid` when it is
    cancelled, and what an unauthenticated websocket gets."""
    from tornado.httpclient import HTTPClientError, HTTPRequest
    from tornado.websocket import websocket_connect

    async def connect(server: Any, token: str) -> Any:
        url = f"ws://127.0.0.1:{server.port}/gpujobs/api/events"
        return await websocket_connect(HTTPRequest(url, headers={"Authorization": f"token {token}"} if token else {}))

    s1, s2 = team.servers[U1], team.servers[U2]
    owner, other = await connect(s1, s1.token), await connect(s2, s2.token)
    out: dict[str, Any] = {}
    try:
        await connect(s1, "")
    except HTTPClientError as err:
        out["unauthenticated"] = err.code
    await asyncio.sleep(0.3)
    async with httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=str(team.socket))) as c:
        await c.delete(f"http://x/gpujobs/api/jobs/{jid}")

    async def job_message(ws: Any) -> dict[str, Any]:
        while True:
            msg = json.loads(await ws.read_message())
            if msg["type"] == "job" and msg["job"]["id"] == jid and msg["job"]["state"] == "CANCELLED":
                return msg["job"]

    out["owner"] = await asyncio.wait_for(job_message(owner), 20)
    out["other"] = await asyncio.wait_for(job_message(other), 20)
    owner.close()
    other.close()
    return out


# ------------------------------------------------------------------------------- the burst


class GPUWatch(threading.Thread):
    """Polls, until stopped, the running jobs the engine reports and the job processes on the
    machine (their GPUJOBS_GPU_UUIDS); records any GPU under two jobs at once."""

    def __init__(self, team: Team):
        super().__init__(daemon=True)
        self.team = team
        self.stop = threading.Event()
        self.violations: list[str] = []
        self.uids: dict[str, set[int]] = {}  # job id -> uids its processes ran as
        self.polls = 0
        with team.socket_client() as c:
            self.uuids = {g["uuid"] for g in c.get("gpus").json()["gpus"]}

    def run(self) -> None:
        with self.team.socket_client() as c:
            while not self.stop.is_set():
                holders: dict[int, int] = {}
                for job in c.get("jobs", params={"state": "RUNNING", "limit": 1000}).json()["jobs"]:
                    for g in job["assigned_gpus"]:
                        if g in holders:
                            self.violations.append(f"engine: GPU {g} under jobs {holders[g]} and {job['id']}")
                        holders[g] = job["id"]
                by_uuid: dict[str, str] = {}
                for job_id, uuids, uid in _job_processes(self.uuids):
                    self.uids.setdefault(job_id, set()).add(uid)
                    for u in uuids:
                        if by_uuid.setdefault(u, job_id) != job_id:
                            self.violations.append(f"processes: {u} used by jobs {by_uuid[u]} and {job_id}")
                self.polls += 1
                time.sleep(0.05)


def _job_processes(uuids: set[str]) -> Iterator[tuple[str, list[str], int]]:
    """(job id, GPU UUIDs, uid) of every process of a job on these GPUs."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            raw = Path(f"/proc/{pid}/environ").read_bytes()
            uid = os.stat(f"/proc/{pid}").st_uid
        except OSError:
            continue
        env = dict(item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
        job, used = env.get(b"GPUJOBS_JOB_ID"), env.get(b"GPUJOBS_GPU_UUIDS")
        if job and used:
            mine = [u for u in used.decode().split(",") if u in uuids]
            if mine:
                yield job.decode(), mine, uid


def test_a_burst_from_both_users_never_shares_a_gpu_and_is_fair(team: Team) -> None:
    s1, s2 = team.servers[U1], team.servers[U2]
    with team.socket_client() as c:  # the GPUs are free (earlier tests' jobs have ended)
        deadline = time.monotonic() + 30
        while any(g["job_id"] for g in c.get("gpus").json()["gpus"]) and time.monotonic() < deadline:
            time.sleep(0.1)
    watch = GPUWatch(team)
    watch.start()
    kernels = {u: team.servers[u].start_kernel() for u in USERS}
    ids: dict[str, list[int]] = {U1: [], U2: []}
    try:
        # fair-share across the two servers: while an admin's job holds every GPU, U1 queues 8
        # jobs, then U2 4; once the GPUs free, U1's first jobs run and U2's go ahead of U1's rest
        go = team.base / "go"
        with team.socket_client() as c:  # working in the team's folder under /tmp, it keeps the machine's /tmp
            blocker = c.post("jobs", json={"command": ["sh", "-c", f"while [ ! -e {go} ]; do sleep 0.05; done"],
                                           "gpus": 4, "cwd": str(team.base)}).json()["id"]
        team.wait_state(blocker, ("RUNNING",))
        for _ in range(8):
            ids[U1].append(s1.api("POST", "jobs", json={"command": ["sleep", "1.5"], "gpus": 1}).json()["id"])
        for _ in range(4):
            ids[U2].append(s2.api("POST", "jobs", json={"command": ["sleep", "1.5"], "gpus": 1}).json()["id"])
        go.touch()
        fair = {u: list(v) for u, v in ids.items()}
        fair_jobs = {jid: team.wait_state(jid, ("COMPLETED",), timeout=60) for u in USERS for jid in fair[u]}
        # then everything at once: the CLI, REST with 2 GPUs, and %%gpujob cells in each user's kernel
        cells = {}
        for user, kc in kernels.items():
            kc.execute("%load_ext jupyter_gpujobs", silent=True)
            code = "%%gpujob -g 1 -t 1m\nimport os, time\ntime.sleep(0.3)\nprint('cell', os.environ['CUDA_VISIBLE_DEVICES'])\n"
            cells[user] = [kc.execute(code), kc.execute(code)]
        for user in USERS:
            r = team.cli(user, "submit", "-g", "1", "-t", "1m", "--array", "0-7", "--json", "--", "sleep", "0.2")
            assert r.returncode == 0, r.stderr
            ids[user] += json.loads(r.stdout)["array_tasks"]
            for _ in range(4):
                job = team.servers[user].api("POST", "jobs", json={"command": ["sleep", "0.3"], "gpus": 2}).json()
                ids[user].append(job["id"])
        for user, kc in kernels.items():
            for msg_id in cells[user]:
                reply = _reply(kc, msg_id, timeout=120)
                assert reply["status"] == "ok", reply
        jobs = {jid: team.wait_state(jid, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "LOST"), timeout=180)
                for user in USERS for jid in ids[user]}
    finally:
        watch.stop.set()
        watch.join(10)
        for user, kc in kernels.items():
            team.servers[user].shutdown_kernel(kc)
    with team.socket_client() as c:
        cell_jobs = [j for j in c.get("jobs", params={"kind": "cell", "limit": 1000}).json()["jobs"]]
    assert sorted(j["user"] for j in cell_jobs if j["state"] == "COMPLETED") == [U1, U1, U2, U2]
    total = len(jobs) + len(cell_jobs)
    assert total >= 40
    assert all(j["state"] == "COMPLETED" for j in jobs.values()), [j for j in jobs.values() if j["state"] != "COMPLETED"]
    for user in USERS:
        assert {jobs[jid]["user"] for jid in ids[user]} == {user}
    assert watch.polls > 20 and not watch.violations, watch.violations[:5]
    # each job's processes ran as its owner (and none as root or the other user)
    owner_uid = {str(jid): _uid(jobs[jid]["user"]) for jid in jobs}
    seen = {jid: uids for jid, uids in watch.uids.items() if jid in owner_uid}
    assert len(seen) >= 10, watch.uids
    assert all(uids == {owner_uid[jid]} for jid, uids in seen.items()), seen
    # fair-share: U2's jobs, queued after all of U1's, start before U1's second half
    u1_late = sorted(fair_jobs[j]["started_at"] for j in fair[U1])[4:]
    u2_starts = [fair_jobs[j]["started_at"] for j in fair[U2]]
    assert max(u2_starts) <= min(u1_late) + 0.05, (u2_starts, u1_late)


def _reply(kc: Any, msg_id: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            msg = kc.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError("no reply from the kernel") from None
        if msg["parent_header"].get("msg_id") == msg_id:
            return msg["content"]


def _uid(user: str) -> int:
    import pwd

    return pwd.getpwnam(user).pw_uid
