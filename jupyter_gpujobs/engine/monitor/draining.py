"""`DrainingBackend`: the engine's GPU backend with the monitor's drained GPUs marked `draining`.

The monitor puts it in front of the engine's backend (`Monitor.install`); the scheduler then
starts no new job on a drained GPU. May call: the GPU backend it wraps.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ...model import GPU
from ..gpus import GPUBackend, GPUProcess, GPUSample


class DrainingBackend(GPUBackend):
    """The engine's view of a backend with the monitor's drained GPUs marked `draining`."""

    def __init__(self, inner: GPUBackend, drained: set[tuple[str, int]]):
        self.inner = inner
        self.drained = drained
        self.name = inner.name

    def inventory(self) -> list[GPU]:
        gpus = self.inner.inventory()
        if not self.drained:
            return gpus
        return [replace(g, draining=True) if (g.host, g.index) in self.drained else g for g in gpus]

    def processes(self) -> dict[int, list[GPUProcess]]:
        return self.inner.processes()

    def sample(self) -> list[GPUSample]:
        return self.inner.sample()

    def close(self) -> None:
        self.inner.close()

    def device_nodes(self) -> dict[int, str]:
        return self.inner.device_nodes()  # the GPU fence needs them: never the base class's none

    def instance_nodes(self) -> dict[int, tuple[str, ...]]:
        return self.inner.instance_nodes()  # the fence between MIG instances: never the base class's none

    def remove_device_nodes(self) -> None:
        self.inner.remove_device_nodes()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
