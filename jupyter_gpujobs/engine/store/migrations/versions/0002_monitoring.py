"""Monitoring: GPUs seen, downsampled GPU samples, per-job GPU stats, findings.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gpu_info",
        sa.Column("uuid", sa.String(128), primary_key=True),
        sa.Column("host", sa.String(128), nullable=False),
        sa.Column("gpu_index", sa.Integer, nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("memory_total_mb", sa.Integer, nullable=False),
        sa.Column("first_seen", sa.Float, nullable=False),
        sa.Column("last_seen", sa.Float, nullable=False),
    )
    op.create_table(
        "gpu_samples",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("host", sa.String(128), nullable=False),
        sa.Column("gpu_index", sa.Integer, nullable=False),
        sa.Column("gpu_uuid", sa.String(128), nullable=False),
        sa.Column("resolution", sa.Integer, nullable=False),
        sa.Column("time", sa.Float, nullable=False),
        sa.Column("count", sa.Integer, nullable=False),
        sa.Column("utilization", sa.Float),
        sa.Column("utilization_max", sa.Float),
        sa.Column("memory_used_mb", sa.Float),
        sa.Column("memory_used_max_mb", sa.Float),
        sa.Column("memory_total_mb", sa.Integer),
        sa.Column("temperature_c", sa.Float),
        sa.Column("temperature_max_c", sa.Float),
        sa.Column("power_w", sa.Float),
        sa.Column("power_max_w", sa.Float),
        sa.Column("ecc_errors", sa.Integer),
        sa.Column("xid", sa.Integer),
    )
    op.create_index("ix_gpu_samples_resolution_time", "gpu_samples", ["resolution", "time"])
    op.create_index("ix_gpu_samples_gpu", "gpu_samples", ["host", "gpu_index", "resolution", "time"])
    op.create_table(
        "job_stats",
        sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("samples", sa.Integer, nullable=False),
        sa.Column("utilization_mean", sa.Float),
        sa.Column("utilization_max", sa.Float),
        sa.Column("memory_mean_mb", sa.Float),
        sa.Column("memory_max_mb", sa.Float),
        sa.Column("memory_total_mb", sa.Integer),
        sa.Column("memory_max_fraction", sa.Float),
        sa.Column("first_at", sa.Float),
        sa.Column("last_at", sa.Float),
        sa.Column("final", sa.Boolean, nullable=False),
    )
    op.create_table(
        "findings",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("kind", sa.String(32), nullable=False, index=True),
        sa.Column("key", sa.String(300), nullable=False),
        sa.Column("severity", sa.String(16), nullable=False),
        sa.Column("time", sa.Float, nullable=False, index=True),
        sa.Column("last_seen", sa.Float, nullable=False),
        sa.Column("resolved_at", sa.Float),
        sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id", ondelete="SET NULL"), index=True),
        sa.Column("user", sa.String(128)),
        sa.Column("host", sa.String(128)),
        sa.Column("gpu_index", sa.Integer),
        sa.Column("pid", sa.Integer),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("data", sa.JSON, nullable=False),
    )
    op.create_index(
        "uq_findings_open_key",
        "findings",
        ["key"],
        unique=True,
        sqlite_where=sa.text("resolved_at IS NULL"),
        postgresql_where=sa.text("resolved_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_index("uq_findings_open_key", table_name="findings")
    op.drop_table("findings")
    op.drop_table("job_stats")
    op.drop_index("ix_gpu_samples_gpu", table_name="gpu_samples")
    op.drop_index("ix_gpu_samples_resolution_time", table_name="gpu_samples")
    op.drop_table("gpu_samples")
    op.drop_table("gpu_info")
