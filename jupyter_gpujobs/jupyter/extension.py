"""The Jupyter server extension. It either hosts the engine (a personal deployment) or, when
the machine has a shared engine (`c.GPUJobs.engine_url`, or the default socket exists),
forwards its `{base_url}gpujobs/api/` routes to it (forward.py) and hosts none.

Hosting: builds the engine from `c.GPUJobs` settings (engine/app.py), mounts the REST API
and websocket, starts the engine loops once the server's event loop runs.
Either way it gives kernels what the client needs in their environment: `GPUJOBS_URL` (and,
for its own engine, `GPUJOBS_TOKEN`, see docs/shared-server.md for why that is safe).
"""

from __future__ import annotations

import getpass
import json
import os
from pathlib import Path

from jupyter_core.paths import jupyter_data_dir
from jupyter_server.base.handlers import APIHandler
from jupyter_server.extension.application import ExtensionApp
from tornado import web
from traitlets import Any, Instance, TraitError, Unicode

from ..config import GPUJobs
from ..engine.api.handlers import HANDLERS
from ..engine.app import build_engine, describe, engine_settings, start_engine, stop_engine
from ..engine.connections import set_timeouts
from ..engine.service import JobService


def not_started_text(err: Exception) -> str:
    """What a user reads when the extension could not start: the cause, and what to do."""
    if isinstance(err, TraitError):  # a setting: its own message names it and the value
        return (f"jupyter-gpujobs did not start: {err}. Fix that setting (jupyter_server_config.py or "
                "the server's command line) and restart the server.")
    return (f"jupyter-gpujobs did not start: {type(err).__name__}: {err}. `jupyter gpujobs doctor` "
            "says what is in force; the server's log has the details. Fix it and restart the server.")


class NotStartedHandler(APIHandler):
    """Every gpujobs/api/ request of a server whose extension could not start: 503 saying why
    (to authenticated users only: the reason may quote the server's settings)."""

    def initialize(self, reason: str) -> None:
        self.reason = reason

    async def prepare(self) -> None:
        await super().prepare()
        if not self.current_user:
            raise web.HTTPError(403)
        self.set_status(503)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"message": self.reason, "field": None}))


def shared_engine_socket(cfg: GPUJobs) -> str | None:
    """The shared engine's socket this server should forward to, or None to host an engine."""
    url = cfg.engine_url.strip()
    if url:
        if not url.startswith("unix://"):
            raise ValueError(f"c.GPUJobs.engine_url: expected unix:///path/to/engine.sock, got {url!r}")
        return url[len("unix://"):]
    path = cfg.engine_socket
    return path if path and os.path.exists(path) else None


class GPUJobsApp(ExtensionApp):
    name = "jupyter_gpujobs"
    description = "GPU job queue and scheduler for Jupyter"
    load_other_extensions = True

    settings_obj = Instance(GPUJobs, allow_none=True)
    service = Instance(JobService, allow_none=True)
    monitor = Any(None, allow_none=True)  # monitor.Monitor, built with the service
    engine_socket = Unicode(None, allow_none=True)  # set: this server forwards to the shared engine
    #: why the extension could not start (a bad setting, a store it cannot open): every request
    #: under gpujobs/api/ is answered 503 with it, so the CLI, doctor and the panel say what to fix
    #: instead of finding no extension at all
    not_started = Unicode(None, allow_none=True)

    def initialize_settings(self) -> None:
        try:
            self._initialize_settings()
        except Exception as err:
            self.not_started = not_started_text(err)
            self.log.error("gpujobs: %s", self.not_started, exc_info=not isinstance(err, TraitError))

    def _initialize_settings(self) -> None:
        server = self.serverapp
        cfg = GPUJobs(parent=server)
        self.settings_obj = cfg
        unix_user = getpass.getuser()
        self.engine_socket = shared_engine_socket(cfg)
        if self.engine_socket:
            # Kernels, jobs and terminals talk to the shared engine themselves, as their Unix user.
            os.environ["GPUJOBS_URL"] = "unix://" + self.engine_socket
            os.environ.pop("GPUJOBS_TOKEN", None)
            self.settings["gpujobs_engine_socket"] = self.engine_socket
            self.log.info("gpujobs: forwarding gpujobs/api/ to the shared engine at %s as Unix user %s "
                          "(this server hosts no engine)", self.engine_socket, unix_user)
            return

        data_dir = Path(cfg.state_dir or os.path.join(jupyter_data_dir(), "gpujobs"))
        identity = cfg.user_identity
        if identity == "auto":
            from jupyter_server.auth.identity import IdentityProvider, PasswordIdentityProvider

            provider = type(server.identity_provider)
            identity = "unix" if provider in (IdentityProvider, PasswordIdentityProvider) else "jupyter"

        url = server.connection_url.rstrip("/") + "/"
        token = server.identity_provider.token or ""
        job_env = {"GPUJOBS_URL": url, "GPUJOBS_TOKEN": token}
        private = (identity == "jupyter") if cfg.private_data is None else cfg.private_data
        self.service, self.monitor = build_engine(
            cfg, self.log, data_dir=data_dir, root_dir=Path(server.root_dir).expanduser().resolve(),
            job_env=job_env,
            admin_users=set(cfg.admin_users) | ({unix_user} if identity == "unix" else set()),
            private_data=private)
        # Kernels (and jobs) started by this server find the engine with no arguments.
        os.environ.update(job_env)
        self.settings.update(engine_settings(self.service, self.monitor, identity, unix_user,
                                             cfg.max_body_bytes))
        self.log.info("gpujobs: %s; owner identity: %s; private data %s", describe(self.service), identity,
                      "on" if private else "off")

    def initialize_handlers(self) -> None:
        if self.not_started is not None:
            self.handlers.append((r"/gpujobs/api(?:/.*)?", NotStartedHandler, {"reason": self.not_started}))
            return
        if self.engine_socket:
            from .forward import FORWARD_HANDLERS

            self.handlers.extend(FORWARD_HANDLERS)
            return
        from ..engine.api.accounting import ACCOUNTING_HANDLERS
        from ..engine.api.monitor import MONITOR_HANDLERS

        self.handlers.extend(HANDLERS)
        self.handlers.extend(MONITOR_HANDLERS)
        self.handlers.extend(ACCOUNTING_HANDLERS)

    async def _start_jupyter_server_extension(self, serverapp: object) -> None:
        if self.not_started is not None:
            return
        if self.service is not None:
            await start_engine(self.service, self.monitor)
        cfg = self.settings_obj
        server = getattr(serverapp, "http_server", None)
        if cfg is not None and server is not None:  # jupyter_server sets no timeouts: tornado's hour and none
            set_timeouts(server, cfg.connection_idle_timeout, cfg.connection_body_timeout)
        from .provisioner import start_reconciler

        start_reconciler(self.log)  # end the jobs of GPU kernels that did not survive a restart

    async def stop_extension(self) -> None:
        from .provisioner import release_kernel_jobs

        await release_kernel_jobs()  # while the engine still answers; kernels stop next
        if self.service is not None:
            await stop_engine(self.service, self.monitor)
