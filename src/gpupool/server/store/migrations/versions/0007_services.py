"""Online services: a services table, and jobs name the service they are a replica of.

A service outlives its replicas: deleting it sets deleted_at (its name may then be taken
again); its replicas are ordinary job rows of kind online-inference whose `service`
column names it (nullable: the jobs already stored are jobs of their own), and `port`
the loopback port a replica serves on, set at each launch.

Written out by hand like 0001-0006.
Revision ID: 0007.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("service", sa.String(), nullable=True))
    op.add_column("jobs", sa.Column("port", sa.Integer(), nullable=True))
    op.create_index("ix_jobs_service", "jobs", ["service"])
    op.create_table(
        "services",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("team", sa.String(), nullable=False),
        sa.Column("model", sa.String(), nullable=True),
        sa.Column("gpu_model", sa.String(), nullable=True),
        sa.Column("gpu_mem_mib", sa.Integer(), nullable=True),
        sa.Column("gpu_milli", sa.Integer(), server_default=sa.text("1000"), nullable=False),
        sa.Column("min_replicas", sa.Integer(), nullable=False),
        sa.Column("max_replicas", sa.Integer(), nullable=False),
        sa.Column("replica_rps", sa.Double(), nullable=False),
        sa.Column("slo_p99_ms", sa.Double(), nullable=False),
        sa.Column("port_env", sa.String(), nullable=False),
        sa.Column("command", sa.JSON(), nullable=False),
        sa.Column("cwd", sa.Text(), nullable=True),
        sa.Column("env", sa.JSON(), nullable=False),
        sa.Column("grace_s", sa.Double(), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("owner_token", sa.String(), nullable=True),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.Column("deleted_at", sa.Double(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_services"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_services_name", "services", ["name"])


def downgrade() -> None:
    op.drop_index("ix_services_name", table_name="services")
    op.drop_table("services")
    op.drop_index("ix_jobs_service", table_name="jobs")
    op.drop_column("jobs", "port")
    op.drop_column("jobs", "service")
