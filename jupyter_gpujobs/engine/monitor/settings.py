"""`MonitorSettings`: what the monitor is told (the c.GPUJobs traitlets, see config.py).

May call: the model's duration parser.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...model import parse_duration


@dataclass(frozen=True)
class MonitorSettings:
    """What the monitor is told (c.GPUJobs traitlets, see config.py)."""

    enabled: bool = True
    sample_interval: float = 5.0
    raw_retention_s: float = 6 * 3600
    minute_retention_s: float = 14 * 86400
    hour_retention_s: float = 400 * 86400
    idle_hog_after_s: float = 1800
    idle_hog_threshold: float = 1.0
    rogue_policy: str = "warn"  # "warn" | "kill"
    rogue_ignore: tuple[str, ...] = ("Xorg", "gnome-shell", "nvidia-persistenced")
    drain_after_errors: int = 0  # 0: never drain automatically
    gpu_error_repeat: int = 2
    failure_streak: int = 3
    oom_memory_fraction: float = 0.95
    predict_min_confidence: float = 0.6
    kill_grace_s: float = 10
    # learned reservations and quiet hours (habits.py): how often, how far back, how sure
    habits_interval_s: float = 3600
    habits_lookback_weeks: int = 8
    habits_min_weeks: int = 3
    quiet_threshold: float = 20.0  # percent utilization under which an hour is quiet

    @classmethod
    def from_config(cls, cfg: Any) -> MonitorSettings:
        def seconds(name: str, default: float) -> float:
            value = getattr(cfg, name, None)
            return float(parse_duration(value, f"c.GPUJobs.{name}")) if value not in (None, "") else default

        d = cls()
        return cls(
            enabled=bool(getattr(cfg, "monitor", True)),
            sample_interval=float(getattr(cfg, "sample_interval", d.sample_interval)),
            raw_retention_s=seconds("sample_retention", d.raw_retention_s),
            minute_retention_s=seconds("sample_retention_minutes", d.minute_retention_s),
            hour_retention_s=seconds("sample_retention_hours", d.hour_retention_s),
            idle_hog_after_s=seconds("idle_hog_after", d.idle_hog_after_s),
            idle_hog_threshold=float(getattr(cfg, "idle_hog_threshold", d.idle_hog_threshold)),
            rogue_policy=str(getattr(cfg, "rogue_policy", d.rogue_policy)),
            rogue_ignore=tuple(getattr(cfg, "rogue_ignore", d.rogue_ignore)),
            drain_after_errors=int(getattr(cfg, "drain_after_errors", d.drain_after_errors)),
            failure_streak=int(getattr(cfg, "failure_streak", d.failure_streak)),
            oom_memory_fraction=float(getattr(cfg, "oom_memory_fraction", d.oom_memory_fraction)),
            predict_min_confidence=float(getattr(cfg, "predict_min_confidence", d.predict_min_confidence)),
            kill_grace_s=float(cfg.seconds("kill_grace")) if hasattr(cfg, "seconds") else d.kill_grace_s,
        )
