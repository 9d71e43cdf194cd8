"""Users' notification settings: e-mail and webhook for their jobs' events outside Lab.

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "notifications",
        sa.Column("user", sa.String(128), primary_key=True),
        sa.Column("email", sa.String(254)),
        sa.Column("webhook", sa.Text),
        sa.Column("events", sa.JSON, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("notifications")
