"""The learned policy's standing in the live service, kept across restarts.

- learning_mode: one row per server (key "mode"): shadow or active, and when and why it
  was last set.
- learning_changes: every promotion and demotion (by a person, or the guard's own fall
  back recorded as it happened), with the replay evidence a promotion was granted on.

Written out by hand like 0001-0009; it follows 0009 (telemetry history).
Revision ID: 0010.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "learning_mode",
        sa.Column("key", sa.String(), nullable=False),
        sa.Column("mode", sa.String(), nullable=False),
        sa.Column("set_at_s", sa.Double(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("key", name="pk_learning_mode"),
    )
    op.create_table(
        "learning_changes",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("at_s", sa.Double(), nullable=False),
        sa.Column("action", sa.String(), nullable=False),
        sa.Column("mode", sa.String(), nullable=False),
        sa.Column("by", sa.String(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("evidence", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_learning_changes"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_learning_changes_at_s", "learning_changes", ["at_s"])


def downgrade() -> None:
    op.drop_index("ix_learning_changes_at_s", table_name="learning_changes")
    op.drop_table("learning_changes")
    op.drop_table("learning_mode")
