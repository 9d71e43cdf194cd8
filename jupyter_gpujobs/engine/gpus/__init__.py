"""GPUs of this machine behind one interface, `GPUBackend`: real ones through NVML, fake
ones for machines without GPUs (tests, demo, binder), or none.

`make_backend(fake_spec, log)` picks the backend: a fake spec (`c.GPUJobs.fake_gpus` or the
environment variable `GPUJOBS_FAKE_GPUS`, e.g. "4xA100-80GB,2xT4") gives fake GPUs; otherwise
NVML; otherwise 0 GPUs with one clear log line saying why and how to get a demo.

Memory used means used by processes, the driver's reservation apart (memory.py); whether a GPU
no job holds is in use outside the queue, and what to do then, is foreign.py's.
"""

from __future__ import annotations

import logging
import os

from ...model import parse_fake_gpus
from .base import LOCAL_HOST, GPUBackend, GPUProcess, GPUSample, NoGPUBackend
from .fake import PIDNS_OFFSET, FakeBackend, fake_uuid
from .foreign import ForeignUse, foreign_use
from .memory import MemoryReading, MemorySplitter

FAKE_ENV = "GPUJOBS_FAKE_GPUS"


def make_backend(fake_spec: str | None, log: logging.Logger, fleet: str | None = None,
                 device_dir: str | None = None) -> GPUBackend:
    """The GPU backend for this machine (see the module docstring for the order).

    `fleet` names a server's fake GPUs so that it sees only its own jobs on them (fake.py).
    `device_dir`: where fake GPUs get their device nodes (fake.py), for the GPU fence.
    A bad fake spec raises `model.InvalidInput` (field "fake_gpus").
    """
    spec = fake_spec or os.environ.get(FAKE_ENV) or None
    if spec and spec.strip():
        return FakeBackend(parse_fake_gpus(spec), fleet=fleet, device_dir=device_dir)
    try:
        from .nvml import NVMLBackend

        backend: GPUBackend = NVMLBackend.open(log)
        if backend.inventory():
            return backend
        backend.close()
        error = "the driver reports no devices"
    except ImportError as err:
        error = f"nvidia-ml-py is not installed ({err})"
    except Exception as err:
        error = str(err) or type(err).__name__
    log.warning("No NVIDIA GPUs found (NVML: %s); reporting 0 GPUs. For a demo without GPUs set "
                "GPUJOBS_FAKE_GPUS=2xA100 or c.GPUJobs.fake_gpus", error)
    return NoGPUBackend(error)


__all__ = [
    "FAKE_ENV", "LOCAL_HOST", "PIDNS_OFFSET", "FakeBackend", "ForeignUse", "GPUBackend", "GPUProcess", "GPUSample",
    "MemoryReading", "MemorySplitter", "NoGPUBackend", "fake_uuid", "foreign_use", "make_backend",
]
