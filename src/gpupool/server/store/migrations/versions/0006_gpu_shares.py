"""Jobs may ask for part of one GPU: gpu_milli (thousandths of it) or gpu_mem_mib.

gpu_milli defaults to 1000 on the server, so the jobs already stored read back as whole
GPUs; gpu_mem_mib (nullable) is the GPU memory a sharing job asked for, which the core
turns into a share of the card it lands on.

Written out by hand like 0001-0005.
Revision ID: 0006.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column(
        "jobs",
        sa.Column("gpu_milli", sa.Integer(), server_default=sa.text("1000"), nullable=False),
    )
    op.add_column("jobs", sa.Column("gpu_mem_mib", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "gpu_mem_mib")
    op.drop_column("jobs", "gpu_milli")
