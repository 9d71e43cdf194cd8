"""Host memory and CPU limits of a job (--mem, --cpus), enforced by its cgroup.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("mem_bytes", sa.BigInteger, nullable=True))
        batch.add_column(sa.Column("cpus", sa.Float, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("cpus")
        batch.drop_column("mem_bytes")
