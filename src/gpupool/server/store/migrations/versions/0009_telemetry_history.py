"""Telemetry history: what each card measured and each service served, minute by minute,
and the fleet and settings the monthly review reads back without a running server.

- gpu_minutes: per-GPU means over one bucket (memory used, SM utilisation, power,
  temperature) and how many samples each mean is of; pruned by age and a row cap.
- service_minutes: each service's p99 latency and request rate over one bucket.
- fleet_gpus: the cards the service ran on (node, index, type, site, memory), so the
  review knows the capacity of a period even when a card held no job.
- service_settings: what the service was configured with that the review needs (team
  quotas, tariff, day window), as JSON by key.

Written out by hand like 0001-0008; it follows 0008 (elastic jobs).
Revision ID: 0009.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "gpu_minutes",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("gpu_id", sa.String(), nullable=False),
        sa.Column("t_s", sa.Double(), nullable=False),
        sa.Column("period_s", sa.Double(), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("mem_used_mib", sa.Double(), nullable=False),
        sa.Column("sm_util_pct", sa.Double(), nullable=False),
        sa.Column("power_w", sa.Double(), nullable=True),
        sa.Column("temp_c", sa.Double(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_gpu_minutes"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_gpu_minutes_t_s", "gpu_minutes", ["t_s"])
    op.create_table(
        "service_minutes",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("service", sa.String(), nullable=False),
        sa.Column("t_s", sa.Double(), nullable=False),
        sa.Column("period_s", sa.Double(), nullable=False),
        sa.Column("p99_ms", sa.Double(), nullable=True),
        sa.Column("rps", sa.Double(), nullable=False),
        sa.Column("replicas", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_service_minutes"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_service_minutes_t_s", "service_minutes", ["t_s"])
    op.create_table(
        "fleet_gpus",
        sa.Column("gpu_id", sa.String(), nullable=False),
        sa.Column("node", sa.String(), nullable=False),
        sa.Column("gpu_index", sa.Integer(), nullable=False),
        sa.Column("gpu_type", sa.String(), nullable=False),
        sa.Column("site", sa.String(), nullable=False),
        sa.Column("mem_total_mib", sa.Integer(), nullable=False),
        sa.Column("first_seen_s", sa.Double(), nullable=False),
        sa.Column("last_seen_s", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("gpu_id", name="pk_fleet_gpus"),
    )
    op.create_table(
        "service_settings",
        sa.Column("key", sa.String(), nullable=False),
        sa.Column("value", sa.JSON(), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("key", name="pk_service_settings"),
    )


def downgrade() -> None:
    op.drop_table("service_settings")
    op.drop_table("fleet_gpus")
    op.drop_index("ix_service_minutes_t_s", table_name="service_minutes")
    op.drop_table("service_minutes")
    op.drop_index("ix_gpu_minutes_t_s", table_name="gpu_minutes")
    op.drop_table("gpu_minutes")
