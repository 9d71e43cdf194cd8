"""Configuration of the engine: the `c.GPUJobs.*` traitlets an admin sets in
`jupyter_server_config.py`, and their translation into the scheduler's `Policy`.

Every value is checked when the server starts; a wrong one stops the start with a message
naming the setting, rather than being half-applied. The checks live here, with the settings
(the e-mail and webhook checks too, which the notifier also applies to users' own settings).

May import: the model, and the runners' registry (`engine.runners.runner_names`, a light
module); nothing else of the engine, which imports this module.
"""

from __future__ import annotations

import ast
import json
import math
import os
import re
from typing import Any
from urllib.parse import urlsplit

from traitlets import Bool, Dict, Enum, Float, Integer, List, TraitError, Unicode, Union, validate
from traitlets.config import Configurable

from .engine.runners import runner_names
from .model import (
    DEFAULT_PRIORITY_TIERS,
    MAX_GPUS,
    InvalidInput,
    OffpeakWindow,
    Policy,
    Quota,
    parse_duration,
    parse_fake_gpus,
    parse_priority_tiers,
)

_DAYS = {"mon": 0, "tue": 1, "wed": 2, "thu": 3, "fri": 4, "sat": 5, "sun": 6}


def parse_offpeak(text: str) -> OffpeakWindow:
    """`"mon-fri 20:00-08:00"`, `"sat-sun"`, `"thu 14:00-24:00"` -> OffpeakWindow."""
    parts = text.strip().lower().split()
    if not parts or len(parts) > 2:
        raise InvalidInput("offpeak_windows", f"cannot read {text!r}; write e.g. 'mon-fri 20:00-08:00' or 'sat-sun'")
    day_part = parts[0]
    if "-" in day_part:
        first, last = day_part.split("-", 1)
    else:
        first = last = day_part
    if first[:3] not in _DAYS or last[:3] not in _DAYS:
        raise InvalidInput("offpeak_windows", f"unknown weekday in {text!r}; use mon..sun")
    a, b = _DAYS[first[:3]], _DAYS[last[:3]]
    days = tuple(range(a, b + 1)) if a <= b else tuple(list(range(a, 7)) + list(range(0, b + 1)))
    start, end = 0.0, 24.0
    if len(parts) == 2:
        try:
            s, e = parts[1].split("-")
            start = _hour(s)
            end = _hour(e)
        except ValueError:
            raise InvalidInput("offpeak_windows", f"cannot read hours in {text!r}; write e.g. 20:00-08:00") from None
        if end <= start:
            end += 24.0  # wraps past midnight
    return OffpeakWindow(days=days, start_hour=start, end_hour=end)


def _hour(text: str) -> float:
    h, _, m = text.partition(":")
    hour, minute = int(h), int(m or 0)
    if not (0 <= hour <= 24 and 0 <= minute < 60):
        raise ValueError(text)
    return hour + minute / 60


#: The most running jobs a quota may name.
MAX_RUNNING_JOBS = 1_000_000


def _count(where: str, value: Any, high: int) -> int:
    """A whole number from 0 to `high` (a JSON number or its digits), else TraitError."""
    if isinstance(value, str) and re.fullmatch(r"\s*[0-9]{1,9}\s*", value):
        value = int(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TraitError(f"{where}: expected a whole number, got {value!r}"[:200])
    if not 0 <= value <= high:
        raise TraitError(f"{where}: must be between 0 and {high}, got {value}")
    return value


def _quota(where: str, value: Any) -> Quota:
    """A quota from its dict form (keys as in user_quotas), every value checked."""
    if isinstance(value, Quota):
        return value
    if isinstance(value, str):  # `--GPUJobs.user_quotas alice='{"max_gpus": 2}'` on a command line
        try:
            value = json.loads(value)
        except ValueError:
            pass
    if not isinstance(value, dict):
        raise TraitError(f"{where}: expected a dict such as {{'guaranteed_gpus': 2, 'max_gpus': 4}}")
    known = {"guaranteed_gpus", "max_gpus", "max_running_jobs", "max_time_limit", "elastic"}
    unknown = set(value) - known
    if unknown:
        raise TraitError(f"{where}: unknown key {str(sorted(map(str, unknown))[0])[:60]!r}; "
                         f"known keys are {', '.join(sorted(known))}")
    tl = value.get("max_time_limit")
    elastic = value.get("elastic", True)
    if not isinstance(elastic, bool):
        raise TraitError(f"{where}.elastic: expected true or false, got {elastic!r}"[:200])
    try:
        max_time_limit_s = None if tl is None else parse_duration(tl, f"{where}.max_time_limit")
    except InvalidInput as err:
        raise TraitError(str(err)) from None
    return Quota(
        guaranteed_gpus=_count(f"{where}.guaranteed_gpus", value.get("guaranteed_gpus", 0), MAX_GPUS),
        max_gpus=None if value.get("max_gpus") is None else _count(f"{where}.max_gpus", value["max_gpus"], MAX_GPUS),
        max_running_jobs=(None if value.get("max_running_jobs") is None
                          else _count(f"{where}.max_running_jobs", value["max_running_jobs"], MAX_RUNNING_JOBS)),
        max_time_limit_s=max_time_limit_s,
        elastic=elastic,
    )


def string_list(value: Any, where: str) -> list[str]:
    """A list setting as people write it: a list, a JSON list (`'["alice", "bob"]'`) or
    comma-separated text (`alice,bob`). A list given on the command line to a server that
    does not know the setting's class yet arrives as one item holding all of it."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise TraitError(f"{where}: expected a list of names such as ['alice', 'bob'], got {value!r}")
    out: list[str] = []
    for item in value:
        if not isinstance(item, str):
            raise TraitError(f"{where}: expected names (text), got {item!r}")
        text = item.strip()
        if text.startswith("["):
            try:
                parsed = json.loads(text)
            except ValueError:
                try:
                    parsed = ast.literal_eval(text)
                except (ValueError, SyntaxError):
                    raise TraitError(f"{where}: cannot read {item!r}; write a list such as "
                                     "[\"alice\", \"bob\"] or alice,bob") from None
            out.extend(string_list(parsed, where))
            continue
        out.extend(part.strip() for part in text.split(",") if part.strip())
    return out


_EMAIL = re.compile(r"[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]{1,64}@"
                    r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")
#: Control characters: none in a webhook URL, and the notifier strips them from its messages.
CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f]+")


def validate_email(value: Any, field_name: str = "email") -> str:
    """An e-mail address (`user@host.domain`, no name part), or InvalidInput naming the field."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput(field_name, "expected an e-mail address such as alice@example.org")
    text = value.strip()
    if len(text) > 254 or not _EMAIL.fullmatch(text):
        raise InvalidInput(field_name, f"not an e-mail address: {text[:80]!r}; expected one such as "
                                       "alice@example.org")
    return text


def validate_webhook(value: Any, field_name: str = "webhook") -> str:
    """A webhook URL (http or https, a host, no user or password in it), or InvalidInput."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput(field_name, "expected a webhook URL such as https://hooks.slack.com/services/...")
    text = value.strip()
    if len(text) > 2000:
        raise InvalidInput(field_name, "longer than 2000 characters")
    if CONTROL_CHARACTERS.search(text) or " " in text:
        raise InvalidInput(field_name, "a URL holds no spaces or control characters")
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as err:
        raise InvalidInput(field_name, f"not a URL: {err}") from None
    if parts.scheme not in ("http", "https"):
        raise InvalidInput(field_name, f"only http and https webhooks are allowed, not {parts.scheme or 'no scheme'!r}")
    if not parts.hostname:
        raise InvalidInput(field_name, "the URL names no host")
    if parts.username is not None or parts.password is not None:
        raise InvalidInput(field_name, "a webhook URL may not hold a user name or password")
    del port
    return text


def quota_to_dict(q: Quota | None) -> dict[str, Any] | None:
    if q is None:
        return None
    return {
        "guaranteed_gpus": q.guaranteed_gpus,
        "max_gpus": q.max_gpus,
        "max_running_jobs": q.max_running_jobs,
        "max_time_limit_s": q.max_time_limit_s,
        "elastic": q.elastic,
    }


def retention_seconds(value: Any, name: str = "c.GPUJobs.job_retention") -> int:
    """A duration in seconds that may be 0 (a retention: keep forever; a minimum: none)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0:
        return 0
    if isinstance(value, str) and re.fullmatch(r"0+(\.0+)?\s*[dhms]?", value.strip().lower()):
        return 0
    return parse_duration(value, name)


def server_time_zone() -> str:
    """The IANA name of the server's time zone: TZ when it names one, else the zone that
    /etc/localtime links to, else /etc/timezone; "" when none is found (then a fixed offset,
    the zone's standard time, is all that is known)."""
    from zoneinfo import ZoneInfo

    candidates = [os.environ.get("TZ", "").removeprefix(":")]
    if not candidates[0]:
        try:
            target = os.path.realpath("/etc/localtime")
            if "/zoneinfo/" in target:
                candidates.append(target.split("/zoneinfo/", 1)[1])
        except OSError:
            pass
        try:
            with open("/etc/timezone") as f:
                candidates.append(f.read().strip())
        except OSError:
            pass
    for name in candidates:
        if not name or name.startswith("/"):
            continue
        try:
            ZoneInfo(name)
            return name
        except (ValueError, OSError, KeyError):
            continue
    return ""


class GPUJobs(Configurable):
    """Settings of the jupyter-gpujobs engine (`c.GPUJobs.<name>` in jupyter_server_config.py)."""

    db_url = Unicode(
        "", config=True,
        help="SQLAlchemy URL of the store. Empty: SQLite file gpujobs/gpujobs.sqlite in the Jupyter data dir.",
    )
    state_dir = Unicode(
        "", config=True, help="Folder for job logs and supervisor state. Empty: gpujobs/ in the Jupyter data dir."
    )
    fake_gpus = Unicode(
        os.environ.get("GPUJOBS_FAKE_GPUS", ""), config=True,
        help="Fake GPUs for demos and machines without GPUs, e.g. '4xA100-80GB,2xT4'. "
        "Also read from the environment variable GPUJOBS_FAKE_GPUS.",
    )
    runner = Unicode("local", config=True,
                     help="How jobs run: 'local' (on this machine, scheduled by the engine) or 'slurm' (handed "
                          "to a Slurm cluster, which schedules them; settings in c.Slurm, see docs/slurm.md). "
                          "Other names come from the entry point group jupyter_gpujobs.runners.")
    default_time_limit = Union([Integer(), Unicode()], default_value="1h", config=True,
                               help="Time limit of a job that gives none (e.g. '1h', 3600).")
    max_time_limit = Union([Integer(), Unicode()], default_value="7d", config=True,
                           help="Longest time limit a job may ask for.")
    kill_grace = Union([Integer(), Unicode()], default_value="10s", config=True,
                       help="Time between SIGTERM and SIGKILL when a job is stopped at its limit or cancelled.")
    preempt_grace = Union([Integer(), Unicode()], default_value="30s", config=True,
                          help="Time a preempted job gets between SIGTERM and SIGKILL (GPUJOBS_PREEMPT_GRACE).")
    preempt_grace_max = Union([Integer(), Unicode()], default_value="10m", config=True,
                              help="The longest a preempted job's grace gets when its signal before the end "
                                   "(--signal USR1@5m) asks for more than preempt_grace: the asked time plus "
                                   "kill_grace, at most this; a job asking for more is told in its events.")
    max_requeues = Integer(3, config=True,
                           help="How many times a job submitted with --requeue goes back to the queue at its "
                                "time limit or when its run is lost (a job may ask for another count with "
                                "max_requeues). Preempted jobs are requeued without a count.")
    preempt_min_runtime = Union([Integer(), Unicode()], default_value="1m", config=True,
                                help="How long a job runs (each time it starts) before it may be preempted; "
                                     "0: at once. Keeps a requeued job from being preempted again and again.")
    foreign_memory_threshold = Integer(
        300, allow_none=True, config=True,
        help="A GPU that no job holds on which processes hold more memory than this (MiB; never counting what "
             "the driver reserves for itself) is used by a process outside the "
             "queue: no job is started there until it is released or an admin overrides it "
             "(POST gpus/foreign, `jupyter gpujobs gpus --override N`). None: never.")
    time_limit_warning = Union([Integer(), Unicode()], default_value="5m", config=True,
                               help="How long before its time limit a job gets a warning event.")
    user_max_running_jobs = Integer(None, allow_none=True, config=True, help="Running jobs per user (None: no limit).")
    user_max_gpus = Integer(None, allow_none=True, config=True, help="GPUs in use per user (None: no limit).")
    backfill = Bool(True, config=True, help="Backfill: later jobs start ahead if they delay no reserved job.")
    reservation_depth = Integer(100, allow_none=True, config=True,
                                help="How many blocked jobs get a full reservation each cycle (None: all). "
                                     "Deeper jobs get a cheaper estimate and may be passed by backfill.")
    fairshare = Bool(True, config=True, help="Order the queue by fair-share usage as well as age and class.")
    fairshare_half_life = Union([Integer(), Unicode()], default_value="7d", config=True,
                                help="Half-life of past GPU usage in fair-share.")
    weight_age = Float(1.0, config=True, help="Weight of queue age in the multifactor priority.")
    weight_fairshare = Float(2.0, config=True, help="Weight of fair-share in the multifactor priority.")
    weight_class = Float(4.0, config=True, help="Weight of the priority class in the multifactor priority.")
    weight_size = Float(0.25, config=True, help="Weight of job size (GPUs) in the multifactor priority.")
    user_shares = Dict(config=True, help="Fair-share shares per user, e.g. {'alice': 2, 'bob': 1}. Missing: 1.")
    group_shares = Dict(config=True, help="Fair-share shares per group (project).")
    user_quotas = Dict(config=True, help="Quotas per user: {'alice': {'guaranteed_gpus': 2, 'max_gpus': 4, "
                                         "'max_running_jobs': 8, 'max_time_limit': '2d', 'elastic': True}}.")
    group_quotas = Dict(config=True, help="Quotas per group (project), same keys as user_quotas.")
    default_user_quota = Dict(config=True, help="Quota of users not in user_quotas (empty: none).")
    group_members = Dict(config=True, help="Groups a user may submit to: {'vision': ['alice', 'bob']}. "
                                           "Empty: any user may name any group.")
    urgent_reserve_gpus = Integer(0, config=True, help="GPUs that only 'urgent' jobs may use.")
    budget_hour_seconds = Float(3600.0, config=True, help=(
        "Seconds of one GPU that count as one GPU-hour of a GPU-hour budget (PUT budgets). "
        "Only for tests and demos, which compress time with less."))

    @validate("budget_hour_seconds")
    def _check_budget_hour_seconds(self, proposal: Any) -> float:
        if not proposal["value"] > 0:
            raise TraitError(f"c.GPUJobs.budget_hour_seconds: must be above 0, got {proposal['value']!r}")
        return float(proposal["value"])
    priority_tiers = Dict(default_value={k: list(v) for k, v in DEFAULT_PRIORITY_TIERS.items()}, config=True,
                          help="Who may submit at each priority class: {'urgent': ['alice', '@oncall'], "
                               "'high': ['@ml-team']} (user names, '@group' for a Unix group's members, '*' for "
                               "everyone; [] for admins only). A class not named is open to everyone; admins may "
                               "use every class. Default: urgent is for admins only.")
    user_max_pending_jobs = Integer(5000, allow_none=True, config=True,
                                    help="Jobs one user (not an admin) may have waiting at once, array tasks "
                                         "counted one by one (None: no cap).")
    user_max_array_tasks = Integer(1000, allow_none=True, config=True,
                                   help="Tasks one array submitted by a user (not an admin) may have (None: no cap "
                                        "but the engine's own of 10,000).")
    notebook_max_bytes = Integer(64 << 20, config=True,
                                 help="Largest notebook a notebook job may name (bytes); checked as its user.")
    notebook_check_timeout = Float(5.0, config=True,
                                   help="Seconds the check of a notebook job's notebook (as its user, in a helper "
                                        "process) may take before the submission is refused.")
    preemption = Bool(True, config=True, help="Let guaranteed and urgent jobs reclaim GPUs from borrowers.")
    offpeak_windows = List(Unicode(), default_value=["mon-fri 20:00-08:00", "sat-sun"], config=True,
                           help="Off-peak windows in local time (c.GPUJobs.time_zone) for --when offpeak jobs.")
    time_zone = Unicode("", config=True,
                        help="The IANA time zone (e.g. 'Europe/Berlin') of off-peak windows and of the times "
                             "in reasons, reservations and habits; its real offset at each instant is used, "
                             "so daylight saving moves nothing. Empty: the server's own zone (TZ, else "
                             "/etc/localtime).")

    @validate("time_zone")
    def _valid_time_zone(self, proposal: dict[str, Any]) -> str:
        name = str(proposal["value"]).strip()
        if name:
            from zoneinfo import ZoneInfo

            try:
                ZoneInfo(name)
            except (ValueError, OSError, KeyError):  # ZoneInfoNotFoundError is a KeyError
                raise TraitError(f"c.GPUJobs.time_zone: unknown time zone {name!r}; use an IANA name such as "
                                 "'Europe/Berlin' or 'America/New_York'") from None
        return name
    admin_users = List(Unicode(), config=True, help="Users who may see and cancel every job and set quotas. "
                                                    "The user running the server is always an admin.")
    user_identity = Unicode("auto", config=True,
                            help="Who owns a job: 'unix' (the user running the server; right for a personal "
                                 "server), 'jupyter' (the authenticated Jupyter user, e.g. under JupyterHub), "
                                 "or 'auto' (jupyter when the server has named users, else unix).")
    run_as_owner = Enum(["auto", "always", "never"], default_value="auto", config=True,
                        help="Run each job as the Unix user who owns it (its uid, groups, HOME, umask 077; "
                             "its supervisor stays the engine's): 'auto' when the engine runs as root and "
                             "the owner is a Unix user here; 'always' (refuse jobs of owners who are not "
                             "Unix users here); 'never' (every job runs as the engine's user).")
    job_python = Unicode("", config=True,
                         help="The Python that runs notebook jobs (with jupyter-gpujobs, nbclient and a kernel "
                              "installed). Empty: the engine's own. An engine that runs jobs as their owners "
                              "needs one every user can run, e.g. a venv outside root's home.")
    cgroups = Enum(["auto", "v2", "off"], default_value="auto", config=True,
                   help="Confine each job in its own cgroup (its whole process tree, a device fence "
                        "on its GPUs, --mem/--cpus limits): 'auto' where the host lets the engine write "
                        "cgroups (root); 'v2': the cgroup v2 hierarchy alone (the fence a BPF device "
                        "program), as on a v2-only host; 'off' keeps to subreaper supervision and "
                        "CUDA_VISIBLE_DEVICES.")
    job_environment = Enum(["auto", "inherit", "clean"], default_value="auto", config=True,
                           help="What a job gets of the engine's own environment: 'clean' (PATH, LANG, LC_*, TZ "
                                "and the names in job_env_allow, then the job's own variables: never a credential "
                                "of the engine's); 'inherit' (all of it, for jobs run as the engine's own user); "
                                "'auto': inherit in a personal server's engine (the user's own session), clean "
                                "in the shared engine and for every job run as another user.")
    job_env_allow = List(Unicode(), config=True,
                         help="More names (shell patterns: 'CUDA_*') of the engine's environment a clean job "
                              "environment keeps, e.g. ['http_proxy', 'https_proxy', 'LD_LIBRARY_PATH'].")
    private_tmp = Enum(["auto", "off"], default_value="auto", config=True,
                       help="Give each job a private /tmp (a folder of its run directory, removed at its end) and "
                            "/dev/shm (a tmpfs of its own) in a mount namespace: 'auto' where the host allows "
                            "one (the engine runs as root); the start line, `jupyter gpujobs gpus` and doctor "
                            "say whether it is in force. A job whose working directory is under /tmp keeps the "
                            "machine's /tmp.")
    default_image = Unicode("", config=True,
                            help="The container image a job runs in when it names none (docs/containers.md); "
                                 "empty: the host's own environment. A job asks for the host with image \"\".")
    allowed_images = List(Unicode(), config=True,
                          help="Shell patterns of the images jobs may run in, e.g. ['localhost/*', "
                               "'docker.io/library/*', '/shared/images/*.sif']; empty: any image.")
    container_runtime = Unicode("podman", config=True,
                                help="The container runtime of image names (an entry point of "
                                     "jupyter_gpujobs.containers: podman); an image file (.sif) runs in apptainer.")
    container_pull = Bool(True, config=True,
                          help="Pull a job's image that is not there for its owner (a registry reference, or "
                               "podman's docker-archive:/oci-archive:/oci: of a file) as the owner before the job "
                               "may take GPUs, its progress in the job's log and reason (docs/containers.md). "
                               "False: such an image is refused at submit.")
    container_pull_timeout = Float(1800.0, config=True,
                                   help="Seconds a pull of a job's image may take; past it the job ends FAILED.")
    container_options = List(Unicode(), config=True,
                             help="More options for every container run, in the runtime's own words, after the "
                                  "engine's (e.g. ['--network=none'] for podman).")
    log_max_bytes = Integer(1 << 30, config=True,
                            help="Largest log of a job, in bytes (0: no cap; at least 65536): past it the first "
                                 "half and the newest output are kept, with a line saying how much was cut.")
    engine_url = Unicode("", config=True,
                         help="The shared engine this server forwards to, e.g. "
                              "'unix:///run/jupyter-gpujobs/engine.sock'. Empty: that default socket when it "
                              "exists, else this server hosts its own engine (a personal deployment).")
    engine_socket = Unicode("/run/jupyter-gpujobs/engine.sock", config=True,
                            help="The Unix socket the shared engine (`jupyter gpujobs engine`) listens on.")
    admin_group = Unicode("gpujobs-admins", config=True,
                          help="Shared engine: members of this Unix group (and root) are admins.")
    private_data = Bool(None, allow_none=True, config=True,
                        help="Show another user's job only as its queue view (id, owner, GPUs, state, "
                             "position, expected start, reason), its command, cwd, payload, log, events and "
                             "stats only to its owner and admins, as Slurm's PrivateData=jobs. None: on for the "
                             "shared engine and a server with named users, off for a personal server.")
    claim_dir = Unicode("/run/lock/jupyter-gpujobs", config=True,
                        help="Machine-wide directory of the GPU claims: an engine locks its GPUs there so no "
                             "other engine on the machine hands them out. A root engine keeps it root's (0755, "
                             "lock files 0600) so no user can take, spoof or block a claim; an engine that is "
                             "not root claims in its own user's folder (this one if it is theirs).")
    max_body_bytes = Integer(1 << 20, config=True, help="Largest request body accepted by the REST API.")
    connection_idle_timeout = Float(60.0, config=True,
                                    help="Seconds a connection to the server may stay open without sending a "
                                         "request (also between the requests of a kept-alive one) before it is "
                                         "closed: idle connections would otherwise hold open files for an hour.")
    connection_body_timeout = Float(60.0, config=True,
                                    help="Seconds a request body may stall before its connection is closed.")
    max_connections_per_user = Integer(256, config=True,
                                       help="The shared engine's socket: open connections one Unix user may hold; "
                                            "more are closed at once.")
    poll_interval = Float(0.05, config=True, help="Seconds between checks for ended jobs.")
    tick_interval = Float(5.0, config=True, help="Seconds between scheduling cycles when nothing happens.")
    estimate_interval = Float(10.0, config=True,
                              help="Seconds between the cycles that also estimate the start of every job past "
                                   "the reservation depth (every cycle decides starts, preemptions and the "
                                   "reservations; on a deep queue the estimates are most of a cycle's cost). "
                                   "0 = estimate in every cycle.")
    job_retention = Union([Integer(), Unicode()], default_value="7d", config=True,
                          help="How long the files of an ended job (its run directories and log) are kept, "
                               "e.g. '7d'; then they are removed, the job's record stays. 0: keep forever.")
    job_cleanup_interval = Float(300.0, config=True,
                                 help="Seconds between the passes that remove files past job_retention.")
    # --- monitoring (jupyter_gpujobs/monitor/, docs/monitoring.md)
    monitor = Bool(True, config=True, help="Sample the GPUs and run the detectors (findings, stats, heatmap).")
    sample_interval = Float(5.0, config=True, help="Seconds between GPU readings.")
    sample_retention = Union([Integer(), Unicode()], default_value="6h", config=True,
                             help="How long raw GPU readings are kept (then only per-minute rows).")
    sample_retention_minutes = Union([Integer(), Unicode()], default_value="14d", config=True,
                                     help="How long per-minute GPU rows are kept (then only per-hour rows).")
    sample_retention_hours = Union([Integer(), Unicode()], default_value="400d", config=True,
                                   help="How long per-hour GPU rows are kept.")
    idle_hog_after = Union([Integer(), Unicode()], default_value="30m", config=True,
                           help="A running job whose GPUs stay at ~0% this long is reported as an idle hog.")
    idle_hog_threshold = Float(1.0, config=True, help="Utilization (%) at or below which a GPU counts as idle.")
    rogue_policy = Unicode("warn", config=True,
                           help="Processes on a GPU without an allocation: 'warn' (report and log) or "
                                "'kill' (also SIGTERM, then SIGKILL after kill_grace).")
    rogue_ignore = List(Unicode(), default_value=["Xorg", "gnome-shell", "nvidia-persistenced"], config=True,
                        help="Process names never reported as rogue (display servers, daemons).")
    drain_after_errors = Integer(0, config=True,
                                 help="Drain a GPU (no new starts) after this many error events "
                                      "(uncorrected ECC, Xid, unreadable); 0 never drains automatically.")
    failure_streak = Integer(3, config=True, help="Failures in a row of one user's job that make a finding.")
    oom_memory_fraction = Float(0.95, config=True,
                                help="A failed job whose GPU memory peaked at this fraction of a card ran out of memory.")
    use_predictions = Bool(True, config=True,
                           help="Expected starts use confident runtime predictions from history where they "
                                "give an earlier start than the time limits (shown as a prediction, 'about "
                                "13:40'; otherwise as a bound, 'by 14:05 at the latest'). Starts, backfill "
                                "and reservations always follow the time limits.")
    share_grace = Union([Integer(), Unicode()], default_value="10s", config=True,
                        help="How long a job holding a share of a GPU may use more GPU memory than its share "
                             "before the engine stops it (it is warned when first seen over).")
    mps = Bool(False, config=True,
               help="Run an NVIDIA MPS control daemon per shared GPU and give each share job its pinned "
                    "memory limit and active thread percentage, so the driver enforces them. Needs "
                    "nvidia-cuda-mps-control; without it the engine says so and its watcher alone enforces shares.")
    mps_pipe_dir = Unicode("", config=True,
                           help="Folder of the MPS daemons' pipe directories (one per shared GPU). Empty: "
                                "/run/jupyter-gpujobs/mps for a root engine, else mps/pipe in the state dir.")
    mps_log_dir = Unicode("", config=True,
                          help="Folder of the MPS daemons' log directories (one per shared GPU). Empty: "
                               "/var/log/jupyter-gpujobs/mps for a root engine, else mps/log in the state dir.")
    predict_min_confidence = Float(0.6, config=True,
                                   help="Runtime predictions at least this confident set Job.predicted_runtime_s "
                                        "(used by expected starts when use_predictions is on).")
    # notifications outside Lab (engine/notify.py; docs/notifications.md)
    notify_smtp_host = Unicode("", config=True,
                               help="Mail server for e-mail notifications; empty: no e-mail (webhooks only).")
    notify_smtp_port = Integer(0, config=True, help="Its port; 0: 25, or 465 with notify_smtp_security='ssl'.")
    notify_smtp_security = Enum(["none", "starttls", "ssl"], default_value="none", config=True,
                                help="'starttls' (upgrade a plain connection, usually port 587), 'ssl' (TLS "
                                     "from the start, usually 465) or 'none' (a local relay).")
    notify_smtp_from = Unicode("", config=True, help="Sender address; empty: gpujobs@<this host's name>.")
    notify_smtp_user = Unicode("", config=True, help="User to log in to the mail server as; empty: no login.")
    notify_smtp_password_env = Unicode("", config=True,
                                       help="Name of the environment variable that holds the mail password "
                                            "(never written in a config file, never logged).")
    notify_smtp_password_file = Unicode("", config=True,
                                        help="File whose first line is the mail password (readable by the "
                                             "engine only), if not notify_smtp_password_env.")
    notify_webhook_hosts = List(Unicode(), config=True,
                                help="Hosts users' webhooks may post to, e.g. ['hooks.slack.com', "
                                     "'chat.example.org'] ('*.example.org': its subdomains); empty: any. A "
                                     "webhook URL is the user's choice: restrict it where the engine can reach "
                                     "internal services its users cannot.")
    notify_private_webhooks = Bool(False, config=True,
                                   help="Let users' webhooks post to loopback, private, link-local and other "
                                        "non-public addresses. Off: such a webhook is refused (when it is set, "
                                        "and when its host's name resolves to such an address at delivery), "
                                        "unless its host is named in notify_webhook_hosts.")
    notify_email_domains = List(Unicode(), config=True,
                                help="Mail domains users' notification addresses may be in, e.g. "
                                     "['example.org']; empty: any.")
    notify_admin_emails = List(Unicode(), config=True,
                               help="Addresses the monitor's findings (OOM, repeated failures, idle hogs, "
                                    "GPU errors, rogue processes) are mailed to.")
    notify_admin_webhooks = List(Unicode(), config=True,
                                 help="Webhooks (Slack/Mattermost incoming webhooks) the findings are posted to.")
    notify_timeout = Float(10.0, config=True, help="Seconds one delivery (mail or webhook) may take.")
    notify_retries = Integer(5, config=True,
                             help="Tries after the first for a message a destination did not take (backoff "
                                  "doubling from 2 s, at most 5 min).")

    @validate("fake_gpus")
    def _check_fake(self, proposal: Any) -> str:
        try:
            parse_fake_gpus(proposal["value"])
        except InvalidInput as err:
            raise TraitError(f"c.GPUJobs.fake_gpus: {err.message}") from None
        return proposal["value"]

    @validate("default_time_limit", "max_time_limit", "kill_grace", "preempt_grace", "preempt_grace_max", "time_limit_warning",
              "fairshare_half_life", "sample_retention", "sample_retention_minutes", "sample_retention_hours",
              "idle_hog_after", "share_grace")
    def _check_duration(self, proposal: Any) -> Any:
        name = proposal["trait"].name
        try:
            parse_duration(proposal["value"], f"c.GPUJobs.{name}")
        except InvalidInput as err:
            raise TraitError(str(err)) from None
        return proposal["value"]

    @validate("foreign_memory_threshold")
    def _check_foreign_threshold(self, proposal: Any) -> Any:
        if proposal["value"] is not None and proposal["value"] < 0:
            raise TraitError(f"c.GPUJobs.foreign_memory_threshold: must be 0 or more MiB, got {proposal['value']!r}")
        return proposal["value"]

    @validate("container_pull_timeout")
    def _check_pull_timeout(self, proposal: Any) -> Any:
        if not proposal["value"] > 0:  # (NaN too: else every pull would fail at once)
            raise TraitError(f"c.GPUJobs.container_pull_timeout: must be more than 0 seconds, got {proposal['value']!r}")
        return proposal["value"]

    @validate("preempt_min_runtime")
    def _check_preempt_min_runtime(self, proposal: Any) -> Any:
        try:
            retention_seconds(proposal["value"], "c.GPUJobs.preempt_min_runtime")
        except InvalidInput as err:
            raise TraitError(f"{err}; or 0 to let a job be preempted at once") from None
        return proposal["value"]

    @validate("job_retention")
    def _check_job_retention(self, proposal: Any) -> Any:
        try:
            retention_seconds(proposal["value"])
        except InvalidInput as err:
            raise TraitError(f"{err}; or 0 to keep the files of ended jobs forever") from None
        return proposal["value"]

    @validate("job_cleanup_interval")
    def _check_cleanup_interval(self, proposal: Any) -> Any:
        if not proposal["value"] > 0:
            raise TraitError(f"c.GPUJobs.job_cleanup_interval: must be positive, got {proposal['value']!r}")
        return proposal["value"]

    @validate("offpeak_windows")
    def _check_offpeak(self, proposal: Any) -> Any:
        windows = string_list(proposal["value"], "c.GPUJobs.offpeak_windows")
        for text in windows:
            try:
                parse_offpeak(text)
            except InvalidInput as err:
                raise TraitError(f"c.GPUJobs.{err}") from None
        return windows

    @validate("admin_users", "rogue_ignore")
    def _check_names(self, proposal: Any) -> Any:
        return string_list(proposal["value"], f"c.GPUJobs.{proposal['trait'].name}")

    @validate("group_members")
    def _check_members(self, proposal: Any) -> Any:
        return {str(group): string_list(users, f"c.GPUJobs.group_members[{group!r}]")
                for group, users in proposal["value"].items()}

    @validate("user_shares", "group_shares")
    def _check_shares(self, proposal: Any) -> Any:
        name = proposal["trait"].name
        out = {}
        for who, share in proposal["value"].items():
            try:
                number = float(share)
            except (TypeError, ValueError):
                number = float("nan")
            if isinstance(share, bool) or not math.isfinite(number) or number < 0:
                raise TraitError(f"c.GPUJobs.{name}[{who!r}]: expected a share (a number of 0 or more), "
                                 f"got {share!r}")
            out[str(who)] = number
        return out

    @validate("user_quotas", "group_quotas")
    def _check_quotas(self, proposal: Any) -> Any:
        name = proposal["trait"].name
        for who, value in proposal["value"].items():
            _quota(f"c.GPUJobs.{name}[{who!r}]", value)
        return {who: json.loads(value) if isinstance(value, str) else value
                for who, value in proposal["value"].items()}

    @validate("default_user_quota")
    def _check_default_quota(self, proposal: Any) -> Any:
        if proposal["value"]:
            _quota("c.GPUJobs.default_user_quota", proposal["value"])
        return proposal["value"]

    @validate("rogue_policy")
    def _check_rogue_policy(self, proposal: Any) -> Any:
        if proposal["value"] not in ("warn", "kill"):
            raise TraitError(f"c.GPUJobs.rogue_policy: {proposal['value']!r} is not one of warn, kill")
        return proposal["value"]

    @validate("sample_interval")
    def _check_sample_interval(self, proposal: Any) -> Any:
        if proposal["value"] <= 0:
            raise TraitError(f"c.GPUJobs.sample_interval: must be positive, got {proposal['value']!r}")
        return proposal["value"]

    @validate("runner")
    def _check_runner(self, proposal: Any) -> Any:
        if proposal["value"] not in runner_names():
            raise TraitError(f"c.GPUJobs.runner: no runner named {proposal['value']!r}; "
                             f"there are {', '.join(runner_names())}")
        return proposal["value"]

    @validate("notify_admin_emails", "notify_admin_webhooks", "notify_webhook_hosts", "notify_email_domains")
    def _check_notify_lists(self, proposal: Any) -> Any:
        name = proposal["trait"].name
        values = string_list(proposal["value"], f"c.GPUJobs.{name}")
        check = {"notify_admin_emails": validate_email, "notify_admin_webhooks": validate_webhook}.get(name)
        for value in values if check else ():
            try:
                check(value, name)
            except InvalidInput as err:
                raise TraitError(f"c.GPUJobs.{name}: {err.message}") from None
        return values

    @validate("notify_smtp_port", "notify_retries")
    def _check_notify_counts(self, proposal: Any) -> Any:
        high = 65535 if proposal["trait"].name == "notify_smtp_port" else 100
        if not 0 <= proposal["value"] <= high:
            raise TraitError(f"c.GPUJobs.{proposal['trait'].name}: must be between 0 and {high}, "
                             f"got {proposal['value']!r}")
        return proposal["value"]

    @validate("notify_timeout")
    def _check_notify_timeout(self, proposal: Any) -> Any:
        if not 0 < proposal["value"] <= 300:
            raise TraitError(f"c.GPUJobs.notify_timeout: must be between 0 and 300 seconds, got {proposal['value']!r}")
        return proposal["value"]

    @validate("priority_tiers")
    def _check_priority_tiers(self, proposal: Any) -> Any:
        try:  # (on a command line: `--GPUJobs.priority_tiers urgent=@oncall,alice`)
            return {k: list(v) for k, v in parse_priority_tiers(proposal["value"], "c.GPUJobs.priority_tiers").items()}
        except InvalidInput as err:
            raise TraitError(str(err)) from None

    @validate("user_max_pending_jobs", "user_max_array_tasks", "notebook_max_bytes")
    def _check_caps(self, proposal: Any) -> Any:
        value = proposal["value"]
        if value is not None and value < 1:
            raise TraitError(f"c.GPUJobs.{proposal['trait'].name}: must be at least 1, got {value}")
        return value

    @validate("notebook_check_timeout")
    def _check_notebook_timeout(self, proposal: Any) -> Any:
        value = proposal["value"]
        if not (0 < value <= 600):
            raise TraitError(f"c.GPUJobs.notebook_check_timeout: must be between 0 and 600 seconds, got {value}")
        return value

    @validate("user_identity")
    def _check_identity(self, proposal: Any) -> Any:
        if proposal["value"] not in ("auto", "unix", "jupyter"):
            raise TraitError(f"c.GPUJobs.user_identity: {proposal['value']!r} is not one of auto, unix, jupyter")
        return proposal["value"]

    def seconds(self, name: str) -> int:
        return parse_duration(getattr(self, name), f"c.GPUJobs.{name}")

    def policy(self, overrides: dict[str, Any] | None = None) -> Policy:
        """The scheduler Policy for these settings; `overrides` are quota changes made through the API."""
        overrides = overrides or {}
        user_quotas = {u: _quota(f"user_quotas[{u!r}]", q) for u, q in self.user_quotas.items()}
        group_quotas = {g: _quota(f"group_quotas[{g!r}]", q) for g, q in self.group_quotas.items()}
        user_quotas.update({u: _quota(u, q) for u, q in overrides.get("users", {}).items()})
        group_quotas.update({g: _quota(g, q) for g, q in overrides.get("groups", {}).items()})
        default_quota = _quota("default_user_quota", self.default_user_quota) if self.default_user_quota else None
        import time as _time

        return Policy(
            default_time_limit_s=self.seconds("default_time_limit"),
            max_time_limit_s=self.seconds("max_time_limit"),
            user_max_running_jobs=self.user_max_running_jobs,
            user_max_gpus=self.user_max_gpus,
            backfill=self.backfill,
            reservation_depth=self.reservation_depth,
            weight_age=self.weight_age,
            weight_fairshare=self.weight_fairshare,
            weight_class=self.weight_class,
            weight_size=self.weight_size,
            fairshare=self.fairshare,
            fairshare_half_life_s=self.seconds("fairshare_half_life"),
            user_shares={str(k): float(v) for k, v in self.user_shares.items()},
            group_shares={str(k): float(v) for k, v in self.group_shares.items()},
            user_quotas=user_quotas,
            group_quotas=group_quotas,
            default_user_quota=default_quota,
            urgent_reserve_gpus=self.urgent_reserve_gpus,
            priority_tiers=parse_priority_tiers(self.priority_tiers, "c.GPUJobs.priority_tiers"),
            user_max_pending_jobs=self.user_max_pending_jobs,
            user_max_array_tasks=self.user_max_array_tasks,
            preemption=self.preemption,
            preempt_grace_s=self.seconds("preempt_grace"),
            preempt_grace_max_s=self.seconds("preempt_grace_max"),
            kill_grace_s=self.seconds("kill_grace"),
            max_requeues=max(0, self.max_requeues),
            preempt_min_runtime_s=retention_seconds(self.preempt_min_runtime, "c.GPUJobs.preempt_min_runtime"),
            offpeak_windows=tuple(parse_offpeak(w) for w in self.offpeak_windows),
            time_zone=self.time_zone or server_time_zone(),
            utc_offset_s=-_time.timezone,  # where the server's zone has no name (see server_time_zone)
            use_predictions=self.use_predictions,
            budget_hour_s=self.budget_hour_seconds,
        )
