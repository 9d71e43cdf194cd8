"""Trust between users of one shared engine (issue 34, part 2), as real Unix users against a
real root engine (`tests/team.py`):

- a job's working folder is looked at as its user: a link into another user's private folder
  gets the answer of a missing folder; `~` is the submitting user's home, never root's;
- a notebook job's notebook is looked at as its user, off the engine's loop, bounded in time
  and size: a huge sparse file, a FIFO, a device, a file only root may read, a file swapped
  for a FIFO while it is checked: each gets its answer at once, the same answer whatever root
  could read, and the engine answers everyone else meanwhile;
- who may use each priority class is policy (403 naming the class), shown in `quota`;
- one user may queue only so much (a cap on waiting jobs, one on an array's tasks);
- another user's failed job shows nothing of what it ran, in any field or event;
- users' webhooks reach only public addresses unless an admin allows more.

The rules' pure parts (tiers, caps, addresses) are tested here without an engine as well.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from team import ADMIN, REPO, USERS, Team, UserServer, missing

from jupyter_gpujobs.model import (
    InvalidInput,
    may_use_priority,
    parse_priority_tiers,
    pending_cap_refusal,
    priorities_for,
)

U1, U2 = USERS
NEEDS_TEAM = pytest.mark.skipif(missing() is not None, reason=str(missing()))
NOTEBOOK = json.dumps({"cells": [{"cell_type": "code", "source": "print(1)", "metadata": {}, "outputs": [],
                                  "execution_count": None}],
                       "metadata": {}, "nbformat": 4, "nbformat_minor": 5})
#: the caps and tiers of the team's engine
MAX_PENDING, MAX_TASKS = 4, 3


# ------------------------------------------------------------------------------ pure rules


def test_priority_tiers_name_users_groups_or_everyone() -> None:
    tiers = parse_priority_tiers({"urgent": [], "high": ["alice", "@ml"], "LOW": "*"})
    assert tiers == {"urgent": (), "high": ("alice", "@ml"), "low": ("*",)}
    in_ml = {"carol"}
    for user, expected in [("alice", ["low", "normal", "high"]), ("carol", ["low", "normal", "high"]),
                           ("bob", ["low", "normal"])]:
        assert priorities_for(tiers, user, lambda g, u=user: g == "ml" and u in in_ml) == expected
    assert not may_use_priority(tiers, "urgent", "alice", lambda g: True)  # [] is for admins only
    for bad, field in [({"mega": []}, "priority_tiers"), ({"high": ["a b"]}, "priority_tiers.high"),
                       ({"high": 3}, "priority_tiers.high"), (["high"], "priority_tiers")]:
        with pytest.raises(InvalidInput) as err:
            parse_priority_tiers(bad)
        assert err.value.field == field


def test_the_pending_cap_counts_what_is_waiting_and_what_comes() -> None:
    assert pending_cap_refusal(None, 10**6, 10**4) is None
    assert pending_cap_refusal(5, 3, 2) is None
    refusal = pending_cap_refusal(5, 3, 3)
    assert refusal is not None and "user_max_pending_jobs" in refusal and "5" in refusal


def test_only_public_addresses_are_public() -> None:
    from jupyter_gpujobs.engine.addresses import is_public, literal_problem

    for host in ("127.0.0.1", "127.1", "2130706433", "0x7f.1", "::1", "::ffff:127.0.0.1", "10.1.2.3",
                 "192.168.0.1", "169.254.169.254", "100.64.0.1", "0.0.0.0", "fe80::1", "localhost", "x.localhost"):
        assert literal_problem(host) is not None, host
    for host in ("8.8.8.8", "2001:4860:4860::8888", "hooks.slack.com", "chat.example.org"):
        assert literal_problem(host) is None, host
    assert is_public("8.8.8.8") and not is_public("::ffff:10.0.0.1") and not is_public("not an address")


# ------------------------------------------------------------------------------ the helper


def _files(base: Path, owner: str) -> Path:
    """A folder of `owner`'s with the inputs a user may name, and a file only root may read."""
    pw = pwd.getpwnam(owner)
    home = base / owner
    home.mkdir(mode=0o700, exist_ok=True)
    os.chown(home, pw.pw_uid, pw.pw_gid)
    hidden = base / "root-only"
    hidden.mkdir(mode=0o700, exist_ok=True)
    (hidden / "secret.ipynb").write_text(NOTEBOOK)
    (hidden / "secret.ipynb").chmod(0o600)
    (home / "good.ipynb").write_text(NOTEBOOK)
    with open(home / "big.ipynb", "wb") as f:
        f.truncate(1 << 30)  # 1 GB, sparse
    os.mkfifo(home / "fifo")
    (home / "folder.ipynb").mkdir()
    for name, target in [("pipe.ipynb", "fifo"), ("zero.ipynb", "/dev/zero"),
                         ("secret.ipynb", str(hidden / "secret.ipynb"))]:
        os.symlink(target, home / name)
    for path in home.iterdir():
        os.lchown(path, pw.pw_uid, pw.pw_gid)
    return home


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """A folder every user may enter (pytest's tmp_path is under a folder of root's alone)."""
    with tempfile.TemporaryDirectory(prefix="gpujobs-sec-", dir="/tmp") as d:
        Path(d).chmod(0o755)
        yield Path(d)


@NEEDS_TEAM
def test_the_helper_sees_what_the_user_sees(open_tmp: Path) -> None:
    from jupyter_gpujobs.engine.userfiles import Bounds, HelperFailed, check_notebook

    home = _files(open_tmp, U1)
    bounds = Bounds(max_bytes=1 << 20, timeout_s=30)

    def verdict(user: str | None, name: str) -> str:
        return asyncio.run(check_notebook(user, str(home / name), bounds=bounds)).notebook

    assert verdict(U1, "good.ipynb") == "ok"
    assert verdict(U1, "secret.ipynb") == verdict(U1, "missing.ipynb") == "missing"
    assert verdict(None, "secret.ipynb") == "ok"  # (root may read it: the helper ran as U1 above)
    assert verdict(U1, "pipe.ipynb") == verdict(U1, "zero.ipynb") == verdict(U1, "folder.ipynb") == "not_a_file"
    assert verdict(U1, "big.ipynb") == "too_big"
    folder = asyncio.run(check_notebook(U2, str(home / "good.ipynb"), str(home), bounds=bounds))
    assert folder.notebook == "missing"  # U2 may not enter U1's folder
    with pytest.raises(HelperFailed):
        asyncio.run(check_notebook(U1, str(home / "good.ipynb"), bounds=Bounds(timeout_s=0.001)))

    async def many() -> list[str]:  # more at once than one user's slots: they take turns
        checks = [check_notebook(U1, str(home / "good.ipynb"), bounds=bounds) for _ in range(6)]
        return [v.notebook for v in await asyncio.gather(*checks)]

    assert asyncio.run(many()) == ["ok"] * 6


# ------------------------------------------------------------------------------ the team


@pytest.fixture(scope="module")
def team() -> Iterator[Team]:
    args = ["--GPUJobs.priority_tiers=urgent=", f"--GPUJobs.priority_tiers=high={U2}",
            f"--GPUJobs.user_max_pending_jobs={MAX_PENDING}", f"--GPUJobs.user_max_array_tasks={MAX_TASKS}"]
    with Team(fake_gpus="2xA100", engine_args=args) as t:
        yield t


def wait_for(what: str, check: Any, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout} s")
        time.sleep(0.1)


def cancel_all(team: Team) -> None:
    """Cancel every waiting job (as root), so each test starts with an empty queue."""
    with team.socket_client() as c:
        for job in c.get("queue", params={"limit": 1000}).json()["jobs"]:
            c.delete(f"jobs/{job['id']}")


def submit_as(team: Team, user: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """POST jobs on the engine's socket as `user` (an admin has no server of their own here)."""
    code = ("import httpx, json; c = httpx.Client(transport=httpx.HTTPTransport(uds="
            f"{str(team.socket)!r}), base_url='http://x/gpujobs/api/', timeout=60); "
            f"r = c.post('jobs', json={body!r}); print(json.dumps([r.status_code, r.json()]))")
    status, reply = team.run_as(user, code)
    return status, reply


@NEEDS_TEAM
def test_a_notebook_is_looked_at_as_its_user_at_once(team: Team) -> None:
    s1, s2 = team.servers[U1], team.servers[U2]
    home = _files(team.base, U1)

    def submit(name: str) -> httpx.Response:
        return s1.api("POST", "jobs", json={"kind": "notebook", "gpus": 0, "begin": "+1d",
                                            "payload": {"notebook": str(home / name)}})

    good = submit("good.ipynb")
    assert good.status_code == 201, good.text
    # a link to a file only root may read: the answer of a missing file (root's rights are not lent)
    secret, absent = submit("secret.ipynb"), submit("missing.ipynb")
    assert (secret.status_code, absent.status_code) == (400, 400)
    assert secret.json()["field"] == absent.json()["field"] == "payload.notebook"
    assert secret.json()["message"].replace("secret", "X") == absent.json()["message"].replace("missing", "X")
    for name in ("pipe.ipynb", "zero.ipynb", "folder.ipynb"):
        r = submit(name)
        assert r.status_code == 400 and "not a file" in r.json()["message"], (name, r.text)

    # three 1 GB (sparse) notebooks at once: each answered within 2 s, everyone else within 1 s meanwhile
    answers: dict[int, tuple[float, httpx.Response]] = {}

    def big(i: int) -> None:
        t0 = time.monotonic()
        r = submit("big.ipynb")
        answers[i] = (time.monotonic() - t0, r)

    threads = [threading.Thread(target=big, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    others = []
    while any(t.is_alive() for t in threads) or not others:
        t0 = time.monotonic()
        assert s2.api("GET", "whoami").status_code == 200
        others.append(time.monotonic() - t0)
    for t in threads:
        t.join()
    for seconds, r in answers.values():
        assert r.status_code == 400 and "larger than" in r.json()["message"], r.text
        assert seconds < 2.0, f"a 1 GB notebook took {seconds:.2f} s to refuse"
    assert max(others) < 1.0, f"another user waited {max(others):.2f} s"
    cancel_all(team)


@NEEDS_TEAM
def test_a_notebook_swapped_for_a_fifo_while_checked_hangs_nothing(team: Team) -> None:
    """The engine that stat()ed a regular file and then opened what had become a FIFO waited
    forever for a writer, and every request of every user with it."""
    s1, s2 = team.servers[U1], team.servers[U2]
    home = _files(team.base, U1) if not (team.base / U1 / "fifo").exists() else team.base / U1
    race, spare = home / "race.ipynb", home / ".race-next"
    stop = threading.Event()

    def swap() -> None:
        while not stop.is_set():
            for target in ("fifo", "good.ipynb"):
                try:
                    os.symlink(target, spare)
                    os.replace(spare, race)
                except FileExistsError:
                    os.unlink(spare)

    swapper = threading.Thread(target=swap)
    swapper.start()
    try:
        for _ in range(30):
            r = s1.api("POST", "jobs", json={"kind": "notebook", "gpus": 0, "begin": "+1d",
                                             "payload": {"notebook": str(race)}})
            assert r.status_code in (201, 400), r.text
            if r.status_code == 201:
                s1.api("DELETE", f"jobs/{r.json()['id']}")
            assert s2.api("GET", "whoami").status_code == 200
    finally:
        stop.set()
        swapper.join()
        try:  # an engine stuck in open() of the FIFO: give it a writer, so it ends
            os.close(os.open(home / "fifo", os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
    cancel_all(team)


@NEEDS_TEAM
def test_a_cwd_behind_a_link_gets_the_answer_of_a_missing_one(team: Team) -> None:
    """The engine checked a job's folder as root, following links: a link into another user's
    0700 folder was accepted when the folder behind it existed and refused when it did not."""
    s1 = team.servers[U1]
    home, theirs = team.servers[U1].home, team.servers[U2].home  # each 0700, its user's
    assert theirs.stat().st_mode & 0o777 == 0o700
    tag = uuid.uuid4().hex[:8]
    (theirs / f"exists-{tag}").mkdir()
    os.chown(theirs / f"exists-{tag}", pwd.getpwnam(U2).pw_uid, -1)
    links = {"to-existing": theirs / f"exists-{tag}", "to-missing": theirs / f"no-such-folder-{tag}"}
    for name, target in links.items():
        os.symlink(target, home / f"{name}-{tag}")
        os.lchown(home / f"{name}-{tag}", pwd.getpwnam(U1).pw_uid, -1)

    def submit(cwd: str) -> httpx.Response:
        return s1.api("POST", "jobs", json={"command": ["/bin/true"], "gpus": 0, "begin": "+1d", "cwd": cwd})

    paths = [str(home / f"to-existing-{tag}"), str(home / f"to-missing-{tag}"), str(theirs / f"exists-{tag}")]
    existing, absent, direct = (submit(path) for path in paths)
    assert (existing.status_code, absent.status_code, direct.status_code) == (400, 400, 400), existing.text
    messages = [r.json()["message"].replace(path, "X") for r, path in zip((existing, absent, direct), paths)]
    assert existing.json()["field"] == absent.json()["field"] == "cwd"
    assert messages[0] == messages[1] == messages[2] == f"no such directory, or {U1} may not enter it: X"
    ok = submit(str(home))
    assert ok.status_code == 201, ok.text
    cancel_all(team)


@NEEDS_TEAM
def test_a_tilde_is_the_submitting_users_home_not_roots(team: Team) -> None:
    s1 = team.servers[U1]
    pw = pwd.getpwnam(U1)
    folder = Path(pw.pw_dir) / f"tilde-{uuid.uuid4().hex[:8]}"
    folder.mkdir(parents=True)
    (folder / "good.ipynb").write_text(NOTEBOOK)
    for path in (folder, folder / "good.ipynb"):
        os.chown(path, pw.pw_uid, pw.pw_gid)
    try:
        r = s1.api("POST", "jobs", json={"command": ["/bin/true"], "gpus": 0, "begin": "+1d",
                                         "cwd": f"~/{folder.name}"})
        assert r.status_code == 201, r.text
        assert s1.api("GET", f"jobs/{r.json()['id']}").json()["cwd"] == str(folder)
        r = s1.api("POST", "jobs", json={"kind": "notebook", "gpus": 0, "begin": "+1d", "cwd": "~",
                                         "payload": {"notebook": f"~/{folder.name}/good.ipynb"}})
        assert r.status_code == 201, r.text
        job = s1.api("GET", f"jobs/{r.json()['id']}").json()
        assert job["payload"]["notebook"] == str(folder / "good.ipynb") and job["cwd"] == pw.pw_dir
        r = s1.api("POST", "jobs", json={"command": ["/bin/true"], "gpus": 0, "cwd": "~no-such-user-xyz/a"})
        assert r.status_code == 400 and r.json()["field"] == "cwd", r.text
        assert "give an absolute path" in r.json()["message"]
    finally:
        cancel_all(team)
        subprocess.run(["rm", "-rf", str(folder)], check=False)


@NEEDS_TEAM
def test_priority_classes_are_policy_admins_use_all(team: Team) -> None:
    s1, s2 = team.servers[U1], team.servers[U2]
    for priority in ("urgent", "high"):
        r = s1.api("POST", "jobs", json={"command": "true", "gpus": 0, "priority": priority})
        assert r.status_code == 403, r.text
        assert r.json()["field"] == "priority" and f"priority '{priority}'" in r.json()["message"]
        assert "you may use low, normal" in r.json()["message"]
    assert s1.api("POST", "jobs", json={"command": "true", "gpus": 0, "priority": "normal"}).status_code == 201
    assert s2.api("POST", "jobs", json={"command": "true", "gpus": 0, "priority": "high"}).status_code == 201
    r = s2.api("POST", "jobs", json={"command": "true", "gpus": 0, "priority": "urgent"})
    assert r.status_code == 403 and "'urgent'" in r.json()["message"]
    status, job = submit_as(team, ADMIN, {"command": "true", "gpus": 0, "priority": "urgent"})  # via the group
    assert status == 201 and job["priority"] == "urgent", job

    # `quota` says which classes and caps apply
    q1, q2 = s1.api("GET", "quota").json(), s2.api("GET", "quota").json()
    assert q1["priorities"] == ["low", "normal"] and q2["priorities"] == ["low", "normal", "high"]
    assert (q1["max_pending_jobs"], q1["max_array_tasks"]) == (MAX_PENDING, MAX_TASKS)
    out = team.run_as(U1, "import contextlib, io, json; from jupyter_gpujobs.cli import main\n"  # this checkout's CLI
                          "out = io.StringIO()\nwith contextlib.redirect_stdout(out):\n"
                          "    try:\n        main(['quota'])\n    except SystemExit:\n        pass\n"
                          "print(json.dumps(out.getvalue()))", PYTHONPATH=str(REPO))
    assert "priorities     low, normal" in out and f"max {MAX_PENDING} waiting" in out, out
    assert f"arrays of at most {MAX_TASKS} tasks" in out, out


@NEEDS_TEAM
def test_one_user_may_queue_only_so_much(team: Team) -> None:
    cancel_all(team)
    s1 = team.servers[U1]
    later = {"command": "true", "gpus": 0, "begin": "+1d"}
    r = s1.api("POST", "jobs", json={**later, "array": f"0-{MAX_TASKS}"})
    assert r.status_code == 400 and r.json()["field"] == "array", r.text
    assert f"more than the {MAX_TASKS}" in r.json()["message"] and "user_max_array_tasks" in r.json()["message"]
    ids = [s1.api("POST", "jobs", json=later).json()["id"] for _ in range(MAX_PENDING)]
    for body in (later, {**later, "array": "0-1"}):
        r = s1.api("POST", "jobs", json=body)
        assert r.status_code == 409, r.text
        assert "user_max_pending_jobs" in r.json()["message"] and f"more than {MAX_PENDING}" in r.json()["message"]
    # another user is not held by it, and an admin is not capped
    assert team.servers[U2].api("POST", "jobs", json=later).status_code == 201
    status, reply = submit_as(team, ADMIN, {**later, "array": "0-9"})
    assert status == 201 and len(reply["array_tasks"]) == 10, reply
    # a job that leaves the queue makes room
    assert s1.api("DELETE", f"jobs/{ids[0]}").status_code == 200
    assert s1.api("POST", "jobs", json=later).status_code == 201
    cancel_all(team)


class EventFeed:
    """The events websocket of a user's server, read in a thread of its own."""

    def __init__(self, server: UserServer):
        self.server = server
        self.messages: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        from tornado.httpclient import HTTPRequest
        from tornado.websocket import websocket_connect

        url = f"ws://127.0.0.1:{self.server.port}/gpujobs/api/events"
        ws = await websocket_connect(HTTPRequest(url, headers={"Authorization": f"token {self.server.token}"}))
        try:
            while not self._stop.is_set():
                try:
                    raw = await asyncio.wait_for(ws.read_message(), 0.2)
                except asyncio.TimeoutError:
                    continue
                if raw is None:
                    return
                self.messages.append(json.loads(raw))
        finally:
            ws.close()

    def __enter__(self) -> EventFeed:
        self._thread.start()
        wait_for("first GPU update on the events websocket", lambda: any(m["type"] == "gpus" for m in self.messages))
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


@NEEDS_TEAM
def test_another_users_failed_job_shows_nothing_of_what_it_ran(team: Team) -> None:
    s1, s2 = team.servers[U1], team.servers[U2]
    secret = f"project-x-{uuid.uuid4().hex[:8]}"
    command = [str(team.base / U1 / secret / "run.sh"), "--token", f"{secret}-arg"]
    with EventFeed(s2) as feed:
        r = s1.api("POST", "jobs", json={"command": command, "gpus": 0, "name": f"{secret}-name"})
        assert r.status_code == 201, r.text
        jid = r.json()["id"]
        mine = wait_for("the job's failure", lambda: (lambda j: j if j["state"] == "FAILED" else None)(
            s1.api("GET", f"jobs/{jid}").json()))
        assert f"command not found: {command[0]}" in mine["reason"]  # its owner is told why
        wait_for("the failure on the other user's websocket", lambda: any(
            m["type"] == "job" and m["job"]["id"] == jid and m["job"]["state"] == "FAILED" for m in feed.messages))
        seen_live = [m for m in feed.messages if m["type"] == "job" and m["job"]["id"] == jid]
    theirs = s2.api("GET", f"jobs/{jid}").json()
    assert theirs["private"] is True and theirs["state"] == "FAILED" and theirs["reason"] == "failed"
    listed = [j for j in s2.api("GET", "jobs", params={"limit": 1000}).json()["jobs"] if j["id"] == jid]
    findings = s2.api("GET", "findings").json()
    shown = json.dumps([theirs, listed, seen_live, findings])
    assert secret not in shown and "run.sh" not in shown, shown
    assert [s2.api("GET", f"jobs/{jid}/{sub}").status_code for sub in ("log", "events", "stats")] == [403] * 3


class Receiver:
    """An HTTP server on every address of this machine that records what it is sent."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        paths = self.paths

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                paths.append(self.path)
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("0.0.0.0", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@NEEDS_TEAM
def test_webhooks_post_only_to_public_addresses(team: Team) -> None:
    s1 = team.servers[U1]
    for url in ("http://127.0.0.1:9/x", "http://localhost:9/x", "http://[::1]/x", "http://2130706433/x",
                "http://169.254.169.254/latest/meta-data", "http://10.0.0.1/hook"):
        r = s1.api("PUT", "notifications", json={"webhook": url})
        assert r.status_code == 400 and r.json()["field"] == "webhook", (url, r.text)
        assert "notify_private_webhooks" in r.json()["message"], r.text
    assert s1.api("GET", "notifications").json()["webhook"] is None
    # a name is resolved when the message goes out: one that resolves to this machine gets nothing
    from jupyter_gpujobs.engine.addresses import is_public

    host = socket.gethostname()
    if is_public(socket.gethostbyname(host)):
        pytest.skip(f"this machine's name {host} resolves to a public address")
    receiver = Receiver()
    try:
        assert s1.api("PUT", "notifications", json={"webhook": f"http://{host}:{receiver.port}/u1"}).status_code == 200
        assert s1.api("POST", "notifications/test").status_code == 200
        wait_for("the refusal in the engine's log", lambda: f"{host} resolves to" in team.engine_log.read_text())
        assert receiver.paths == []
    finally:
        s1.api("PUT", "notifications", json={"webhook": None})
        receiver.stop()
