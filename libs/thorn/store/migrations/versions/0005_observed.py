"""Registration: each node's latest observed state, and links found miscabled.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "link_miscabled",
        sa.Column(
            "link_id",
            sa.Integer(),
            sa.ForeignKey("links.id", ondelete="CASCADE"),
            primary_key=True,
            autoincrement=False,
        ),
        sa.Column("reason", sa.String(500), nullable=False),
    )
    op.create_table(
        "observed_nodes",
        sa.Column("node", sa.String(63), primary_key=True),
        sa.Column("run", sa.String(32), nullable=True),
        sa.Column("seq", sa.BigInteger(), nullable=True),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("observed", sa.JSON(), nullable=True),
        sa.Column("refused_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("refused_error", sa.String(1000), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("observed_nodes")
    op.drop_table("link_miscabled")
