"""Elastic jobs: gpu_count_min (the fewest GPUs a job runs on; gpu_count is the most) and
resize_gpus (the GPUs a resize in flight moves it to, so that a restart of the server
mid-resize relaunches it there once its processes left, neither twice nor never).

Both nullable: the jobs already stored read back as fixed-size jobs, not resizing.

Written out by hand like 0001-0007; it follows 0007 (services).
Revision ID: 0008.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("gpu_count_min", sa.Integer(), nullable=True))
    op.add_column("jobs", sa.Column("resize_gpus", sa.JSON(none_as_null=True), nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "resize_gpus")
    op.drop_column("jobs", "gpu_count_min")
