"""Tenants: the NCCL_IB_TIMEOUT and NCCL_IB_RETRY_CNT their jobs run with (the RC budget);
null: not declared, NCCL's default applies.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("tenants", sa.Column("nccl_ib_timeout", sa.Integer(), nullable=True))
    op.add_column("tenants", sa.Column("nccl_ib_retry_cnt", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tenants") as batch:
        batch.drop_column("nccl_ib_retry_cnt")
        batch.drop_column("nccl_ib_timeout")
