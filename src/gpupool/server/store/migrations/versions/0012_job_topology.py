"""The topology level a gang requires or prefers (jobs.topology, jobs.topology_preferred).

Written out by hand like 0001-0011; it follows 0011 (job user). Old rows keep NULL: their
gangs run anywhere, as before.
Revision ID: 0012.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("topology", sa.String(), nullable=True))
    op.add_column("jobs", sa.Column("topology_preferred", sa.String(), nullable=True))


def downgrade() -> None:
    # ALTER TABLE ... DROP COLUMN: PostgreSQL, and SQLite since 3.35 (as 0002's)
    op.drop_column("jobs", "topology_preferred")
    op.drop_column("jobs", "topology")
