"""Jobs carry a wall-time limit and a hold flag; drained nodes are kept in node_drains.

time_limit_s is the limit of one run (since its start or resume) the job was accepted
with, its kind's default filled in at submit (nullable: no limit); held is set by
`gpupool hold` and cleared by `gpupool release` (server default false, so the jobs
already stored read back not held). node_drains lists the nodes an admin drained, so a
restarted server keeps them out of new placements.

Written out by hand like 0001-0004.
Revision ID: 0005.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("time_limit_s", sa.Double(), nullable=True))
    op.add_column(
        "jobs", sa.Column("held", sa.Boolean(), server_default=sa.false(), nullable=False)
    )
    op.create_table(
        "node_drains",
        sa.Column("node", sa.String(), nullable=False),
        sa.Column("since_s", sa.Double(), nullable=False),
        sa.Column("by", sa.String(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("node", name="pk_node_drains"),
    )


def downgrade() -> None:
    op.drop_table("node_drains")
    op.drop_column("jobs", "held")
    op.drop_column("jobs", "time_limit_s")
