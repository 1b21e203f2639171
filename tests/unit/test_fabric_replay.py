"""A consumer of `topology.changed` applies the event's rows to its own fabric
(`Fabric.replay`) and ends where the writer is, without reloading the store."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from new_host import new_host

from thorn import generators
from thorn.events import Change as EventChange
from thorn.events import TopologyChanged, utcnow
from thorn.fabric import Change, Fabric, FabricError, NotFound
from thorn.model import (
    AdminState,
    NodeUpdate,
    PortUpdate,
    Tenant,
    TenantUpdate,
    Vni,
)

Operation = Callable[[Fabric], list[Change]]


def start() -> Fabric:
    document = generators.generate("leaf_spine", {"spines": 2, "leaves": 2, "hosts_per_leaf": 2})
    return Fabric.from_document(document, 1)


OPERATIONS: list[tuple[str, Operation]] = [
    ("a new host with a port, link, TEPs and a workload", new_host),
    ("a host deleted with everything it has", lambda f: f.delete_node("host2", cascade=True)),
    ("a link drained", lambda f: f.drain_link(1)),
    ("a switch drained", lambda f: f.drain_node("spine1")),
    ("a node's labels and offload", lambda f: f.update_node(
        "host1", NodeUpdate(labels={"rack": "r1"}, offload="software"))),
    ("a port's address", lambda f: f.update_port("spine1", "swp1", PortUpdate(speed_mbps=100000))),
    ("a link marked miscabled", lambda f: f.set_miscabled(3, "heard leaf9:swp1")),
    ("a tenant's timeout", lambda f: f.update_tenant("default", TenantUpdate(nccl_ib_timeout=22))),
    ("a tenant and a VNI", lambda f: f.add_tenant(Tenant(name="t2"))
     + f.add_vni(Vni(vni=2000, name="v2", tenant="t2"))),
    ("a workload moved out", lambda f: f.delete_workload("host3-vf0")),
]  # fmt: skip


def as_event(revision: int, changes: list[Change]) -> list[EventChange]:
    """The changes as a consumer gets them: through the event's JSON and back."""
    event = TopologyChanged(revision=revision, at=utcnow(), actor="admin", changes=[
        EventChange(kind=c.kind, op=c.op, key=c.key,
                    value=c.value.model_dump(mode="json") if c.value is not None else None)
        for c in changes])  # fmt: skip
    return TopologyChanged.model_validate_json(event.model_dump_json()).changes


def same(a: Fabric, b: Fabric) -> None:
    assert a.to_document() == b.to_document()
    assert (a.miscabled, a.next_link_id) == (b.miscabled, b.next_link_id)


def test_replaying_each_operations_rows_reaches_the_writers_fabric() -> None:
    writer, reader = start(), start()
    for revision, (_, operation) in enumerate(OPERATIONS, start=2):
        reader.replay(as_event(revision, operation(writer)))
        same(reader, writer)


@pytest.mark.parametrize(("name", "operation"), OPERATIONS, ids=[n for n, _ in OPERATIONS])
def test_each_operation_alone_replays(name: str, operation: Operation) -> None:
    writer, reader = start(), start()
    reader.replay(as_event(2, operation(writer)))
    same(reader, writer)


def test_rows_that_do_not_fit_this_fabric_are_refused() -> None:
    writer, reader = start(), start()
    changes = as_event(2, writer.delete_node("host2", cascade=True))
    reader.replay(changes)
    with pytest.raises((FabricError, NotFound)):
        reader.replay(changes)  # a second time: the rows are gone already


def test_a_drained_link_replays_as_drained() -> None:
    writer, reader = start(), start()
    reader.replay(as_event(2, writer.drain_link(2)))
    assert reader.links[2].admin_state is AdminState.drained


def test_the_hosts_a_change_touches_are_named_and_a_switch_change_names_none() -> None:
    f = start()
    assert f.hosts_touched(as_event(2, new_host(start()))) == {"host5"}  # and a leaf port
    readdress = start().update_port("leaf1", "swp1", PortUpdate(address="10.0.0.1/31",
                                                                speed_mbps=1000))  # fmt: skip
    assert f.hosts_touched(as_event(2, readdress)) is None
    assert f.hosts_touched(as_event(2, start().delete_node("host2", cascade=True))) == {"host2"}
    assert f.hosts_touched(as_event(2, start().drain_link(1))) == {"host1"}
    assert f.hosts_touched(as_event(2, start().delete_workload("host3-vf0"))) == {"host3"}
    assert f.hosts_touched(as_event(2, start().drain_node("spine1"))) is None
    spine_link = next(i for i, lk in f.links.items() if lk.a.node.startswith("spine")
                      or lk.b.node.startswith("spine"))  # fmt: skip
    assert f.hosts_touched(as_event(2, start().drain_link(spine_link))) is None
    tenant = start().add_tenant(Tenant(name="t2"))
    assert f.hosts_touched(as_event(2, tenant)) == set()


def test_a_copy_replays_while_the_original_stays_as_it_was() -> None:
    original = start()
    before = original.to_document()
    ports = {node: list(names) for node, names in original.node_ports.items()}
    copy = original.copy()
    for _, operation in OPERATIONS:
        operation(copy)
    # ... and a port of a node the original has goes: the new host's link, then its leaf port
    copy.delete_link(copy.link_of_port[("leaf1", "swp9")])
    copy.delete_port("leaf1", "swp9")
    assert original.to_document() == before and original.miscabled == {}
    assert original.node_ports == ports  # a copy shares port lists: replaced, never changed
    assert copy.to_document() != before
    again = start()
    for _, operation in OPERATIONS:
        operation(again)
    again.delete_link(again.link_of_port[("leaf1", "swp9")])
    again.delete_port("leaf1", "swp9")
    same(copy, again)


def test_drains_and_undrains_are_admin_state_changes_only_and_nothing_else_is() -> None:
    f = start()
    spine_link = next(i for i, lk in f.links.items() if lk.a.node.startswith("spine")
                      or lk.b.node.startswith("spine"))  # fmt: skip
    assert f.admin_states_only(as_event(2, start().drain_node("spine1")))
    assert f.admin_states_only(as_event(2, start().drain_link(spine_link)))
    drained = start()
    drained.drain_node("spine1")
    assert drained.admin_states_only(as_event(3, start().drain_node("spine1")))  # no change
    offload = start().update_node("spine1", NodeUpdate(offload="software"))
    assert not f.admin_states_only(as_event(2, offload))
    readdress = start().update_port("leaf1", "swp1", PortUpdate(speed_mbps=1000))
    assert not f.admin_states_only(as_event(2, readdress))
    assert not f.admin_states_only(as_event(2, new_host(start())))
    assert not f.admin_states_only([])
