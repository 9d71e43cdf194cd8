"""Quotas set through the API, kept across restarts, and their audit.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "quotas",
        sa.Column("scope", sa.String(16), primary_key=True),
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("quota", sa.JSON, nullable=False),
        sa.Column("set_by", sa.String(128), nullable=False),
        sa.Column("set_at", sa.Float, nullable=False),
    )
    op.create_table(
        "quota_changes",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("time", sa.Float, nullable=False, index=True),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("scope", sa.String(16), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("before", sa.JSON),
        sa.Column("after", sa.JSON),
    )
    op.create_index("ix_quota_changes_target", "quota_changes", ["scope", "name"])


def downgrade() -> None:
    op.drop_index("ix_quota_changes_target", table_name="quota_changes")
    op.drop_table("quota_changes")
    op.drop_table("quotas")
