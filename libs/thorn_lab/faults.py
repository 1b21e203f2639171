"""Failure injection on a running lab; every fault is recorded so `restore` undoes it.

Kinds, and what each side sees (``near`` is the end named first, see `Lab.link`):

``link-down``   Both ends admin down. Each side: its port IFF_UP clear, operstate DOWN, a
                link event in its own namespace; the kernel deletes the routes through it.
``carrier``     The near end loses carrier: the far end is set admin down. Near side: admin
                still up, NO-CARRIER, operstate DOWN, routes through it stay (flagged
                ``linkdown``); far side: admin down, operstate DOWN, its routes deleted.
                (veth has no ``carrier off`` of its own; this is the closest a veth gets to
                a fibre cut seen by one side.)
``node-down``   The node dies: from one instant every packet arriving at any of its
                ports is dropped, then every port goes admin down, so each neighbour sees
                carrier loss on the port facing it, exactly as the near side of
                ``carrier``; hosts' workload representors are left alone.
``drop``        A silent drop (black hole): admin and carrier stay up at both ends, no
                link event anywhere, and packets arriving at the chosen end(s) are
                discarded by a tc ingress BPF program before IP sees them (ARP included).
``loss``        The same, for a random `percent` of the packets (bpf_get_prandom_u32).

``drop`` and ``loss`` take a direction relative to the near end: ``both`` (default),
``in`` (packets arriving at the near end) or ``out`` (packets the near end sends, dropped
at the far end's ingress). Drops are counted by the clsact qdisc (`status` shows them).

Two faults may not touch the same port; restore one first.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from contextlib import suppress
from enum import StrEnum

from thorn_lab import bpf, state
from thorn_lab.blueprint import EndPlan
from thorn_lab.handle import Lab, LinkEnds, UnknownName
from thorn_lab.rtnl import AtOnce, Rtnl, change_at_once, set_admin_at_once

__all__ = [
    "Direction",
    "FaultConflict",
    "carrier_loss",
    "link_down",
    "node_down",
    "packet_loss",
    "restore",
    "silent_drop",
]


RESTORE_WAIT_S = 5.0


class Direction(StrEnum):
    both = "both"
    into = "in"
    out = "out"


class FaultConflict(RuntimeError):
    """The port is already affected by another recorded fault."""


def _device(end: EndPlan) -> state.Device:
    assert end.port is not None, "faults act on fabric ports only"
    return state.Device(node=end.node, port=end.port, namespace=end.namespace, ifname=end.ifname)


def _set_admin(devices: list[state.Device], up: bool) -> None:
    """Every device up or down, as close together in time as the kernel allows (a whole
    switch fails at once, not port by port)."""
    indexes: dict[str | None, list[int]] = {}
    for ns in dict.fromkeys(d.namespace for d in devices):
        with Rtnl.open(ns) as handle:
            links = handle.links()
        indexes[ns] = [links[d.ifname].index for d in devices if d.namespace == ns]
    set_admin_at_once(indexes, up)


def _detach(device: state.Device) -> None:
    with Rtnl.open(device.namespace) as handle:
        links = handle.links()
        if device.ifname in links:
            handle.detach_ingress_bpf(links[device.ifname].index)


def _apply(record: state.FaultRecord) -> None:
    """Make the kernel match the record; on failure undo what was done and re-raise.

    Everything slow comes first (the program's load, clsact qdiscs, the link tables); then
    one batch per namespace attaches the drops and only then takes the ports down. A node
    that dies so forwards nothing from one instant: taken down port by port (each admin
    down costs the kernel ~1 ms), it went on forwarding through the ports still up, and a
    flow through it lost a packet at each port instead of one run. Drops attached one by
    one (a program load and a link dump each) left the two ends of a link 10-40 ms apart."""
    fd = None
    if record.filters:
        program = bpf.drop_all() if record.percent is None else bpf.drop_fraction(record.percent)
        fd = bpf.load(program, "thorn_drop" if record.percent is None else "thorn_loss")
    try:
        batches: dict[str | None, AtOnce] = {}
        for ns in dict.fromkeys(d.namespace for d in [*record.filters, *record.admin_down]):
            with Rtnl.open(ns) as handle:  # one handle and one link dump per namespace
                links = handle.links()
                drop = [links[d.ifname].index for d in record.filters if d.namespace == ns]
                for index in drop:
                    handle.ensure_clsact(index)
                    handle.detach_ingress_bpf(index)  # a leftover from a lost record
                admin = [links[d.ifname].index for d in record.admin_down if d.namespace == ns]
            batches[ns] = AtOnce(drop=drop, admin=admin)
        try:
            program_ref = None if fd is None else (fd, "thorn-fault")
            change_at_once(batches, up=False, program=program_ref)
        except BaseException:
            for device in record.filters:
                _detach(device)
            if record.admin_down:
                _set_admin(record.admin_down, True)
            raise
    finally:
        if fd is not None:
            os.close(fd)  # the filters hold the program now


def _unapply(record: state.FaultRecord) -> None:
    for device in record.filters:
        _detach(device)
    if record.admin_down:
        _set_admin(record.admin_down, True)
    _wait_oper_up(record.touches)


def _wait_oper_up(devices: list[state.Device], timeout: float = RESTORE_WAIT_S) -> None:
    """Return once every device reports operstate UP again (the kernel's linkwatch takes up
    to a second), so a restored link carries traffic when `restore` returns."""
    deadline = time.monotonic() + timeout
    pending = list(devices)
    while pending and time.monotonic() < deadline:
        still = []
        for device in pending:
            with Rtnl.open(device.namespace) as handle:
                link = handle.links().get(device.ifname)
            if link is not None and link.operstate != "UP":
                still.append(device)
        pending = still
        if pending:
            time.sleep(0.02)


def _record(lab: Lab, make: Callable[[str], state.FaultRecord]) -> state.FaultRecord:
    with state.lock(lab.prefix):
        book = state.load_faults(lab.prefix)
        record = make(f"f{book.next_id}")
        touched = {(d.namespace, d.ifname) for d in record.touches}
        for other in book.faults:
            clash = [d for d in other.touches if (d.namespace, d.ifname) in touched]
            if clash:
                raise FaultConflict(
                    f"{clash[0]} is already affected by fault {other.id} ({other.kind.value} "
                    f"{other.target}); restore it first"
                )
        _apply(record)
        book.faults.append(record)
        book.next_id += 1
        state.save_faults(lab.prefix, book)
    return record


def _link_fault(
    lab: Lab,
    ref: str,
    kind: state.FaultKind,
    build: Callable[[LinkEnds, state.Device, state.Device], dict[str, object]],
) -> state.FaultRecord:
    ends = lab.link(ref)
    near, far = _device(ends.near), _device(ends.far)

    def make(fault_id: str) -> state.FaultRecord:
        fields = build(ends, near, far)
        return state.FaultRecord.model_validate(
            {
                "id": fault_id,
                "kind": kind,
                "target": ends.name,
                "created_at": state.now(),
                "touches": [near, far],
                **fields,
            }
        )

    return _record(lab, make)


def link_down(lab: Lab, link: str) -> state.FaultRecord:
    """Both ends of `link` admin down."""

    def build(_: LinkEnds, near: state.Device, far: state.Device) -> dict[str, object]:
        sees = "admin down (IFF_UP clear), operstate DOWN; its routes through the port deleted"
        return {"admin_down": [near, far], "sees": {str(near): sees, str(far): sees}}

    return _link_fault(lab, link, state.FaultKind.link_down, build)


def carrier_loss(lab: Lab, end: str) -> state.FaultRecord:
    """The named end (``node:port``) loses carrier: its peer is set admin down."""
    if ":" not in end or "--" in end:
        raise UnknownName(f"'{end}': name the end that loses carrier as node:port")

    def build(_: LinkEnds, near: state.Device, far: state.Device) -> dict[str, object]:
        return {
            "admin_down": [far],
            "sees": {
                str(near): "carrier lost: admin up, NO-CARRIER, operstate DOWN; routes kept "
                "(flagged linkdown)",
                str(far): "admin down (IFF_UP clear), operstate DOWN; its routes deleted",
            },
        }

    return _link_fault(lab, end, state.FaultKind.carrier, build)


def _filter_fault(
    lab: Lab, link: str, direction: Direction, percent: float | None
) -> state.FaultRecord:
    kind = state.FaultKind.drop if percent is None else state.FaultKind.loss
    if percent is not None:
        bpf.threshold(percent)  # refuse 0, 100 or out of range before touching anything
    what = "all packets" if percent is None else f"{percent:g}% of packets"

    def build(_: LinkEnds, near: state.Device, far: state.Device) -> dict[str, object]:
        receivers = {Direction.both: [near, far], Direction.into: [near], Direction.out: [far]}
        chosen = receivers[direction]
        sees = {
            str(d): (
                f"admin and carrier up; {what} arriving here dropped at ingress"
                if d in chosen
                else "admin and carrier up; nothing changes here"
            )
            for d in (near, far)
        }
        return {"filters": chosen, "percent": percent, "sees": sees}

    return _link_fault(lab, link, kind, build)


def silent_drop(lab: Lab, link: str, direction: Direction = Direction.both) -> state.FaultRecord:
    """Black-hole `link` with carrier up: every packet in `direction` is dropped."""
    return _filter_fault(lab, link, direction, None)


def packet_loss(
    lab: Lab, link: str, percent: float, direction: Direction = Direction.both
) -> state.FaultRecord:
    """Drop `percent` (0 < percent < 100) of the packets on `link` at random."""
    return _filter_fault(lab, link, direction, percent)


def node_down(lab: Lab, node: str) -> state.FaultRecord:
    """`node` dies: it forwards nothing from one instant (a drop at every port's ingress,
    attached at once), then every port goes admin down and its neighbours see carrier loss."""
    links = lab.node_links(node)
    if not links:
        raise UnknownName(f"node '{node}' has no links in lab '{lab.prefix}'")
    own = [_device(e.near) for e in links]
    peers = [_device(e.far) for e in links]

    def make(fault_id: str) -> state.FaultRecord:
        sees = {
            str(d): "everything arriving dropped at ingress; admin down (IFF_UP clear), "
            "operstate DOWN"
            for d in own
        }
        sees |= {str(d): "carrier lost: admin up, NO-CARRIER, operstate DOWN" for d in peers}
        return state.FaultRecord(
            id=fault_id,
            kind=state.FaultKind.node_down,
            target=node,
            created_at=state.now(),
            sees=sees,
            admin_down=own,
            filters=own,
            touches=own + peers,
        )

    return _record(lab, make)


def faults(lab: Lab) -> list[state.FaultRecord]:
    return state.load_faults(lab.prefix).faults


def restore(lab: Lab, fault_id: str | None = None) -> list[state.FaultRecord]:
    """Undo fault `fault_id`, or every recorded fault for None; return what was undone.

    A fault id may also be given as its target (a link name or a node)."""
    with state.lock(lab.prefix):
        book = state.load_faults(lab.prefix)
        if fault_id is None:
            chosen = list(book.faults)
        else:
            wanted = {fault_id}
            with suppress(UnknownName):
                wanted.add(lab.link(fault_id).name)  # any spelling of the link
            chosen = [f for f in book.faults if f.id in wanted or f.target in wanted]
            if not chosen:
                known = ", ".join(f"{f.id} ({f.kind.value} {f.target})" for f in book.faults)
                raise UnknownName(
                    f"no fault '{fault_id}' in lab '{lab.prefix}'"
                    + (f"; recorded: {known}" if known else "; none is recorded")
                )
        for record in chosen:
            _unapply(record)
            book.faults.remove(record)
            state.save_faults(lab.prefix, book)
    return chosen
