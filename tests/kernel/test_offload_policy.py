"""The flower driver's offload policy on a kernel with flower, on devices that cannot offload.

The representors here are veth devices: no phys_switch_id, no eswitch, no NIC to take a
rule. So `hardware` (skip_sw) must be refused with the kernel's own reason and say so,
`auto` must fall back to software (skip_hw) and say why, `software` must set skip_hw, and
the read-back must show every rule not_in_hw with in_hw_count 0. What a switchdev NIC would
do is not testable here (docs/datapath.md, "Offload policy").
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from structlog.testing import capture_logs
from twohosts import TwoHosts, hosts_fixture, sh, udp_exchange  # noqa: F401  (hosts_fixture: the `hosts` fixture)

from thorn.desired import OffloadName
from thorn.events import OffloadReport
from thorn_programmer.drivers import offload
from thorn_programmer.drivers.flower import FlowerDriver
from thorn_programmer.intent import HostIntent
from thorn_programmer.kernel import PRIO_BAND, PRIO_BASE, PRIO_ENCAP
from thorn_programmer.reconcile import ReconcileResult, reconcile


def with_policy(intent: HostIntent, policy: OffloadName) -> HostIntent:
    return dataclasses.replace(intent, offload=policy)


async def program(lab: TwoHosts, policy: OffloadName, host: str = "h1") -> tuple[
    ReconcileResult, OffloadReport | None
]:  # fmt: skip
    async with FlowerDriver.open(lab.ns[host]) as driver:
        await driver.setup()
        result = await reconcile(driver, with_policy(lab.intent(host), policy))
        return result, driver.offload_report()


def thorn_filters(ns: str, dev: str) -> list[dict[str, Any]]:
    out = sh("tc", "-n", ns, "-j", "filter", "show", "dev", dev, "ingress")
    filters = json.loads(out) if out.strip() else []
    return [f for f in filters if "options" in f and PRIO_BASE <= f["pref"] < PRIO_BASE + PRIO_BAND]


async def test_hardware_is_refused_with_the_kernels_reason(hosts: TwoHosts) -> None:
    result, report = await program(hosts, "hardware")
    assert report is not None
    assert (report.policy, report.mode) == ("hardware", "hardware")
    # The trial's skip_sw filter on the veth representor, in the kernel's words.
    assert report.reason is not None
    assert report.reason.startswith("refused by the kernel: vf0_rep: [Errno 95]"), report.reason
    assert report.devices == {"vf0_rep": "not a switchdev port (no phys_switch_id)"}
    # Every rule and shared action was asked for with skip_sw and refused: none is in place.
    assert not result.ok
    # Seen on 6.1: the shared action is refused without an extack (EINVAL: no device took
    # it), the decap rules with EOPNOTSUPP, and the encap and BUM rules find no action to bind.
    refusals = {(e.errno, e.message.split(" (batch")[0]) for e in result.errors}
    assert refusals <= {
        (22, "[Errno 22] Invalid argument"),
        (22, "[Errno 22] Invalid argument: Unknown tunnel key action"),
        (95, "[Errno 95] Operation not supported"),
    }, refusals
    assert (95, "[Errno 95] Operation not supported") in refusals
    assert thorn_filters(hosts.ns["h1"], "vf0_rep") == []
    assert report.filters == 0 and report.actions == 0


async def test_auto_falls_back_to_software_and_says_why(hosts: TwoHosts) -> None:
    await program(hosts, "software", host="h2")
    with capture_logs() as logs:
        result, report = await program(hosts, "auto")
    assert result.ok, result.errors
    assert report is not None
    why = "not a switchdev port (no phys_switch_id)"
    assert (report.policy, report.mode, report.reason) == ("auto", "software", f"vf0_rep: {why}")
    assert report.devices == {"vf0_rep": why}
    [decided] = [e for e in logs if e["event"] == "offload_decided"]
    assert (decided["log_level"], decided["mode"], decided["reason"]) == (
        "warning", "software", f"vf0_rep: {why}")  # fmt: skip
    [encap] = [f for f in thorn_filters(hosts.ns["h1"], "vf0_rep") if f["pref"] == PRIO_ENCAP]
    assert encap["options"]["skip_hw"] is True
    assert udp_exchange(hosts) == 20  # the software datapath carries the traffic


async def test_software_sets_skip_hw_and_reads_back_not_in_hw(hosts: TwoHosts) -> None:
    result, report = await program(hosts, "software")
    assert result.ok, result.errors
    assert report is not None
    assert (report.mode, report.reason, report.devices) == ("software", None, {})
    filters = thorn_filters(hosts.ns["h1"], "vf0_rep") + thorn_filters(hosts.ns["h1"], "thorn-vx")
    assert filters
    for f in filters:
        opts = f["options"]
        assert (opts.get("skip_hw"), opts.get("not_in_hw"), opts.get("in_hw")) == (True, True, None)
    # The driver's own read-back says the same: every rule not in hardware, no NIC holds one.
    async with FlowerDriver.open(hosts.ns["h1"]) as driver:
        driver.render(hosts.intent("h1"))
        await driver.read()
        again = driver.offload_report()
    assert again is not None
    assert again.filters == len(filters)
    assert (again.not_in_hw, again.in_hw, again.in_hw_count) == (len(filters), 0, 0)
    assert again.actions == 1 and again.actions_in_hw == 0


async def test_a_change_of_policy_replaces_the_rules_of_the_old_mode(hosts: TwoHosts) -> None:
    """software -> hardware deletes the skip_hw rules and actions first (a bound action's
    flags cannot change in place), the skip_sw ones are refused; back to software, the
    rules come back and carry traffic again."""
    await program(hosts, "software", host="h2")
    await program(hosts, "software")
    assert udp_exchange(hosts) == 20
    result, _ = await program(hosts, "hardware")
    deleted = [c for c in result.applied if c.op == "delete"]
    assert deleted
    assert not any("Mismatch" in e.message for e in result.errors), [
        (e.change.op, e.change.obj, e.message) for e in result.errors
    ]
    assert thorn_filters(hosts.ns["h1"], "vf0_rep") == []
    result, report = await program(hosts, "software")
    assert result.ok, result.errors
    assert report is not None and report.mode == "software"
    assert udp_exchange(hosts) == 20


def test_the_devlink_request_reaches_the_kernel() -> None:
    """DEVLINK_CMD_ESWITCH_GET for a device this guest does not have: the kernel answers
    "no such device", not "invalid" (the request itself is well formed)."""
    answer = offload.eswitch_mode("pci/0000:ff:1f.7")
    assert answer.startswith("eswitch mode not read:"), answer
    assert "No such device" in answer, answer
