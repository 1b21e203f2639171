"""SQL tables of the topology store (SQLAlchemy 2.0 declarative).

Natural keys (node name, node+port name, VNI number) are the primary keys, because they are
what the API addresses and what the fabric rules are about. Links get a number that is never
reused, so failure history can refer to it. Rules that span tables (an address is unique
across management, port and TEP addresses) are enforced by `thorn.fabric`; the constraints
here are the backstop.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from thorn.model import NAME_MAX

NAME = NAME_MAX  # thorn.model.Name
PORT = 64
ADDR = 64  # the longest IPv6 interface text, with prefix


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {dict[str, Any]: JSON, list[str]: JSON}


class Meta(Base):
    """Counters of the store: `revision` and `next_link_id`."""

    __tablename__ = "meta"
    key: Mapped[str] = mapped_column(String(32), primary_key=True)
    value: Mapped[int] = mapped_column(Integer)


class NodeRow(Base):
    __tablename__ = "nodes"
    name: Mapped[str] = mapped_column(String(NAME), primary_key=True)
    role: Mapped[str] = mapped_column(String(16))
    mgmt_address: Mapped[str | None] = mapped_column(String(ADDR), unique=True)
    labels: Mapped[dict[str, Any]]
    admin_state: Mapped[str] = mapped_column(String(16))
    offload: Mapped[str] = mapped_column(String(16), default="auto", server_default="auto")


class PortRow(Base):
    __tablename__ = "ports"
    node: Mapped[str] = mapped_column(
        String(NAME), ForeignKey("nodes.name", ondelete="CASCADE"), primary_key=True
    )
    name: Mapped[str] = mapped_column(String(PORT), primary_key=True)
    mac: Mapped[str | None] = mapped_column(String(17), unique=True)
    address: Mapped[str | None] = mapped_column(String(ADDR))
    speed_mbps: Mapped[int | None] = mapped_column(Integer)


class LinkRow(Base):
    __tablename__ = "links"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    a_node: Mapped[str] = mapped_column(String(NAME))
    a_port: Mapped[str] = mapped_column(String(PORT))
    b_node: Mapped[str] = mapped_column(String(NAME))
    b_port: Mapped[str] = mapped_column(String(PORT))
    srlgs: Mapped[list[str]]
    admin_state: Mapped[str] = mapped_column(String(16))
    __table_args__ = (
        ForeignKeyConstraint(["a_node", "a_port"], ["ports.node", "ports.name"]),
        ForeignKeyConstraint(["b_node", "b_port"], ["ports.node", "ports.name"]),
        UniqueConstraint("a_node", "a_port", name="uq_links_a"),
        UniqueConstraint("b_node", "b_port", name="uq_links_b"),
    )


class TenantRow(Base):
    __tablename__ = "tenants"
    name: Mapped[str] = mapped_column(String(NAME), primary_key=True)
    description: Mapped[str] = mapped_column(String(1000))
    # The RC budget its jobs run with; null: not declared (NCCL's default applies).
    nccl_ib_timeout: Mapped[int | None] = mapped_column(Integer)
    nccl_ib_retry_cnt: Mapped[int | None] = mapped_column(Integer)


class VniRow(Base):
    __tablename__ = "vnis"
    vni: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    name: Mapped[str] = mapped_column(String(NAME), unique=True)
    tenant: Mapped[str] = mapped_column(String(NAME), ForeignKey("tenants.name"))


class WorkloadRow(Base):
    __tablename__ = "workloads"
    name: Mapped[str] = mapped_column(String(NAME), primary_key=True)
    node: Mapped[str] = mapped_column(String(NAME), ForeignKey("nodes.name"))
    vni: Mapped[int] = mapped_column(Integer, ForeignKey("vnis.vni"))
    vf: Mapped[str] = mapped_column(String(15))
    mac: Mapped[str] = mapped_column(String(17))
    ip: Mapped[str] = mapped_column(String(ADDR))
    __table_args__ = (
        UniqueConstraint("node", "vf", name="uq_workloads_vf"),
        UniqueConstraint("vni", "ip", name="uq_workloads_ip"),
        UniqueConstraint("vni", "mac", name="uq_workloads_mac"),
    )


class TepRow(Base):
    __tablename__ = "teps"
    node: Mapped[str] = mapped_column(String(NAME), ForeignKey("nodes.name"), primary_key=True)
    colour: Mapped[str] = mapped_column(String(16), primary_key=True)
    address: Mapped[str] = mapped_column(String(ADDR), unique=True)


class TokenRow(Base):
    """An API token: the SHA-256 of its secret, never the secret. After a rotation the old
    secret's digest stays in `previous_hash` until `previous_until` (the overlap)."""

    __tablename__ = "api_tokens"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(NAME), unique=True)
    role: Mapped[str] = mapped_column(String(16))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    created_by: Mapped[str] = mapped_column(String(NAME))
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    rotated_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    previous_hash: Mapped[str | None] = mapped_column(String(64))
    previous_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    __table_args__ = (Index("ix_api_tokens_previous_hash", "previous_hash"),)


class AuditRow(Base):
    __tablename__ = "audit_log"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    actor: Mapped[str] = mapped_column(String(NAME))
    action: Mapped[str] = mapped_column(String(64))
    target: Mapped[str] = mapped_column(String(256))
    revision: Mapped[int | None] = mapped_column(Integer)
    detail: Mapped[dict[str, Any]]
    # ok, refused (4xx), denied (401/403) or failed (5xx); the client's address as the
    # service saw it (the entry point's X-Forwarded-For, from a trusted proxy only).
    outcome: Mapped[str] = mapped_column(String(16), default="ok", server_default="ok")
    client: Mapped[str | None] = mapped_column(String(ADDR))
    __table_args__ = (
        Index("ix_audit_log_actor", "actor"),
        Index("ix_audit_log_at", "at"),
        Index("ix_audit_log_outcome", "outcome"),
    )


class TopologyOutboxRow(Base):
    """A topology.changed event not yet known to be in the stream: written in the same
    transaction as its revision, deleted once JetStream has acknowledged it. Whichever
    replica finds one left behind (its writer died before sending) sends it."""

    __tablename__ = "topology_outbox"
    revision: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    event: Mapped[str] = mapped_column(Text)  # the event's JSON, as it is published
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True))  # when it was committed


# --- health: each link's machine (for a restart) and the failure history ------------------
# No foreign key to `links`: history outlives the links it is about (deletes, imports), and
# link ids are never reused.


class HealthLinkRow(Base):
    """The last state of one link's health machine, so a restarted health starts from it."""

    __tablename__ = "health_links"
    link_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    state: Mapped[str | None] = mapped_column(String(16))
    sources: Mapped[dict[str, Any]]  # source -> up (bool)
    loss: Mapped[float] = mapped_column(Float)
    drained: Mapped[bool] = mapped_column(Boolean)
    suppressed: Mapped[bool] = mapped_column(Boolean)
    penalty: Mapped[float] = mapped_column(Float)
    penalty_at: Mapped[float] = mapped_column(Float)  # wall-clock seconds (Unix time)
    changed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class HealthFailureRow(Base):
    """One failure of a link: from the report that took it out of service to the one that
    brought it back (`ended_at` is null while it lasts)."""

    __tablename__ = "health_failures"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    link_id: Mapped[int] = mapped_column(Integer)
    a_node: Mapped[str] = mapped_column(String(NAME))
    a_port: Mapped[str] = mapped_column(String(PORT))
    b_node: Mapped[str] = mapped_column(String(NAME))
    b_port: Mapped[str] = mapped_column(String(PORT))
    state: Mapped[str] = mapped_column(String(16))  # the worst state: degraded/down/flapping
    source: Mapped[str] = mapped_column(String(200))
    source_kind: Mapped[str] = mapped_column(String(16))
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    detected_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    received_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    detection_latency_ms: Mapped[float | None] = mapped_column(Float)
    ended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    end_source: Mapped[str | None] = mapped_column(String(200))
    __table_args__ = (
        Index("ix_health_failures_link", "link_id", "ended_at"),
        Index("ix_health_failures_started", "started_at"),
        Index("ix_health_failures_a", "a_node"),
        Index("ix_health_failures_b", "b_node"),
    )


class HealthFailoverRow(Base):
    """One `FailoverEvent` (one node's flip) as health stored it from THORN_FAILOVER. The
    events of one failover share `trace_id`; an event without a trace gets an id of its own.

    (`stream_seq`, `node`, `at`) is unique: a redelivered message is stored once, and the
    node and time keep a recreated stream, whose sequences start at 1 again, from colliding
    with what is already stored."""

    __tablename__ = "health_failovers"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    stream_seq: Mapped[int] = mapped_column(BigInteger)
    trace_id: Mapped[str] = mapped_column(String(100))
    traced: Mapped[bool] = mapped_column(Boolean)
    node: Mapped[str] = mapped_column(String(NAME))
    tier: Mapped[str] = mapped_column(String(16))
    from_colour: Mapped[str | None] = mapped_column(String(16))
    to_colour: Mapped[str] = mapped_column(String(16))
    peers: Mapped[list[str]]
    reason: Mapped[str] = mapped_column(String(500))
    link_id: Mapped[int | None] = mapped_column(Integer)  # when the reason names a link
    kernel_ms: Mapped[float] = mapped_column(Float)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True))  # the node's clock
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))  # the first hop
    hops: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    __table_args__ = (
        UniqueConstraint("stream_seq", "node", "at", name="uq_health_failovers_message"),
        Index("ix_health_failovers_trace", "trace_id"),
        Index("ix_health_failovers_started", "started_at"),
        Index("ix_health_failovers_node", "node"),
        Index("ix_health_failovers_link", "link_id"),
    )


class MiscabledRow(Base):
    """A link the cabling check found miscabled (topology's verdict from the agents'
    registrations); path computation leaves it out. Gone with its link."""

    __tablename__ = "link_miscabled"
    link_id: Mapped[int] = mapped_column(
        Integer, ForeignKey("links.id", ondelete="CASCADE"), primary_key=True,
        autoincrement=False,
    )  # fmt: skip
    reason: Mapped[str] = mapped_column(String(500))


class ObservedNodeRow(Base):
    """The latest registration each node's agent sent (what it observes), and the last one
    topology refused, with why. No foreign key: a registration outlives a re-import of
    its node, and only nodes in the topology are shown."""

    __tablename__ = "observed_nodes"
    node: Mapped[str] = mapped_column(String(NAME), primary_key=True)
    run: Mapped[str | None] = mapped_column(String(32))
    seq: Mapped[int | None] = mapped_column(BigInteger)
    received_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    observed: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    refused_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    refused_error: Mapped[str | None] = mapped_column(String(1000))
