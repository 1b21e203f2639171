"""Topology: a host's offload policy (auto, hardware, software) on its node row.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Existing nodes take the default: auto (what the agent did before was software only,
    # and auto gives exactly that on a NIC that is not a switchdev eswitch).
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("offload", sa.String(16), nullable=False, server_default="auto"))


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("offload")
