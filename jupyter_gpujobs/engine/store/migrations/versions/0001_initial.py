"""The first tables: jobs, events, allocations, usage.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("user", sa.String(128), nullable=False, index=True),
        sa.Column("name", sa.String(200), nullable=False, server_default=""),
        sa.Column("kind", sa.String(16), nullable=False, server_default="script"),
        sa.Column("command", sa.JSON, nullable=False),
        sa.Column("gpus", sa.Integer, nullable=False),
        sa.Column("gpu_type", sa.String(64)),
        sa.Column("time_limit_s", sa.Integer),
        sa.Column("priority", sa.String(16), nullable=False),
        sa.Column("group_name", sa.String(64), index=True),
        sa.Column("preemptible", sa.Boolean, nullable=False),
        sa.Column("requeue", sa.Boolean, nullable=False),
        sa.Column("begin", sa.Float),
        sa.Column("offpeak", sa.Boolean, nullable=False),
        sa.Column("depends", sa.JSON, nullable=False),
        sa.Column("array_job_id", sa.Integer, index=True),
        sa.Column("array_index", sa.Integer),
        sa.Column("array_max_running", sa.Integer),
        sa.Column("cwd", sa.Text),
        sa.Column("env", sa.JSON, nullable=False),
        sa.Column("payload", sa.JSON, nullable=False),
        sa.Column("state", sa.String(16), nullable=False, index=True),
        sa.Column("submitted_at", sa.Float, nullable=False),
        sa.Column("started_at", sa.Float),
        sa.Column("ended_at", sa.Float),
        sa.Column("host", sa.String(128)),
        sa.Column("assigned_gpus", sa.JSON, nullable=False),
        sa.Column("borrowed", sa.Boolean, nullable=False),
        sa.Column("exit_code", sa.Integer),
        sa.Column("signal", sa.Integer),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("run_seconds", sa.Float, nullable=False),
        sa.Column("restarts", sa.Integer, nullable=False),
        sa.Column("runner_handle", sa.JSON, nullable=False),
        sa.Column("log_path", sa.Text),
    )
    op.create_table(
        "events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False, index=True),
        sa.Column("time", sa.Float, nullable=False, index=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("data", sa.JSON, nullable=False),
    )
    op.create_table(
        "allocations",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False, index=True),
        sa.Column("host", sa.String(128), nullable=False),
        sa.Column("gpu_index", sa.Integer, nullable=False),
        sa.Column("gpu_uuid", sa.String(128), nullable=False),
        sa.Column("started_at", sa.Float, nullable=False),
        sa.Column("released_at", sa.Float),
    )
    op.create_index(
        "uq_allocations_active_gpu",
        "allocations",
        ["host", "gpu_index"],
        unique=True,
        sqlite_where=sa.text("released_at IS NULL"),
        postgresql_where=sa.text("released_at IS NULL"),
    )
    op.create_table(
        "usage",
        sa.Column("key", sa.String(200), primary_key=True),
        sa.Column("gpu_seconds", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("usage")
    op.drop_index("uq_allocations_active_gpu", table_name="allocations")
    op.drop_table("allocations")
    op.drop_table("events")
    op.drop_table("jobs")
