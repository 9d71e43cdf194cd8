"""Who calls the shared engine: the Unix user at the other end of its socket.

The engine listens on a Unix socket; the kernel tells it the uid of the connecting process
(`SO_PEERCRED`), and the user is that uid's name. There is no token, header or name a caller
could send to be someone else. (Who is an admin is the engine's rule: `JobService.is_admin`.)
"""

from __future__ import annotations

import pwd
import socket
import struct
from typing import Any

from jupyter_server.auth.identity import IdentityProvider, User

_CRED = struct.Struct("3i")  # pid, uid, gid


def peer_uid(handler: Any) -> int | None:
    """The uid of the process at the other end of a request's Unix socket (None over TCP)."""
    stream = handler.request.connection.stream
    cached = getattr(stream, "_gpujobs_peer_uid", None)
    if cached is not None:
        return cached
    sock = stream.socket
    if sock is None or sock.family != socket.AF_UNIX:
        return None
    _pid, uid, _gid = _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
    stream._gpujobs_peer_uid = uid  # one connection, one peer: keep-alive requests ask once
    return uid


def peer_pid(handler: Any) -> int | None:
    """The pid of the process at the other end of a request's Unix socket (None over TCP)."""
    sock = handler.request.connection.stream.socket
    if sock is None or sock.family != socket.AF_UNIX:
        return None
    pid, _uid, _gid = _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
    return pid


def user_name(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None  # a uid with no account is nobody the engine can run jobs for


class PeerCredIdentityProvider(IdentityProvider):
    """jupyter_server identity: the socket peer's Unix user; no tokens, cookies or logins."""

    def get_user(self, handler: Any) -> User | None:  # type: ignore[override]
        uid = peer_uid(handler)
        name = user_name(uid) if uid is not None else None
        return User(username=name) if name else None

    def is_token_authenticated(self, handler: Any) -> bool:
        # the kernel vouches for every request (no cookie a page could ride on): no XSRF check
        return True
