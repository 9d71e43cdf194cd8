"""The database tables of jupyter-gpujobs (SQLAlchemy 2 typed ORM).

`jobs` holds every job with what was asked and what happened, `events` every state change
(who, when, why: the audit log, the accounting source and the websocket feed), and
`allocations` which GPU a job holds. A partial unique index on `allocations` makes it
impossible to hand one GPU to two jobs, whatever the code above does.
Change these only together with a new alembic revision in `migrations/versions/`.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Boolean, Float, ForeignKey, Index, Integer, String, Text, text
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

    __table_args__ = (
        Index(
            "uq_allocations_active_gpu",
            "host",
            "gpu_index",
            unique=True,
            sqlite_where=text("released_at IS NULL"),
            postgresql_where=text("released_at IS NULL"),
        ),
    )


class UsageRow(Base):
    """Decayed fair-share usage (GPU-seconds) per user or group, kept across restarts."""

    __tablename__ = "usage"

    key: Mapped[str] = mapped_column(String(200), primary_key=True)  # "user:alice" / "group:vision"
    gpu_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    updated_at: Mapped[float] = mapped_column(Float, default=0.0)
