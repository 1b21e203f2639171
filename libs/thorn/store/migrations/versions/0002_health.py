"""Health: each link's state machine (for a restart) and the failure history.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "health_links",
        sa.Column("link_id", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("state", sa.String(16), nullable=True),
        sa.Column("sources", sa.JSON(), nullable=False),
        sa.Column("loss", sa.Float(), nullable=False),
        sa.Column("drained", sa.Boolean(), nullable=False),
        sa.Column("suppressed", sa.Boolean(), nullable=False),
        sa.Column("penalty", sa.Float(), nullable=False),
        sa.Column("penalty_at", sa.Float(), nullable=False),
        sa.Column("changed_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_table(
        "health_failures",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("link_id", sa.Integer(), nullable=False),
        sa.Column("a_node", sa.String(63), nullable=False),
        sa.Column("a_port", sa.String(64), nullable=False),
        sa.Column("b_node", sa.String(63), nullable=False),
        sa.Column("b_port", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("source", sa.String(200), nullable=False),
        sa.Column("source_kind", sa.String(16), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("detected_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("detection_latency_ms", sa.Float(), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("end_source", sa.String(200), nullable=True),
    )
    op.create_index("ix_health_failures_link", "health_failures", ["link_id", "ended_at"])
    op.create_index("ix_health_failures_started", "health_failures", ["started_at"])
    op.create_index("ix_health_failures_a", "health_failures", ["a_node"])
    op.create_index("ix_health_failures_b", "health_failures", ["b_node"])


def downgrade() -> None:
    op.drop_table("health_failures")
    op.drop_table("health_links")
