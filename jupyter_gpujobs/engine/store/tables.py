"""The database tables of jupyter-gpujobs (SQLAlchemy 2 typed ORM).

`jobs` holds every job with what was asked and what happened, `events` every state change
(who, when, why: the audit log, the accounting source and the websocket feed), and
`allocations` which GPU a job holds. A partial unique index on `allocations` makes it
impossible to hand one whole GPU to two jobs, whatever the code above does; shares of one
card (rows with a `share`) are checked against each other and against whole holders by
`Store.start` in its transaction.
Change these only together with a new alembic revision in `migrations/versions/`.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, Float, ForeignKey, Index, Integer, String, Text, text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


class JobRow(Base):
    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    user: Mapped[str] = mapped_column(String(128), index=True)
    name: Mapped[str] = mapped_column(String(200), default="")
    kind: Mapped[str] = mapped_column(String(16), default="script")
    command: Mapped[list[Any]] = mapped_column(JSON, default=list)
    gpus: Mapped[int] = mapped_column(Integer, default=1)
    gpu_type: Mapped[str | None] = mapped_column(String(64), nullable=True)
    time_limit_s: Mapped[int | None] = mapped_column(Integer, nullable=True)
    priority: Mapped[str] = mapped_column(String(16), default="normal")
    group: Mapped[str | None] = mapped_column("group_name", String(64), nullable=True, index=True)
    preemptible: Mapped[bool] = mapped_column(Boolean, default=False)
    requeue: Mapped[bool] = mapped_column(Boolean, default=True)
    begin: Mapped[float | None] = mapped_column(Float, nullable=True)
    offpeak: Mapped[bool] = mapped_column(Boolean, default=False)
    depends: Mapped[list[Any]] = mapped_column(JSON, default=list)
    array_job_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    array_index: Mapped[int | None] = mapped_column(Integer, nullable=True)
    array_max_running: Mapped[int | None] = mapped_column(Integer, nullable=True)
    cwd: Mapped[str | None] = mapped_column(Text, nullable=True)
    env: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    payload: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    mem_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    cpus: Mapped[float | None] = mapped_column(Float, nullable=True)
    share: Mapped[float | None] = mapped_column(Float, nullable=True)  # revision 0005
    gpu_memory: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    nodes: Mapped[int] = mapped_column(Integer, default=1, server_default="1")  # revision 0011
    image: Mapped[str | None] = mapped_column(Text, nullable=True)  # revision 0013: a container image
    # revision 0010: a signal before the end ("USR1@300"), requeue at a time limit (`Job.max_requeues`)
    warn_signal: Mapped[str | None] = mapped_column(String(32), nullable=True)
    max_requeues: Mapped[int | None] = mapped_column(Integer, nullable=True)
    requeues: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # revision 0009: retries of failed runs, and the hold (`Job.retries`, `Job.held`)
    retries: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    retry_backoff_s: Mapped[int] = mapped_column(Integer, default=30, server_default="30")
    retry_oom: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))
    held: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))
    retried: Mapped[int] = mapped_column(Integer, default=0, server_default="0")

    state: Mapped[str] = mapped_column(String(16), default="PENDING", index=True)
    submitted_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    host: Mapped[str | None] = mapped_column(String(128), nullable=True)
    assigned_gpus: Mapped[list[Any]] = mapped_column(JSON, default=list)
    borrowed: Mapped[bool] = mapped_column(Boolean, default=False)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    signal: Mapped[int | None] = mapped_column(Integer, nullable=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    run_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    restarts: Mapped[int] = mapped_column(Integer, default=0)
    runner_handle: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    log_path: Mapped[str | None] = mapped_column(Text, nullable=True)

    # revision 0012: a user's latest ended jobs of one name, which the monitor reads at each end
    __table_args__ = (Index("ix_jobs_user_name_ended", "user", "name", "ended_at"),)


class EventRow(Base):
    __tablename__ = "events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    time: Mapped[float] = mapped_column(Float, index=True)
    state: Mapped[str] = mapped_column(String(16))
    actor: Mapped[str] = mapped_column(String(128))
    reason: Mapped[str] = mapped_column(Text, default="")
    data: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class AllocationRow(Base):
    __tablename__ = "allocations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    host: Mapped[str] = mapped_column(String(128))
    gpu_index: Mapped[int] = mapped_column(Integer)
    gpu_uuid: Mapped[str] = mapped_column(String(128), default="")
    started_at: Mapped[float] = mapped_column(Float)
    released_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # the part of the card a share job holds (revision 0005); None: the whole card
    share: Mapped[float | None] = mapped_column(Float, nullable=True)

    __table_args__ = (
        Index(
            "uq_allocations_active_gpu",
            "host",
            "gpu_index",
            unique=True,
            sqlite_where=text("released_at IS NULL AND share IS NULL"),
            postgresql_where=text("released_at IS NULL AND share IS NULL"),
        ),
    )


class UsageRow(Base):
    """Decayed fair-share usage (GPU-seconds) per user or group, kept across restarts."""

    __tablename__ = "usage"

    key: Mapped[str] = mapped_column(String(200), primary_key=True)  # "user:alice" / "group:vision"
    gpu_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    updated_at: Mapped[float] = mapped_column(Float, default=0.0)


class QuotaRow(Base):
    """A quota set by an admin through the API or CLI (revision 0004); it overrides the
    configured one of the same user or group, across restarts."""

    __tablename__ = "quotas"

    scope: Mapped[str] = mapped_column(String(16), primary_key=True)  # "users" / "groups"
    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    quota: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    set_by: Mapped[str] = mapped_column(String(128))
    set_at: Mapped[float] = mapped_column(Float)


class QuotaChangeRow(Base):
    """The audit of quota changes: who set or cleared which quota, when, from what to what."""

    __tablename__ = "quota_changes"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    time: Mapped[float] = mapped_column(Float, index=True)
    actor: Mapped[str] = mapped_column(String(128))
    scope: Mapped[str] = mapped_column(String(16))
    name: Mapped[str] = mapped_column(String(128))
    before: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    after: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)

    __table_args__ = (Index("ix_quota_changes_target", "scope", "name"),)


class ReservationRow(Base):
    """An advance reservation (revision 0006): GPUs kept for some users or groups, once or
    repeating; `source` says where it came from ("" by hand, "finding:<id>" from a learned
    proposal that was accepted)."""

    __tablename__ = "reservations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(100), default="")
    gpus: Mapped[int] = mapped_column(Integer)
    gpu_type: Mapped[str | None] = mapped_column(String(64), nullable=True)
    host: Mapped[str | None] = mapped_column(String(253), nullable=True)
    start: Mapped[float] = mapped_column(Float)
    duration_s: Mapped[int] = mapped_column(Integer)
    repeat: Mapped[str | None] = mapped_column(String(16), nullable=True)
    users: Mapped[list[Any]] = mapped_column(JSON, default=list)
    groups: Mapped[list[Any]] = mapped_column(JSON, default=list)
    created_by: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[float] = mapped_column(Float)
    source: Mapped[str] = mapped_column(String(64), default="")


class NotificationRow(Base):
    """A user's notification settings (revision 0007): where the engine tells them about their
    jobs outside Lab (engine/notify.py). Only the user sets their own; no row: none wanted."""

    __tablename__ = "notifications"

    user: Mapped[str] = mapped_column(String(128), primary_key=True)
    email: Mapped[str | None] = mapped_column(String(254), nullable=True)
    webhook: Mapped[str | None] = mapped_column(Text, nullable=True)
    events: Mapped[list[Any]] = mapped_column(JSON, default=list)
    updated_at: Mapped[float] = mapped_column(Float)


class BudgetRow(Base):
    """A GPU-hour budget of a user or group over a period (revision 0008, issue 30; as Slurm's
    GrpTRESMins): `period` "week", "month" or "dates" (then `start`/`end`); `mode` "hold"
    (jobs wait once it is used) or "low" (they run at low priority). `warned_period` and
    `warned_level` keep the warnings (80, 100 %) sent, so a restart sends none twice."""

    __tablename__ = "budgets"

    scope: Mapped[str] = mapped_column(String(16), primary_key=True)  # "users" / "groups"
    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    gpu_hours: Mapped[float] = mapped_column(Float)
    period: Mapped[str] = mapped_column(String(16), default="month")
    start: Mapped[float | None] = mapped_column(Float, nullable=True)
    end: Mapped[float | None] = mapped_column(Float, nullable=True)
    mode: Mapped[str] = mapped_column(String(16), default="hold")
    set_by: Mapped[str] = mapped_column(String(128))
    set_at: Mapped[float] = mapped_column(Float)
    warned_period: Mapped[float | None] = mapped_column(Float, nullable=True)
    warned_level: Mapped[int] = mapped_column(Integer, default=0)


class AuditRow(Base):
    """The audit trail of admin actions and policy changes (revision 0008, issue 30): who did
    what to which target, when, with the state before and after."""

    __tablename__ = "audit"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    time: Mapped[float] = mapped_column(Float, index=True)
    actor: Mapped[str] = mapped_column(String(128))
    action: Mapped[str] = mapped_column(String(64), index=True)
    target: Mapped[str] = mapped_column(String(300), default="")
    before: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    after: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)


# --------------------------------------------------------------------------- monitoring
# (revision 0002; read and written by store/monitoring.py for jupyter_gpujobs/monitor/)


class GPUInfoRow(Base):
    """Every GPU ever seen, by UUID: its model and memory, so usage by model still knows a
    card that has since left the machine."""

    __tablename__ = "gpu_info"

    uuid: Mapped[str] = mapped_column(String(128), primary_key=True)
    host: Mapped[str] = mapped_column(String(128))
    gpu_index: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(128))
    memory_total_mb: Mapped[int] = mapped_column(Integer, default=0)
    first_seen: Mapped[float] = mapped_column(Float)
    last_seen: Mapped[float] = mapped_column(Float)


class GPUSampleRow(Base):
    """GPU readings, downsampled: `resolution` 0 is a raw reading at `time`; 60 and 3600 are
    per-minute and per-hour rows whose `time` is the bucket start and `count` the number of
    raw readings behind them (means are weighted by it)."""

    __tablename__ = "gpu_samples"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    host: Mapped[str] = mapped_column(String(128))
    gpu_index: Mapped[int] = mapped_column(Integer)
    gpu_uuid: Mapped[str] = mapped_column(String(128), default="")
    resolution: Mapped[int] = mapped_column(Integer, default=0)
    time: Mapped[float] = mapped_column(Float)
    count: Mapped[int] = mapped_column(Integer, default=1)
    utilization: Mapped[float | None] = mapped_column(Float, nullable=True)
    utilization_max: Mapped[float | None] = mapped_column(Float, nullable=True)
    memory_used_mb: Mapped[float | None] = mapped_column(Float, nullable=True)
    memory_used_max_mb: Mapped[float | None] = mapped_column(Float, nullable=True)
    memory_total_mb: Mapped[int | None] = mapped_column(Integer, nullable=True)
    temperature_c: Mapped[float | None] = mapped_column(Float, nullable=True)
    temperature_max_c: Mapped[float | None] = mapped_column(Float, nullable=True)
    power_w: Mapped[float | None] = mapped_column(Float, nullable=True)
    power_max_w: Mapped[float | None] = mapped_column(Float, nullable=True)
    ecc_errors: Mapped[int | None] = mapped_column(Integer, nullable=True)
    xid: Mapped[int | None] = mapped_column(Integer, nullable=True)

    __table_args__ = (
        Index("ix_gpu_samples_resolution_time", "resolution", "time"),
        Index("ix_gpu_samples_gpu", "host", "gpu_index", "resolution", "time"),
    )


class JobStatsRow(Base):
    """GPU use of one job over its runs: utilization (mean over its GPUs per reading) and
    memory (summed over its GPUs), mean and peak."""

    __tablename__ = "job_stats"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    samples: Mapped[int] = mapped_column(Integer, default=0)
    utilization_mean: Mapped[float | None] = mapped_column(Float, nullable=True)
    utilization_max: Mapped[float | None] = mapped_column(Float, nullable=True)
    memory_mean_mb: Mapped[float | None] = mapped_column(Float, nullable=True)
    memory_max_mb: Mapped[float | None] = mapped_column(Float, nullable=True)
    memory_total_mb: Mapped[int | None] = mapped_column(Integer, nullable=True)
    memory_max_fraction: Mapped[float | None] = mapped_column(Float, nullable=True)  # peak used/total of one GPU
    first_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    final: Mapped[bool] = mapped_column(Boolean, default=False)


class FindingRow(Base):
    """Something the monitor noticed (out of memory, repeated failures, an idle hog, a GPU with
    errors, a rogue process). An open finding (`resolved_at` NULL) is unique by `key`, so a
    condition seen at every reading is one row whose `last_seen` moves."""

    __tablename__ = "findings"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(32), index=True)
    key: Mapped[str] = mapped_column(String(300))
    severity: Mapped[str] = mapped_column(String(16), default="warning")
    time: Mapped[float] = mapped_column(Float, index=True)
    last_seen: Mapped[float] = mapped_column(Float)
    resolved_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    job_id: Mapped[int | None] = mapped_column(
        ForeignKey("jobs.id", ondelete="SET NULL"), nullable=True, index=True)
    user: Mapped[str | None] = mapped_column(String(128), nullable=True)
    host: Mapped[str | None] = mapped_column(String(128), nullable=True)
    gpu_index: Mapped[int | None] = mapped_column(Integer, nullable=True)
    pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    action: Mapped[str] = mapped_column(String(32), default="")
    message: Mapped[str] = mapped_column(Text, default="")
    data: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)

    __table_args__ = (
        Index(
            "uq_findings_open_key",
            "key",
            unique=True,
            sqlite_where=text("resolved_at IS NULL"),
            postgresql_where=text("resolved_at IS NULL"),
        ),
    )
