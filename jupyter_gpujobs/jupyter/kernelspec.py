"""`jupyter gpujobs kernelspec install|list`: the kernelspecs whose kernels queue for GPUs.

A GPU kernelspec is a copy of an existing one (python3 by default: its argv, language, env,
logos) plus `metadata.kernel_provisioner` naming `gpujobs-provisioner` with the request
(`gpus`, `gpu_type`, `time_limit`, `priority`, `idle_timeout`, `max_wait`, `signal`, `image`). It is installed
with jupyter_client's `KernelSpecManager.install_kernel_spec`, so it lands where Jupyter looks
(`--user`, `--sys-prefix`, `--prefix`, or the system-wide default) and shows in the Lab launcher.

    jupyter gpujobs kernelspec install --name python3-gpu --display-name "Python 3 (1 GPU, 4h)" \\
        --gpus 1 --time 4h --type A100 --idle-timeout 30m --max-wait 1h --user
    jupyter gpujobs kernelspec install --name python3-gpu-16g --gpu-mem 16G --time 8h --user  # a share
    jupyter gpujobs kernelspec list
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
from typing import Any

from ..model import (
    InvalidInput,
    format_duration,
    parse_duration,
    parse_gpu_memory,
    parse_gpus,
    parse_image,
    parse_priority,
    parse_warn_signal,
)
from .provisioner import PROVISIONER_NAME

_NAME = re.compile(r"^[a-z0-9._-]+$", re.IGNORECASE)
#: How to add a first GPU kernelspec (said where none is installed).
INSTALL_HINT = "jupyter gpujobs kernelspec install --name python3-gpu --gpus 1 --time 4h --user"


def build_spec(wrapped: dict[str, Any], *, gpus: Any, time_limit: Any, gpu_type: str | None = None,
               priority: str = "normal", idle_timeout: Any = None, max_wait: Any = None,
               display_name: str | None = None, gpu_memory: Any = None, signal: str | None = None,
               image: str | None = None) -> dict[str, Any]:
    """kernel.json of a GPU kernelspec wrapping `wrapped` (a kernel.json dict). Raises InvalidInput.
    `gpus` below 1 (0.5) or `gpu_memory` ("16G"): its kernels run on a share of one GPU."""
    n, share = parse_gpus(gpus, "gpus")
    if n < 1:
        raise InvalidInput("gpus", "a GPU kernel needs at least 1 GPU or a share of one, e.g. 0.5")
    memory = parse_gpu_memory(gpu_memory) if gpu_memory not in (None, "") else None
    if memory is not None and n != 1:
        raise InvalidInput("gpu_memory", f"asks for memory on one shared GPU; it cannot go with {n} GPUs")
    limit = parse_duration(time_limit, "time_limit")
    config: dict[str, Any] = {"gpus": share if share is not None else n, "time_limit": format_duration(limit),
                              "priority": parse_priority(priority or "normal")}
    if memory is not None:
        config["gpu_memory"] = f"{memory >> 20}M" if memory % (1 << 30) else f"{memory >> 30}G"
    if gpu_type is not None:
        if not gpu_type.strip() or not re.fullmatch(r"[\w.-]+", gpu_type.strip()):
            raise InvalidInput("gpu_type", f"expected a GPU model such as A100, got {gpu_type!r}")
        config["gpu_type"] = gpu_type.strip()
    if idle_timeout not in (None, ""):
        config["idle_timeout"] = format_duration(parse_duration(idle_timeout, "idle_timeout"))
    if max_wait not in (None, ""):
        config["max_wait"] = format_duration(parse_duration(max_wait, "max_wait"))
    if signal not in (None, ""):  # a signal before the time limit (`--signal USR1@5m`)
        config["signal"] = parse_warn_signal(signal, limit, "signal").text()
    if image is not None:  # the container image its kernels run in (issue 29); "": the host
        config["image"] = parse_image(image)
    if not display_name:
        base = re.sub(r"\s*\(ipykernel\)\s*$", "", wrapped.get("display_name") or "Kernel")
        if share is not None or memory is not None:  # "0.5 of a GPU", "16G of an A100"
            part = config.get("gpu_memory") or f"{share:g}"
            what = f"{part} of {'a GPU' if 'gpu_type' not in config else config['gpu_type']}"
        else:
            what = f"{n}x{config['gpu_type']}" if "gpu_type" in config else f"{n} GPU{'s' if n > 1 else ''}"
        display_name = f"{base} ({what}, {config['time_limit']})"
    spec = {k: v for k, v in wrapped.items() if k not in ("display_name", "metadata")}
    metadata = dict(wrapped.get("metadata") or {})
    metadata["kernel_provisioner"] = {"provisioner_name": PROVISIONER_NAME, "config": config}
    spec["display_name"] = display_name
    spec["metadata"] = metadata
    return spec


def _where(args: argparse.Namespace) -> dict[str, Any]:
    if getattr(args, "user", False):
        return {"user": True, "prefix": None}
    if getattr(args, "sys_prefix", False):
        return {"user": False, "prefix": sys.prefix}
    if getattr(args, "prefix", None):
        return {"user": False, "prefix": os.path.abspath(args.prefix)}
    return {"user": False, "prefix": None}  # Jupyter's default: the system-wide kernel dir


def install(args: argparse.Namespace) -> int:
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    name = args.name.strip()
    if not _NAME.match(name):
        raise InvalidInput("name", f"{name!r} is not a valid kernelspec name; use letters, digits, '.', '_', '-'")
    ksm = KernelSpecManager()
    try:
        wrapped = ksm.get_kernel_spec(args.kernel)
    except NoSuchKernel:
        raise InvalidInput("kernel", f"no kernelspec {args.kernel!r} to wrap; see `jupyter kernelspec list`") from None
    source = wrapped.to_dict()
    wrapped_provisioner = (source.get("metadata") or {}).get("kernel_provisioner", {}).get("provisioner_name")
    if wrapped_provisioner == PROVISIONER_NAME:
        raise InvalidInput("kernel", f"{args.kernel!r} is already a GPU kernelspec; wrap a plain one (e.g. python3)")
    spec = build_spec(source, gpus=args.gpus, time_limit=args.time_limit, gpu_type=args.gpu_type,
                      priority=args.priority, idle_timeout=args.idle_timeout, max_wait=args.max_wait,
                      display_name=args.display_name, gpu_memory=getattr(args, "gpu_memory", None),
                      signal=getattr(args, "signal", None), image=getattr(args, "image", None))
    with tempfile.TemporaryDirectory() as tmp:
        folder = os.path.join(tmp, name)
        os.mkdir(folder)
        for entry in os.listdir(wrapped.resource_dir):  # logos and other resources
            if entry != "kernel.json" and os.path.isfile(os.path.join(wrapped.resource_dir, entry)):
                shutil.copy(os.path.join(wrapped.resource_dir, entry), folder)
        with open(os.path.join(folder, "kernel.json"), "w") as f:
            json.dump(spec, f, indent=1)
        try:
            dest = ksm.install_kernel_spec(folder, kernel_name=name, **_where(args))
        except PermissionError as err:
            print(f"error: cannot write {err.filename or 'the kernelspec'}: permission denied; "
                  "use --user or --sys-prefix", file=sys.stderr)
            return 1
        except (OSError, ValueError) as err:
            print(f"error: cannot install kernelspec {name!r}: {err}", file=sys.stderr)
            return 1
    cfg = spec["metadata"]["kernel_provisioner"]["config"]
    print(f"installed GPU kernelspec {name} ({spec['display_name']}) in {dest}")
    print("  " + ", ".join(f"{k}={v}" for k, v in cfg.items()))
    return 0


def gpu_kernelspecs() -> dict[str, dict[str, Any]]:
    """name -> {"resource_dir", "spec"} of every installed GPU kernelspec."""
    from jupyter_client.kernelspec import KernelSpecManager

    out = {}
    for name, info in sorted(KernelSpecManager().get_all_specs().items()):
        provisioner = (info["spec"].get("metadata") or {}).get("kernel_provisioner") or {}
        if provisioner.get("provisioner_name") == PROVISIONER_NAME:
            out[name] = info
    return out


def server_config() -> Any:
    """The Jupyter server's config files (jupyter_config, jupyter_server_config), as the server
    reads them: where `c.GPUKernelProvisioner.*` defaults for every GPU kernel are set."""
    from jupyter_core.application import JupyterApp

    class _ServerConfig(JupyterApp):  # type: ignore[misc]
        name = "jupyter-server"

        @property
        def config_file_name(self) -> str:  # type: ignore[override]
            return "jupyter_server_config"

    app = _ServerConfig()
    app.load_config_file()
    return app.config


def settings_in_force(spec: dict[str, Any], config: Any = None) -> dict[str, Any]:
    """The request a kernel of `spec` makes: its kernelspec's values, else the server's
    `c.GPUKernelProvisioner` config, else the provisioner's defaults (e.g. max_wait 1h).
    Raises GPUKernelStartError naming a bad value."""
    from .provisioner import GPUKernelProvisioner

    cfg = (spec.get("metadata") or {}).get("kernel_provisioner", {}).get("config") or {}
    return GPUKernelProvisioner(config=config, **cfg)._settings()


def gpu_kernels_in_force() -> list[tuple[str, dict[str, Any], dict[str, Any] | Exception]]:
    """Every installed GPU kernelspec as (name, {"resource_dir", "spec"}, the request its kernels
    make, from `settings_in_force`), or in third place the GPUKernelStartError naming its bad
    value. For `kernelspec list` and `doctor`."""
    from .provisioner import GPUKernelStartError

    specs = gpu_kernelspecs()
    config = server_config() if specs else None
    out: list[tuple[str, dict[str, Any], dict[str, Any] | Exception]] = []
    for name, info in specs.items():
        try:
            out.append((name, info, settings_in_force(info["spec"], config)))
        except GPUKernelStartError as err:
            out.append((name, info, err))
    return out


def list_specs(args: argparse.Namespace) -> int:
    kernels = gpu_kernels_in_force()
    if not kernels:
        print(f"no GPU kernelspecs; add one with: {INSTALL_HINT}")
        return 0
    rows = []
    for name, info, s in kernels:
        if isinstance(s, Exception):
            rows.append([name, info["spec"].get("display_name", ""), f"error: {s}", "", "", "",
                         info["resource_dir"]])
            continue
        gpus = (f"{s['share']:g}" if s.get("share") is not None else str(s["gpus"]))
        if s.get("gpu_memory") is not None:
            gpus += f"/{s['gpu_memory'] / (1 << 30):.3g}G"
        gpus += f"x{s['gpu_type']}" if s["gpu_type"] else ""
        rows.append([name, info["spec"].get("display_name", ""), gpus,
                     format_duration(s["time_limit"]) if s["time_limit"] else "server default",
                     format_duration(s["idle_timeout"]) if s["idle_timeout"] else "never",
                     format_duration(s["max_wait"]) if s["max_wait"] else "no limit", info["resource_dir"]])
    headers = ["NAME", "DISPLAY NAME", "GPUS", "TIME", "IDLE", "MAX WAIT", "PATH"]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    for row in [headers, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    return 0


def main(args: argparse.Namespace) -> int:
    """Entry from `jupyter gpujobs kernelspec ...` (cli.py parses the arguments)."""
    if args.ks_cmd == "install":
        return install(args)
    if args.ks_cmd == "list":
        return list_specs(args)
    print("usage: jupyter gpujobs kernelspec install|list (see --help)", file=sys.stderr)
    return 2


__all__ = ["build_spec", "gpu_kernels_in_force", "gpu_kernelspecs", "install", "list_specs", "main"]
