"""Notifications outside Lab, against a real SMTP server (aiosmtpd) and a real HTTP receiver:
each user is told of their own jobs only, once per event, at the addresses they set; admins
get the monitor's findings; a receiver that is down or hangs neither slows the engine nor
floods its log, and is retried until it takes the message."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from email import message_from_bytes
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from servers import free_port, wait_job, wait_until

from jupyter_gpujobs.client import GPUJobsClient, GPUJobsError

USERS = {"tok-alice": "alice", "tok-bob": "bob", "tok-admin": "admin"}


class Mailbox:
    """A real SMTP server on a free port (aiosmtpd, in its own thread) keeping what it gets."""

    def __init__(self) -> None:
        from aiosmtpd.controller import Controller

        self.messages: list[tuple[list[str], Any]] = []
        self.port = free_port()
        self.controller = Controller(self, hostname="127.0.0.1", port=self.port)
        self.controller.start()

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802 (aiosmtpd's name)
        self.messages.append((list(envelope.rcpt_tos), message_from_bytes(envelope.content)))
        return "250 OK"

    def subjects(self, to: str) -> list[str]:
        return [str(m["Subject"]) for rcpt, m in self.messages if to in rcpt]

    def stop(self) -> None:
        self.controller.stop()


class Receiver:
    """A real HTTP server on `port` (a thread) keeping the JSON posted to each path, each
    answered after `delay` seconds."""

    def __init__(self, port: int | None = None, delay: float = 0.0) -> None:
        posts: dict[str, list[dict[str, Any]]] = {}
        self.posts = posts

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                time.sleep(delay)  # a slow receiver
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                posts.setdefault(self.path, []).append(json.loads(body))
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.port = port or free_port()
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def texts(self, path: str) -> list[str]:
        return [p["text"].split("\n")[0] for p in self.posts.get(path, [])]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Hang:
    """A port that takes connections and never answers (a hung webhook or mail server)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(100)
        self.port = self.sock.getsockname()[1]

    def stop(self) -> None:
        self.sock.close()


@pytest.fixture
def mailbox() -> Iterator[Mailbox]:
    box = Mailbox()
    yield box
    box.stop()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.stop()


def _clients(server: Any) -> dict[str, GPUJobsClient]:
    return {name: GPUJobsClient(url=server.url, token=tok) for tok, name in USERS.items()}


def test_each_user_is_told_of_their_own_jobs_once_and_admins_of_findings(
        live_server: Any, mailbox: Mailbox, receiver: Receiver) -> None:
    server = live_server(users=USERS, config={
        "notify_private_webhooks": True,  # the receivers listen on loopback
        "admin_users": "admin", "notify_smtp_host": "127.0.0.1", "notify_smtp_port": mailbox.port,
        "notify_admin_emails": "ops@example.org", "notify_admin_webhooks": receiver.url("/admins"),
        "notify_timeout": 5, "failure_streak": 2})
    c = _clients(server)
    mine = c["alice"].set_notifications(email="alice@example.org", webhook=receiver.url("/alice"))
    assert mine["email"] == "alice@example.org" and mine["events"] == ["started", "ended", "failed", "warning",
                                                                     "finding"]
    assert c["bob"].set_notifications(webhook=receiver.url("/bob"), events=["failed"])["email"] is None
    assert c["bob"].notifications()["webhook"] == receiver.url("/bob")  # each sees only their own
    assert c["admin"].notifications()["webhook"] is None

    done = c["alice"].submit("true", gpus=1, name="done")
    late = c["alice"].submit("sleep 60", gpus=1, name="late", time_limit="6s")
    wait_job(c["alice"], done["id"], ("COMPLETED",))
    bobs = [c["bob"].submit("false", gpus=0, name="crash") for _ in range(2)]
    for job in bobs:
        wait_job(c["bob"], job["id"], ("FAILED",))
    wait_job(c["alice"], late["id"], ("TIMEOUT",), timeout=40)

    expected_alice = {f"[gpujobs] job {done['id']} (done) started", f"[gpujobs] job {done['id']} (done) completed",
                      f"[gpujobs] job {late['id']} (late) started",
                      f"[gpujobs] job {late['id']} (late) nears its time limit",
                      f"[gpujobs] job {late['id']} (late) reached its time limit"}
    wait_until(lambda: set(mailbox.subjects("alice@example.org")) >= expected_alice, 20, "alice's mails")
    wait_until(lambda: set(receiver.texts("/alice")) >= expected_alice, 20, "alice's webhook posts")
    wait_until(lambda: len(receiver.texts("/bob")) >= 2, 20, "bob's webhook posts")
    wait_until(lambda: any("crash" in t for t in receiver.texts("/admins")), 20, "the finding posted to the admins")
    wait_until(lambda: any("crash" in t for t in mailbox.subjects("ops@example.org")), 20,
               "the finding mailed to the admins")
    time.sleep(1.5)  # anything sent twice would arrive by now
    # alice: each of her job events once, at each of her addresses; nothing of bob's
    # (a finding about a stray process on her job's GPU, from another test on the machine, may come too)
    assert sorted(t for t in mailbox.subjects("alice@example.org") if t.startswith("[gpujobs] job ")) == sorted(
        expected_alice)
    assert sorted(t for t in receiver.texts("/alice") if t.startswith("[gpujobs] job ")) == sorted(expected_alice)
    # bob: only failures (his choice), of his own jobs
    assert sorted(receiver.texts("/bob")) == sorted(f"[gpujobs] job {j['id']} (crash) failed" for j in bobs)
    assert all("alice" not in p["text"] and "late" not in p["text"] for p in receiver.posts["/bob"])
    # the admins: the finding (bob's job failed twice in a row), once at each address (other
    # findings may come from processes of other tests on the machine's fake GPUs)
    streak = "job 'crash' of bob failed 2 times in a row"
    assert sum(streak in t for t in receiver.texts("/admins")) == 1, receiver.texts("/admins")
    assert sum(streak in t for t in mailbox.subjects("ops@example.org")) == 1
    mail = next(m for rcpt, m in mailbox.messages if "alice@example.org" in rcpt)
    assert mail["From"].startswith("gpujobs@") and mail["Auto-Submitted"] == "auto-generated"
    # a test message on request
    assert c["bob"].test_notifications() == {"queued": ["webhook"]}
    wait_until(lambda: "[gpujobs] test notification" in receiver.texts("/bob"), 10, "bob's test message")
    # once a minute: a user who asks again and again has the engine send nothing more for them
    r = c["bob"]._http.post("notifications/test")  # (raw: the answer's headers)
    assert r.status_code == 429 and "one a minute" in r.json()["message"], r.text
    assert 0 < int(r.headers["Retry-After"]) <= 60, r.headers
    assert receiver.texts("/bob").count("[gpujobs] test notification") == 1
    with pytest.raises(GPUJobsError) as err:
        c["admin"].test_notifications()
    assert err.value.status == 409


def test_bad_settings_are_refused_naming_the_field_and_good_ones_outlive_a_restart(live_server: Any) -> None:
    server = live_server(users=USERS, config={"notify_webhook_hosts": "127.0.0.1,*.example.org"})
    alice = _clients(server)["alice"]
    bad: list[tuple[dict[str, Any], int, str]] = [
        ({"email": "alice"}, 400, "email"),
        ({"email": "a@b@c"}, 400, "email"),
        ({"email": 7}, 400, "email"),
        ({"webhook": "ftp://127.0.0.1/x"}, 400, "webhook"),
        ({"webhook": "http://user:secret@127.0.0.1/x"}, 400, "webhook"),
        ({"webhook": "http:///nohost"}, 400, "webhook"),
        ({"webhook": "http://10.0.0.1/internal"}, 400, "webhook"),  # not in the allow-list
        ({"webhook": "https://hooks.example.org.evil.test/x"}, 400, "webhook"),
        ({"events": ["ended", "bogus"]}, 400, "events"),
        ({"events": "ended"}, 400, "events"),
        ({"user": "bob", "webhook": "http://127.0.0.1/x"}, 400, "user"),  # nobody sets another's
        ({"email": "alice@example.org"}, 409, "email"),  # this engine has no mail server
    ]
    for body, status, field in bad:
        with pytest.raises(GPUJobsError) as err:
            alice.api("PUT", "notifications", body=body)
        assert (err.value.status, err.value.field) == (status, field), body
    assert alice.notifications()["webhook"] is None  # nothing was half-applied
    # the command line, as alice
    cli = server.cli("--token", "tok-alice", "notify", "--webhook", "gopher://127.0.0.1/x")
    assert cli.returncode == 1 and "webhook" in cli.stderr and "http" in cli.stderr, cli.stderr
    cli = server.cli("--token", "tok-alice", "notify", "--webhook", "http://127.0.0.1:9/hook", "--events", "failed")
    assert cli.returncode == 0, cli.stderr
    assert "notifications on failed to:" in cli.stdout and "http://127.0.0.1:9/hook" in cli.stdout
    assert "sends no e-mail" in cli.stdout
    ok = alice.set_notifications(webhook="https://chat.example.org/hooks/abc", events=["failed", "ended"])
    assert ok["webhook"] == "https://chat.example.org/hooks/abc" and ok["events"] == ["ended", "failed"]
    assert ok["email_available"] is False and ok["webhook_hosts"] == ["127.0.0.1", "*.example.org"]
    _magic_as(server, "tok-bob", "--webhook https://ci.example.org/hook --events ended", "notifications on ended")
    with pytest.raises(Exception, match=r"%gpujobs notify \(events\): unknown kind 'bogus'"):
        _magic_as(server, "tok-bob", "--events bogus", "")
    server.stop()
    server.start()
    again = _clients(server)
    assert again["alice"].notifications()["webhook"] == "https://chat.example.org/hooks/abc"
    assert again["alice"].notifications()["events"] == ["ended", "failed"]
    assert again["bob"].notifications()["webhook"] == "https://ci.example.org/hook"
    off = again["alice"].clear_notifications()
    assert off["webhook"] is None and off["email"] is None


def test_upgrade_to_stored_notifications_keeps_jobs(tmp_path: Any) -> None:
    from schema_upgrade import write_pending_job_at

    from jupyter_gpujobs.engine.store import Store
    from jupyter_gpujobs.engine.store.notifications import load_settings, save_settings

    url = f"sqlite:///{tmp_path / 'gpujobs.sqlite'}"
    job_id = write_pending_job_at(url, "0006")  # the schema before notification settings were stored
    store = Store(url)
    store.migrate()
    try:
        job = store.get(job_id)
        assert job is not None and (job.user, job.command, job.gpus) == ("alice", ["true"], 1)
        save_settings(store, "alice", {"email": "alice@example.org", "webhook": None, "events": ["failed"]}, 5.0)
        save_settings(store, "bob", {"email": None, "webhook": "https://x.example.org/h", "events": []}, 6.0)
        save_settings(store, "bob", None, 7.0)
        assert load_settings(store) == {"alice": {"email": "alice@example.org", "webhook": None,
                                                  "events": ["failed"], "updated_at": 5.0}}
    finally:
        store.close()


def _magic_as(server: Any, token: str, line: str, expect: str) -> None:
    """`%gpujobs notify LINE` in an IPython shell whose client is `token`'s."""
    import contextlib
    import io
    import os

    from IPython.testing.globalipapp import get_ipython

    ip = get_ipython()
    ip.run_line_magic("load_ext", "jupyter_gpujobs")
    magics = ip.magics_manager.registry["GPUJobMagics"]
    old = {k: os.environ.get(k) for k in ("GPUJOBS_URL", "GPUJOBS_TOKEN")}
    os.environ.update(GPUJOBS_URL=server.url, GPUJOBS_TOKEN=token)
    try:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            magics.gpujobs(f"notify {line}")
        assert expect in out.getvalue(), out.getvalue()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_a_receiver_that_is_down_is_retried_and_logged_once(live_server: Any) -> None:
    port = free_port()  # nothing listens there yet: connection refused
    server = live_server(users=USERS, config={"notify_timeout": 2, "notify_private_webhooks": True})
    alice = _clients(server)["alice"]
    alice.set_notifications(webhook=f"http://127.0.0.1:{port}/alice", events=["started", "ended"])
    jobs = [alice.submit("true", gpus=1, name=f"j{i}") for i in range(3)]
    for job in jobs:
        wait_job(alice, job["id"], ("COMPLETED",))
    down = f"webhook host 127.0.0.1:{port} cannot be reached"
    wait_until(lambda: down in server.server_log(), 10, "the failure logged")
    receiver = Receiver(port)  # it comes back: the messages waiting are delivered, each once
    try:
        expected = {f"[gpujobs] job {j['id']} (j{i}) {what}" for i, j in enumerate(jobs)
                    for what in ("started", "completed")}
        wait_until(lambda: set(receiver.texts("/alice")) == expected, 30, "the messages delivered after a retry")
        time.sleep(1)
        assert sorted(receiver.texts("/alice")) == sorted(expected)
    finally:
        receiver.stop()
    log = server.server_log()
    assert log.count(down) == 1, log[-3000:]
    assert f"webhook host 127.0.0.1:{port} takes messages again" in log



def test_messages_queued_when_the_engine_stops_are_still_sent(live_server: Any) -> None:
    slow = Receiver(delay=0.4)  # one message at a time per destination: six take 2.4 s
    try:
        server = live_server(users=USERS, config={"notify_private_webhooks": True})
        alice = _clients(server)["alice"]
        alice.set_notifications(webhook=slow.url("/alice"), events=["started", "ended"])
        jobs = [alice.submit("true", gpus=0, name=f"q{i}") for i in range(3)]
        for job in jobs:
            wait_job(alice, job["id"], ("COMPLETED",))
        server.stop()  # (SIGTERM, as systemd stops the engine)
        expected = {f"[gpujobs] job {j['id']} (q{i}) {what}" for i, j in enumerate(jobs)
                    for what in ("started", "completed")}
        assert set(slow.texts("/alice")) == expected
        assert len(slow.texts("/alice")) == len(expected)  # each once
    finally:
        slow.stop()


def _dispatch_seconds(client: GPUJobsClient, n: int) -> tuple[float, float]:
    """(seconds until n short jobs all completed, the slowest API answer meanwhile)."""
    t0 = time.monotonic()
    jobs = [client.submit("true", gpus=1, name="quick") for _ in range(n)]
    slowest = 0.0
    for job in jobs:
        while True:
            t = time.monotonic()
            state = client.job(job["id"])["state"]
            slowest = max(slowest, time.monotonic() - t)
            if state == "COMPLETED":
                break
            assert state in ("PENDING", "RUNNING"), state
            assert time.monotonic() - t0 < 60, "jobs did not complete"
            time.sleep(0.05)
    return time.monotonic() - t0, slowest


def test_a_hung_receiver_and_mail_server_do_not_slow_the_engine_or_other_receivers(
        live_server: Any, receiver: Receiver) -> None:
    hung_web, hung_mail = Hang(), Hang()
    try:
        server = live_server(users=USERS, config={"notify_smtp_host": "127.0.0.1", "notify_private_webhooks": True,
                                                  "notify_smtp_port": hung_mail.port, "notify_timeout": 6})
        c = _clients(server)
        alice = c["alice"]
        _dispatch_seconds(alice, 2)  # warm up (the first supervisors)
        base, base_slowest = _dispatch_seconds(alice, 10)
        alice.set_notifications(email="alice@example.org", webhook=f"http://127.0.0.1:{hung_web.port}/hook")
        c["bob"].set_notifications(webhook=receiver.url("/bob"), events=["ended"])
        hung, hung_slowest = _dispatch_seconds(alice, 10)
        # bob's receiver works: his message comes at once, not after alice's hung deliveries
        t0 = time.monotonic()
        bobs = c["bob"].submit("true", gpus=1, name="bobs")
        wait_job(c["bob"], bobs["id"], ("COMPLETED",))
        wait_until(lambda: receiver.texts("/bob"), 10, "bob's message")
        bob_s = time.monotonic() - t0
        print(f"10 jobs: {base:.2f}s with no notifications (slowest answer {base_slowest * 1000:.0f} ms), "
              f"{hung:.2f}s with a hung webhook and mail server (slowest answer {hung_slowest * 1000:.0f} ms); "
              f"another user's working webhook told within {bob_s:.2f}s of submitting")
        # an engine that waited on a delivery would stall for its 6 s timeout, per message (20 of
        # them); the margins are for a loaded machine
        assert hung < base * 2 + 3
        assert hung_slowest < 3.0
        assert bob_s < 5.0
        assert receiver.texts("/bob") == [f"[gpujobs] job {bobs['id']} (bobs) completed"]
        down = f"webhook host 127.0.0.1:{hung_web.port} cannot be reached"
        wait_until(lambda: "mail server cannot be reached" in server.server_log() and down in server.server_log(),
                   20, "the timeouts logged")
        time.sleep(1)
        log = server.server_log()
        assert log.count(down) == 1, log[-3000:]
        assert log.count("mail server cannot be reached") == 1, log[-3000:]
    finally:
        hung_web.stop()
        hung_mail.stop()
