"""Containers (issue 29): a job run in its owner's own image, on its GPUs and nothing else.

Owns what the engine asks of a container runtime, whatever it is: the `Runtime` interface
(is it installed, is an image there for a user, the command line that runs a job in an
image), finding runtimes by name from the entry point group `jupyter_gpujobs.containers`
(as runners are found: a site can add its own), the site's settings (`Containers`: the
default image, the allow-list, the runtime to use) and `ContainerRun`, what the local runner
writes into a run's spec so that its supervisor wraps the job's command (`wrap`).

The supervisor (runners/shim.py) imports this module and one runtime module on the start of
a job in an image (only then: a job without one pays nothing), so both use the standard
library only and look up nothing at import (entry points are read by the engine alone).

May call: nothing of the engine (the runtime modules it loads by name).
"""

from __future__ import annotations

import fnmatch
import importlib
import os
from dataclasses import dataclass, field
from typing import Any

#: The entry point group of container runtimes: name -> a `Runtime` subclass.
ENTRY_POINT_GROUP = "jupyter_gpujobs.containers"

#: Device nodes every CUDA process needs beside its GPUs' (on a real GPU host, where they exist).
NVIDIA_CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")


class ImageProblem(ValueError):
    """An image a job cannot run in here: the text names the image and what to do."""


@dataclass
class ContainerRun:
    """How one run goes into its image: written into the run's spec (`as_spec`) by the local
    runner, read by its supervisor (`wrap`)."""

    module: str  # the runtime's module (it has `wrap`)
    image: str
    name: str  # the container's name: gpujobs-<job id>-<run>
    #: (node on the host, path inside) of exactly the job's GPUs, then the control nodes
    devices: list[tuple[str, str]] = field(default_factory=list)
    #: GPU indices given as CDI names (nvidia-container-toolkit) instead of `devices`
    cdi: list[str] = field(default_factory=list)
    #: (host path, path inside, "ro" | "rw"): the job's folder and its owner's home, the
    #: driver's libraries read-only
    mounts: list[tuple[str, str, str]] = field(default_factory=list)
    workdir: str = ""
    options: list[str] = field(default_factory=list)  # the site's own runtime options

    def as_spec(self) -> dict[str, Any]:
        return {"module": self.module, "image": self.image, "name": self.name,
                "devices": [list(d) for d in self.devices], "cdi": list(self.cdi),
                "mounts": [list(m) for m in self.mounts], "workdir": self.workdir, "options": list(self.options)}

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> ContainerRun:
        return cls(module=str(spec["module"]), image=str(spec["image"]), name=str(spec.get("name") or ""),
                   devices=[(str(a), str(b)) for a, b in spec.get("devices") or ()],
                   cdi=[str(c) for c in spec.get("cdi") or ()],
                   mounts=[(str(a), str(b), str(c)) for a, b, c in spec.get("mounts") or ()],
                   workdir=str(spec.get("workdir") or ""), options=[str(o) for o in spec.get("options") or ()])


class Runtime:
    """A container runtime. Subclasses name themselves (`name`, the entry point's name) and
    give their module's `wrap` (the supervisor's half, standard library only)."""

    name = ""
    #: the program it runs (looked up on PATH)
    program = ""

    def problem(self) -> str:
        """"" when this runtime can run jobs here, else why not (for the submitter and doctor)."""
        from shutil import which

        return "" if which(self.program) else f"{self.program} is not installed on this machine"

    def refusal(self, image: str) -> str:
        """"" when `image` is a reference this runtime runs, else why not."""
        return ""

    def exists_command(self, image: str) -> list[str] | None:
        """The command that exits 0 when `image` is present for the user who runs it (run as
        the job's owner, at submit); None when the image is a file looked at directly."""
        return None

    def missing_text(self, image: str) -> str:
        """What a user reads when `image` is not there for them."""
        return f"image {image} is not on this machine"

    def pull_command(self, image: str) -> list[str] | None:
        """The command that fetches `image` into the storage of the user who runs it (run as
        the job's owner before the job may take GPUs: containers/pull.py; its last line of
        output names the image pulled); None when it is nothing a pull can fetch."""
        return None

    def local_source(self, image: str) -> str | None:
        """The file or folder of this machine a reference is pulled from (looked at as the
        job's owner at submit), None for any other reference."""
        return None

    def module(self) -> str:
        return type(self).__module__


def inside_devices(nodes: list[str]) -> list[tuple[str, str]]:
    """(host node, node inside) of a job's GPUs: inside, each keeps its name (/dev/nvidiaN:
    the driver knows a GPU by its node's minor number, not by its name), a fake GPU's node
    from its folder comes in as /dev/nvidiaN; then the control nodes this host has."""
    return [(node, "/dev/" + os.path.basename(node)) for node in nodes]


def control_devices() -> list[tuple[str, str]]:
    """The NVIDIA control nodes of this host (none without a driver)."""
    return [(node, node) for node in NVIDIA_CONTROL_NODES if os.path.exists(node)]


def not_plain(path: str) -> str:
    """A refusal of a file's path an image names unless it is written plainly (no `.`, `..`
    or `//` parts): the allow-list's shell patterns match it as written (`*` matches `/..`),
    so `/shared/images/../../home/u/x` would pass `/shared/images/*`. "" when it is plain."""
    if os.path.normpath(path) == path:
        return ""
    return f"the path {path} is not written plainly (no '.', '..' or '//' parts): give {os.path.normpath(path)}"


def renumbered(visible: str) -> str:
    """CUDA_VISIBLE_DEVICES inside a container that has only the job's GPUs: 0..n-1 for whole
    GPUs (what CUDA numbers them there), a MIG instance's UUID kept (CUDA finds it by UUID)."""
    out = []
    n = 0
    for part in (p for p in visible.split(",") if p):
        if part.startswith("MIG-"):
            out.append(part)
        else:
            out.append(str(n))
            n += 1
    return ",".join(out)


#: what a job's environment does not carry into its image: the host's search paths and shell
#: (the image has its own), and what the runtime sets itself
NOT_INTO_IMAGE = frozenset({"PATH", "SHELL", "LD_LIBRARY_PATH", "PYTHONHOME", "HOSTNAME", "TERM", "container"})


def env_inside(env: dict[str, str]) -> dict[str, str]:
    """The job's environment as it runs in its image: without `NOT_INTO_IMAGE`, with its GPUs
    renumbered (`renumbered`), and NVIDIA_VISIBLE_DEVICES=void: the engine gives the container
    its GPUs itself, so nvidia-container-toolkit's hook (where a host has it) adds none, neither
    host GPU 0 for a renumbered "0" nor every GPU for the "all" of CUDA images."""
    inside = {k: v for k, v in env.items() if k not in NOT_INTO_IMAGE}
    if "CUDA_VISIBLE_DEVICES" in env:
        inside["CUDA_VISIBLE_DEVICES"] = renumbered(env["CUDA_VISIBLE_DEVICES"])
    inside["NVIDIA_VISIBLE_DEVICES"] = "void"
    return inside


def wrap(spec: dict[str, Any], command: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The supervisor's half: `command` (with `env`) run in the image of `spec`
    (`ContainerRun.as_spec`): the argv to exec and its environment."""
    run = ContainerRun.from_spec(spec)
    module = importlib.import_module(run.module)
    return module.wrap(run, command, env)  # type: ignore[no-any-return]


def _home(unix_user: str | None) -> str:
    """The home of the Unix user a job runs as (None: the engine's own user)."""
    import pwd

    try:
        return pwd.getpwnam(unix_user).pw_dir if unix_user else os.path.expanduser("~")
    except KeyError:
        return ""


def cleanup(spec: dict[str, Any]) -> list[str] | None:
    """The command that removes what the runtime keeps of the container of `spec` once its
    processes are gone (podman keeps the record and the writable layer of a container that was
    killed, e.g. at its time limit), run as the owner; None when there is nothing to remove."""
    run = ContainerRun.from_spec(spec)
    module = importlib.import_module(run.module)
    remove = getattr(module, "cleanup", None)
    return remove(run) if remove is not None else None


def runtime_names() -> list[str]:
    """The container runtimes this installation has (entry points)."""
    from importlib.metadata import entry_points

    return sorted({ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})


def load_runtime(name: str) -> Runtime:
    """The runtime named `name`, from its entry point. ValueError naming the ones there are."""
    from importlib.metadata import entry_points

    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    if not found:
        raise ValueError(f"no container runtime {name!r}; installed: {', '.join(runtime_names()) or 'none'}")
    cls = found[0].load()
    return cls()  # type: ignore[no-any-return]


@dataclass
class Containers:
    """The site's container settings (c.GPUJobs.container_runtime, default_image,
    allowed_images) and what a submission's image comes to under them."""

    runtime: str = "podman"  # the runtime of OCI images; a `.sif` file goes to apptainer
    default_image: str = ""  # a job that names no image runs in this one ("": on the host)
    #: shell patterns an image must match ("docker.io/library/*", "/shared/images/*.sif");
    #: empty: any image
    allowed_images: list[str] = field(default_factory=list)
    #: more options for every container run (the runtime's own words), from the admin
    options: list[str] = field(default_factory=list)
    #: pull (or load) a job's image that is not there for its owner, before it may take GPUs
    #: (c.GPUJobs.container_pull; containers/pull.py), within this many seconds
    pull: bool = True
    pull_timeout_s: float = 1800.0
    #: job id -> the image id the job's own pull named, for references podman runs by id only
    #: (its local transports: each pull of one may name another image); kept by
    #: containers/pull.py for the jobs pending or running
    pulled: dict[int, str] = field(default_factory=dict, repr=False)
    _loaded: dict[str, Runtime] = field(default_factory=dict, repr=False)

    def image_for(self, asked: str | None) -> str:
        """The image a job runs in: the one it asked for, the site's default when it asked for
        none (None), the host ("") when it asked for "" (no image)."""
        return self.default_image if asked is None else asked

    def allowed(self, image: str) -> bool:
        return not self.allowed_images or any(fnmatch.fnmatchcase(image, p) for p in self.allowed_images)

    def runtime_for(self, image: str) -> Runtime:
        """The runtime that runs `image`: apptainer for a `.sif` file, else the configured one.
        ImageProblem when it is not installed or not allowed here."""
        name = "apptainer" if image.endswith(".sif") else self.runtime
        runtime = self._loaded.get(name)
        if runtime is None:
            try:
                runtime = self._loaded[name] = load_runtime(name)
            except ValueError as err:
                raise ImageProblem(f"image {image} needs a container runtime: {err}") from None
        problem = runtime.problem()
        if problem:
            raise ImageProblem(f"image {image} cannot run here: {problem} (container runtime {name!r})")
        refused = runtime.refusal(image)
        if refused:
            raise ImageProblem(f"image {image}: {refused}")
        return runtime

    def launch(self, job_id: int, image: str, cwd: str, gpu_nodes: list[str], unix_user: str | None,
               fake: bool = False) -> dict[str, Any]:
        """What a run of job `job_id` in `image` gets (`ContainerRun.as_spec()`, for its
        LaunchRequest): its GPUs' nodes (or their CDI names where the site has CDI specs of real
        GPUs) and the control nodes, the driver's libraries read-only without CDI, its folder
        `cwd` (also the working directory) and its owner's home read-write at the same paths."""
        runtime = self.runtime_for(image)
        module = importlib.import_module(runtime.module())
        run = ContainerRun(module=runtime.module(), image=self.pulled.get(job_id, image),
                           name=f"gpujobs-{job_id}-{os.urandom(4).hex()}", workdir=cwd, options=list(self.options))
        cdi = not fake and getattr(module, "cdi_available", lambda: False)()
        if cdi:
            run.cdi = [f"nvidia.com/gpu={os.path.basename(n).removeprefix('nvidia')}" for n in gpu_nodes]
        else:
            run.devices = inside_devices(gpu_nodes) + ([] if fake else control_devices())
            libraries = [] if fake else getattr(module, "driver_libraries", list)()
            run.mounts = [(path, path, "ro") for path in libraries]
        home = _home(unix_user)
        for folder in dict.fromkeys(p for p in (home, cwd) if p and p != "/"):
            if not any(folder == m[0] or folder.startswith(m[0].rstrip("/") + "/") for m in run.mounts):
                run.mounts.append((folder, folder, "rw"))
        return run.as_spec()

    def describe(self, runs_containers: bool, runner: str) -> dict[str, Any]:
        """What is in force for GET info and doctor: {"ready": can jobs run in images here,
        "text": one line, "default_image"}."""
        default = self.default_image or "none (the host's environment)"
        allowed = ", ".join(self.allowed_images) or "any"
        problem = ""
        if not runs_containers:
            problem = f"the {runner} runner runs no container images"
        elif runner != "slurm":
            try:
                problem = load_runtime(self.runtime).problem()
            except ValueError as err:
                problem = str(err)
        if problem:
            text = f"none: {problem}; jobs with an image are refused (docs/containers.md)"
        elif runner == "slurm":
            text = f"by Slurm's container support on the nodes; default image {default}; allowed {allowed}"
        else:
            pulls = (f"missing images pulled as the owner before GPUs (within "
                     f"{self.pull_timeout_s:g} s)" if self.pull else "no pulls: missing images refused")
            text = f"{self.runtime}, rootless as each job's owner, on its GPUs alone; default image {default}; " \
                   f"allowed {allowed}; {pulls}"
        return {"ready": not problem, "text": text, "default_image": self.default_image}

    def check(self, image: str) -> Runtime:
        """The runtime of an image a user asked for, after the allow-list; ImageProblem else."""
        if not self.allowed(image):
            raise ImageProblem(f"image {image} is not allowed here; allowed: {', '.join(self.allowed_images)}")
        return self.runtime_for(image)
