"""Who submitted a job inside its team (jobs.user_name), for fair share inside a team.

Written out by hand like 0001-0010; it follows 0010 (learning). Old rows keep NULL: the
core reads them as submitted by their token (owner_token).
Revision ID: 0011.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("user_name", sa.String(), nullable=True))


def downgrade() -> None:
    # ALTER TABLE ... DROP COLUMN: PostgreSQL, and SQLite since 3.35 (as 0002's)
    op.drop_column("jobs", "user_name")
