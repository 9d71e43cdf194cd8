"""Multi-node jobs on Slurm (issue 30): the nodes a job asks for, `gpus` GPUs on each.

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # a plain ADD COLUMN: a batch copies the jobs table in SQLite, and dropping the old one
    # deletes its events (ON DELETE CASCADE)
    op.add_column("jobs", sa.Column("nodes", sa.Integer, nullable=False, server_default="1"))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("nodes")
