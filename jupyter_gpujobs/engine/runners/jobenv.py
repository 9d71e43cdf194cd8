"""Who a job runs as and with what environment, for its supervisor (`shim.py`): the allow-list
of the supervisor's own variables (`ENV_ALLOWED`, `allowed_environment`), the job's environment
(`job_environment`: the request's variables, then the GPUs it holds and its limits), the
visible devices of its GPUs and MIG instances (`visible_devices`), the signal it asked for
before its end (`parse_warning`), and its Unix user (`resolve_user`).

May call: nothing of the package.
Standard library only: the supervisor imports it on every job start.
"""

from __future__ import annotations

import fnmatch
import os
import signal
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence



def visible_devices(indices: Sequence[int], uuids: Sequence[str]) -> str:
    """CUDA_VISIBLE_DEVICES of a job: the index of each whole GPU, the UUID of each MIG
    instance ("MIG-…"), which CUDA addresses by UUID only."""
    out = []
    for n, index in enumerate(indices):
        uuid = uuids[n] if n < len(uuids) else ""
        out.append(uuid if uuid.startswith("MIG-") else str(int(index)))
    return ",".join(out)


#: what a job gets of the supervisor's (so the engine's) environment when it may not inherit
#: it all: the search path and the locale. Never a credential of the engine's.
ENV_ALLOWED = ("PATH", "LANG", "LANGUAGE", "LC_*", "TZ")


def allowed_environment(base: dict[str, str], patterns: Sequence[str]) -> dict[str, str]:
    """The variables of `base` whose names match one of `patterns` (shell-style: "LC_*")."""
    return {k: v for k, v in base.items() if any(fnmatch.fnmatchcase(k, p) for p in patterns)}


def job_environment(spec: dict[str, Any], base: dict[str, str]) -> dict[str, str]:
    """The environment of the job: the shim's own (all of it with `inherit_env`, else only
    what `ENV_ALLOWED` and the admin's `env_allow` name), the request's additions, then the
    variables the runner guarantees (which the additions cannot override)."""
    if spec.get("inherit_env"):
        env = dict(base)
    else:
        env = allowed_environment(base, (*ENV_ALLOWED, *(str(p) for p in spec.get("env_allow") or ())))
    pythonpath = spec.get("pythonpath")
    if pythonpath is None:
        env.pop("PYTHONPATH", None)
    else:
        env["PYTHONPATH"] = pythonpath
    for key in ("GPUJOBS_FAKE", "GPUJOBS_FAKE_GPU_USE"):
        env.pop(key, None)  # never inherit a fake-GPU marker from the server
    env.update({str(k): str(v) for k, v in (spec.get("env") or {}).items()})
    indices = visible_devices(spec.get("gpu_indices") or [], spec.get("gpu_uuids") or [])
    limit = spec.get("time_limit_s")
    env.update({
        "CUDA_VISIBLE_DEVICES": indices,
        "NVIDIA_VISIBLE_DEVICES": indices,
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "GPUJOBS_JOB_ID": str(spec["job_id"]),
        "GPUJOBS_GPU_UUIDS": ",".join(spec.get("gpu_uuids") or []),
        "GPUJOBS_TIME_LIMIT": str(int(limit)) if limit else "",
        "GPUJOBS_KILL_GRACE": str(int(spec.get("grace_s") or 0)),
        "GPUJOBS_PREEMPT_GRACE": str(int(spec["preempt_grace_s"] if spec.get("preempt_grace_s") is not None
                                         else spec.get("grace_s") or 0)),
        "PYTHONUNBUFFERED": "1",
        # when the time limit ends the run (epoch seconds), for jupyter_gpujobs.checkpoint
        "GPUJOBS_ENDS_AT": str(int(time.time() + float(limit))) if limit else "",
    })
    warning = parse_warning(spec.get("warn_signal"))
    if warning is not None:
        env["GPUJOBS_SIGNAL"] = signal.Signals(warning[0]).name[3:]
        env["GPUJOBS_SIGNAL_BEFORE"] = str(int(warning[1]))
    if spec.get("fake"):
        env["GPUJOBS_FAKE"] = "1"
    return env


def parse_warning(text: Any) -> tuple[int, float, bool] | None:
    """(signal number, seconds before the end, first process only) of a stored signal before
    the end ("USR1@300", "B:USR1@300"; model.WarnSignal.text), None for none or a bad one."""
    if not isinstance(text, str) or "@" not in text:
        return None
    first_only = text.startswith("B:")
    name, _, before = text[2 if first_only else 0:].partition("@")
    try:
        return int(getattr(signal, "SIG" + name)), float(before), first_only
    except (AttributeError, ValueError):
        return None


def resolve_user(spec: dict[str, Any]) -> tuple[str, int, int, str, str, list[int]] | None:
    """(name, uid, gid, home, shell, groups) of the Unix user the job runs as, as the runner
    resolved it (`account`), else looked up here; None when the job runs as the supervisor's
    own user. KeyError when there is no such user."""
    name = spec.get("run_as")
    if not name:
        return None
    account = spec.get("account")
    if account:
        return (str(account[0]), int(account[1]), int(account[2]), str(account[3]), str(account[4]),
                [int(g) for g in account[5]])
    import pwd

    entry = pwd.getpwnam(name)
    if entry.pw_uid == os.getuid():
        return None
    return (entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir, entry.pw_shell,
            os.getgrouplist(entry.pw_name, entry.pw_gid))
