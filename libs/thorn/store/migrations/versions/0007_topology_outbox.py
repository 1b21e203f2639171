"""Topology: the outbox of topology.changed events, written in the write's own transaction.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-04
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Empty at the upgrade: the events of earlier writes were sent (or lost) by the release
    # that made them.
    op.create_table(
        "topology_outbox",
        sa.Column("revision", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("event", sa.Text(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("topology_outbox")
