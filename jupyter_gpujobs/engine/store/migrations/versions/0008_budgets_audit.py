"""GPU-hour budgets per user or group over a period, and the audit trail of admin actions
(issue 30).

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "budgets",
        sa.Column("scope", sa.String(16), primary_key=True),
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("gpu_hours", sa.Float, nullable=False),
        sa.Column("period", sa.String(16), nullable=False),
        sa.Column("start", sa.Float),
        sa.Column("end", sa.Float),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("set_by", sa.String(128), nullable=False),
        sa.Column("set_at", sa.Float, nullable=False),
        sa.Column("warned_period", sa.Float),
        sa.Column("warned_level", sa.Integer, nullable=False),
    )
    op.create_table(
        "audit",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("time", sa.Float, nullable=False),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("target", sa.String(300), nullable=False),
        sa.Column("before", sa.JSON),
        sa.Column("after", sa.JSON),
    )
    op.create_index("ix_audit_time", "audit", ["time"])
    op.create_index("ix_audit_action", "audit", ["action"])


def downgrade() -> None:
    op.drop_index("ix_audit_action", "audit")
    op.drop_index("ix_audit_time", "audit")
    op.drop_table("audit")
    op.drop_table("budgets")
