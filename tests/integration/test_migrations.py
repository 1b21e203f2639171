"""Upgrading a store written by an older release, as every service does at start
(`Store.open`: `alembic upgrade head` under the migration lock), on SQLite and PostgreSQL.

There are no release tags: the previous release is the revision before head (0007), and
every older one back to 0001 is upgraded too. Each store is built at its revision and filled
by raw SQL in that revision's own columns (what a service of that release wrote); after the
upgrade every row is still there, read back through today's store, and the columns added
since hold their defaults.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import Connection, text

from thorn.model import AdminState, TokenRole
from thorn.store import Store
from thorn.store.failovers import FailoverQuery
from thorn.store.health import FailureQuery
from thorn.store.store import _upgrade
from thorn.store.tokens import TokenRecord

REVISIONS = ["0001", "0002", "0003", "0004", "0005", "0006", "0007"]
HEAD = "0008"
AT = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)

Rows = list[tuple[str, list[dict[str, Any]]]]


def _json(value: Any) -> str:
    return json.dumps(value)


# What each revision added, written in that revision's columns. A store at revision R holds
# the rows of every step up to R.
ROWS: dict[str, Rows] = {
    "0001": [
        ("UPDATE meta SET value = :value WHERE key = :key",
         [{"key": "revision", "value": 7}, {"key": "next_link_id", "value": 3}]),
        ("INSERT INTO nodes (name, role, mgmt_address, labels, admin_state) "
         "VALUES (:name, :role, :mgmt, :labels, :state)",
         [{"name": "leaf1", "role": "switch", "mgmt": "192.0.2.1",
           "labels": _json({"rack": "r1"}), "state": "up"},
          {"name": "spine1", "role": "switch", "mgmt": None, "labels": _json({}),
           "state": "drained"},
          {"name": "host1", "role": "host", "mgmt": None, "labels": _json({"gpu": "h100"}),
           "state": "up"}]),
        ("INSERT INTO ports (node, name, mac, address, speed_mbps) "
         "VALUES (:node, :name, :mac, :address, :speed)",
         [{"node": "leaf1", "name": "swp1", "mac": None, "address": None, "speed": 400000},
          {"node": "leaf1", "name": "swp2", "mac": None, "address": None, "speed": None},
          {"node": "spine1", "name": "swp1", "mac": None, "address": None, "speed": None},
          {"node": "host1", "name": "eth0", "mac": "02:00:00:00:01:00",
           "address": "10.0.0.2/31", "speed": 200000}]),
        ("INSERT INTO links (id, a_node, a_port, b_node, b_port, srlgs, admin_state) "
         "VALUES (:id, :an, :ap, :bn, :bp, :srlgs, :state)",
         [{"id": 1, "an": "leaf1", "ap": "swp1", "bn": "spine1", "bp": "swp1",
           "srlgs": _json(["duct-a"]), "state": "up"},
          {"id": 2, "an": "host1", "ap": "eth0", "bn": "leaf1", "bp": "swp2",
           "srlgs": _json([]), "state": "up"}]),
        ("INSERT INTO tenants (name, description) VALUES (:name, :description)",
         [{"name": "acme", "description": "the ML team"}]),
        ("INSERT INTO vnis (vni, name, tenant) VALUES (:vni, :name, :tenant)",
         [{"vni": 10010, "name": "acme-net", "tenant": "acme"}]),
        ("INSERT INTO teps (node, colour, address) VALUES (:node, :colour, :address)",
         [{"node": "host1", "colour": "red", "address": "10.255.0.1"},
          {"node": "host1", "colour": "blue", "address": "10.255.1.1"}]),
        ("INSERT INTO workloads (name, node, vni, vf, mac, ip) "
         "VALUES (:name, :node, :vni, :vf, :mac, :ip)",
         [{"name": "job1", "node": "host1", "vni": 10010, "vf": "vf0",
           "mac": "02:00:00:00:00:01", "ip": "10.10.0.1"}]),
        ("INSERT INTO api_tokens (name, role, token_hash, created_at, created_by) "
         "VALUES (:name, :role, :hash, :at, :by)",
         [{"name": "ops", "role": "operator", "hash": "ab" * 32, "at": AT, "by": "admin"}]),
        ("INSERT INTO audit_log (at, actor, action, target, revision, detail) "
         "VALUES (:at, :actor, :action, :target, :revision, :detail)",
         [{"at": AT, "actor": "admin", "action": "fabric.import", "target": "fabric",
           "revision": 7, "detail": _json({"source": "import"})}]),
    ],
    "0002": [
        ("INSERT INTO health_links (link_id, state, sources, loss, drained, suppressed, "
         "penalty, penalty_at, changed_at) VALUES (:link, :state, :sources, :loss, :drained, "
         ":suppressed, :penalty, :penalty_at, :at)",
         [{"link": 1, "state": "down", "sources": _json({"carrier:leaf1:swp1": False}),
           "loss": 0.0, "drained": False, "suppressed": False, "penalty": 1000.0,
           "penalty_at": 1764496800.0, "at": AT}]),
        ("INSERT INTO health_failures (link_id, a_node, a_port, b_node, b_port, state, "
         "source, source_kind, started_at, detected_at, received_at, detection_latency_ms) "
         "VALUES (1, 'leaf1', 'swp1', 'spine1', 'swp1', 'down', 'carrier:leaf1:swp1', "
         "'carrier', :at, :at, :at, 1.5)",
         [{"at": AT}]),
    ],
    "0003": [
        ("INSERT INTO health_failovers (stream_seq, trace_id, traced, node, tier, "
         "from_colour, to_colour, peers, reason, link_id, kernel_ms, at, started_at, hops) "
         "VALUES (12, 'trace-1', :traced, 'host1', 'central', 'red', 'blue', :peers, "
         "'central: link 1', 1, 0.4, :at, :at, :hops)",
         [{"traced": True, "peers": _json(["host2"]), "at": AT,
           "hops": _json([{"step": "agent_applied", "at": AT.isoformat(),
                           "clock": "host1"}])}]),
    ],
    "0004": [
        ("UPDATE tenants SET nccl_ib_timeout = 18, nccl_ib_retry_cnt = 7 WHERE name = 'acme'",
         [{}]),
    ],
    "0005": [
        ("INSERT INTO link_miscabled (link_id, reason) VALUES (2, :reason)",
         [{"reason": "leaf1:swp2 hears spine9:swp4"}]),
        ("INSERT INTO observed_nodes (node, run, seq, received_at, observed, refused_at, "
         "refused_error) VALUES ('leaf1', 'run-1', 42, :at, :observed, NULL, NULL)",
         [{"at": AT, "observed": _json({"node": "leaf1", "ports": []})}]),
    ],
    "0006": [],  # a column with a default: what it holds is checked below
    "0007": [],  # the outbox: events of earlier writes were sent by the release that made them
}  # fmt: skip


def build_at(conn: Connection, revision: str) -> int:
    """The schema at `revision` with every step's rows up to it; returns the store id."""
    for step in REVISIONS[: REVISIONS.index(revision) + 1]:
        _upgrade(conn, step)
        for sql, params in ROWS[step]:
            conn.execute(text(sql), params)
    return int(conn.execute(text("SELECT value FROM meta WHERE key = 'store_id'")).scalar_one())


@pytest.mark.parametrize("revision", REVISIONS)
async def test_a_store_written_by_an_older_release_keeps_its_data_through_the_upgrade(
    database_url: str, revision: str
) -> None:
    older = await Store.open(database_url, migrate=False)
    try:
        async with older.engine.begin() as conn:
            store_id = await conn.run_sync(build_at, revision)
    finally:
        await older.close()

    store = await Store.open(database_url)  # what a service does at start
    try:
        await assert_upgraded(store, revision, store_id)
    finally:
        await store.close()


async def assert_upgraded(store: Store, revision: str, store_id: int) -> None:
    since = REVISIONS.index(revision)
    async with store.engine.connect() as conn:
        version = (await conn.execute(text("SELECT version_num FROM alembic_version"))).scalar()
        offload = set((await conn.execute(text("SELECT offload FROM nodes"))).scalars())
    assert version == HEAD and await store.store_id() == store_id
    fabric = await store.load()
    assert (fabric.revision, fabric.next_link_id) == (7, 3)
    assert set(fabric.nodes) == {"leaf1", "spine1", "host1"}
    assert fabric.nodes["leaf1"].labels == {"rack": "r1"}
    assert str(fabric.nodes["leaf1"].mgmt_address) == "192.0.2.1"
    assert fabric.nodes["spine1"].admin_state is AdminState.drained
    # 0007: the outbox of topology.changed starts empty (earlier events were sent or lost)
    assert await store.unannounced(before=datetime.now(UTC)) == []
    # 0006: every node written before the offload policy is auto
    assert offload == {"auto"} and {n.offload for n in fabric.nodes.values()} == {"auto"}
    eth0 = fabric.ports[("host1", "eth0")]
    assert (str(eth0.mac), str(eth0.address), eth0.speed_mbps) == (
        "02:00:00:00:01:00", "10.0.0.2/31", 200000,
    )  # fmt: skip
    assert fabric.links[1].srlgs == ["duct-a"] and fabric.links[2].a.node == "host1"
    acme = fabric.tenants["acme"]
    assert acme.description == "the ML team"
    # 0004: a tenant from before the RC budget is undeclared; one declared since keeps it
    expected_budget = (18, 7) if since >= REVISIONS.index("0004") else (None, None)
    assert (acme.nccl_ib_timeout, acme.nccl_ib_retry_cnt) == expected_budget
    assert fabric.vnis[10010].tenant == "acme"
    assert fabric.workloads["job1"].ip.compressed == "10.10.0.1"
    assert {str(t.address) for t in fabric.teps.values()} == {"10.255.0.1", "10.255.1.1"}
    # 0008: a token made before expiry and rotation never expires, was never seen in use;
    # an audit entry made before outcomes was a committed write, from an unknown client
    assert await store.token_by_hash("ab" * 32) == TokenRecord("ops", TokenRole.operator)
    [ops] = await store.tokens()
    assert (ops.expires_at, ops.last_used_at, ops.rotated_at, ops.old_secret_until) == (
        None, None, None, None,
    )  # fmt: skip
    total, [entry] = await store.audit()
    assert total == 1 and (entry.action, entry.revision) == ("fabric.import", 7)
    assert (entry.outcome, entry.client) == ("ok", None)

    states = await store.health_states()
    failures = (await store.failures(FailureQuery()))[1]
    traces = (await store.failover_page(FailoverQuery()))[1]
    observed = await store.observed_nodes()
    if since >= REVISIONS.index("0002"):
        [state] = states
        assert (state.link_id, state.state, dict(state.sources)) == (
            1, "down", {"carrier:leaf1:swp1": False},
        )  # fmt: skip
        assert [(f.link_id, f.ended_at, f.detection_latency_ms) for f in failures] == [
            (1, None, 1.5)
        ]
    else:
        assert states == [] and failures == []
    if since >= REVISIONS.index("0003"):
        [[failover]] = traces
        assert (failover.trace_id, failover.peers, failover.hops[0].step) == (
            "trace-1", ("host2",), "agent_applied",
        )  # fmt: skip
    else:
        assert traces == []
    if since >= REVISIONS.index("0005"):
        assert {i: m.reason for i, m in fabric.miscabled.items()} == {
            2: "leaf1:swp2 hears spine9:swp4"
        }
        assert [(o.node, o.seq, o.observed) for o in observed] == [
            ("leaf1", 42, {"node": "leaf1", "ports": []})
        ]
    else:
        assert fabric.miscabled == {} and observed == []
