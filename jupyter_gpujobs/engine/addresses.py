"""Where a user's webhook may post: public addresses only, unless an admin allows more.

The engine posts a user's webhook from inside the machine, so a webhook to `127.0.0.1`, a
private network or a cloud's metadata address (`169.254.169.254`) would let a user reach
services that only the machine can (request forgery). Such addresses are refused:

- when the webhook is set, for an address written in the URL (any form the resolver takes
  without DNS: `127.1`, `2130706433`, `[::ffff:127.0.0.1]`) and for `localhost` names;
- when it is delivered, for a host name that resolves to one: the very addresses the HTTP
  client connects to are checked (`PublicOnlyResolver`), so a name that changes what it
  resolves to between the check and the connection is caught too.

An admin allows them with `c.GPUJobs.notify_private_webhooks = True`, or for chosen hosts by
naming them in `c.GPUJobs.notify_webhook_hosts` (an internal chat server), and the admins'
own webhooks (`c.GPUJobs.notify_admin_webhooks`) are always allowed.

May call: the standard library and tornado's resolver; nothing else of ours.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from typing import Any

from tornado.netutil import DefaultLoopResolver, Resolver


class PrivateAddress(ConnectionError):
    """A webhook's host is (or resolves to) an address users' webhooks may not post to."""


def is_public(address: str) -> bool:
    """Whether an IP address is a public (globally routable unicast) one: not loopback,
    private, link-local, shared, reserved, unspecified or multicast; an IPv4-mapped or
    -translated IPv6 address counts as its IPv4 one."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address):
        inner = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if inner is not None:
            ip = inner
    return ip.is_global and not ip.is_multicast


def _literal(host: str) -> str | None:
    """The address a host written as an IP address stands for (in any form the system's
    resolver reads without DNS: `127.1`, `0x7f.1`, `2130706433`), or None for a name."""
    try:
        infos = socket.getaddrinfo(host, None, flags=socket.AI_NUMERICHOST)
    except (socket.gaierror, UnicodeError, ValueError):
        return None
    return str(infos[0][4][0]) if infos else None


def literal_problem(host: str) -> str | None:
    """Why a webhook host is refused from its text alone (an IP address that is not public, or
    a `localhost` name), or None: a name is checked when it is resolved (`PublicOnlyResolver`)."""
    name = host.lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return f"{host} is this machine"
    address = _literal(name.strip("[]"))
    if address is not None and not is_public(address):
        return f"{host} is not a public address"
    return None


class PublicOnlyResolver(Resolver):
    """A tornado resolver that refuses (PrivateAddress) a host that resolves to any address
    that is not public, unless `allowed(host)`."""

    def initialize(self, allowed: Callable[[str], bool]) -> None:  # type: ignore[override]
        self._inner = DefaultLoopResolver()
        self._allowed = allowed

    async def resolve(self, host: str, port: int,  # type: ignore[override]
                      family: socket.AddressFamily = socket.AF_UNSPEC) -> list[tuple[int, Any]]:
        found = await self._inner.resolve(host, port, family)
        if self._allowed(host):
            return found
        for _family, sockaddr in found:
            if not is_public(str(sockaddr[0])):
                raise PrivateAddress(f"{host} resolves to {sockaddr[0]}, not a public address "
                                     "(c.GPUJobs.notify_private_webhooks)")
        return found


__all__ = ["PrivateAddress", "PublicOnlyResolver", "is_public", "literal_problem"]
