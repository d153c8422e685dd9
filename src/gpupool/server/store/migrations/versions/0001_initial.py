"""Initial schema: jobs, their event log and API tokens.

Written out in full rather than derived from the ORM models, so later model changes cannot
silently change what this revision creates. Revision ID: 0001.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("team", sa.String(), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("gpu_count", sa.Integer(), nullable=False),
        sa.Column("gpu_model", sa.String(), nullable=True),
        sa.Column("command", sa.JSON(), nullable=False),
        sa.Column("env", sa.JSON(), nullable=False),
        sa.Column("cwd", sa.Text(), nullable=True),
        sa.Column("checkpoint_every_s", sa.Double(), nullable=True),
        sa.Column("grace_s", sa.Double(), nullable=False),
        sa.Column("max_retries", sa.Integer(), nullable=False),
        sa.Column("retries", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("reason", sa.Text(), server_default="", nullable=False),
        sa.Column("gpus", sa.JSON(), nullable=False),
        sa.Column("node", sa.String(), nullable=True),
        sa.Column("attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("preemptions", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("pgid", sa.Integer(), nullable=True),
        sa.Column("start_ticks", sa.BigInteger(), nullable=True),
        sa.Column("duration_s", sa.Double(), nullable=True),
        sa.Column("submitted_at", sa.Double(), nullable=False),
        sa.Column("started_at", sa.Double(), nullable=True),
        sa.Column("ended_at", sa.Double(), nullable=True),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.Column("idempotency_key", sa.String(), nullable=True),
        sa.Column("owner_token", sa.String(), nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_jobs"),
        sa.UniqueConstraint("idempotency_key", name="uq_jobs_idempotency_key"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_jobs_team", "jobs", ["team"])
    op.create_index("ix_jobs_state", "jobs", ["state"])
    op.create_table(
        "events",
        sa.Column(
            "seq",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("at_s", sa.Double(), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_events_job_id_jobs"),
        sa.PrimaryKeyConstraint("seq", name="pk_events"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_events_job_id", "events", ["job_id"])
    op.create_table(
        "tokens",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("team", sa.String(), nullable=True),
        sa.Column("hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_tokens"),
        sa.UniqueConstraint("name", name="uq_tokens_name"),
        sa.UniqueConstraint("hash", name="uq_tokens_hash"),
    )


def downgrade() -> None:
    op.drop_table("tokens")
    op.drop_index("ix_events_job_id", table_name="events")
    op.drop_table("events")
    op.drop_index("ix_jobs_state", table_name="jobs")
    op.drop_index("ix_jobs_team", table_name="jobs")
    op.drop_table("jobs")
