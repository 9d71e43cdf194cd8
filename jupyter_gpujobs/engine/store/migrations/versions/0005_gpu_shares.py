"""GPU shares: a job may ask for part of one GPU (`share`, `gpu_memory`), and several share
allocations may hold one card, so the unique index on active allocations covers whole cards only.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("share", sa.Float, nullable=True))
        batch.add_column(sa.Column("gpu_memory", sa.BigInteger, nullable=True))
    op.drop_index("uq_allocations_active_gpu", table_name="allocations")
    with op.batch_alter_table("allocations") as batch:
        batch.add_column(sa.Column("share", sa.Float, nullable=True))
    op.create_index("uq_allocations_active_gpu", "allocations", ["host", "gpu_index"], unique=True,
                    sqlite_where=sa.text("released_at IS NULL AND share IS NULL"),
                    postgresql_where=sa.text("released_at IS NULL AND share IS NULL"))


def downgrade() -> None:
    op.drop_index("uq_allocations_active_gpu", table_name="allocations")
    with op.batch_alter_table("allocations") as batch:
        batch.drop_column("share")
    op.create_index("uq_allocations_active_gpu", "allocations", ["host", "gpu_index"], unique=True,
                    sqlite_where=sa.text("released_at IS NULL"), postgresql_where=sa.text("released_at IS NULL"))
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("gpu_memory")
        batch.drop_column("share")
