"""Health: the failover history, one row per FailoverEvent, grouped by trace id.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "health_failovers",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("stream_seq", sa.BigInteger(), nullable=False),
        sa.Column("trace_id", sa.String(100), nullable=False),
        sa.Column("traced", sa.Boolean(), nullable=False),
        sa.Column("node", sa.String(63), nullable=False),
        sa.Column("tier", sa.String(16), nullable=False),
        sa.Column("from_colour", sa.String(16), nullable=True),
        sa.Column("to_colour", sa.String(16), nullable=False),
        sa.Column("peers", sa.JSON(), nullable=False),
        sa.Column("reason", sa.String(500), nullable=False),
        sa.Column("link_id", sa.Integer(), nullable=True),
        sa.Column("kernel_ms", sa.Float(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("hops", sa.JSON(), nullable=False),
        sa.UniqueConstraint("stream_seq", "node", "at", name="uq_health_failovers_message"),
    )
    op.create_index("ix_health_failovers_trace", "health_failovers", ["trace_id"])
    op.create_index("ix_health_failovers_started", "health_failovers", ["started_at"])
    op.create_index("ix_health_failovers_node", "health_failovers", ["node"])
    op.create_index("ix_health_failovers_link", "health_failovers", ["link_id"])


def downgrade() -> None:
    op.drop_table("health_failovers")
