"""Notifications outside Lab: e-mail (SMTP) and webhooks (Slack/Mattermost `{"text": ...}`)
when a job starts, ends, fails or nears its time limit, when a GPU-hour budget a user draws
on is 80 % or 100 % used (as a "warning"), and the monitor's findings to admins.

The `Notifier` listens to the engine's events (`JobService.subscribe`) and decides who gets
what: a job's owner, at the addresses they set (`GET/PUT notifications`, only their own; their
settings are stored in the `notifications` table), about their own jobs and the findings
about them; admins, at the configured addresses (`c.GPUJobs.notify_admin_*`), every finding.
Each message goes to a bounded queue that worker tasks drain, so the engine's loop never
waits on a mail server or a webhook: mail is sent by smtplib in a thread of the notifier's
own, webhooks by tornado's HTTP client, each within `notify_timeout`. One destination (a
mail server, a webhook's host) takes one message at a time; one that fails is retried with
backoff while its messages wait, and its trouble is logged once per interval, not per
message. Each job event makes at most one message per destination.

It receives what it needs of the engine (`NotifyEngine`: the store that keeps users'
settings and the engine's events) and imports no part of the service. May call: config's
address checks, the store's notification settings, the monitor's `may_see`, the engine's
errors. What it is told (`NotifySettings`) is in notify_settings.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import smtplib
import ssl
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from email.message import EmailMessage
from email.utils import formatdate, make_msgid
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from ..config import CONTROL_CHARACTERS, validate_email, validate_webhook
from ..model import InvalidInput, format_duration
from .addresses import PrivateAddress, PublicOnlyResolver, literal_problem
from .errors import Conflict, TooSoon
from .monitor import may_see
from .notify_settings import NotifySettings
from .store.notifications import load_settings, save_settings

if TYPE_CHECKING:
    from .store import Store

log = logging.getLogger("jupyter_gpujobs")

#: What a user may be told about: their job started, ended (completed or was cancelled),
#: failed (failed, ran out of time, was lost), nears its time limit; a finding about them.
KINDS = ("started", "ended", "failed", "warning", "finding")
DEFAULT_KINDS = ("started", "ended", "failed", "warning", "finding")
TEST_INTERVAL_S = 60.0  # how often one user may have a test message sent (`POST notifications/test`)
_EVENT_KIND = {"RUNNING": "started", "WARNING": "warning", "COMPLETED": "ended", "CANCELLED": "ended",
               "FAILED": "failed", "TIMEOUT": "failed", "LOST": "failed"}
_VERB = {"RUNNING": "started", "WARNING": "nears its time limit", "COMPLETED": "completed",
         "CANCELLED": "was cancelled", "FAILED": "failed", "TIMEOUT": "reached its time limit",
         "LOST": "was lost"}

def host_allowed(host: str, allowed: Iterable[str]) -> bool:
    """Whether `host` is in an allow-list of host names (`*.example.org`: its subdomains); an
    empty list allows any."""
    patterns = [a.strip().lower().rstrip(".") for a in allowed if a.strip()]
    if not patterns:
        return True
    host = host.lower().rstrip(".")
    for p in patterns:
        if p.startswith("*.") and host.endswith(p[1:]):
            return True
        if host == p:
            return True
    return False


@dataclass
class Delivery:
    """One message to one destination."""

    key: str  # the event it tells of: one message per event and destination
    channel: str  # "email" | "webhook"
    to: str
    subject: str
    text: str
    tries: int = 0

    @property
    def destination(self) -> str:
        """What takes it, as the log names it: the mail server, or a webhook's host and port
        (never its path, which often holds its secret). One destination takes one message at
        a time; a destination that hangs holds up no other."""
        if self.channel == "email":
            return "mail server"
        url = urlsplit(self.to)
        return f"webhook host {url.hostname}" + (f":{url.port}" if url.port else "")


class Permanent(Exception):
    """A destination refused a message for good (bad address, 4xx): no retry."""


@dataclass
class _Destination:
    busy: bool = False
    failures: int = 0
    down_until: float = 0.0
    waiting: deque[Delivery] = field(default_factory=deque)
    timer: asyncio.TimerHandle | None = None
    logged_at: float = -float("inf")
    dropped: int = 0


class NotifyEngine(Protocol):
    """What the notifier uses of the engine (the JobService is one)."""

    store: Store  # users' settings (the `notifications` table)

    def subscribe(self, listener: Callable[[dict[str, Any]], None]) -> Callable[[], None]:
        """Call `listener` with each engine event (`{"type": "job" | "finding", ...}`); returns
        the call that stops it."""
        ...


class Notifier:
    """Who is told what, and the delivery of it, for one engine."""

    def __init__(self, service: NotifyEngine, settings: NotifySettings | None = None,
                 logger: logging.Logger | None = None):
        self.service = service
        self.settings = settings or NotifySettings()
        self.log = logger or log
        self.users: dict[str, dict[str, Any]] = {}  # user -> {"email", "webhook", "events", "updated_at"}
        self.sent = 0
        self.failed = 0
        self.dropped = 0
        self._queue: asyncio.Queue[Delivery] | None = None
        self._seen: OrderedDict[tuple[str, str, str], None] = OrderedDict()
        self._tested: dict[str, float] = {}  # user -> when their last test message was queued (monotonic)
        self._destinations: dict[str, _Destination] = {}
        self._tasks: list[asyncio.Task[Any]] = []
        self._unsubscribe: Any = None
        self._pool: ThreadPoolExecutor | None = None
        self._http: Any = None
        self._full_logged_at = -float("inf")

    # ================================================================= life cycle

    async def start(self) -> None:
        if self._tasks:
            return
        try:
            self.users = load_settings(self.service.store)
        except Exception:
            self.log.exception("gpujobs: reading users' notification settings failed")
        if self.settings.admin_emails and not self.email_available:
            self.log.warning("gpujobs: c.GPUJobs.notify_admin_emails is set but no mail server "
                             "(c.GPUJobs.notify_smtp_host): findings are not mailed")
        self._queue = asyncio.Queue(self.settings.queue_size)
        self._tasks = [asyncio.ensure_future(self._work()) for _ in range(self.settings.workers)]
        self._unsubscribe = self.service.subscribe(self._on_message)

    #: How long stop() lets messages already queued go out (a destination that is down or
    #: hung is not waited for beyond this).
    DRAIN_S = 5.0

    async def stop(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        await self._drain(time.monotonic() + self.DRAIN_S)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        self._tasks = []
        for dest in self._destinations.values():
            if dest.timer is not None:
                dest.timer.cancel()
        self._destinations = {}
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        if self._http is not None:
            self._http.close()
            self._http = None

    async def _drain(self, deadline: float) -> None:
        """Until the messages queued when the engine stops are sent (the job that ended just
        before a restart is still told of), a destination that is down has nothing to send
        before its backoff ends, or `deadline`."""
        while self._tasks and time.monotonic() < deadline:
            now = time.monotonic()
            if not ((self._queue is not None and not self._queue.empty())
                    or any(d.busy or (d.waiting and d.down_until <= now) for d in self._destinations.values())):
                return
            await asyncio.sleep(0.05)

    # ================================================================= users' settings

    @property
    def email_available(self) -> bool:
        return bool(self.settings.smtp_host)

    def settings_for(self, user: str) -> dict[str, Any]:
        """A user's settings as `GET notifications` shows them, with what this engine offers."""
        mine = self.users.get(user) or {}
        return {
            "user": user,
            "email": mine.get("email"),
            "webhook": mine.get("webhook"),
            "events": list(mine.get("events", DEFAULT_KINDS)),
            "updated_at": mine.get("updated_at"),
            "email_available": self.email_available,
            "kinds": list(KINDS),
            "webhook_hosts": list(self.settings.webhook_hosts),
        }

    def set_settings(self, user: str, body: dict[str, Any]) -> dict[str, Any]:
        """A user sets their own settings: `email`, `webhook` (null clears one) and `events`
        (kinds, see KINDS); fields left out keep their value. Stored first, so they outlive
        restarts. InvalidInput names a bad field."""
        unknown = sorted(set(body) - {"email", "webhook", "events"})
        if unknown:
            raise InvalidInput(unknown[0], "unknown field; expected email, webhook, events")
        current = self.users.get(user) or {}
        new = {"email": current.get("email"), "webhook": current.get("webhook"),
               "events": list(current.get("events", DEFAULT_KINDS))}
        if "email" in body:
            new["email"] = None if body["email"] in (None, "") else self.check_email(body["email"])
            if new["email"] is not None and not self.email_available:
                raise Conflict("email", "this engine sends no e-mail (no mail server is set: "
                                        "c.GPUJobs.notify_smtp_host); use a webhook")
        if "webhook" in body:
            new["webhook"] = None if body["webhook"] in (None, "") else self.check_webhook(body["webhook"])
        if "events" in body:
            events = body["events"]
            if not isinstance(events, list) or not all(isinstance(e, str) for e in events):
                raise InvalidInput("events", f"expected a list of kinds, some of {', '.join(KINDS)}")
            bad = [e for e in events if e not in KINDS]
            if bad:
                raise InvalidInput("events", f"unknown kind {bad[0][:40]!r}; kinds are {', '.join(KINDS)}")
            new["events"] = [k for k in KINDS if k in events]
        now = time.time()
        if new["email"] is None and new["webhook"] is None:
            save_settings(self.service.store, user, None, now)
            self.users.pop(user, None)
        else:
            save_settings(self.service.store, user, new, now)
            self.users[user] = {**new, "updated_at": now}
        self.log.info("gpujobs: %s set their notifications: %s", user, self._describe(self.users.get(user)))
        return self.settings_for(user)

    def check_email(self, value: Any) -> str:
        address = validate_email(value)
        domains = [d.lower() for d in self.settings.email_domains]
        if domains and address.rsplit("@", 1)[1].lower() not in domains:
            raise InvalidInput("email", f"this engine mails only addresses in {', '.join(domains)} "
                                        "(c.GPUJobs.notify_email_domains)")
        return address

    def check_webhook(self, value: Any) -> str:
        url = validate_webhook(value)
        host = urlsplit(url).hostname or ""
        if not host_allowed(host, self.settings.webhook_hosts):
            raise InvalidInput("webhook", f"webhooks may post only to {', '.join(self.settings.webhook_hosts)} "
                                          f"here (c.GPUJobs.notify_webhook_hosts), not to {host!r}")
        problem = None if self.may_post_privately(host) else literal_problem(host)
        if problem:
            raise InvalidInput("webhook", f"{problem}: webhooks may post only to public addresses here, unless "
                                          "an admin allows more (c.GPUJobs.notify_private_webhooks)")
        return url

    def may_post_privately(self, host: str) -> bool:
        """Whether a webhook may post to `host` at a non-public address (addresses.py): an admin
        allows it for all (notify_private_webhooks), for hosts they named (notify_webhook_hosts),
        and for their own webhooks' hosts."""
        s = self.settings
        return (s.private_webhooks or bool(s.webhook_hosts) and host_allowed(host, s.webhook_hosts)
                or host.lower() in {(urlsplit(u).hostname or "") for u in s.admin_webhooks})

    @staticmethod
    def _describe(settings: dict[str, Any] | None) -> str:
        """Settings for the log: where to (a webhook by its host only), and what."""
        if not settings:
            return "none"
        where = ["e-mail"] if settings.get("email") else []
        if settings.get("webhook"):
            where.append(f"webhook to {urlsplit(settings['webhook']).hostname}")
        return f"{' and '.join(where)} on {', '.join(settings.get('events') or []) or 'nothing'}"

    def send_test(self, user: str) -> list[str]:
        """Queue a test message to the user's destinations now; returns their channels.
        Conflict when the user has none set; TooSoon within `TEST_INTERVAL_S` of their last."""
        left = TEST_INTERVAL_S - (time.monotonic() - self._tested.get(user, -math.inf))
        if left > 0:  # (each test reaches an address the user names: the engine is no mailer for them)
            raise TooSoon(f"a test message went out less than a minute ago (one a minute): try again in "
                          f"{math.ceil(left)} s", math.ceil(left))
        mine = self.users.get(user) or {}
        text = (f"This is a test of your jupyter-gpujobs notifications on {self.settings.server}: "
                "messages about your jobs will look like this.")
        key = f"test:{user}:{time.time()}"
        channels = [d.channel for d in self._to_user(user, mine, key, "[gpujobs] test notification", text)
                    if self._enqueue(d)]
        if not channels:
            raise Conflict(None, "you have no notifications set (PUT notifications with an email or webhook)")
        self._tested[user] = time.monotonic()
        return channels

    # ================================================================= who is told what

    def _on_message(self, message: dict[str, Any]) -> None:
        """An engine event (on the engine's loop: only decides and queues, never waits)."""
        try:
            if message.get("type") == "job":
                self._on_job(message)
            elif message.get("type") == "finding":
                self._on_finding(message.get("finding") or {})
            elif message.get("type") == "budget":
                self._on_budget(message)
        except Exception:
            self.log.exception("gpujobs: preparing a notification failed")

    def _on_job(self, message: dict[str, Any]) -> None:
        job, event = message.get("job") or {}, message.get("event") or {}
        state = event.get("state")
        kind = _EVENT_KIND.get(state or "")
        if kind is None or (state in ("RUNNING", "WARNING") and job.get("state") != "RUNNING"):
            return  # (a start or warning published after the job ended tells nothing)
        owner = job.get("user")
        mine = self.users.get(owner or "")
        if not mine or kind not in mine.get("events", ()):
            return
        # one message per event: a start per run (a requeued job starts again), one end
        run = job.get("started_at") or event.get("time")
        key = f"job:{job.get('id')}:{state}:{run}" if state in ("RUNNING", "WARNING") else f"job:{job.get('id')}:end"
        subject, text = self._job_text(job, event)
        for d in self._to_user(owner, mine, key, subject, text):
            self._enqueue(d)

    def _job_text(self, job: dict[str, Any], event: dict[str, Any]) -> tuple[str, str]:
        state = event.get("state") or job.get("state") or ""
        name = _plain(job.get("name") or "")
        title = f"job {job.get('id')}" + (f" ({name})" if name else "")
        subject = f"[gpujobs] {title} {_VERB.get(state, state.lower())}"
        lines = [f"Your {title} {_VERB.get(state, state.lower())} on {self.settings.server}."]
        reason = _plain(event.get("reason") or "")
        if reason:
            lines.append(f"Reason: {reason}")
        if state in ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "LOST"):
            started, ended = job.get("started_at"), job.get("ended_at")
            if started and ended:
                lines.append(f"Ran for {format_duration(max(0.0, ended - started))}.")
            if job.get("exit_code") is not None:
                lines.append(f"Exit code: {job['exit_code']}")
        gpus = job.get("assigned_gpus") or []
        if gpus and state in ("RUNNING", "WARNING"):
            lines.append(f"GPUs: {', '.join(str(g) for g in gpus)}" + (f" on {job['host']}" if job.get("host") else ""))
        return subject, "\n".join(lines)

    def _on_finding(self, finding: dict[str, Any]) -> None:
        if not finding.get("open") or finding.get("id") is None:
            return  # told when it opens, not when it closes
        key = f"finding:{finding['id']}"
        message = _plain(finding.get("message") or "")
        subject = f"[gpujobs] {finding.get('severity', 'warning')}: {message[:120]}"
        text = f"{message}\n\n({finding.get('kind')} on {self.settings.server}; see `jupyter gpujobs findings`)"
        s = self.settings
        for address in s.admin_emails if self.email_available else ():
            self._enqueue(Delivery(key, "email", address, subject, text))
        for url in s.admin_webhooks:
            self._enqueue(Delivery(key, "webhook", url, subject, text))
        for user, mine in list(self.users.items()):
            if "finding" in mine.get("events", ()) and may_see(finding, user, False):
                for d in self._to_user(user, mine, key, subject, text):
                    self._enqueue(d)

    def _on_budget(self, message: dict[str, Any]) -> None:
        """A GPU-hour budget reached 80 % or 100 % (engine/rules.py): its users are told, at
        their addresses, when they take warnings; once per budget, period and level."""
        b, level = message.get("budget") or {}, int(message.get("level") or 0)
        whose = f"{'user' if b.get('scope') == 'users' else 'group'} {_plain(str(b.get('name')))}"
        state = "is used up" if level >= 100 else f"is {level} % used"
        subject = f"[gpujobs] the GPU-hour budget of {whose} {state}"
        lines = [f"The budget of {whose} on {self.settings.server}: {b.get('used_gpu_hours', 0):.2f} of "
                 f"{b.get('gpu_hours', 0):g} GPU-hours used, {b.get('left_gpu_hours', 0):.2f} left."]
        if level >= 100:
            lines.append("New jobs run at low priority." if b.get("mode") == "low" else
                         "New jobs wait until it renews or an admin raises it.")
        key = f"budget:{b.get('scope')}:{b.get('name')}:{b.get('period_start')}:{level}"
        for user in message.get("users") or ():
            mine = self.users.get(user)
            if mine and "warning" in mine.get("events", ()):
                for d in self._to_user(user, mine, key, subject, "\n".join(lines)):
                    self._enqueue(d)

    def _to_user(self, user: str, mine: dict[str, Any], key: str, subject: str, text: str) -> list[Delivery]:
        out = [Delivery(key, "email", mine["email"], subject, text)] if mine.get("email") and self.email_available else []
        if mine.get("webhook"):
            out.append(Delivery(key, "webhook", mine["webhook"], subject, text))
        return out

    # ================================================================= delivery

    def _enqueue(self, d: Delivery) -> bool:
        """Queue a message once (per event and destination); never waits: a full queue drops it."""
        seen = (d.key, d.channel, d.to)
        if seen in self._seen:
            return False
        self._seen[seen] = None
        if len(self._seen) > 20_000:
            self._seen.popitem(last=False)
        if self._queue is None:
            return False
        try:
            self._queue.put_nowait(d)
            return True
        except asyncio.QueueFull:
            self.dropped += 1
            now = time.monotonic()
            if now - self._full_logged_at >= self.settings.log_interval_s:
                self._full_logged_at = now
                self.log.warning("gpujobs: %d notification(s) wait to be sent; new ones are dropped "
                                 "(%d so far; logged once per %s)", self._queue.qsize(), self.dropped,
                                 format_duration(self.settings.log_interval_s))
            return False

    def _destination(self, d: Delivery) -> _Destination:
        return self._destinations.setdefault(d.destination, _Destination())

    async def _work(self) -> None:
        assert self._queue is not None
        while True:
            d = await self._queue.get()
            dest = self._destination(d)
            wait = dest.down_until - time.monotonic()
            if dest.busy or wait > 0:
                self._hold(dest, d)
                if not dest.busy and dest.timer is None:  # (released when its backoff ends)
                    dest.timer = asyncio.get_running_loop().call_later(wait, self._release, dest)
                continue
            dest.busy = True
            try:
                await self._deliver(d)
            except asyncio.CancelledError:
                raise
            except Exception as err:
                self._failed(dest, d, err)
            else:
                self.sent += 1
                self._recovered(d.destination, dest)
            finally:
                dest.busy = False
            if dest.down_until <= time.monotonic():
                self._release(dest)

    def _hold(self, dest: _Destination, d: Delivery, first: bool = False) -> None:
        """Keep a message for a destination that is busy or down, bounded: the oldest go."""
        if len(dest.waiting) >= self.settings.queue_size:
            dest.waiting.popleft()
            dest.dropped += 1
            self.dropped += 1
        if first:
            dest.waiting.appendleft(d)
        else:
            dest.waiting.append(d)

    def _release(self, dest: _Destination) -> None:
        """The destination may take messages again: its next waiting one goes to the queue."""
        dest.timer = None
        if not dest.waiting or self._queue is None or dest.busy:  # (busy: released when it is done)
            return
        if self._queue.full():  # (the workers are behind: try again shortly)
            dest.timer = asyncio.get_running_loop().call_later(1.0, self._release, dest)
            return
        self._queue.put_nowait(dest.waiting.popleft())

    def _failed(self, dest: _Destination, d: Delivery, err: Exception) -> None:
        self.failed += 1
        now = time.monotonic()
        d.tries += 1
        permanent = isinstance(err, Permanent)
        if not permanent:
            dest.failures += 1
            backoff = min(self.settings.retry_max_s, self.settings.retry_base_s * 2 ** (dest.failures - 1))
            dest.down_until = now + backoff
            if d.tries <= self.settings.retries:
                self._hold(dest, d, first=True)
            else:
                dest.dropped += 1
                self.dropped += 1
            if dest.timer is not None:
                dest.timer.cancel()
            dest.timer = asyncio.get_running_loop().call_later(backoff, self._release, dest)
        if now - dest.logged_at >= self.settings.log_interval_s:
            dest.logged_at = now
            what = "refused a notification" if permanent else "cannot be reached"
            self.log.warning("gpujobs: notifications: %s %s: %s; %s (%d waiting, %d dropped; this is logged "
                             "once per %s while it lasts)", d.destination, what, _error_text(err),
                             "not retried" if permanent else f"retrying in {format_duration(dest.down_until - now)}",
                             len(dest.waiting), dest.dropped, format_duration(self.settings.log_interval_s))

    def _recovered(self, name: str, dest: _Destination) -> None:
        if dest.failures:
            self.log.info("gpujobs: notifications: %s takes messages again", name)
        dest.failures = 0
        dest.down_until = 0.0
        dest.logged_at = -float("inf")

    async def _deliver(self, d: Delivery) -> None:
        if d.channel == "email":
            if self._pool is None:
                self._pool = ThreadPoolExecutor(2, thread_name_prefix="gpujobs-mail")
            loop = asyncio.get_running_loop()
            await asyncio.wait_for(loop.run_in_executor(self._pool, self._send_mail, d),
                                   self.settings.timeout_s * 3)
        else:
            await self._post(d)

    def _send_mail(self, d: Delivery) -> None:
        """Send one mail (in a thread; every step bounded by the timeout)."""
        s = self.settings
        msg = EmailMessage()
        msg["From"] = s.smtp_from
        msg["To"] = d.to
        msg["Subject"] = d.subject
        msg["Date"] = formatdate(localtime=True)
        msg["Message-ID"] = make_msgid(domain=s.server or None)
        msg["Auto-Submitted"] = "auto-generated"
        msg.set_content(d.text)
        try:
            smtp: smtplib.SMTP
            if s.smtp_security == "ssl":
                smtp = smtplib.SMTP_SSL(s.smtp_host, s.smtp_port, timeout=s.timeout_s,
                                        context=ssl.create_default_context())
            else:
                smtp = smtplib.SMTP(s.smtp_host, s.smtp_port, timeout=s.timeout_s)
            with smtp:
                if s.smtp_security == "starttls":
                    smtp.starttls(context=ssl.create_default_context())
                if s.smtp_user:
                    smtp.login(s.smtp_user, s.smtp_password)
                smtp.send_message(msg)
        except smtplib.SMTPRecipientsRefused as err:
            raise Permanent(f"the mail server refused the address: {_refusal(err)}") from None
        except smtplib.SMTPAuthenticationError as err:
            raise RuntimeError(f"login as {s.smtp_user!r} refused ({err.smtp_code})") from None
        except smtplib.SMTPResponseException as err:
            if 500 <= err.smtp_code < 600:
                raise Permanent(f"the mail server answered {err.smtp_code}") from None
            raise

    async def _post(self, d: Delivery) -> None:
        from tornado.httpclient import AsyncHTTPClient, HTTPRequest

        host = urlsplit(d.to).hostname or ""
        if not host_allowed(host, self.settings.webhook_hosts) and d.to not in self.settings.admin_webhooks:
            raise Permanent(f"{host!r} is not in c.GPUJobs.notify_webhook_hosts")
        if self._http is None:  # its own client: a slow webhook takes no connection of the server's
            self._http = AsyncHTTPClient(force_instance=True, max_clients=self.settings.workers,
                                         resolver=PublicOnlyResolver(allowed=self.may_post_privately))
        t = self.settings.timeout_s
        request = HTTPRequest(d.to, method="POST", body=json.dumps({"text": f"{d.subject}\n{d.text}"}),
                              headers={"Content-Type": "application/json"}, connect_timeout=t,
                              request_timeout=t, follow_redirects=False, user_agent="jupyter-gpujobs")
        response = await self._http.fetch(request, raise_error=False)
        code = response.code
        if 200 <= code < 300:
            return
        if isinstance(response.error, PrivateAddress):  # (set before these rules, or a name that resolves so)
            raise Permanent(str(response.error))
        if code == 599:
            raise ConnectionError(str(response.error) if response.error else "no answer")
        if code == 429 or code >= 500:
            raise ConnectionError(f"HTTP {code}")
        raise Permanent(f"HTTP {code}")


def _plain(text: str) -> str:
    """Text for a subject line or a chat message: no control characters."""
    return CONTROL_CHARACTERS.sub(" ", text).strip()


def _refusal(err: smtplib.SMTPRecipientsRefused) -> str:
    codes = {code for code, _ in err.recipients.values()}
    return ", ".join(str(c) for c in sorted(codes)) or "refused"


def _error_text(err: BaseException) -> str:
    if isinstance(err, asyncio.TimeoutError):
        return "timed out"
    text = str(err) or type(err).__name__
    return text[:300]
