"""The podman runtime (entry point `podman`): a job in an OCI image, run by rootless podman as
its owner (the supervisor drops to the owner before it execs podman; the engine never runs
podman as root for a job, so nobody gets root on the host through it).

What a job's container gets (`wrap`):
- the owner's uid and gid inside (`--userns=keep-id`), no capabilities, no new privileges;
- exactly the job's GPUs: its GPUs' device nodes (a fake GPU's node as /dev/nvidiaN) and the
  NVIDIA control nodes, with the driver's libraries mounted read-only; or, where the site has
  CDI specs of nvidia-container-toolkit, the CDI devices of its GPUs;
- its folder (the working directory, also the container's) and its owner's home, read-write at
  the same paths; the host's network (`--network=host`; the site may add its own options);
- its environment without the host's PATH and shell, CUDA_VISIBLE_DEVICES renumbered 0..n-1;
- no pull (`--pull=never`: the image must be there when the job starts; admission checks that
  at submit, and a job whose image is to be pulled (`pull_command`: a registry reference, or
  one of podman's local transports `docker-archive:`, `oci-archive:`, `oci:`) is pulled as its
  owner before it may take GPUs, containers/pull.py), no log of podman's own
  (`--log-driver=none`: the output goes to the job's log as any job's).

The container's processes stay in the job's cgroup (`--cgroup-manager=cgroupfs`: no systemd
scope elsewhere; rootless podman cannot make cgroups of its own in a root-owned one), so the
job's device fence, memory and CPU limits, time limit and stop apply to all of it.

May call: `containers` (the interface). Standard library only (the supervisor imports it).
"""

from __future__ import annotations

import glob
import os
from typing import TYPE_CHECKING

from . import Runtime, env_inside, not_plain

if TYPE_CHECKING:
    from . import ContainerRun

#: where nvidia-container-toolkit writes CDI specs
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
#: the driver's user-space libraries a CUDA program loads (mounted read-only without CDI)
DRIVER_LIBRARIES = ("libcuda.so*", "libnvidia-ml.so*", "libnvidia-ptxjitcompiler.so*", "libnvidia-nvvm.so*",
                    "libcudadebugger.so*", "libnvidia-gpucomp.so*")
LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib")
#: podman's transports that fetch an image from a file or folder of the machine (no registry)
LOCAL_TRANSPORTS = ("docker-archive:", "oci-archive:", "oci:")


class Podman(Runtime):
    name = "podman"
    program = "podman"

    def refusal(self, image: str) -> str:
        if image.startswith(("/", ".")):
            return "podman runs images by name (localhost/name:tag, docker.io/...), not files"
        source = self.local_source(image)
        if source is not None and not source.startswith("/"):
            return f"{image.partition(':')[0]}: needs an absolute path ({image.partition(':')[0]}:/path)"
        return not_plain(source) if source is not None else ""

    def exists_command(self, image: str) -> list[str] | None:
        if self.local_source(image) is not None:
            return None  # podman looks up no stored image by a transport: it is pulled (loaded) each time
        return ["podman", "image", "exists", image]

    def missing_text(self, image: str) -> str:
        if self.pull_command(image) is None:
            return (f"image {image} is not on this machine for you and names no registry to pull it from: build "
                    f"or load it first (podman build, podman load), or pull it yourself (podman pull REFERENCE)")
        return (f"image {image} is not on this machine for you: pull it first (podman pull {image}); "
                "this site pulls no image for a job (c.GPUJobs.container_pull)")

    def local_source(self, image: str) -> str | None:
        for transport in LOCAL_TRANSPORTS:
            if image.startswith(transport):
                return image[len(transport):].partition(":")[0]
        return None

    def pull_command(self, image: str) -> list[str] | None:
        if self.local_source(image) is None and not has_registry(image):
            return None
        return ["podman", "--log-level=error", "pull", image]


def has_registry(image: str) -> bool:
    """Does a reference name a registry to pull from (docker.io/library/python:3.12,
    registry:5000/x)? `localhost/...` is podman's name of an image built or loaded here."""
    first, slash, _rest = image.partition("/")
    return bool(slash) and first != "localhost" and ("." in first or ":" in first)


def cdi_available() -> bool:
    """Does this host have CDI specs of NVIDIA GPUs (nvidia-container-toolkit)?"""
    return any(glob.glob(os.path.join(d, "nvidia*.yaml")) or glob.glob(os.path.join(d, "nvidia*.json"))
               for d in CDI_DIRS)


def driver_libraries() -> list[str]:
    """The NVIDIA driver's libraries on this host (none without a driver)."""
    found: list[str] = []
    for folder in LIBRARY_DIRS:
        for pattern in DRIVER_LIBRARIES:
            found.extend(sorted(glob.glob(os.path.join(folder, pattern))))
    return found


def wrap(run: ContainerRun, command: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """`command` run in `run.image` by podman: its argv and podman's environment (the job's,
    which podman hands on by name: no value is on the command line)."""
    inside = env_inside(env)
    argv = ["podman", "--log-level=error", "--cgroup-manager=cgroupfs", "run", "--rm", "--name", run.name, "--pull=never",
            "--log-driver=none", "--network=host", "--userns=keep-id", "--cap-drop=all",
            "--security-opt=no-new-privileges"]
    for host, there in run.devices:
        argv.append(f"--device={host}:{there}")
    for name in run.cdi:
        argv.append(f"--device={name}")
    for host, there, mode in run.mounts:
        argv.append(f"--mount=type=bind,source={host},destination={there}" + (",ro" if mode == "ro" else ""))
    if run.workdir:
        argv.append(f"--workdir={run.workdir}")
    for key in sorted(inside):
        argv.append(f"--env={key}")
    argv.extend(run.options)
    argv.append(run.image)
    argv.extend(command)
    return argv, {**inside, "PATH": env.get("PATH") or "/usr/local/bin:/usr/bin:/bin"}


def cleanup(run: ContainerRun) -> list[str]:
    """Remove the container's record and writable layer (`--rm` does it only when its podman
    lives to see it end; a job stopped at its limit has it killed with the rest)."""
    return ["podman", "--log-level=error", "rm", "--force", "--ignore", run.name]
