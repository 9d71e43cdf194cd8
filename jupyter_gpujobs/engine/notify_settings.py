"""`NotifySettings`: what the notifier (notify.py) is told, from the c.GPUJobs.notify_* traitlets.

The traitlets and their checks are config.py's; this is their plain-data form, with the SMTP
password read from the environment variable or file the admin named. May call: nothing of
the package.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import Any


def _smtp_password(cfg: Any) -> str:
    if cfg.notify_smtp_password_env:
        return os.environ.get(cfg.notify_smtp_password_env, "")
    if cfg.notify_smtp_password_file:
        try:
            with open(cfg.notify_smtp_password_file, encoding="utf-8") as f:
                return f.readline().rstrip("\r\n")
        except OSError as err:
            raise SystemExit(f"c.GPUJobs.notify_smtp_password_file: cannot read it: {err.strerror}") from None
    return ""


@dataclass(frozen=True)
class NotifySettings:
    """What the notifier is told (the c.GPUJobs.notify_* traitlets, see config.py)."""

    smtp_host: str = ""
    smtp_port: int = 25
    smtp_security: str = "none"  # "none" | "starttls" | "ssl"
    smtp_from: str = ""
    smtp_user: str = ""
    smtp_password: str = field(default="", repr=False)
    webhook_hosts: tuple[str, ...] = ()
    private_webhooks: bool = False  # users' webhooks may post to non-public addresses (addresses.py)
    email_domains: tuple[str, ...] = ()
    admin_emails: tuple[str, ...] = ()
    admin_webhooks: tuple[str, ...] = ()
    timeout_s: float = 10.0
    retries: int = 5
    retry_base_s: float = 2.0
    retry_max_s: float = 300.0
    log_interval_s: float = 300.0  # a failing destination is logged once per this
    queue_size: int = 1000
    workers: int = 4
    server: str = ""  # this machine's name, in the messages

    @classmethod
    def from_config(cls, cfg: Any) -> NotifySettings:
        security = cfg.notify_smtp_security
        port = cfg.notify_smtp_port or (465 if security == "ssl" else 25)
        server = socket.gethostname()
        return cls(
            smtp_host=cfg.notify_smtp_host, smtp_port=port, smtp_security=security,
            smtp_from=cfg.notify_smtp_from or f"gpujobs@{server}", smtp_user=cfg.notify_smtp_user,
            smtp_password=_smtp_password(cfg), webhook_hosts=tuple(cfg.notify_webhook_hosts),
            private_webhooks=cfg.notify_private_webhooks,
            email_domains=tuple(cfg.notify_email_domains), admin_emails=tuple(cfg.notify_admin_emails),
            admin_webhooks=tuple(cfg.notify_admin_webhooks), timeout_s=cfg.notify_timeout,
            retries=cfg.notify_retries, server=server)
