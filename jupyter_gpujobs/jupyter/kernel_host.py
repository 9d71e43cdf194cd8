"""What the GPU kernel provisioner and its Slurm path share, so that neither imports the other.

- `GPUKernelStartError`: a GPU kernel could not start; both the provisioner (provisioner.py)
  and the Slurm kernel (slurm_kernel.py) raise it, and the kernelspec checks (kernelspec.py)
  catch it.
- `KernelHost`: the provisioner as the Slurm kernel uses it (its kernelspec, kernel manager,
  job and the calls that queue, record and end that job). provisioner.py makes a
  `SlurmKernel(self)`; slurm_kernel.py knows it only by this type.

May import: tornado (the error is an HTTP error), the client's types.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from tornado import web

if TYPE_CHECKING:
    from ..client import AsyncGPUJobsClient


class GPUKernelStartError(web.HTTPError):
    """A GPU kernel could not start (no GPU within the maximum wait, a refused request).

    A tornado HTTPError, so the server answers `POST /api/kernels` with this status and the
    message (JupyterLab shows it in its "Error Starting Kernel" dialog); elsewhere (nbclient,
    jupyter console) it is an ordinary exception whose text is the message.
    """

    def __init__(self, message: str, status: int = 503):
        super().__init__(status, message)  # log_message: what the server's JSON answer shows
        self.message = message

    def __str__(self) -> str:
        return self.message


class KernelHost(Protocol):
    """The GPU kernel provisioner, as its Slurm path (`SlurmKernel`) uses it."""

    kernel_spec: Any  # jupyter_client's KernelSpec (its `env`, `interrupt_mode`), or None
    parent: Any  # the kernel manager: its connection info is set from the node's
    job_id: int | None  # the kernel's job, once queued
    _pending_end: tuple[str, str] | None  # how the job is to end (idle, time limit), if decided

    async def _get_client(self) -> AsyncGPUJobsClient:
        """The engine's client, shared by the kernels of this process."""
        ...

    async def _allocation(self, settings: dict[str, Any], command: list[str] | None = None,
                          **extra: Any) -> dict[str, Any]:
        """Queue the kernel's job (here with its `command`) and wait until it runs."""
        ...

    def _remember(self, job: dict[str, Any]) -> None:
        """Keep what the running job says (its deadline)."""

    def _write_state(self, kernel_pid: int | None) -> None:
        """Record the allocation for reconciliation after a server restart."""

    async def _end(self, state: str, reason: str) -> None:
        """Report the end of the job to the engine (once)."""
