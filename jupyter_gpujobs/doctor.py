"""`jupyter gpujobs doctor`: what is in force and what is wrong, for a new user or an admin.

Each check is a function in `CHECKS` returning `Check` rows (status ok, warn or fail, what was
found, and what to do about a problem). Checks that ask the engine go through the client
(`GET whoami`, `GET info`, `GET gpus`) and read whatever the engine reports, so a field a newer
engine adds shows up without a change here; local checks look at this machine's Jupyter
install (the `jupyter` command, the lab extension, the GPU kernelspecs).

    jupyter gpujobs doctor          # a table; exit 1 when a check fails
    jupyter gpujobs doctor --json
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from .client import GPUJobsClient, GPUJobsError, locate_engine
from .model import format_bytes, format_duration

OK, WARN, FAIL = "ok", "warn", "fail"
LAB_EXTENSION = "jupyter-gpujobs"


@dataclass
class Check:
    name: str
    status: str
    found: str
    todo: str = ""


@dataclass
class Context:
    """What the checks share: how to reach the engine and what it answered."""

    url: str | None
    token: str | None
    client: GPUJobsClient | None = None
    info: dict[str, Any] = field(default_factory=dict)


def check_command(ctx: Context) -> list[Check]:
    """Is `jupyter` on PATH, and is it this installation's?"""
    found = shutil.which("jupyter")
    mine = os.path.join(os.path.dirname(sys.executable), "jupyter")
    if found is None:
        return [Check("jupyter command", WARN, "`jupyter` is not on PATH",
                      f"activate the environment jupyter-gpujobs is installed in (e.g. `source "
                      f"{os.path.dirname(os.path.dirname(sys.executable))}/bin/activate`)")]
    if os.path.exists(mine) and os.path.realpath(found) != os.path.realpath(mine):
        return [Check("jupyter command", WARN, f"`jupyter` on PATH is {found}, not this installation's {mine}",
                      "put this environment's bin first on PATH (activate it)")]
    return [Check("jupyter command", OK, found)]


def check_engine(ctx: Context) -> list[Check]:
    """Which engine the CLI reaches, how it found it, and who you are there."""
    how = "none found"
    try:
        url, token, how = locate_engine(ctx.url, ctx.token)
        ctx.client = GPUJobsClient(url=url, token=token, timeout=10)
        who = ctx.client.whoami()
    except (GPUJobsError, OSError) as err:
        ctx.client = None
        message = getattr(err, "message", str(err))
        if getattr(err, "status", None) == 503 and "did not start" in message:
            return [Check("engine", FAIL, f"found ({how}), but {message}",
                          "do what it says (a damaged store: restore the file it names from a backup; another "
                          "engine on the store: stop it), then restart the server")]
        return [Check("engine", FAIL, f"not reachable ({how}): {message}",
                      "start JupyterLab with the extension (`scripts/run-lab.sh` in a clone, or `jupyter lab`); "
                      "check `jupyter server extension list` shows jupyter_gpujobs enabled")]
    try:
        ctx.info = ctx.client.info()
    except GPUJobsError:
        ctx.info = {}  # an engine older than `GET info`
    version = ctx.info.get("version")
    role = "admin" if who.get("admin") else "user"
    return [Check("engine", OK, f"{url} (found from {how})" + (f", version {version}" if version else "")
                  + f"; you are {who.get('user')} ({role})")]


def check_gpus(ctx: Context) -> list[Check]:
    if ctx.client is None:
        return []
    report = ctx.client.gpu_report()
    gpus, backend = report["gpus"], report.get("backend")
    models: dict[str, int] = {}
    for g in gpus:
        models[g["name"]] = models.get(g["name"], 0) + 1
    what = ", ".join(f"{n}x{m}" for m, n in sorted(models.items()))
    if not gpus:
        return [Check("GPUs", WARN, f"none found (backend: {backend or 'none'})",
                      "on a machine with NVIDIA GPUs install the driver (NVML); for a demo set fake ones: "
                      "GPUJOBS_FAKE_GPUS=2xA100-80GB,2xT4 or c.GPUJobs.fake_gpus")]
    rows = []
    reserved = sorted({g.get("memory_reserved_mb") or 0 for g in gpus} - {0})
    kept = "" if not reserved else (f"; the driver keeps {reserved[0]}" if len(reserved) == 1
                                    else f"; the driver keeps {reserved[0]}-{reserved[-1]}")
    kept += " MiB of each for itself (not counted as used)" if reserved else ""
    if backend == "fake":
        rows.append(Check("GPUs", OK, f"{len(gpus)} fake GPUs ({what}): scheduled like real ones, for demos and tests"
                                      + kept))
    else:
        rows.append(Check("GPUs", OK, f"{len(gpus)} GPUs via {backend} ({what}){kept}"))
    rows.extend(foreign_rows(gpus))
    draining = [str(g["index"]) for g in gpus if g.get("draining")]
    if draining:
        rows.append(Check("GPUs", WARN, f"draining: GPU {', '.join(draining)}",
                          "see `jupyter gpujobs findings`; an admin undrains with the panel or POST gpus/drain"))
    for key, value in sorted(report.items()):
        if key not in ("gpus", "backend", "isolation", "share_enforcement", "share_mode", "fake_fleet") \
                and isinstance(value, str) \
                and value:
            rows.append(Check("GPUs", WARN, f"{key}: {value}"))  # e.g. a notice the engine gives
    isolation = report.get("isolation") or ctx.info.get("isolation")
    if isolation is None:
        rows.append(Check("isolation", WARN, "not reported by this engine: jobs see only their "
                          "CUDA_VISIBLE_DEVICES, nothing fences the other GPUs"))
    elif "none" in str(isolation).split(";")[0].lower():
        rows.append(Check("isolation", WARN, str(isolation),
                          "on a shared machine run the engine as root on cgroup v2 so jobs are fenced to their GPUs"))
    elif "no private /tmp" in str(isolation) and str(getattr(ctx.client, "url", "")).startswith("unix"):
        rows.append(Check("isolation", WARN, str(isolation),
                          "jobs of different users share /tmp and /dev/shm: run the shared engine as root on a host "
                          "that allows mount namespaces, with c.GPUJobs.private_tmp = 'auto' (docs/security.md)"))
    else:
        rows.append(Check("isolation", OK, str(isolation)))
    sharing = report.get("share_enforcement") or ctx.info.get("share_enforcement")
    if sharing and "MPS asked for but" in str(sharing):
        rows.append(Check("GPU shares", WARN, str(sharing),
                          "install NVIDIA's MPS (nvidia-cuda-mps-control, with the driver or CUDA toolkit) on the "
                          "engine's PATH, or set c.GPUJobs.mps = False"))
    elif sharing:
        rows.append(Check("GPU shares", OK, str(sharing)))
    containers = ctx.info.get("containers")
    if isinstance(containers, dict) and containers.get("text"):
        if containers.get("ready") or not containers.get("default_image"):
            rows.append(Check("containers", OK, str(containers["text"])))
        else:  # every job runs in the site's default image, and none can here
            rows.append(Check("containers", FAIL, str(containers["text"]),
                              "install podman and uidmap, or unset c.GPUJobs.default_image (docs/containers.md)"))
    return rows


def foreign_rows(gpus: list[dict[str, Any]]) -> list[Check]:
    """A GPU the engine takes as in use outside the queue: by what (which process, how much, or
    memory it cannot attribute) and what to do; the driver's reserved memory never counts."""
    rows = []
    for g in gpus:
        if not g.get("foreign"):
            continue
        where = f"GPU {g['index']}" + (f" on {g['host']}" if g.get("host") not in (None, "localhost") else "")
        reserved = g.get("memory_reserved_mb")
        also = f"; the driver's {reserved} MiB reserved are not counted" if reserved else ""
        if g.get("foreign_override"):
            rows.append(Check("GPU in use", OK, f"{where} is {g['foreign']}, handed out all the same "
                                                f"({g['foreign_override']})"))
            continue
        rows.append(Check("GPU in use", WARN, f"{where} is {g['foreign']}: no job starts there{also}",
                          g.get("foreign_todo") or f"stop that process, or an admin overrides: "
                                                   f"jupyter gpujobs gpus --override {g['index']}"))
    return rows


#: /proc mount options that hide other users' processes (their command lines) from `ps`
HIDEPID_ON = ("1", "2", "4", "noaccess", "invisible", "ptraceable")


def proc_mount_options(mounts: str = "/proc/mounts") -> dict[str, str] | None:
    """The options of the proc file system mounted on /proc ({"hidepid": "2", ...}); None
    where there is none (not Linux)."""
    try:
        with open(mounts) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):  # the last mount on /proc is the one in force
        parts = line.split()
        if len(parts) >= 4 and parts[1] == "/proc" and parts[2] == "proc":
            return dict((o.split("=", 1) + [""])[:2] for o in parts[3].split(","))
    return None


def check_hidepid(ctx: Context) -> list[Check]:
    """Do users see each other's command lines (`ps`)? Hidden only when the host mounts /proc
    with hidepid, which the engine cannot do (docs/security.md)."""
    options = proc_mount_options()
    if options is None:
        return []
    value = options.get("hidepid", "0")
    if value in HIDEPID_ON:
        return [Check("/proc", OK, f"mounted with hidepid={value}: users do not see each other's processes")]
    shared = str(getattr(ctx.client, "url", "") or "").startswith("unix")
    found = "mounted without hidepid: every user sees everyone's command lines with `ps`"
    todo = ("as root: mount -o remount,hidepid=invisible,gid=ADMIN_GROUP /proc, and the same options in "
            "/etc/fstab (docs/security.md)")
    if shared:
        return [Check("/proc", WARN, found, todo)]
    return [Check("/proc", OK, found + " (one user's machine: fine; on a shared one, see docs/security.md)")]


def check_store(ctx: Context) -> list[Check]:
    store = ctx.info.get("store")
    if ctx.client is None or not isinstance(store, dict):
        return []
    where = f" at {store['url']}" if store.get("url") else ""
    size = store.get("size_bytes")
    found = f"{store.get('kind')}{where}, {format_bytes(size)}"
    if size is not None and size > 2 * 1024**3:
        return [Check("store", WARN, found, "shorten c.GPUJobs.job_retention and the monitor's sample retention, "
                      "or move to PostgreSQL (c.GPUJobs.db_url)")]
    return [Check("store", OK, found)]


def check_open_files(ctx: Context) -> list[Check]:
    """The engine's open-files limit (raised to the hard one at start) and how much is used."""
    files = ctx.info.get("open_files")
    if ctx.client is None or not isinstance(files, dict) or not files.get("soft"):
        return []
    soft, used = int(files["soft"]), files.get("in_use")
    found = f"limit {soft}" + (f" (raised at start from {files['raised_from']})" if files.get("raised_from") else "")
    found += f", {used} open" if used is not None else ""
    if soft < 4096 or (used is not None and used > 0.8 * soft):
        return [Check("open files", WARN, found,
                      "raise the engine's hard limit (LimitNOFILE= in its systemd unit, or `ulimit -Hn` before "
                      "starting the server): each connection and job holds open files")]
    return [Check("open files", OK, found)]


def check_lab_extension(ctx: Context) -> list[Check]:
    """The JupyterLab extension, as this machine's Jupyter finds it (the panel)."""
    from jupyter_core.paths import jupyter_config_path, jupyter_path

    where = next((d for d in jupyter_path("labextensions")
                  if os.path.isfile(os.path.join(d, LAB_EXTENSION, "package.json"))), None)
    if where is None:
        return [Check("lab extension", FAIL, f"{LAB_EXTENSION} is not installed",
                      "reinstall the package (`pip install jupyter-gpujobs`); from a clone, build it with "
                      "`scripts/run-lab.sh` (needs Node.js)")]
    for folder in jupyter_config_path():
        path = os.path.join(folder, "labconfig", "page_config.json")
        try:
            with open(path) as f:
                disabled = json.load(f).get("disabledExtensions") or {}
        except (OSError, ValueError):
            continue
        # {"name": true} as JupyterLab writes it; a list in older page configs
        if LAB_EXTENSION in disabled if isinstance(disabled, list) else disabled.get(LAB_EXTENSION):
            return [Check("lab extension", FAIL, f"{LAB_EXTENSION} is disabled in {path}",
                          f"jupyter labextension enable {LAB_EXTENSION}")]
    return [Check("lab extension", OK, f"{LAB_EXTENSION} enabled ({os.path.join(where, LAB_EXTENSION)})")]


def check_kernelspecs(ctx: Context) -> list[Check]:
    from .jupyter.kernelspec import INSTALL_HINT, gpu_kernels_in_force

    kernels = gpu_kernels_in_force()
    if not kernels:
        return [Check("GPU kernels", OK, "no GPU kernelspecs (optional)", f"add one: {INSTALL_HINT}")]
    rows = []
    for name, info, s in kernels:
        if isinstance(s, Exception):
            rows.append(Check("GPU kernels", FAIL, f"{name}: {s}",
                              f"reinstall it: jupyter gpujobs kernelspec install --name {name} ..."))
            continue
        gpus = f"{s['gpus']}x{s['gpu_type']}" if s["gpu_type"] else f"{s['gpus']} GPU(s)"
        limit = format_duration(s["time_limit"]) if s["time_limit"] else "server default"
        row = Check("GPU kernels", OK, f"{name} ({gpus}, time limit {limit}) in {info['resource_dir']}")
        available = ctx.info.get("gpu_models")
        if ctx.client is not None and s["gpu_type"] and available is not None and not any(
                s["gpu_type"].lower() in m.lower() for m in available):
            row = Check("GPU kernels", WARN, row.found + f": no {s['gpu_type']} on this server",
                        "its kernels would wait forever; reinstall it with a --type this server has")
        rows.append(row)
    return rows


#: The checks, in the order they are shown. Add one by appending a function Context -> [Check].
CHECKS: list[Callable[[Context], list[Check]]] = [
    check_command, check_engine, check_gpus, check_hidepid, check_store, check_open_files, check_lab_extension,
    check_kernelspecs,
]


def run_checks(url: str | None = None, token: str | None = None) -> list[Check]:
    ctx = Context(url=url, token=token)
    rows: list[Check] = []
    try:
        for check in CHECKS:
            try:
                rows.extend(check(ctx))
            except Exception as err:  # a check that breaks is itself a finding, not a crash
                rows.append(Check(check.__name__.removeprefix("check_"), FAIL, f"{type(err).__name__}: {err}"))
    finally:
        if ctx.client is not None:
            ctx.client.close()
    return rows


def format_checks(rows: list[Check]) -> str:
    width = max(len(r.name) for r in rows)
    lines = []
    for r in rows:
        lines.append(f"{r.status.upper():<4}  {r.name:<{width}}  {r.found}")
        if r.todo and r.status != OK:
            lines.append(f"{'':<4}  {'':<{width}}  -> {r.todo}")
    problems = sum(r.status != OK for r in rows)
    lines.append("all good" if not problems else f"{problems} problem(s); see the -> lines")
    return "\n".join(lines)


def main(url: str | None, token: str | None, as_json: bool) -> int:
    rows = run_checks(url, token)
    print(json.dumps([asdict(r) for r in rows], indent=2) if as_json else format_checks(rows))
    return 1 if any(r.status == FAIL for r in rows) else 0


__all__ = ["CHECKS", "Check", "Context", "format_checks", "main", "run_checks"]
