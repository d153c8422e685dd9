"""Jobs carry what multi-cluster placement needs: dataset, dataset_gb, deadline_at,
user_region and latency_bound_ms.

Written out by hand like 0001. Every new column is nullable except dataset_gb, whose server
default of 0 fills it in for the jobs already stored, so a database at 0001 upgrades in place
and its jobs read back with the defaults (no dataset, 0 GB, no deadline, region or bound).
Revision ID: 0002.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("dataset", sa.String(), nullable=True))
    op.add_column(
        "jobs",
        sa.Column("dataset_gb", sa.Double(), server_default=sa.text("0"), nullable=False),
    )
    op.add_column("jobs", sa.Column("deadline_at", sa.Double(), nullable=True))
    op.add_column("jobs", sa.Column("user_region", sa.String(), nullable=True))
    op.add_column("jobs", sa.Column("latency_bound_ms", sa.Double(), nullable=True))


def downgrade() -> None:
    # ALTER TABLE ... DROP COLUMN: PostgreSQL, and SQLite since 3.35 (none of these columns
    # is indexed or constrained, which SQLite would refuse to drop)
    op.drop_column("jobs", "latency_bound_ms")
    op.drop_column("jobs", "user_region")
    op.drop_column("jobs", "deadline_at")
    op.drop_column("jobs", "dataset_gb")
    op.drop_column("jobs", "dataset")
