"""An index on jobs (user, name, ended_at): the monitor reads a user's latest ended jobs of one
name at every job's end ("failed N times in a row"), which sorted all of them without it.

Revision ID: 0012
Revises: 0011
"""

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_jobs_user_name_ended", "jobs", ["user", "name", "ended_at"])


def downgrade() -> None:
    op.drop_index("ix_jobs_user_name_ended", table_name="jobs")
