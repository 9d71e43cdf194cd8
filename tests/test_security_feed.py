"""The events websocket between users of one shared engine, as real Unix users against a real
root engine (`tests/team.py`):

- a budget's warning goes to the users whose budget it is (and admins), never to every
  websocket: another's GPU-hours are theirs, as `GET budgets` keeps them;
- a client that opens the websocket and never reads it is disconnected once its unread
  messages pass a bound, so that the engine does not keep them for it without end; a client
  that reads gets the same burst whole; one that starts sending a long message is
  disconnected before the engine buffers it;
- why another's run failed stays theirs when the job waits to run again (a retry), and so does
  its name when they change it: others read "run 1 of 2 failed" and "updated by ...".
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from team import USER_PYTHON, USERS, Team, as_user, missing, user_env
from test_security_api import EventFeed, wait_for

U1, U2 = USERS
pytestmark = pytest.mark.skipif(missing() is not None, reason=str(missing()))


@pytest.fixture(scope="module")
def team() -> Iterator[Team]:
    # one GPU-hour of a budget is one GPU-second here: a job uses up 2 of them in 2 s
    with Team(fake_gpus="2xA100", engine_args=["--GPUJobs.budget_hour_seconds=1"]) as t:
        yield t


def test_a_budget_warning_goes_only_to_whom_it_concerns(team: Team) -> None:
    s1 = team.servers[U1]
    with team.socket_client() as root:
        r = root.put("budgets", json={"scope": "users", "name": U1, "budget": {"gpu_hours": 2, "period": "week"}})
        assert r.status_code == 200, r.text
    try:
        with EventFeed(s1) as mine, EventFeed(team.servers[U2]) as theirs:
            r = s1.api("POST", "jobs", json={"command": ["sleep", "60"], "gpus": 1})
            assert r.status_code == 201, r.text
            jid = r.json()["id"]
            warning = wait_for("the budget's warning on its user's websocket", lambda: [
                m for m in mine.messages if m["type"] == "budget"])
            assert warning[0]["users"] == [U1] and warning[0]["budget"]["name"] == U1
            assert s1.api("DELETE", f"jobs/{jid}").status_code == 200
            # the other user's feed has passed the warning: it has the job's end, published after it
            wait_for("the job's end on the other user's websocket", lambda: any(
                m["type"] == "job" and m["job"]["id"] == jid and m["job"]["state"] == "CANCELLED"
                for m in theirs.messages))
            assert [m for m in theirs.messages if m["type"] == "budget"] == []
            assert team.servers[U2].api("GET", "budgets").json()["budgets"] == []  # as GET budgets says
    finally:
        with team.socket_client() as root:
            root.put("budgets", json={"scope": "users", "name": U1, "budget": None})


#: What both scripts below start with: the events websocket's handshake on a connected socket.
HANDSHAKE = r"""
def handshake(s):
    s.sendall(b"GET /gpujobs/api/events HTTP/1.1\r\nHost: engine\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
              b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
    head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(1)
    return head
"""

#: As the user: open the events websocket on the engine's socket with a small receive buffer,
#: say so, read nothing until told to, then read to its end (or for 60 s) and say what came.
SLOW_READER = HANDSHAKE + r"""
import json, socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
s.connect(sys.argv[1])
head = handshake(s)
print(json.dumps(head.split(b"\r\n")[0].decode()), flush=True)
sys.stdin.readline()
s.settimeout(60)
got, eof = 0, False
deadline = time.monotonic() + 60
try:
    while time.monotonic() < deadline:
        data = s.recv(1 << 16)
        if not data:
            eof = True
            break
        got += len(data)
except OSError:
    eof = True  # (reset by the engine)
print(json.dumps({"bytes": got, "eof": eof}), flush=True)
"""


def test_a_websocket_that_is_never_read_is_closed(team: Team) -> None:
    """Every message for a websocket that its client does not read waited in the engine's
    memory: a user who opened websockets and never read them grew the engine without end."""
    home = team.base / U2
    reader = subprocess.Popen(as_user(U2, [str(USER_PYTHON), "-c", SLOW_READER, str(team.socket)]),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=home,
                              env=user_env(U2, home))
    assert reader.stdout is not None and reader.stdin is not None
    try:
        assert "101" in json.loads(reader.stdout.readline())
        dropped = f"closing the events websocket of {U2}"
        with EventFeed(team.servers[U1]) as reading, team.socket_client() as root:
            last = None
            for _ in range(4):  # a burst of job changes: 600 tasks submitted, then cancelled
                r = root.post("jobs", json={"command": "true", "gpus": 0, "begin": "+1d", "array": "0-599"})
                assert r.status_code == 201, r.text
                tasks = r.json()["array_tasks"]
                assert root.post("jobs/cancel", json={"array": tasks[0]}).json()["cancelled"] == tasks
                last = tasks[-1]
                if dropped in team.engine_log.read_text():
                    break
            wait_for("the unread websocket closed", lambda: dropped in team.engine_log.read_text())
            # a client that reads has the whole burst, and stays
            wait_for("the last cancel on a reading websocket", lambda: any(
                m["type"] == "job" and m["job"]["id"] == last and m["job"]["state"] == "CANCELLED"
                for m in reading.messages), timeout=120)
            assert dropped.replace(U2, U1) not in team.engine_log.read_text()
        reader.stdin.write("read\n")
        reader.stdin.flush()
        seen: dict[str, Any] = json.loads(reader.stdout.readline())
        assert seen["eof"] is True, seen
        assert team.servers[U2].api("GET", "whoami").status_code == 200
    finally:
        reader.kill()
        reader.wait()


def test_a_retry_and_a_rename_show_nothing_private_to_others(team: Team) -> None:
    """A failed run that is retried goes back to the queue with a reason naming why it failed
    (`command not found: /home/...`), and a rename is an event naming the old and new names:
    both went to every user's websocket as they were, and the first into the job's view."""
    import uuid

    s1, s2 = team.servers[U1], team.servers[U2]
    secret = f"project-y-{uuid.uuid4().hex[:8]}"
    command = [str(team.base / U1 / secret / "train.sh")]
    with EventFeed(s2) as feed:
        r = s1.api("POST", "jobs", json={"command": command, "gpus": 0, "name": f"{secret}-a", "retries": 1,
                                         "retry_backoff": "1h"})
        assert r.status_code == 201, r.text
        jid = r.json()["id"]
        retried = wait_for("the failed run's retry", lambda: (lambda j: j if j["retried"] == 1 else None)(
            s1.api("GET", f"jobs/{jid}").json()))
        assert retried["state"] == "PENDING"
        renamed = s1.api("PATCH", f"jobs/{jid}", json={"name": f"{secret}-b"})
        assert renamed.status_code == 200, renamed.text
        theirs = s2.api("GET", f"jobs/{jid}").json()
        assert s1.api("DELETE", f"jobs/{jid}").status_code == 200
        wait_for("the cancel on the other user's websocket", lambda: any(
            m["type"] == "job" and m["job"]["id"] == jid and m["job"]["state"] == "CANCELLED" for m in feed.messages))
        events = [m["event"] for m in feed.messages if m["type"] == "job" and m["job"]["id"] == jid]
    mine = s1.api("GET", f"jobs/{jid}/events").json()["events"]
    assert any(f"command not found: {command[0]}" in (e["reason"] or "") for e in mine)  # its owner is told
    assert any(f"{secret}-b" in (e["reason"] or "") for e in mine)
    shown = json.dumps([theirs, events])
    assert secret not in shown and "train.sh" not in shown, shown
    reasons = [e["reason"] for e in events]
    assert any(r.startswith("run 1 of 2 failed; retry 1 of 1 after") for r in reasons), reasons
    assert f"updated by {U1}" in reasons, reasons


def test_a_submission_stores_a_bounded_amount(team: Team) -> None:
    """What one job carries (its environment, its payload) and what one submission stores over
    its tasks are bounded: a 1 MiB body with 1000 tasks stored 900 MB in the engine's database,
    holding its loop 10 s, and a user's 5 of them filled the disk every user's jobs need."""
    from jupyter_gpujobs.model import MAX_ENV_CHARS, MAX_PAYLOAD_CHARS, MAX_SUBMISSION_CHARS

    s1 = team.servers[U1]
    later = {"command": "true", "gpus": 0, "begin": "+1d"}
    big_env = {"V": "x" * MAX_ENV_CHARS}
    r = s1.api("POST", "jobs", json={**later, "env": big_env})
    assert r.status_code == 400 and r.json()["field"] == "env" and f"{MAX_ENV_CHARS:,} allowed" in r.json()["message"]
    r = s1.api("POST", "jobs", json={**later, "payload": {"p": "x" * MAX_PAYLOAD_CHARS}})
    assert r.status_code == 400 and r.json()["field"] == "payload", r.text
    per_task = MAX_SUBMISSION_CHARS // 1000 + 100
    r = s1.api("POST", "jobs", json={**later, "env": {"V": "x" * per_task}, "array": "0-999"})
    assert r.status_code == 400 and r.json()["field"] == "array", r.text
    assert f"{MAX_SUBMISSION_CHARS:,} one submission may store" in r.json()["message"]
    r = s1.api("POST", "jobs", json={**later, "env": {"V": "x" * (per_task - 200)}, "array": "0-999"})
    assert r.status_code == 201 and len(r.json()["array_tasks"]) == 1000, r.text
    assert s1.api("POST", "jobs/cancel", json={"array": r.json()["id"]}).status_code == 200


#: As the user: open the events websocket, start a 1 MiB message (its frame header only), and
#: say whether the engine closes the connection (or for 30 s, that it did not).
LONG_MESSAGE = HANDSHAKE + r"""
import json, socket, struct, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
head = handshake(s)
s.sendall(bytes([0x81, 0x80 | 127]) + struct.pack(">Q", 1 << 20) + b"mask" + b"x" * 1000)  # 1 MiB coming
s.settimeout(5)
closed = False
deadline = time.monotonic() + 30
try:
    while time.monotonic() < deadline:
        data = s.recv(1 << 16)
        if not data:
            closed = True
            break
        if b"\x88" in data:  # a close frame
            closed = True
            break
except socket.timeout:
    pass
except OSError:
    closed = True
print(json.dumps({"closed": closed}))
"""


def test_a_long_message_from_a_client_closes_its_websocket(team: Team) -> None:
    """Clients send nothing on the events websocket, but the engine read a message of up to
    10 MiB (tornado's default) into memory before ignoring it."""
    seen = team.run_as(U2, LONG_MESSAGE.replace("sys.argv[1]", repr(str(team.socket))))
    assert seen == {"closed": True}
    assert team.servers[U2].api("GET", "whoami").status_code == 200


#: As the user: start a POST whose body is to be 64 MiB, send 64 KiB of it, and say what the
#: engine answers (within 20 s), or "" when it answers nothing, still waiting for the body.
HUGE_BODY = r"""
import json, socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
s.sendall(b"POST /gpujobs/api/jobs HTTP/1.1\r\nHost: engine\r\nContent-Type: application/json\r\n"
          b"Content-Length: 67108864\r\n\r\n" + b" " * 65536)
s.settimeout(5)
got = b""
deadline = time.monotonic() + 20
while time.monotonic() < deadline and b"\r\n" not in got:
    try:
        data = s.recv(4096)
    except socket.timeout:
        continue
    except OSError:
        break
    if not data:
        break
    got += data
print(json.dumps(got.split(b"\r\n")[0].decode()))
"""


def test_a_huge_body_is_refused_at_its_headers(team: Team) -> None:
    """The engine read any body of up to tornado's 100 MB into memory before the API refused it
    (413 past c.GPUJobs.max_body_bytes): a user's 256 connections could hold 25 GB of it."""
    first = team.run_as(U2, HUGE_BODY.replace("sys.argv[1]", repr(str(team.socket))))
    assert first.startswith("HTTP/1.1 400"), first
    # a body over the API's limit but under the server's is still answered as the API says
    r = team.servers[U2].api("POST", "jobs", content=b" " * ((1 << 20) + 10),
                             headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and r.json()["field"] == "body", r.text
