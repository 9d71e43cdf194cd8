"""Advance reservations: GPUs kept for some users or groups, once or repeating.

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "reservations",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(100), nullable=False, server_default=""),
        sa.Column("gpus", sa.Integer, nullable=False),
        sa.Column("gpu_type", sa.String(64), nullable=True),
        sa.Column("host", sa.String(253), nullable=True),
        sa.Column("start", sa.Float, nullable=False),
        sa.Column("duration_s", sa.Integer, nullable=False),
        sa.Column("repeat", sa.String(16), nullable=True),
        sa.Column("users", sa.JSON, nullable=False),
        sa.Column("groups", sa.JSON, nullable=False),
        sa.Column("created_by", sa.String(128), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("source", sa.String(64), nullable=False, server_default=""),
    )


def downgrade() -> None:
    op.drop_table("reservations")
