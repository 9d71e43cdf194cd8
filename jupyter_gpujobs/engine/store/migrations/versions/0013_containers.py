"""Containers (issue 29): the image a job runs in (None: the host's own environment).

Revision ID: 0013
Revises: 0012
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # a plain ADD COLUMN: a batch copies the jobs table in SQLite, and dropping the old one
    # deletes its events (ON DELETE CASCADE)
    op.add_column("jobs", sa.Column("image", sa.Text, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("image")
