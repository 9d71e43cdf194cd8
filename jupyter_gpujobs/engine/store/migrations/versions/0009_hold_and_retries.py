"""Hold and retries (issue 27): a job may be held out of scheduling until released, and
retried after a failed run (how many times, the first wait, whether out of memory counts).

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # plain ADD COLUMNs (with defaults for the rows there): a batch would copy the jobs table
    # in SQLite, and dropping the old one deletes its events (ON DELETE CASCADE)
    op.add_column("jobs", sa.Column("retries", sa.Integer, nullable=False, server_default="0"))
    op.add_column("jobs", sa.Column("retry_backoff_s", sa.Integer, nullable=False, server_default="30"))
    op.add_column("jobs", sa.Column("retry_oom", sa.Boolean, nullable=False, server_default=sa.false()))
    op.add_column("jobs", sa.Column("held", sa.Boolean, nullable=False, server_default=sa.false()))
    op.add_column("jobs", sa.Column("retried", sa.Integer, nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        for column in ("retried", "held", "retry_oom", "retry_backoff_s", "retries"):
            batch.drop_column(column)
