"""Credentials: tokens get a role, an expiry and a revocation time; the audit trail.

Written out by hand like 0001-0003. tokens.role is added with a server default of 'team'
and then set to 'admin' for the tokens that have no team, which is what a token without a
team meant before; expires_at, revoked_at and created_by are nullable (no expiry, not
revoked, made before anyone recorded by whom). Revoked tokens now stay in the table
(revoked_at set) instead of being deleted. So a database at 0003 upgrades in place: every
token keeps working with the rights it had. The audit table is new.
Revision ID: 0004.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column("tokens", sa.Column("role", sa.String(), server_default="team", nullable=False))
    op.execute("UPDATE tokens SET role = 'admin' WHERE team IS NULL")
    op.add_column("tokens", sa.Column("expires_at", sa.Double(), nullable=True))
    op.add_column("tokens", sa.Column("revoked_at", sa.Double(), nullable=True))
    op.add_column("tokens", sa.Column("created_by", sa.String(), nullable=True))
    op.create_table(
        "audit",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("at_s", sa.Double(), nullable=False),
        sa.Column("action", sa.String(), nullable=False),
        sa.Column("token", sa.String(), nullable=True),
        sa.Column("role", sa.String(), nullable=True),
        sa.Column("team", sa.String(), nullable=True),
        sa.Column("method", sa.String(), server_default="", nullable=False),
        sa.Column("path", sa.Text(), server_default="", nullable=False),
        sa.Column("status", sa.Integer(), nullable=True),
        sa.Column("client", sa.String(), nullable=True),
        sa.Column("detail", sa.Text(), server_default="", nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_audit"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_audit_at_s", "audit", ["at_s"])


def downgrade() -> None:
    op.drop_index("ix_audit_at_s", table_name="audit")
    op.drop_table("audit")
    # revoked tokens were deleted before 0004: drop them rather than bring them back to life
    op.execute("DELETE FROM tokens WHERE revoked_at IS NOT NULL")
    op.drop_column("tokens", "created_by")
    op.drop_column("tokens", "revoked_at")
    op.drop_column("tokens", "expires_at")
    op.drop_column("tokens", "role")
