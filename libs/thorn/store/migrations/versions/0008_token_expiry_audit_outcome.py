"""Tokens: expiry, last use and rotation (the old secret's digest until the overlap ends);
the audit log: each entry's outcome and client address.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-04
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Tokens made before this release never expire and have not been seen in use since.
    with op.batch_alter_table("api_tokens") as batch:
        batch.add_column(sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("rotated_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("previous_hash", sa.String(64), nullable=True))
        batch.add_column(sa.Column("previous_until", sa.DateTime(timezone=True), nullable=True))
    op.create_index("ix_api_tokens_previous_hash", "api_tokens", ["previous_hash"])
    # Every entry written before was a committed write: outcome ok; the client is unknown.
    with op.batch_alter_table("audit_log") as batch:
        batch.add_column(sa.Column("outcome", sa.String(16), nullable=False, server_default="ok"))
        batch.add_column(sa.Column("client", sa.String(64), nullable=True))
    op.create_index("ix_audit_log_outcome", "audit_log", ["outcome"])


def downgrade() -> None:
    op.drop_index("ix_audit_log_outcome", "audit_log")
    with op.batch_alter_table("audit_log") as batch:
        batch.drop_column("client")
        batch.drop_column("outcome")
    op.drop_index("ix_api_tokens_previous_hash", "api_tokens")
    with op.batch_alter_table("api_tokens") as batch:
        for column in ("previous_until", "previous_hash", "rotated_at", "last_used_at",
                       "expires_at"):  # fmt: skip
            batch.drop_column(column)
