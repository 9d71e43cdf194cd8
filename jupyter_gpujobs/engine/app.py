"""Building an engine from `c.GPUJobs` settings, and the shared engine `jupyter gpujobs engine`.

`build_engine` makes the store, GPU backend, machine-wide GPU claim, runner, JobService,
notifier and monitor; the Jupyter extension (embedded engine) and `EngineApp` (shared engine) both call it,
and both mount the same handlers (`api/handlers.py`, `api/monitor.py`) with `engine_settings`.

The shared engine is a small tornado application, not a full Jupyter server: it serves the
gpujobs API and nothing else (no contents, kernels or terminals running as root) on a Unix
socket (mode 0666 in a root-owned directory), and knows each caller by the socket's peer
credentials (`api/identity.py`). It runs as root because it starts every user's jobs as
their owner (a supervisor drops to the user's uid) and claims the machine's GPUs for all.
"""

from __future__ import annotations

import asyncio
import getpass
import hashlib
import logging
import os
import signal
import socket
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jupyter_core.application import JupyterApp
from traitlets import Unicode

from ..config import GPUJobs, retention_seconds
from .claim import GPUClaim
from .connections import NOISY_LOGGERS, PeerCappedHTTPServer, install_repeat_filter, raise_open_files_limit
from .gpus import make_backend
from .runners import make_runner
from .runners.mps import MPSControl
from .service import JobService
from .shares import Shares
from .store import SchemaTooNew, Store, default_url, private_sqlite_files
from .store.guard import EngineLock, StoreDamaged, StoreInUse, damaged, refuse_empty_file
from .userfiles import Bounds

if TYPE_CHECKING:
    from .monitor import Monitor

DEFAULT_STATE_DIR = "/var/lib/jupyter-gpujobs"


def build_engine(cfg: GPUJobs, log: logging.Logger, *, data_dir: Path, root_dir: Path,
                 job_env: dict[str, str], admin_users: set[str], private_data: bool,
                 admin_group: str | None = None, shared: bool = False) -> tuple[JobService, Monitor]:
    """(JobService, Monitor) for one engine. `job_env` gets what jobs need to find it
    (and, on fake GPUs, the fleet name). `shared`: the machine's shared engine (its jobs never
    get its environment); else a Jupyter server's own (a personal session)."""
    install_repeat_filter({*NOISY_LOGGERS, log.name, log.name.split(".")[0]})
    limit = raise_open_files_limit()
    if limit["raised_from"] is not None:
        log.info("gpujobs: raised the open-files limit from %d to %d (the hard limit)", limit["raised_from"],
                 limit["soft"])
    for repaired in private_state_dir(data_dir):
        log.warning("gpujobs: %s was readable by other users (it holds every job's command, environment "
                    "and log): made private to the engine's user", repaired)
    store = open_store(cfg.db_url or default_url(data_dir), log)
    # fake GPUs of this engine (named after its data dir, so the same across restarts)
    fleet = hashlib.sha1(str(data_dir.resolve()).encode()).hexdigest()[:12]
    try:
        runner = make_runner(cfg.runner, data_dir / "run", parent=cfg)
    except ValueError as err:
        raise SystemExit(str(err)) from None
    # a job's environment: an allow-list of the engine's, never its credentials, except for a
    # personal server's job run as that server's user (its own session: runners/shim.py)
    runner.inherit_environment = cfg.job_environment == "inherit" or (cfg.job_environment == "auto" and not shared)
    runner.env_allow = tuple(cfg.job_env_allow)
    engine_url = job_env.get("GPUJOBS_URL", "")
    if engine_url.startswith("unix://"):  # a job with a private /tmp still reaches a socket under /tmp
        runner.tmp_keep = (os.path.dirname(engine_url[len("unix://"):]),)
    claim = None
    if runner.schedules_itself:
        from .runners.slurm import SlurmGPUs, ignored_settings

        backend: Any = SlurmGPUs(runner)  # the cluster's GPUs, as its scheduler sees them (it allocates them)
        ignored = ignored_settings(cfg)
        if ignored:
            log.warning("gpujobs: under the %s runner these c.GPUJobs settings are ignored "
                        "(its scheduler decides; see docs/slurm.md): %s", cfg.runner, ", ".join(ignored))
    else:
        # fake GPUs get device nodes (for the GPU fence) where every job's user can open them
        device_dir = f"/dev/gpujobs-fake/{fleet}" if os.geteuid() == 0 else None
        backend = make_backend(cfg.fake_gpus or None, log, fleet=fleet, device_dir=device_dir)
        if hasattr(runner, "standbys"):  # a supervisor waiting for each GPU that may free at once
            runner.standbys = max(1, len(backend.inventory()))
        # this machine's GPUs: no other engine here may hand them out while this one runs
        claim = GPUClaim([g.uuid for g in backend.inventory()], cfg.claim_dir, {"data_dir": str(data_dir)})
        if not claim.acquire():
            log.error("gpujobs: %s", claim.refusal())
    if backend.name == "fake":
        job_env["GPUJOBS_FAKE_FLEET"] = fleet  # jobs and kernels: on this engine's fake GPUs
    shares = Shares(grace_s=cfg.seconds("share_grace"), mps_wanted=cfg.mps, backend=backend.name,
                    runner_schedules_itself=runner.schedules_itself)
    if cfg.mps and backend.name == "nvml":
        root = os.geteuid() == 0
        shares.mps = MPSControl(
            cfg.mps_pipe_dir or ("/run/jupyter-gpujobs/mps" if root else str(data_dir / "mps" / "pipe")),
            cfg.mps_log_dir or ("/var/log/jupyter-gpujobs/mps" if root else str(data_dir / "mps" / "log")))
        if shares.mps.problem:
            log.warning("gpujobs: c.GPUJobs.mps is on but %s; GPU shares are enforced by the engine's watcher "
                        "alone", shares.mps.problem)
    service = JobService(
        store, backend, runner, cfg.policy(),
        state_dir=data_dir,
        root_dir=root_dir,
        # never the server's token: it acts as the server's user in every Jupyter API. A job of
        # that user has it from the session it inherits; a job run as anyone else gets none
        job_env={k: v for k, v in job_env.items() if k != "GPUJOBS_TOKEN"},
        admin_users=admin_users,
        admin_group=admin_group,
        private_data=private_data,
        gpu_claim=claim,
        # the shared engine knows its users by uid, so every owner was a Unix user when it
        # submitted: one not found at launch (account deleted, directory service down) fails
        # its job ("always") instead of having it run as the engine's user, root
        run_as_owner="always" if shared and cfg.run_as_owner == "auto" and os.geteuid() == 0 else cfg.run_as_owner,
        job_python=cfg.job_python,
        group_members={k: list(v) for k, v in cfg.group_members.items()},
        kill_grace_s=cfg.seconds("kill_grace"),
        time_limit_warning_s=cfg.seconds("time_limit_warning"),
        poll_interval=cfg.poll_interval,
        tick_interval=cfg.tick_interval,
        estimate_interval=cfg.estimate_interval,
        job_retention_s=retention_seconds(cfg.job_retention),
        cleanup_interval=cfg.job_cleanup_interval,
        # GPUs in use outside the queue (not where a cluster scheduler hands out its GPUs)
        foreign_memory_threshold_mb=None if claim is None else cfg.foreign_memory_threshold,
        shares=shares,
    )
    from .containers import Containers
    from .monitor import Monitor, MonitorSettings
    from .notify import Notifier, NotifySettings

    service.notifier = Notifier(service, NotifySettings.from_config(cfg), log)
    # jobs in their own images (issue 29, engine/containers)
    service.state.containers = Containers(runtime=cfg.container_runtime, default_image=cfg.default_image,
                                          allowed_images=list(cfg.allowed_images), options=list(cfg.container_options),
                                          pull=cfg.container_pull, pull_timeout_s=cfg.container_pull_timeout)
    # how far the look at a notebook job's notebook (as its user, userfiles.py) may go
    service.admission.input_bounds = Bounds(cfg.notebook_max_bytes, cfg.notebook_check_timeout)
    monitor = Monitor(service, MonitorSettings.from_config(cfg), log)
    monitor.install()  # drained GPUs show as draining in the engine's inventory
    return service, monitor


def open_store(url: str, log: logging.Logger) -> Store:
    """The store at `url`, held for this engine alone and at the newest schema. Raises
    StoreInUse when another engine runs on it, StoreDamaged when an existing file is empty or
    unreadable (never an empty store over it); the messages name the store and what to do."""
    store = Store(url)
    file = store.sqlite_file
    try:
        if file is not None:
            refuse_empty_file(file)  # before private_sqlite_files makes a missing file
            for repaired in private_sqlite_files(file):
                log.warning("gpujobs: the database %s was readable by other users: made private (0600) to the "
                            "engine's user", repaired)
        lock = EngineLock(store)
        lock.acquire()
        store.engine_lock = lock
        try:
            store.migrate()
        except (SchemaTooNew, StoreInUse):
            raise
        except Exception as err:
            trouble = damaged(err, store)
            if trouble is None:
                raise
            raise trouble from err
    except BaseException:
        store.close()
        raise
    return store


#: what the engine makes in its state dir, besides the database's files
ENGINE_ENTRIES = ("logs", "run", "mps")


def private_state_dir(data_dir: Path) -> list[str]:
    """Make the engine's state dir (database, logs, run directories) and what the engine keeps
    directly in it (`ENGINE_ENTRIES`, nothing else someone put there) private to the engine's
    user: folders 0700, files 0600. Made so when new; an existing one with group or other bits
    is repaired. Returns what was repaired ("path (was 0755)"), for the log."""
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    repaired = []
    st = data_dir.stat()
    if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(data_dir, 0o700)
        repaired.append(f"the state dir {data_dir} (was {stat.S_IMODE(st.st_mode):04o})")
    with os.scandir(data_dir) as entries:
        for entry in entries:
            try:
                est = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            mode = stat.S_IMODE(est.st_mode)
            mine = entry.name in ENGINE_ENTRIES or entry.name.startswith("gpujobs.sqlite")
            if not mine or est.st_uid != os.geteuid() or not mode & 0o077:
                continue
            if stat.S_ISDIR(est.st_mode) or stat.S_ISREG(est.st_mode):
                private = 0o700 if stat.S_ISDIR(est.st_mode) else 0o600
                os.chmod(entry.path, private, follow_symlinks=False)
                repaired.append(f"{entry.path} (was {mode:04o})")
    return repaired


def engine_settings(service: JobService, monitor: Monitor, identity: str, unix_user: str,
                    max_body: int) -> dict[str, Any]:
    """The tornado settings the gpujobs handlers read."""
    return {
        "gpujobs_monitor": monitor,
        "gpujobs_service": service,
        "gpujobs_identity": identity,
        "gpujobs_unix_user": unix_user,
        "gpujobs_max_body": max_body,
    }


def describe(service: JobService) -> str:
    """What an engine found, for its first log line."""
    gpus = service.gpus.inventory()
    models = ", ".join(sorted({g.name for g in gpus})) or "none"
    claim = service.gpu_claim
    owner = ("claimed" if claim is None or claim.held
             else f"NOT claimed: {claim.refusal()}")
    if claim is not None and claim.scope != "machine-wide":
        owner += f" ({claim.scope})"
    return (f"{len(gpus)} GPU(s) via {service.gpus.name} ({models}), {owner}; "
            f"store {service.store.engine.url.render_as_string(hide_password=True).split('?')[0]}; "
            f"isolation: {service.isolation}; {service.shares.describe(gpus)}")


def _jobs_run_as(service: JobService) -> str:
    if service.run_as_owner == "never" or os.geteuid() != 0:
        return f"the engine's user {getpass.getuser()} (c.GPUJobs.run_as_owner={service.run_as_owner!r})"
    return "their owners"


async def start_engine(service: JobService, monitor: Monitor) -> None:
    """Start the engine's loops (once the event loop runs)."""
    if service.notifier is not None:  # first: jobs that ended while the engine was down are told too
        await service.notifier.start()
    await service.start()
    await monitor.start()


async def stop_engine(service: JobService, monitor: Monitor) -> None:
    await monitor.stop()
    await service.stop()
    if service.notifier is not None:
        await service.notifier.stop()
    service.store.close()
    claim = service.gpu_claim
    if claim is not None and claim.held:
        # the fake GPUs' device nodes go with the engine that held the GPUs; one refused them
        # (another engine of the same data dir runs) leaves them to that one
        service.gpus.remove_device_nodes()
    service.gpus.close()
    if claim is not None:
        claim.release()


def socket_in_use(path: str) -> bool:
    """Whether an engine answers on the Unix socket `path`."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


class EngineApp(JupyterApp):
    """`jupyter gpujobs engine`: the shared engine of a GPU machine."""

    name = "jupyter-gpujobs-engine"
    description = ("The shared engine of a GPU machine: one queue and scheduler for every user, on a Unix "
                   "socket that knows each caller by uid. Run it as root (a systemd unit, or a "
                   "JupyterHub-managed service: see the examples).")
    examples = """
sudo jupyter gpujobs engine --config=/etc/jupyter/jupyter_gpujobs_engine_config.py

Under JupyterHub, in jupyterhub_config.py (the hub starts and stops the engine; each user's
server finds its socket and forwards the panel's API to it as the user; docs/shared-server.md):

    c.JupyterHub.services = [{"name": "gpujobs-engine", "command": [
        "/opt/gpujobs/bin/jupyter-gpujobs", "engine",
        "--config=/etc/jupyter/jupyter_gpujobs_engine_config.py"]}]
    c.Spawner.cmd = ["/opt/gpujobs/bin/jupyterhub-singleuser"]
"""
    aliases = {
        "socket": "GPUJobs.engine_socket",
        "state-dir": "GPUJobs.state_dir",
        "db-url": "GPUJobs.db_url",
        "fake-gpus": "GPUJobs.fake_gpus",
        "admin-group": "GPUJobs.admin_group",
        "claim-dir": "GPUJobs.claim_dir",
        "config": "JupyterApp.config_file",
        "log-level": "Application.log_level",
    }
    flags: dict[str, Any] = {}
    config_file_name = Unicode("jupyter_gpujobs_engine_config", config=True)
    classes = [GPUJobs]

    def start(self) -> None:
        asyncio.run(self.serve())

    async def serve(self, ready: asyncio.Event | None = None) -> None:
        import tornado.web
        from jupyter_server.auth.authorizer import AllowAllAuthorizer
        from tornado.netutil import bind_unix_socket

        from .api.accounting import ACCOUNTING_HANDLERS
        from .api.handlers import HANDLERS
        from .api.identity import PeerCredIdentityProvider
        from .api.monitor import MONITOR_HANDLERS

        cfg = GPUJobs(parent=self)
        path = cfg.engine_socket
        if socket_in_use(path):
            self.log.critical("gpujobs: an engine already answers on %s; not starting a second one", path)
            raise SystemExit(1)
        sock_dir = Path(path).parent
        sock_dir.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            os.chown(sock_dir, 0, 0)
            os.chmod(sock_dir, 0o755)  # only root may replace the socket
        # what the engine writes is root's alone (database, logs, run directories); the few
        # things users must reach (socket, its folder, device nodes) get their modes explicitly
        os.umask(0o077)
        job_env = {"GPUJOBS_URL": "unix://" + path}  # jobs reach the engine as their own uid: no token
        private = True if cfg.private_data is None else cfg.private_data
        try:
            service, monitor = build_engine(
                cfg, self.log, data_dir=Path(cfg.state_dir or DEFAULT_STATE_DIR), root_dir=Path("/"),
                job_env=job_env, admin_users={"root"} | set(cfg.admin_users), private_data=private,
                admin_group=cfg.admin_group or None, shared=True)
        except (StoreInUse, StoreDamaged) as err:
            self.log.critical("gpujobs: not starting: %s", err)
            raise SystemExit(1) from None
        settings = engine_settings(service, monitor, "jupyter", "root", cfg.max_body_bytes)
        app = tornado.web.Application(
            HANDLERS + MONITOR_HANDLERS + ACCOUNTING_HANDLERS,  # type: ignore[arg-type]
            identity_provider=PeerCredIdentityProvider(parent=self),
            authorizer=AllowAllAuthorizer(parent=self),  # every known uid may use the API; the service checks owners
            base_url="/",
            serverapp=None,
            allow_remote_access=True,  # no TCP: the Host header of a socket request means nothing
            **settings,
        )
        # a body is read whole before a handler may refuse it (413 past max_body_bytes): past twice
        # that the connection is refused at its headers (400), not at tornado's 100 MB a body
        server = PeerCappedHTTPServer(app, xheaders=False, idle_connection_timeout=cfg.connection_idle_timeout,
                                      body_timeout=cfg.connection_body_timeout, max_body_size=2 * cfg.max_body_bytes)
        server.max_per_peer = cfg.max_connections_per_user
        server.add_sockets([bind_unix_socket(path, mode=0o666)])
        await start_engine(service, monitor)
        self.log.info("gpujobs shared engine: %s; socket %s (any local user, known by uid; admins: root%s); "
                      "jobs run as %s; private data %s; pid %d",
                      describe(service), path, f" and group {cfg.admin_group}" if cfg.admin_group else "",
                      _jobs_run_as(service), "on" if private else "off", os.getpid())
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        if ready is not None:
            ready.set()
        await stop.wait()
        self.log.info("gpujobs shared engine: stopping")
        server.stop()
        await stop_engine(service, monitor)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


main = EngineApp.launch_instance
