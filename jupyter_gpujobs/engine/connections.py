"""What keeps the engine's server up under a flood of connections or a failing store (issue 32).

- `raise_open_files_limit`: the soft RLIMIT_NOFILE raised to the hard one at start (1024 open
  files was soon all of them: every request then failed), remembered for `GET info` and
  `jupyter gpujobs doctor`.
- `set_timeouts`: idle connections (no request begun) and half-sent ones (a body that stops
  coming) are closed after a timeout, on the Jupyter server's own HTTP server (its
  `conn_params`, which jupyter_server leaves to tornado's defaults of an hour and none) and the
  shared engine's.
- `PeerCappedHTTPServer`: the shared engine's server on its Unix socket takes at most
  `max_per_peer` open connections of one Unix user (known by the socket's peer credentials);
  more are closed at once, so one user's flood cannot take every file the engine may open.
- `RepeatFilter`: a warning or error logged again and again (the same text, numbers aside)
  is written once per interval, the next one saying how many like it were left out (a full fd
  table or a database outage wrote tens of thousands of lines a second).

May call: tornado, logging and the OS only.
"""

from __future__ import annotations

import logging
import os
import re
import resource
import socket
import struct
import time
from collections.abc import Callable, Iterable
from typing import Any

from tornado.httpserver import HTTPServer
from tornado.iostream import IOStream

log = logging.getLogger("jupyter_gpujobs")

#: the open-files limit this process found and set at start: {"soft", "hard", "raised_from"}
OPEN_FILES: dict[str, int | None] = {}


def raise_open_files_limit() -> dict[str, int | None]:
    """Raise the soft RLIMIT_NOFILE to the hard one (an unlimited hard one: to 1,048,576);
    returns {"soft", "hard", "raised_from" (None when it was already there)}."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    raised_from: int | None = None
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            raised_from, soft = soft, target
        except (ValueError, OSError) as err:
            log.warning("gpujobs: could not raise the open-files limit from %d to %d: %s", soft, target, err)
    OPEN_FILES.update({"soft": soft, "hard": None if hard == resource.RLIM_INFINITY else hard,
                       "raised_from": raised_from})
    return dict(OPEN_FILES)


def open_files_report() -> dict[str, Any]:
    """The limit (as set at start) and how many files this process has open now."""
    out: dict[str, Any] = dict(OPEN_FILES) or {"soft": resource.getrlimit(resource.RLIMIT_NOFILE)[0]}
    try:
        out["in_use"] = len(os.listdir("/proc/self/fd"))
    except OSError:
        out["in_use"] = None
    return out


def set_timeouts(server: HTTPServer, idle_s: float, body_s: float) -> None:
    """Close a connection that begins no request within `idle_s` seconds (also between
    requests of a kept-alive one) or whose request body stalls for `body_s` seconds."""
    params = server.conn_params
    params.header_timeout = idle_s
    params.body_timeout = body_s


def peer_uid(stream: IOStream) -> int | None:
    """The Unix user at the other end of a Unix-socket stream (None for TCP)."""
    sock = stream.socket
    if sock is None or sock.family != socket.AF_UNIX:
        return None
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    return int(struct.unpack("3i", creds)[1])


class PeerCappedHTTPServer(HTTPServer):
    """An HTTPServer that keeps at most `max_per_peer` connections of one Unix user open."""

    max_per_peer = 256
    _open: dict[int, list[IOStream]]

    def handle_stream(self, stream: IOStream, address: Any) -> None:
        uid = peer_uid(stream)
        if uid is not None:
            opened = getattr(self, "_open", None)
            if opened is None:
                opened = self._open = {}
            live = [s for s in opened.get(uid, ()) if not s.closed()]
            if len(live) >= self.max_per_peer:
                log.warning("gpujobs: uid %d has %d connections open to the engine (the most one user may: "
                            "c.GPUJobs.max_connections_per_user); closed another", uid, len(live))
                stream.close()
                opened[uid] = live
                return
            live.append(stream)
            opened[uid] = live
        super().handle_stream(stream, address)


_NUMBERS = re.compile(r"\d+(?:\.\d+)?")


class RepeatFilter(logging.Filter):
    """Let a warning or error through once per `interval_s` for each shape of message (its
    text, with numbers masked where `mask_numbers`: a duration, an fd, a port; its logger,
    level and exception type); the first one after an interval says how many were left out.
    Lower levels pass untouched."""

    def __init__(self, interval_s: float = 60.0, clock: Callable[[], float] = time.monotonic,
                 min_level: int = logging.WARNING, mask_numbers: bool = True):
        super().__init__()
        self.interval_s = interval_s
        self.min_level = min_level
        self.mask_numbers = mask_numbers
        self.clock = clock
        self._seen: dict[tuple[str, int, str, str], list[float]] = {}  # shape -> [since, left out]

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < self.min_level:
            return True
        try:
            text = record.getMessage()
        except Exception:  # a record whose arguments do not fit: let logging report it
            return True
        exc = record.exc_info[0].__name__ if record.exc_info and record.exc_info[0] else ""
        key = (record.name, record.levelno, (_NUMBERS.sub("#", text) if self.mask_numbers else text)[:300], exc)
        now = self.clock()
        entry = self._seen.get(key)
        if entry is not None and now - entry[0] < self.interval_s:
            entry[1] += 1
            return False
        if len(self._seen) > 2000:  # forget the shapes whose interval is over
            self._seen = {k: v for k, v in self._seen.items() if now - v[0] < self.interval_s}
        if entry is not None and entry[1]:
            record.msg = (f"{text} [{int(entry[1])} more like this in the last {now - entry[0]:.0f}s were not "
                          "logged]")
            record.args = None
        self._seen[key] = [now, 0]
        return True


def install_repeat_filter(logger_names: Iterable[str], interval_s: float = 60.0) -> RepeatFilter:
    """One RepeatFilter on each named logger (once: a second call adds none). The engine's own
    lines are repeats only when their text is the same (a job id makes another line); tornado's
    connection notes ("Timeout reading body from ...", one per closed connection) are kept
    down from INFO on."""
    shared = RepeatFilter(interval_s)
    for name in logger_names:
        logger = logging.getLogger(name)
        if any(isinstance(f, RepeatFilter) for f in logger.filters):
            continue
        if name == "jupyter_gpujobs":
            logger.addFilter(RepeatFilter(interval_s, mask_numbers=False))
        elif name == "tornado.general":
            logger.addFilter(RepeatFilter(interval_s, min_level=logging.INFO))
        else:
            logger.addFilter(shared)
    return shared


#: loggers whose repeats are kept down: the engine's, tornado's (accept errors, uncaught
#: exceptions, the access log) and asyncio's (exceptions in callbacks)
NOISY_LOGGERS = ("jupyter_gpujobs", "tornado.application", "tornado.general", "tornado.access", "asyncio")


__all__ = ["NOISY_LOGGERS", "OPEN_FILES", "PeerCappedHTTPServer", "RepeatFilter", "install_repeat_filter",
           "open_files_report", "peer_uid", "raise_open_files_limit", "set_timeouts"]
