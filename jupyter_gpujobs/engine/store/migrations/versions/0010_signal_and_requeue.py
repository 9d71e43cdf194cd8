"""A signal before the end and requeue at a time limit (issue 27, items 1-3): the signal a job
asks for (`signal: "USR1@5m"`, stored as "USR1@300"), how many times it may go back to the
queue at a time limit or a lost run (`max_requeues`; NULL: only when preempted) and how many
times it did (`requeues`).

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # plain ADD COLUMNs: a batch copies the jobs table in SQLite, and dropping the old one
    # deletes its events (ON DELETE CASCADE)
    op.add_column("jobs", sa.Column("warn_signal", sa.String(32), nullable=True))
    op.add_column("jobs", sa.Column("max_requeues", sa.Integer, nullable=True))
    op.add_column("jobs", sa.Column("requeues", sa.Integer, nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        for column in ("requeues", "max_requeues", "warn_signal"):
            batch.drop_column(column)
