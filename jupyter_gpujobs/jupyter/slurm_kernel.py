"""GPU kernels on Slurm nodes: the provisioner's path when its engine hands jobs to Slurm.

Under `c.GPUJobs.runner = "slurm"` (the engine's `GET info` says `"runner": "slurm"`), the GPU
kernel provisioner does not start a local process. Instead:

1. Jupyter writes the kernel's connection file as usual (its key is the one that counts); the
   provisioner submits a job of kind `kernel` whose command is this module's launcher followed by
   the kernel's own command line. Slurm starts it on whatever node it picks, with that node's
   `CUDA_VISIBLE_DEVICES`.
2. On the node, the launcher (`python -m jupyter_gpujobs.jupyter.slurm_kernel CONNECTION_FILE --
   KERNEL COMMAND`) picks five free ports on the node's address, rewrites the connection file
   with them (same key, `ip` = the node's address, `gpujobs_node` = the node's name), then execs
   the kernel, which reads that file. The connection file's folder (Jupyter's runtime dir, under
   the user's home) must be on a filesystem the nodes share, as the job logs are.
3. The provisioner waits for the job to run and for the rewritten file, and hands its
   connection info to Jupyter, which connects to the kernel on the node.

From then on the kernel is the Slurm job: `poll` reads the job's state, `kill`/`terminate` end
the job through the engine (which scancels it), interrupts travel as `interrupt_request`
messages on the control channel (no signal crosses machines), and time limits and idle reclaim
are the provisioner's usual ones.

May import: the client, and kernel_host.py (the provisioner as a `KernelHost`, and the start
error, imported where it is raised: the launcher on the node imports this module and needs
no tornado); never the provisioner itself, which imports this module.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..client import FINAL_STATES, AsyncGPUJobsClient, GPUJobsError

if TYPE_CHECKING:
    from .kernel_host import KernelHost

#: Engine URL -> the runner it uses ("local", "slurm"); it does not change while it runs.
_RUNNERS: dict[str, str] = {}
#: Environment variables passed on to a kernel on a node (besides the kernelspec's own `env`).
PASSED_ENV = ("PYTHONPATH", "PATH", "LANG", "LC_ALL", "JUPYTER_PATH", "JUPYTER_RUNTIME_DIR",
              "IPYTHONDIR", "JPY_SESSION_NAME")
PORT_NAMES = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")


async def engine_runner(client: AsyncGPUJobsClient) -> str:
    """The runner of `client`'s engine, from `GET info` (older engines: "local")."""
    runner = _RUNNERS.get(client.url)
    if runner is None:
        try:
            runner = str((await client.info()).get("runner") or "local")
        except GPUJobsError:
            return "local"
        _RUNNERS[client.url] = runner
    return runner


def launcher_command(connection_file: str, kernel_cmd: list[str]) -> list[str]:
    """The job's command: this module's launcher, then the kernel's command line."""
    return [sys.executable, "-m", __name__, connection_file, "--", *kernel_cmd]


class SlurmKernel:
    """One kernel running as a Slurm job, for its provisioner (`provisioner._slurm`)."""

    def __init__(self, provisioner: KernelHost, start_timeout: float = 120.0):
        self.p = provisioner
        self.start_timeout = start_timeout
        self.state: str | None = None  # the job's last known state
        self.exit_code: int | None = None
        self._read_at = 0.0

    async def launch(self, cmd: list[str], connection_file: str, env: dict[str, str], cwd: str | None,
                     settings: dict[str, Any]) -> dict[str, Any]:
        """Submit the kernel as a Slurm job, wait for it to run and to publish its ports;
        returns the connection info."""
        p = self.p
        if p.kernel_spec is not None:
            # no signal reaches another machine: interrupts go as messages on the control channel
            p.kernel_spec.interrupt_mode = "message"
        path = Path(connection_file)
        with path.open() as f:
            before = json.load(f)
        before.pop("gpujobs_node", None)
        path.write_text(json.dumps(before, indent=1))  # a restart: not the previous node's ports
        passed = {k: env[k] for k in PASSED_ENV if k in env}
        passed.update((p.kernel_spec.env or {}) if p.kernel_spec is not None else {})
        job = await p._allocation(settings, command=launcher_command(connection_file, cmd), cwd=cwd,
                                  env=passed)
        self.state = job["state"]
        p._remember(job)
        info = await self._connection_info(path, job["id"])
        km = p.parent
        for name in PORT_NAMES:  # Jupyter keeps ports already set: take the node's
            setattr(km, name, 0)
        km.load_connection_info(info)
        p._write_state(kernel_pid=None)
        return info

    async def _connection_info(self, path: Path, job_id: int) -> dict[str, Any]:
        """The connection file once the launcher on the node rewrote it."""
        # (here: the launcher on the node imports this module, and tornado, which the error
        # comes with, would add about 0.1 s to every kernel start there)
        from .kernel_host import GPUKernelStartError

        deadline = time.monotonic() + self.start_timeout
        while True:
            try:
                info = json.loads(path.read_text())
            except (OSError, ValueError):
                info = {}
            if info.get("gpujobs_node"):
                info["key"] = info["key"].encode()
                return info
            if not await self.running(force=True):
                raise GPUKernelStartError(f"the Slurm job of GPU kernel job {job_id} ended before the kernel "
                                          f"started; see its log (jupyter gpujobs log {job_id})")
            if time.monotonic() > deadline:
                await self.end("FAILED", "the kernel did not start on its Slurm node")
                raise GPUKernelStartError(
                    f"GPU kernel job {job_id} runs in Slurm but its kernel did not publish its ports in "
                    f"{path} within {self.start_timeout:.0f}s: is Jupyter's runtime dir on a filesystem the "
                    "Slurm nodes share?")
            await asyncio.sleep(0.05)

    async def running(self, force: bool = False) -> bool:
        """Is the kernel's job still active? (read at most every 0.2 s unless `force`)"""
        p = self.p
        if p.job_id is None or self.state in FINAL_STATES:
            return False
        if force or time.monotonic() - self._read_at > 0.2:
            self._read_at = time.monotonic()
            try:
                job = await (await p._get_client()).job(p.job_id)
            except GPUJobsError as err:
                if err.status == 404:
                    self.state = "LOST"
                    return False
                return True
            self.state = job["state"]
            self.exit_code = job.get("exit_code")
        return self.state not in FINAL_STATES

    async def poll(self) -> int | None:
        """None while the kernel's job is active, else its exit code (-1 when it has none)."""
        if await self.running():
            return None
        return -1 if self.exit_code is None else int(self.exit_code)

    async def end(self, state: str = "CANCELLED", reason: str = "kernel stopped") -> None:
        """End the kernel's job through the engine, which scancels it in Slurm."""
        if self.state in FINAL_STATES:
            return
        p = self.p
        await p._end(*(p._pending_end or (state, reason)))
        self.state = "CANCELLED"


# ===================================================================== on the node


def free_ports(ip: str, count: int = len(PORT_NAMES)) -> list[int]:
    """`count` distinct free TCP ports on `ip` (bound together, so none is chosen twice)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((ip, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def node_address() -> tuple[str, str]:
    """(this node's name as Slurm knows it, its address)."""
    name = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    return name, os.environ.get("GPUJOBS_KERNEL_IP") or socket.gethostbyname(name)


def main(argv: list[str] | None = None) -> None:
    """`python -m jupyter_gpujobs.jupyter.slurm_kernel CONNECTION_FILE -- KERNEL COMMAND...`"""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3 or args[1] != "--":
        sys.exit("usage: python -m jupyter_gpujobs.jupyter.slurm_kernel CONNECTION_FILE -- KERNEL COMMAND...")
    path, cmd = Path(args[0]), args[2:]
    info = json.loads(path.read_text())
    node, ip = node_address()
    info.update(zip(PORT_NAMES, free_ports(ip)), ip=ip, transport="tcp", gpujobs_node=node)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it holds the kernel's key
    with os.fdopen(fd, "w") as f:
        json.dump(info, f, indent=1)
    tmp.replace(path)
    print(f"gpujobs: kernel on {node} ({ip}), GPUs {os.environ.get('CUDA_VISIBLE_DEVICES', '')}", flush=True)
    os.execvp(cmd[0], cmd)


if __name__ == "__main__":
    main()
