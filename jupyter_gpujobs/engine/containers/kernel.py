"""A GPU kernel in its image (issue 29), on the user's side:
`python -m jupyter_gpujobs.engine.containers.kernel GO_FILE -- KERNEL_COMMAND...`.

The GPU kernel provisioner (jupyter/provisioner.py) starts this launcher as the kernel's
process, as the kernel's user. It waits until the provisioner has had it confined in its
job's cgroup (`POST jobs/{id}/adopt`) and has written the engine's answer, with the container
the engine made for the job (`ContainerRun.as_spec()`: the job's GPUs, its folder, the site's
options), to GO_FILE; then it becomes the container runtime on the kernel's command
(`containers.wrap`), so the runtime and all it starts are in the job's cgroup: its device
fence, limits and time limit hold for the whole container. The kernel's working directory and
its connection file's folder are mounted at the same paths (the kernel binds its ports on the
host's network, where the server connects to them). ipykernel must be in the image, or
mounted into it by the site (c.GPUJobs.container_options; docs/containers.md).

May call: `containers` (`wrap`). Standard library only.
"""

from __future__ import annotations

import json
import os
import pwd
import sys
import time
from typing import Any

from . import wrap

#: the longest wait for the provisioner's answer (the engine confines a kernel in milliseconds)
WAIT_S = 60.0


def _connection_folder(command: list[str]) -> str | None:
    """The folder of the kernel's connection file (`-f FILE` or `--f=FILE` in its command)."""
    for i, arg in enumerate(command):
        if arg in ("-f", "--f") and i + 1 < len(command):
            return os.path.dirname(os.path.abspath(command[i + 1]))
        if arg.startswith(("--f=", "-f=")):
            return os.path.dirname(os.path.abspath(arg.split("=", 1)[1]))
    return None


def container_for(answer: dict[str, Any], command: list[str], cwd: str) -> dict[str, Any]:
    """The engine's container of the kernel's job, with the kernel's folder (also its working
    directory) and its connection file's folder mounted. ValueError when there is none."""
    spec = answer.get("container")
    if not isinstance(spec, dict):
        raise ValueError(answer.get("error") or "the engine gave no container for this kernel's job")
    mounts = [list(m) for m in spec.get("mounts") or ()]
    for folder in (cwd, _connection_folder(command)):
        if folder and not any(folder == m[0] or folder.startswith(str(m[0]).rstrip("/") + "/") for m in mounts):
            mounts.append([folder, folder, "rw"])
    return {**spec, "mounts": mounts, "workdir": cwd}


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m jupyter_gpujobs.engine.containers.kernel GO_FILE -- KERNEL_COMMAND...",
              file=sys.stderr)
        return 2
    go, command = argv[0], argv[2:]
    deadline = time.monotonic() + WAIT_S
    while not os.path.exists(go):
        if time.monotonic() > deadline:
            print(f"gpujobs: the kernel's job was not confined within {WAIT_S:g} s; not starting its container",
                  file=sys.stderr)
            return 1
        time.sleep(0.02)
    with open(go) as f:
        answer = json.load(f)
    os.unlink(go)
    try:
        os.rmdir(os.path.dirname(go))  # the provisioner's private folder for it
    except OSError:
        pass
    try:
        spec = container_for(answer, command, os.getcwd())
    except ValueError as err:
        print(f"gpujobs: {err}", file=sys.stderr)
        return 1
    env = dict(os.environ)
    # the user's own home (their account's), where their images are: the one the engine
    # looked for the image in at submit, as for any job in an image, whatever the server's HOME
    env["HOME"] = pwd.getpwuid(os.getuid()).pw_dir
    argv_run, env = wrap(spec, command, env)
    os.execvpe(argv_run[0], argv_run, env)
    return 1  # (not reached)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
