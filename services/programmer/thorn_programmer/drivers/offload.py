"""Where a host's flower rules run: the node's offload policy, turned into skip_sw or skip_hw.

The policy comes with the desired state (`HostState.offload`, an admin's node field):
- `software`: every rule and shared action carries skip_hw (what THORN always did);
- `hardware`: every one carries skip_sw; the kernel refuses what the NIC cannot hold, and
  that refusal (its extack) is the report;
- `auto`: skip_sw if every representor carrying rules is a port of a switchdev eswitch and
  the kernel accepts skip_sw there (a trial), else skip_hw, saying why.

One mode per node, not per device: a shared tunnel action is bound by the encap rules of
every representor, and the kernel refuses a binding whose flags differ from the action's
("Mismatch between action and filter offload flags").

Is a device a switchdev port? `eswitch_verdicts` (pure) answers from facts the kernel gives:
the link's IFLA_PHYS_SWITCH_ID and IFLA_PHYS_PORT_NAME (sysfs `phys_switch_id`,
`phys_port_name`; a veth has neither: reading them gives EOPNOTSUPP and the link dump leaves
them out), the parent device (IFLA_PARENT_DEV_BUS_NAME/NAME: `pci`, `0000:08:00.0`), and the
devlink eswitch mode of that device (DEVLINK_CMD_ESWITCH_GET: legacy or switchdev). The
devlink handle is the parent of the eswitch's uplink (`phys_port_name` p0, p1...) where one
shares the port's switch id, else the port's own parent.

The trial (`trial`): on each representor, a flower filter with skip_sw (an unused
destination MAC, `drop`) added and deleted again at THORN's probe priority; then a shared
tunnel_key action with skip_sw at THORN's probe index, added and deleted. The first refusal,
in the kernel's words, is the reason.
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from pyroute2.netlink.exceptions import NetlinkError

from thorn.desired import OffloadName
from thorn.events import OffloadReport
from thorn.netns import run_in_netns
from thorn_programmer.drivers.routes import asciiz, dump_links_message, parse_link
from thorn_programmer.kernel import PROBE_INDEX, PROBE_PRIO, VXLAN_PORT
from thorn_programmer.netlink import (
    Control,
    FlowerFilter,
    FlowerMatch,
    Gact,
    TcError,
    TcSocket,
    TunnelKeySet,
    action_add,
    action_delete,
    filter_add,
    filter_delete,
)

Mode = Literal["hardware", "software"]

IFLA_IFNAME = 3
IFLA_PHYS_SWITCH_ID = 36
IFLA_PHYS_PORT_NAME = 38
IFLA_PARENT_DEV_NAME = 56
IFLA_PARENT_DEV_BUS_NAME = 57
ESWITCH_MODES = {0: "legacy", 1: "switchdev"}  # enum devlink_eswitch_mode
SWITCHDEV = "switchdev"
PROBE_MAC = "02:00:00:00:00:01"  # locally administered, never a workload's (THORN's probes)
_UPLINK = re.compile(r"^p\d+$")  # phys_port_name of an eswitch's uplink (mlx5, ice, nfp...)


@dataclass(frozen=True, slots=True)
class PortFacts:
    """What the kernel says of one netdev about the eswitch it belongs to."""

    name: str
    switch_id: str | None = None  # IFLA_PHYS_SWITCH_ID, hex
    port_name: str | None = None  # IFLA_PHYS_PORT_NAME: p0 (uplink), pf0vf1, pf0sf88...
    parent: str | None = None  # devlink handle of the parent device: "pci/0000:08:00.0"

    @property
    def uplink(self) -> bool:
        return self.port_name is not None and bool(_UPLINK.match(self.port_name))


def port_facts(messages: Iterable[bytes]) -> dict[str, PortFacts]:
    """Every link of an RTM_GETLINK dump, by name."""
    out: dict[str, PortFacts] = {}
    for message in messages:
        link = parse_link(message)
        if link is None or IFLA_IFNAME not in link[1]:
            continue
        attrs = link[1]
        name = asciiz(attrs[IFLA_IFNAME])
        bus, dev = attrs.get(IFLA_PARENT_DEV_BUS_NAME), attrs.get(IFLA_PARENT_DEV_NAME)
        switch_id = attrs.get(IFLA_PHYS_SWITCH_ID)
        port_name = attrs.get(IFLA_PHYS_PORT_NAME)
        out[name] = PortFacts(
            name=name,
            switch_id=switch_id.hex() if switch_id else None,
            port_name=asciiz(port_name) if port_name else None,
            parent=f"{asciiz(bus)}/{asciiz(dev)}" if bus and dev else None,
        )
    return out


def devlink_handle(port: PortFacts, ports: Mapping[str, PortFacts]) -> str | None:
    """The devlink device whose eswitch `port` belongs to (see the module's docstring)."""
    if port.switch_id is None:
        return None
    uplinks = sorted(
        p.parent for p in ports.values()
        if p.switch_id == port.switch_id and p.uplink and p.parent
    )  # fmt: skip
    return uplinks[0] if uplinks else port.parent


def eswitch_verdicts(
    devices: Sequence[str], ports: Mapping[str, PortFacts], modes: Mapping[str, str]
) -> dict[str, str]:
    """Per device: "switchdev", or why it is not a switchdev port. `modes`: devlink handle ->
    its eswitch mode, or the reason it could not be read."""
    verdicts: dict[str, str] = {}
    for dev in devices:
        port = ports.get(dev)
        if port is None:
            verdicts[dev] = "no such device"
        elif port.switch_id is None:
            verdicts[dev] = "not a switchdev port (no phys_switch_id)"
        elif port.port_name is None:
            verdicts[dev] = f"switch {port.switch_id}: no phys_port_name"
        elif (handle := devlink_handle(port, ports)) is None:
            verdicts[dev] = f"switch {port.switch_id}: no parent device for devlink"
        else:
            mode = modes.get(handle, "eswitch mode not read")
            verdicts[dev] = SWITCHDEV if mode == SWITCHDEV else f"{handle}: eswitch {mode}"
    return verdicts


@dataclass(frozen=True, slots=True)
class Decision:
    policy: OffloadName
    mode: Mode
    reason: str | None = None  # why not what the policy asked for; None: as asked
    devices: dict[str, str] = field(default_factory=dict)

    @property
    def skip_sw(self) -> bool:
        return self.mode == "hardware"


def needs_trial(policy: OffloadName, verdicts: Mapping[str, str]) -> bool:
    """Whether the kernel must be asked: hardware always (its refusal is the report), auto
    only where every device is a switchdev port."""
    if policy == "hardware":
        return True
    return policy == "auto" and bool(verdicts) and all(v == SWITCHDEV for v in verdicts.values())


def decide(
    policy: OffloadName, verdicts: Mapping[str, str], refusal: str | None = None
) -> Decision:
    """The node's mode. `refusal`: the trial's first refusal (None: accepted, or not run)."""
    devices = dict(verdicts)
    if policy == "software":
        return Decision(policy, "software", None, devices)
    if policy == "hardware":
        reason = f"refused by the kernel: {refusal}" if refusal else None
        return Decision(policy, "hardware", reason, devices)
    if not verdicts:
        return Decision(policy, "software", "no representor carries rules yet", devices)
    not_switchdev = [f"{d}: {v}" for d, v in sorted(verdicts.items()) if v != SWITCHDEV]
    if not_switchdev:
        return Decision(policy, "software", "; ".join(not_switchdev), devices)
    if refusal:
        return Decision(policy, "software", f"skip_sw refused: {refusal}", devices)
    return Decision(policy, "hardware", None, devices)


def report(decision: Decision, filters: Sequence[tuple[bool, bool, int | None]],
           actions: Sequence[int | None]) -> OffloadReport:  # fmt: skip
    """`filters`: (in_hw, not_in_hw, in_hw_count) of THORN's filters as read back;
    `actions`: THORN's tunnel actions' in_hw_count."""
    return OffloadReport(
        policy=decision.policy, mode=decision.mode, reason=decision.reason,
        devices=decision.devices, filters=len(filters),
        in_hw=sum(1 for f in filters if f[0]), not_in_hw=sum(1 for f in filters if f[1]),
        in_hw_count=sum(f[2] or 0 for f in filters), actions=len(actions),
        actions_in_hw=sum(1 for count in actions if count),
    )  # fmt: skip


# --- asking the kernel ------------------------------------------------------------------------


def read_ports(sock: TcSocket) -> dict[str, PortFacts]:
    return port_facts(sock.dump(dump_links_message()))


def eswitch_mode(handle: str) -> str:
    """DEVLINK_CMD_ESWITCH_GET for "bus/device": "legacy", "switchdev", or why unknown."""
    from pyroute2 import DL
    from pyroute2.netlink import NLM_F_ACK, NLM_F_REQUEST
    from pyroute2.netlink.devlink import DEVLINK_CMD_ESWITCH_GET, devlinkcmd

    bus, _, dev = handle.partition("/")
    msg = devlinkcmd()
    msg["cmd"] = DEVLINK_CMD_ESWITCH_GET
    msg["version"] = 1
    msg["attrs"] = [["DEVLINK_ATTR_BUS_NAME", bus], ["DEVLINK_ATTR_DEV_NAME", dev]]
    try:
        with DL() as dl:
            replies = dl.nlm_request(msg, msg_type=dl.prid, msg_flags=NLM_F_REQUEST | NLM_F_ACK)
    except NetlinkError as exc:
        return f"eswitch mode not read: {exc}"
    for reply in replies:
        mode = reply.get_attr("DEVLINK_ATTR_ESWITCH_MODE")
        if mode is not None:
            return ESWITCH_MODES.get(mode, f"mode {mode}")
    return "eswitch mode not reported"


def eswitch_modes(handles: Iterable[str], netns: str | None) -> dict[str, str]:
    """Each devlink handle's eswitch mode, asked in `netns` (devlink instances are per
    namespace)."""

    def ask() -> dict[str, str]:
        return {h: eswitch_mode(h) for h in sorted(set(handles))}

    return ask() if netns is None else run_in_netns(netns, ask)


def trial(sock: TcSocket, ifindexes: Mapping[str, int]) -> str | None:
    """Ask the kernel for skip_sw on each device, then for a skip_sw shared tunnel action;
    None if all were accepted, else the first refusal ("dev: [Errno ..] ...: extack")."""
    for dev, ifindex in sorted(ifindexes.items()):
        spec = FlowerFilter(ifindex=ifindex, priority=PROBE_PRIO, handle=1,
                            match=FlowerMatch(eth_dst=PROBE_MAC),
                            actions=(Gact(Control.SHOT),), skip_sw=True)  # fmt: skip
        try:
            sock.request(filter_add(spec))
        except TcError as exc:
            return f"{dev}: {exc}"
        with contextlib.suppress(TcError):
            sock.request(filter_delete(spec))
    action = TunnelKeySet(src=ipaddress.ip_address("192.0.2.1"),
                          dst=ipaddress.ip_address("192.0.2.2"), key_id=1,
                          dst_port=VXLAN_PORT, index=PROBE_INDEX)  # fmt: skip
    try:
        sock.request(action_add(action, skip_sw=True))
    except TcError as exc:
        return f"shared tunnel_key action: {exc}"
    with contextlib.suppress(TcError):
        sock.request(action_delete("tunnel_key", PROBE_INDEX))
    return None
