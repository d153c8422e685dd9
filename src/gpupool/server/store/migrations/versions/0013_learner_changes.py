"""Which learner a promotion or demotion was of (learning_changes.learner).

Each learner (the job order, the demand forecast) has its own mode, kept in learning_mode
under its own key ("mode" for the job order, as 0010 wrote it; the learner's name for the
others), so only the record of changes needs a column. Old rows are of the job order.
Written out by hand like 0001-0012; it follows 0012 (job topology).
Revision ID: 0013.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column(
        "learning_changes",
        sa.Column("learner", sa.String(), nullable=False, server_default="order"),
    )


def downgrade() -> None:
    # ALTER TABLE ... DROP COLUMN: PostgreSQL, and SQLite since 3.35 (as 0002's)
    op.drop_column("learning_changes", "learner")
