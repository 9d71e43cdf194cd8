"""The Jupyter server extension: builds the engine from `c.GPUJobs` settings, mounts the
REST API and websocket, starts the engine loops once the server's event loop runs, and gives
kernels what the client needs (GPUJOBS_URL, GPUJOBS_TOKEN) in their environment.
"""

from __future__ import annotations

import getpass
import hashlib
import os
from pathlib import Path

from jupyter_core.paths import jupyter_data_dir
from jupyter_server.extension.application import ExtensionApp
from traitlets import Any, Instance

from ..config import GPUJobs, retention_seconds
from ..engine.api.handlers import HANDLERS
from ..engine.gpus import make_backend
from ..engine.runners import make_runner
from ..engine.service import JobService
from ..engine.store import Store, default_url


class GPUJobsApp(ExtensionApp):
    name = "jupyter_gpujobs"
    description = "GPU job queue and scheduler for Jupyter"
    load_other_extensions = True

    settings_obj = Instance(GPUJobs, allow_none=True)
    service = Instance(JobService, allow_none=True)
    monitor = Any(None, allow_none=True)  # monitor.Monitor, built with the service

    def initialize_settings(self) -> None:
        server = self.serverapp
        cfg = GPUJobs(parent=server)
        self.settings_obj = cfg
        data_dir = Path(cfg.state_dir or os.path.join(jupyter_data_dir(), "gpujobs"))
        data_dir.mkdir(parents=True, exist_ok=True)
        store = Store(cfg.db_url or default_url(data_dir))
        store.migrate()
        # fake GPUs of this server (named after its state dir, so the same across restarts)
        fleet = hashlib.sha1(str(data_dir.resolve()).encode()).hexdigest()[:12]
        try:
            runner = make_runner(cfg.runner, data_dir / "run", parent=cfg)
        except ValueError as err:
            raise SystemExit(str(err)) from None
        if getattr(runner, "schedules_itself", False):
            from ..engine.runners.slurm import SlurmGPUs, ignored_settings

            backend = SlurmGPUs(runner)  # the cluster's GPUs, as its scheduler sees them
            ignored = ignored_settings(cfg)
            if ignored:
                self.log.warning("gpujobs: under the %s runner these c.GPUJobs settings are ignored "
                                 "(its scheduler decides; see docs/slurm.md): %s", cfg.runner, ", ".join(ignored))
        else:
            # fake GPUs get device nodes (for the GPU fence) where every job's user can open them
            device_dir = f"/dev/gpujobs-fake/{fleet}" if os.geteuid() == 0 else None
            backend = make_backend(cfg.fake_gpus or None, self.log, fleet=fleet, device_dir=device_dir)

        unix_user = getpass.getuser()
        identity = cfg.user_identity
        if identity == "auto":
            from jupyter_server.auth.identity import IdentityProvider, PasswordIdentityProvider

            provider = type(server.identity_provider)
            identity = "unix" if provider in (IdentityProvider, PasswordIdentityProvider) else "jupyter"

        url = server.connection_url.rstrip("/") + "/"
        token = server.identity_provider.token or ""
        job_env = {"GPUJOBS_URL": url, "GPUJOBS_TOKEN": token}
        if backend.name == "fake":
            job_env["GPUJOBS_FAKE_FLEET"] = fleet  # jobs and kernels: on this server's fake GPUs
        # Kernels (and jobs) started by this server find the engine with no arguments.
        os.environ.update(job_env)

        self.service = JobService(
            store, backend, runner, cfg.policy(),
            state_dir=data_dir,
            root_dir=Path(server.root_dir).expanduser().resolve(),
            job_env=job_env,
            admin_users=set(cfg.admin_users) | ({unix_user} if identity == "unix" else set()),
            group_members={k: list(v) for k, v in cfg.group_members.items()},
            kill_grace_s=cfg.seconds("kill_grace"),
            time_limit_warning_s=cfg.seconds("time_limit_warning"),
            poll_interval=cfg.poll_interval,
            tick_interval=cfg.tick_interval,
            estimate_interval=cfg.estimate_interval,
            job_retention_s=retention_seconds(cfg.job_retention),
            cleanup_interval=cfg.job_cleanup_interval,
            run_as_owner=cfg.run_as_owner,
            job_python=cfg.job_python,
        )
        from ..engine.monitor import Monitor, MonitorSettings

        self.monitor = Monitor(self.service, MonitorSettings.from_config(cfg), self.log)
        self.monitor.install()  # drained GPUs show as draining in the engine's inventory
        self.settings.update({
            "gpujobs_monitor": self.monitor,
            "gpujobs_service": self.service,
            "gpujobs_identity": identity,
            "gpujobs_unix_user": unix_user,
            "gpujobs_max_body": cfg.max_body_bytes,
        })
        gpus = backend.inventory()
        summary = ", ".join(sorted({g.name for g in gpus})) or "none"
        self.log.info("gpujobs: %d GPU(s) via %s (%s); store %s; owner identity: %s",
                      len(gpus), backend.name, summary, store.url.split("?")[0], identity)
        self.log.info("gpujobs: isolation: %s", runner.isolation.describe())

    def initialize_handlers(self) -> None:
        from ..engine.api.monitor import MONITOR_HANDLERS

        self.handlers.extend(HANDLERS)
        self.handlers.extend(MONITOR_HANDLERS)

    async def _start_jupyter_server_extension(self, serverapp: object) -> None:
        assert self.service is not None
        await self.service.start()
        if self.monitor is not None:
            await self.monitor.start()
        from .provisioner import start_reconciler

        start_reconciler(self.log)  # end the jobs of GPU kernels that did not survive a restart

    async def stop_extension(self) -> None:
        if self.service is not None:
            from .provisioner import release_kernel_jobs

            await release_kernel_jobs()  # while the engine still answers; kernels stop next
            if self.monitor is not None:
                await self.monitor.stop()
            await self.service.stop()
            self.service.store.close()
            self.service.gpus.close()
