"""The host flower driver on a kernel that has cls_flower and act_tunnel_key.

Two hosts joined by a red link (eth1) and a blue link (eth2), one workload behind a
representor on each (tests/support/twohosts.py): the driver's encap and decap rules must
carry the workloads' traffic through VXLAN, move it to blue with one message, read back
the same through `tc -j`, and leave rules it did not make alone.
"""

from __future__ import annotations

import json
from typing import Any

from twohosts import VNI, TwoHosts, hosts_fixture, sh, tx_packets, udp_exchange  # noqa: F401  (hosts_fixture: the `hosts` fixture)

from thorn.model import Colour
from thorn_programmer.drivers import open_driver, probe_flower
from thorn_programmer.drivers.flower import FlowerDriver
from thorn_programmer.kernel import ACTION_INDEX_BASE, PRIO_DECAP, PRIO_ENCAP, TunnelAction, diff
from thorn_programmer.reconcile import plan_changes, reconcile


async def program(lab: TwoHosts, colour: Colour = "red") -> None:
    for host in ("h1", "h2"):
        async with FlowerDriver.open(lab.ns[host]) as driver:
            await driver.setup()
            result = await reconcile(driver, lab.intent(host, colour=colour))
            assert result.ok, result.errors


def tc_json(ns: str, *args: str) -> list[dict[str, Any]]:
    out = sh("tc", "-n", ns, "-j", *args)
    return json.loads(out) if out.strip() else []


async def test_auto_picks_the_flower_driver_on_this_kernel(hosts: TwoHosts) -> None:
    assert await probe_flower(hosts.ns["h1"]) == (True, "")
    async with open_driver("host", hosts.ns["h1"], "auto") as driver:
        assert driver.name == "flower"


async def test_encap_and_decap_rules_carry_workload_traffic(hosts: TwoHosts) -> None:
    await program(hosts)
    red_before = tx_packets(hosts, "h1", "eth1")
    assert udp_exchange(hosts) == 20
    assert tx_packets(hosts, "h1", "eth1") - red_before >= 20  # on the red TEP's link


async def test_failover_is_one_message_and_moves_the_traffic(hosts: TwoHosts) -> None:
    await program(hosts)
    assert udp_exchange(hosts) == 20
    sh("ip", "-n", hosts.ns["h1"], "link", "set", "dev", "eth1", "down")
    async with FlowerDriver.open(hosts.ns["h1"]) as driver:
        red = driver.render(hosts.intent("h1"))
        await driver.read()  # learn the shared actions' indexes
        blue = driver.render(hosts.intent("h1", colour="blue"))
        changes = diff(blue, red)
        assert [(c.op, type(c.obj)) for c in changes] == [("replace", TunnelAction)]
        report = await driver.apply(changes)
        assert not report.errors
    blue_before = tx_packets(hosts, "h1", "eth2")
    assert udp_exchange(hosts) == 20
    assert tx_packets(hosts, "h1", "eth2") - blue_before >= 20


async def test_the_rules_read_back_through_tc_json(hosts: TwoHosts) -> None:
    await program(hosts)
    ns = hosts.ns["h1"]
    [encap] = [f for f in tc_json(ns, "filter", "show", "dev", "vf0_rep", "ingress")
               if f.get("pref") == PRIO_ENCAP and "options" in f]  # fmt: skip
    options = encap["options"]
    assert isinstance(options, dict)
    assert options["keys"]["dst_mac"] == hosts.macs["w2"]
    assert options["skip_hw"] is True and options["not_in_hw"] is True
    kinds = [a["kind"] for a in options["actions"]]
    assert kinds == ["tunnel_key", "mirred"]
    index = options["actions"][0]["index"]
    assert index >= ACTION_INDEX_BASE
    listed = tc_json(ns, "actions", "ls", "action", "tunnel_key")
    [action] = [a for part in listed if isinstance(part, dict) for a in part.get("actions", [])
                if a["index"] == index]  # fmt: skip
    assert (action["dst_ip"], action["key_id"], action["dst_port"]) == (
        hosts.teps["h2"]["red"], VNI, 4789)  # fmt: skip
    decap = [f for f in tc_json(ns, "filter", "show", "dev", "thorn-vx", "ingress")
             if f.get("pref") == PRIO_DECAP and "options" in f]  # fmt: skip
    keys = [(f["options"]["keys"].get("enc_key_id"), f["options"]["keys"].get("dst_mac"))
            for f in decap]  # fmt: skip
    assert (VNI, hosts.macs["w1"]) in keys


async def test_reconcile_leaves_a_foreign_rule_alone_and_a_rerun_changes_nothing(
    hosts: TwoHosts,
) -> None:
    ns = hosts.ns["h1"]
    sh("tc", "-n", ns, "qdisc", "add", "dev", "vf0_rep", "clsact")
    sh("tc", "-n", ns, "filter", "add", "dev", "vf0_rep", "ingress", "prio", "7", "protocol",
       "ip", "flower", "skip_hw", "dst_ip", "198.51.100.7", "action", "drop")  # fmt: skip
    await program(hosts)
    async with FlowerDriver.open(ns) as driver:
        await reconcile(driver, hosts.intent("h1", revision=2, colour="blue"))
        assert await plan_changes(driver, hosts.intent("h1", revision=2, colour="blue")) == []
    foreign = [f for f in tc_json(ns, "filter", "show", "dev", "vf0_rep", "ingress")
               if f.get("pref") == 7 and "options" in f]  # fmt: skip
    assert len(foreign) == 1
    assert udp_exchange(hosts) == 20
