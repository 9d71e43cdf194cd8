"""What the monitor may use of the engine: `MonitoredEngine`, a structural type.

The monitor (`Monitor`, metrics.py) receives the engine (the JobService is one) and uses
only what is listed here; it imports no part of the service, so the service, its parts and
the API may import the monitor. A new need of the monitor is added here first, where a
reader sees the whole of it. May import: the model, the store, the GPU backends and the
shares' settings, for types only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ...model import GPU, Job, Policy, Reservation
    from ..gpus import GPUBackend
    from ..shares import Shares
    from ..store import Store


class MonitoredEngine(Protocol):
    """The engine as the monitor sees it."""

    # --- state it reads (the draining view is put in front of `gpus` by `Monitor.install`)
    store: Store
    gpus: GPUBackend
    shares: Shares  # GPU shares: the grace, whether they are watched; the watcher sets `used_mb`
    set_aside: dict[int, tuple[str, str]]  # job id -> (what, error): jobs the scheduler set aside
    reservations: list[Reservation]
    cycle_seconds: list[float]  # recent scheduling cycle times (metrics)

    @property
    def inventory(self) -> list[GPU]: ...

    def active_jobs(self) -> list[Job]: ...

    def active_job(self, job_id: int) -> Job | None: ...

    def queue(self) -> list[Job]: ...

    def gpu_views(self) -> list[dict[str, Any]]: ...

    def runner_handles(self) -> dict[int, dict[str, Any]]: ...

    def current_policy(self) -> Policy: ...

    # --- events: it listens to the engine's, and adds its findings to them
    def subscribe(self, listener: Callable[[dict[str, Any]], None]) -> Callable[[], None]: ...

    def broadcast(self, message: dict[str, Any]) -> None: ...

    # --- what it asks of the engine
    def refresh_inventory(self, force: bool = False) -> list[GPU]: ...

    def wake(self) -> None:
        """Run a scheduling cycle soon (a GPU was drained or undrained)."""

    def over_share(self, job_id: int, reason: str, stop: bool) -> None:
        """A job uses more GPU memory than its share: warn it, or stop it."""
