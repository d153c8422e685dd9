"""Jobs carry two fields the decision core already uses: state_gib_per_gpu and sizing.

state_gib_per_gpu is the checkpoint size (GiB of state per GPU written when the job is
preempted), from which the core derives checkpoint write and resume times; sizing is a job
given by its model, the planner's PlanRequest as a JSON mapping
(gpupool.sizing.request_json).

Written out by hand like 0001 and 0002. state_gib_per_gpu has a server default of 0, which
fills it in for the jobs already stored; sizing is nullable. So a database at 0002 upgrades
in place and its jobs read back as before: instantly vacatable, sized by their GPU count.
Revision ID: 0003.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column(
        "jobs",
        sa.Column("state_gib_per_gpu", sa.Double(), server_default=sa.text("0"), nullable=False),
    )
    op.add_column("jobs", sa.Column("sizing", sa.JSON(), nullable=True))


def downgrade() -> None:
    # ALTER TABLE ... DROP COLUMN: PostgreSQL, and SQLite since 3.35 (neither column is
    # indexed or constrained, which SQLite would refuse to drop)
    op.drop_column("jobs", "sizing")
    op.drop_column("jobs", "state_gib_per_gpu")
