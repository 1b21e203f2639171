"""Initial topology store: fabric entities, tokens, audit log, counters.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

import secrets

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "meta",
        sa.Column("key", sa.String(32), primary_key=True),
        sa.Column("value", sa.Integer(), nullable=False),
    )
    op.bulk_insert(
        sa.table("meta", sa.column("key", sa.String), sa.column("value", sa.Integer)),
        [
            {"key": "revision", "value": 0},
            {"key": "next_link_id", "value": 1},
            # Tells this store's events apart from another's (a restored backup, a second
            # deployment on the same NATS) in JetStream's de-duplication window.
            {"key": "store_id", "value": secrets.randbits(31)},
        ],
    )
    op.create_table(
        "nodes",
        sa.Column("name", sa.String(63), primary_key=True),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("mgmt_address", sa.String(64), nullable=True, unique=True),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("admin_state", sa.String(16), nullable=False),
    )
    op.create_table(
        "ports",
        sa.Column(
            "node",
            sa.String(63),
            sa.ForeignKey("nodes.name", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("mac", sa.String(17), nullable=True, unique=True),
        sa.Column("address", sa.String(64), nullable=True),
        sa.Column("speed_mbps", sa.Integer(), nullable=True),
    )
    op.create_table(
        "links",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("a_node", sa.String(63), nullable=False),
        sa.Column("a_port", sa.String(64), nullable=False),
        sa.Column("b_node", sa.String(63), nullable=False),
        sa.Column("b_port", sa.String(64), nullable=False),
        sa.Column("srlgs", sa.JSON(), nullable=False),
        sa.Column("admin_state", sa.String(16), nullable=False),
        sa.ForeignKeyConstraint(["a_node", "a_port"], ["ports.node", "ports.name"]),
        sa.ForeignKeyConstraint(["b_node", "b_port"], ["ports.node", "ports.name"]),
        sa.UniqueConstraint("a_node", "a_port", name="uq_links_a"),
        sa.UniqueConstraint("b_node", "b_port", name="uq_links_b"),
    )
    op.create_table(
        "tenants",
        sa.Column("name", sa.String(63), primary_key=True),
        sa.Column("description", sa.String(1000), nullable=False),
    )
    op.create_table(
        "vnis",
        sa.Column("vni", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("name", sa.String(63), nullable=False, unique=True),
        sa.Column("tenant", sa.String(63), sa.ForeignKey("tenants.name"), nullable=False),
    )
    op.create_table(
        "workloads",
        sa.Column("name", sa.String(63), primary_key=True),
        sa.Column("node", sa.String(63), sa.ForeignKey("nodes.name"), nullable=False),
        sa.Column("vni", sa.Integer(), sa.ForeignKey("vnis.vni"), nullable=False),
        sa.Column("vf", sa.String(15), nullable=False),
        sa.Column("mac", sa.String(17), nullable=False),
        sa.Column("ip", sa.String(64), nullable=False),
        sa.UniqueConstraint("node", "vf", name="uq_workloads_vf"),
        sa.UniqueConstraint("vni", "ip", name="uq_workloads_ip"),
        sa.UniqueConstraint("vni", "mac", name="uq_workloads_mac"),
    )
    op.create_table(
        "teps",
        sa.Column("node", sa.String(63), sa.ForeignKey("nodes.name"), primary_key=True),
        sa.Column("colour", sa.String(16), primary_key=True),
        sa.Column("address", sa.String(64), nullable=False, unique=True),
    )
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(63), nullable=False, unique=True),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_by", sa.String(63), nullable=False),
    )
    op.create_table(
        "audit_log",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(63), nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("target", sa.String(256), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=True),
        sa.Column("detail", sa.JSON(), nullable=False),
    )
    op.create_index("ix_audit_log_actor", "audit_log", ["actor"])
    op.create_index("ix_audit_log_at", "audit_log", ["at"])


def downgrade() -> None:
    for table in (
        "audit_log",
        "api_tokens",
        "teps",
        "workloads",
        "vnis",
        "tenants",
        "links",
        "ports",
        "nodes",
        "meta",
    ):
        op.drop_table(table)
