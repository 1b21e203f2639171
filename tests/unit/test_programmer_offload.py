"""The offload policy's pure parts: which devices are switchdev ports, the node's mode and its
reason, the read-back summary, and how a change of mode is applied.

The kernel side (hardware refused, auto falling back, software, the read-back) is in
tests/kernel/test_offload_policy.py; a SmartNIC is not available to any lane (docs/datapath.md).
"""

from __future__ import annotations

import struct

import pytest

from thorn_programmer.drivers.flower import remade_for_mode
from thorn_programmer.drivers.offload import (
    IFLA_IFNAME,
    IFLA_PARENT_DEV_BUS_NAME,
    IFLA_PARENT_DEV_NAME,
    IFLA_PHYS_PORT_NAME,
    IFLA_PHYS_SWITCH_ID,
    PortFacts,
    decide,
    devlink_handle,
    eswitch_verdicts,
    needs_trial,
    port_facts,
    report,
)
from thorn_programmer.intent import HostIntent, LocalWorkload, Peer
from thorn_programmer.kernel import Change, DecapRule, EncapRule, Route, TunnelAction
from thorn_programmer.render import flower_objects

SWITCH = "8a3f0b1c2d4e5f60"
NOT_SWITCHDEV = "not a switchdev port (no phys_switch_id)"


def nla(kind: int, payload: bytes) -> bytes:
    data = struct.pack("=HH", 4 + len(payload), kind) + payload
    return data + b"\0" * (-len(data) % 4)


def newlink(index: int, name: str, **attrs: bytes) -> bytes:
    """An RTM_NEWLINK message as the kernel dumps it (only the attributes asked for)."""
    numbers = {"switch_id": IFLA_PHYS_SWITCH_ID, "port_name": IFLA_PHYS_PORT_NAME,
               "bus": IFLA_PARENT_DEV_BUS_NAME, "dev": IFLA_PARENT_DEV_NAME}  # fmt: skip
    body = struct.pack("=BxHiII", 0, 1, index, 0, 0) + nla(IFLA_IFNAME, name.encode() + b"\0")
    for key, value in attrs.items():
        body += nla(numbers[key], value)
    return struct.pack("=IHHII", 16 + len(body), 16, 2, 0, 0) + body


# An mlx5-like eswitch in switchdev mode: uplink p0 on the PF, VF representors pf0vf0/1.
ESWITCH = [
    newlink(2, "enp8s0f0np0", switch_id=bytes.fromhex(SWITCH), port_name=b"p0\0",
            bus=b"pci\0", dev=b"0000:08:00.0\0"),
    newlink(7, "eth_rep0", switch_id=bytes.fromhex(SWITCH), port_name=b"pf0vf0\0",
            bus=b"pci\0", dev=b"0000:08:00.0\0"),
    newlink(8, "eth_rep1", switch_id=bytes.fromhex(SWITCH), port_name=b"pf0vf1\0"),
    newlink(9, "vf0_rep"),  # a veth: no switch id, no port name, no parent
]  # fmt: skip
PCI = "pci/0000:08:00.0"


def test_a_link_dump_gives_each_ports_switch_port_name_and_parent() -> None:
    ports = port_facts(ESWITCH)
    assert ports["enp8s0f0np0"] == PortFacts("enp8s0f0np0", SWITCH, "p0", PCI)
    assert ports["eth_rep1"] == PortFacts("eth_rep1", SWITCH, "pf0vf1", None)
    assert ports["vf0_rep"] == PortFacts("vf0_rep")
    assert ports["enp8s0f0np0"].uplink and not ports["eth_rep0"].uplink


def test_a_representors_eswitch_is_found_through_the_uplink_of_its_switch() -> None:
    ports = port_facts(ESWITCH)
    # eth_rep1 reports no parent of its own: the uplink sharing its switch id names the device.
    assert devlink_handle(ports["eth_rep1"], ports) == PCI
    assert devlink_handle(ports["vf0_rep"], ports) is None


def test_switchdev_ports_and_why_others_are_not() -> None:
    ports = port_facts(ESWITCH)
    devices = ["eth_rep0", "eth_rep1", "vf0_rep", "gone0"]
    verdicts = eswitch_verdicts(devices, ports, {PCI: "switchdev"})
    assert verdicts == {"eth_rep0": "switchdev", "eth_rep1": "switchdev",
                        "vf0_rep": NOT_SWITCHDEV, "gone0": "no such device"}  # fmt: skip
    legacy = eswitch_verdicts(["eth_rep0"], ports, {PCI: "legacy"})
    assert legacy == {"eth_rep0": f"{PCI}: eswitch legacy"}
    unread = eswitch_verdicts(["eth_rep0"], ports, {PCI: "eswitch mode not read: [Errno 19]"})
    assert unread == {"eth_rep0": f"{PCI}: eswitch eswitch mode not read: [Errno 19]"}
    nameless = port_facts([newlink(3, "x0", switch_id=b"\x01")])
    assert eswitch_verdicts(["x0"], nameless, {}) == {"x0": "switch 01: no phys_port_name"}


def test_auto_uses_the_nic_only_where_every_representor_is_switchdev_and_accepts_skip_sw() -> None:
    good = {"eth_rep0": "switchdev", "eth_rep1": "switchdev"}
    assert needs_trial("auto", good)
    hardware = decide("auto", good)
    assert (hardware.mode, hardware.reason, hardware.skip_sw) == ("hardware", None, True)
    refused = decide("auto", good, "eth_rep0: [Errno 95] Operation not supported")
    assert (refused.mode, refused.skip_sw) == ("software", False)
    assert refused.reason == "skip_sw refused: eth_rep0: [Errno 95] Operation not supported"


def test_auto_falls_back_without_asking_the_kernel_where_a_device_is_not_switchdev() -> None:
    mixed = {"eth_rep0": "switchdev", "vf0_rep": NOT_SWITCHDEV}
    assert not needs_trial("auto", mixed)
    decision = decide("auto", mixed)
    assert (decision.mode, decision.reason) == ("software", f"vf0_rep: {NOT_SWITCHDEV}")
    assert decision.devices == mixed
    empty = decide("auto", {})
    assert (empty.mode, empty.reason) == ("software", "no representor carries rules yet")


def test_hardware_is_always_tried_and_a_refusal_is_reported_not_fallen_back_from() -> None:
    assert needs_trial("hardware", {"vf0_rep": NOT_SWITCHDEV})
    refused = decide("hardware", {"vf0_rep": NOT_SWITCHDEV}, "vf0_rep: [Errno 95] Operation "
                     "not supported")  # fmt: skip
    assert (refused.mode, refused.skip_sw) == ("hardware", True)
    assert refused.reason == "refused by the kernel: vf0_rep: [Errno 95] Operation not supported"
    assert decide("hardware", {"eth_rep0": "switchdev"}).reason is None


def test_software_is_never_tried_and_needs_no_reason() -> None:
    assert not needs_trial("software", {"eth_rep0": "switchdev"})
    decision = decide("software", {})
    assert (decision.mode, decision.reason, decision.skip_sw) == ("software", None, False)


def test_the_read_back_counts_rules_in_and_not_in_hardware() -> None:
    decision = decide("auto", {"vf0_rep": NOT_SWITCHDEV})
    summary = report(decision, [(False, True, 0), (False, True, None), (True, False, 2)], [0, 1])
    assert (summary.filters, summary.in_hw, summary.not_in_hw, summary.in_hw_count) == (3, 1, 2, 2)
    assert (summary.actions, summary.actions_in_hw) == (2, 1)
    assert (summary.policy, summary.mode, summary.reason) == ("auto", "software", decision.reason)


INTENT = HostIntent(
    node="h1", revision=1, teps={"red": "10.224.0.1"}, routes=(),
    local=(LocalWorkload("w1", 100, "vf0_rep", "06:00:00:00:00:01", "100.64.0.1"),),
    peers=(Peer("w2", 100, "06:00:00:00:00:02", "100.64.0.2", "h2", {"red": "10.224.0.2"},
                "red"),),
)  # fmt: skip


@pytest.mark.parametrize("skip_sw", [False, True])
def test_every_rule_and_shared_action_is_rendered_in_the_nodes_one_mode(skip_sw: bool) -> None:
    flagged = [o for o in flower_objects(INTENT, skip_sw=skip_sw) if hasattr(o, "skip_sw")]
    assert {type(o).__name__ for o in flagged} == {"TunnelAction", "EncapRule", "FloodRule",
                                                  "DecapRule"}  # fmt: skip
    assert all(o.skip_sw is skip_sw for o in flagged)


def test_a_change_of_mode_deletes_the_old_rules_before_adding_the_new() -> None:
    action = TunnelAction("h2", 100, "10.224.0.1", "10.224.0.2", index=0x54480001)
    encap = EncapRule("vf0_rep", "06:00:00:00:00:02", "h2", 100, handle=5)
    decap = DecapRule(100, "06:00:00:00:00:01", ("vf0_rep",), handle=6)
    route = Route("10.224.0.2/32", "eth1", None, 10)

    def hw(o: TunnelAction | EncapRule | DecapRule) -> TunnelAction | EncapRule | DecapRule:
        return type(o)(**{**{f: getattr(o, f) for f in o.__slots__}, "skip_sw": True})

    changes = [
        Change("add", route, None),
        Change("replace", hw(action), action),
        Change("replace", hw(decap), decap),
        Change("replace", hw(encap), encap),
    ]
    deletes, rest = remade_for_mode(changes)
    remade = [(c.op, type(c.obj).__name__, getattr(c.obj, "skip_sw", None)) for c in
              deletes + rest]  # fmt: skip
    assert remade == [
        ("delete", "EncapRule", False),  # rules before the action they bind
        ("delete", "DecapRule", False),
        ("delete", "TunnelAction", False),
        ("add", "Route", None),
        ("add", "TunnelAction", True),
        ("add", "DecapRule", True),
        ("add", "EncapRule", True),
    ]
    # A replace within one mode (the failover flip) stays a replace.
    flip = [Change("replace", TunnelAction("h2", 100, "10.224.0.1", "10.240.0.2"), action)]
    assert remade_for_mode(flip) == ([], flip)
