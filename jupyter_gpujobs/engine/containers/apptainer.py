"""The Apptainer (Singularity) runtime (entry point `apptainer`): a job in a `.sif` image file,
run by `apptainer exec` as its owner (the supervisor drops to the owner first; Apptainer never
gives more rights than the user has).

Only image files: a `docker://` reference would be pulled and converted when the job starts,
with its GPUs held, so it is refused at submit with the command that makes the file first
(`apptainer pull IMAGE.sif docker://...`). What the container gets (`wrap`): a clean
environment (`--cleanenv`, the job's variables handed on as APPTAINERENV_*), a contained
/dev, home and /tmp (`--contain`) with exactly the job's GPUs' nodes and the control nodes
bound in, the job's folder and home bound at the same paths, CUDA_VISIBLE_DEVICES renumbered.
The processes stay in the job's cgroup (Apptainer run as a user makes none).

May call: `containers` (the interface). Standard library only (the supervisor imports it).
"""

from __future__ import annotations

import shutil
from typing import TYPE_CHECKING

from . import Runtime, env_inside, not_plain

if TYPE_CHECKING:
    from . import ContainerRun


def program() -> str:
    """apptainer, or singularity where only that is installed."""
    return "apptainer" if shutil.which("apptainer") or not shutil.which("singularity") else "singularity"


class Apptainer(Runtime):
    name = "apptainer"

    @property  # type: ignore[override]
    def program(self) -> str:  # noqa: D401 - the installed one
        return program()

    def refusal(self, image: str) -> str:
        if not image.startswith("/"):
            return (f"Apptainer runs image files given by their absolute path; make one first "
                    f"(apptainer pull NAME.sif {image}): a job never waits for a pull")
        return not_plain(image)

    def exists_command(self, image: str) -> list[str] | None:
        return ["test", "-r", image]

    def missing_text(self, image: str) -> str:
        return f"image file {image} is not there, or you may not read it"


def wrap(run: ContainerRun, command: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """`command` run in the image file `run.image` by Apptainer: its argv and environment."""
    inside = env_inside(env)
    argv = [program(), "exec", "--cleanenv", "--contain", "--no-mount=cwd"]
    for host, there in run.devices:
        argv.append(f"--bind={host}:{there}")
    for host, there, mode in run.mounts:
        argv.append(f"--bind={host}:{there}:{mode}")
    if run.workdir:
        argv.append(f"--pwd={run.workdir}")
    argv.extend(run.options)
    argv.append(run.image)
    argv.extend(command)
    outside = {f"APPTAINERENV_{k}": v for k, v in inside.items()}
    keep = {k: env[k] for k in ("PATH", "HOME", "USER", "LOGNAME", "LANG") if k in env}
    return argv, {**keep, **outside}
