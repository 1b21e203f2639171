"""A dual-homed host loses one of its uplinks (issue 10), with the whole system and real BFD
(tests/support/fabric_system.py) on `leaf_spine(2, 4, 2, dual_homed=True)`: host1 and host2
have `eth1` on leaf1 and `eth2` on leaf2, host3 and host4 `eth1` on leaf3 and `eth2` on
leaf4, two spines. Red leaves and enters a host by one uplink, blue by the other, so a cut
uplink is a failure the host itself and its leaf see: health hears of it from their carrier
reports, and pathcomp flips to blue the sources whose traffic still crosses it (the host's
and its leaf's own backup routes may have moved some already), then re-protects red
through the other uplink.

One lab and one system for the module: each test restores the lab and waits until every
link is up and every agent has applied its documents; hold-down 0.5 s, so that re-protected
sources are back on red soon.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import pytest
from fabric_system import System, flows, outside_gap, running_system

from thorn.generators import leaf_spine
from thorn.natsd import EmbeddedNats
from thorn_lab import faults
from thorn_lab.handle import Lab

GAP_MS = 500  # carrier reports -> health -> urgent flips: tens of ms by design (idle: 25-72)


@pytest.fixture(scope="module")
async def dual_homed(
    make_module_lab: Callable[..., Lab], tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[System]:
    doc = leaf_spine(2, 4, 2, dual_homed=True)
    lab = await asyncio.to_thread(make_module_lab, doc)
    data = tmp_path_factory.mktemp("dual-homed")
    async with (
        EmbeddedNats(store_dir=data / "nats") as server,
        running_system(lab, doc, server.url, data, failover_hold_down_ms=500) as f,
    ):
        yield f


@pytest.fixture
async def system(dual_homed: System) -> AsyncIterator[System]:
    yield dual_homed
    # Not waiting for every override to go: see the last test of the module.
    await dual_homed.restored(overrides=False)


async def _cut_uplink(
    f: System, host: str, peer: str, neighbour: str, cut: Callable[[Lab, str], object]
) -> None:
    """Cut `host`'s red uplink toward `peer` (on the other leaf pair) under flows to and
    from it, and from `neighbour` on its own leaves: each flow loses one short run, and
    re-protection takes red through the other uplink."""
    uplink = f.red_path(host, peer)[0]
    assert uplink == f.red_path(peer, host)[-1], "red enters the host by the same uplink"
    pairs = [(host, peer), (peer, host), (neighbour, host)]
    streams = await flows(f.lab, pairs, 3000, 5301)
    await asyncio.sleep(1.0)
    t0 = time.time_ns()
    await asyncio.to_thread(cut, f.lab, f.end_at(uplink, host))
    await f.until(lambda: f.link_events(uplink, "down", t0), 5, "health: uplink down")
    reports = [await asyncio.to_thread(s.wait) for s in streams]
    seen = {f"{s}->{d}": (r.max_gap_ms, r.lost_ranges)
            for (s, d), r in zip(pairs, reports, strict=True)}  # fmt: skip
    print(f"\n{host}'s uplink cut: {seen}")
    for r in reports:
        assert r.max_gap_ms <= GAP_MS and outside_gap(r) == 0, (seen, f.timeline(t0))
    await f.pathcomp.replanned()
    red = f.red_path(host, peer)
    other = f.fabric.links[red[0]]
    assert red[0] != uplink and host in (other.a.node, other.b.node), red  # the other uplink
    assert uplink not in f.red_path(peer, host)


async def test_a_dual_homed_host_whose_uplink_loses_carrier_carries_on_over_the_other(
    system: System,
) -> None:
    """host1's red uplink (`eth1` to leaf1) loses carrier at the host (leaf1's port goes
    admin down): host1 -> host3, host3 -> host1 and host2 -> host1 each lose one short run."""
    await _cut_uplink(system, "host1", "host3", "host2", faults.carrier_loss)


async def test_a_dual_homed_receiver_whose_uplink_goes_admin_down_carries_on_over_the_other(
    system: System,
) -> None:
    """host3's red uplink goes admin down at both ends (their kernels delete the routes
    through it): host3 -> host2, host2 -> host3 and host4 -> host3 each lose at most one
    short run (its leaf's and host3's own backup routes may leave nothing to flip)."""
    await _cut_uplink(system, "host3", "host2", "host4", faults.link_down)


async def test_once_a_dual_homed_hosts_uplink_is_back_every_source_returns_to_its_plan(
    system: System,
) -> None:
    """host1's red uplink loses carrier for 1.5 s under traffic, then comes back: once
    re-protection has put red back on it and the hold-down (0.5 s) has passed, no host
    sends on another colour than its plan says (revertive failover). The sources' own BFD
    flips too (the red path sessions of host1 and its peers may flap just after the uplink
    returns): those revert when their red session is Up again, which pathcomp never sees."""
    f = system
    uplink = f.red_path("host1", "host3")[0]
    pairs = [("host1", "host3"), ("host3", "host1"), ("host2", "host1"), ("host1", "host2")]
    streams = await flows(f.lab, pairs, 5000, 5311)
    await asyncio.sleep(1.0)
    t0 = time.time_ns()
    await asyncio.to_thread(faults.carrier_loss, f.lab, f.end_at(uplink, "host1"))
    await f.until(lambda: f.link_events(uplink, "down", t0), 5, "health: uplink down")
    await asyncio.sleep(1.5)
    t1 = time.time_ns()
    await asyncio.to_thread(faults.restore, f.lab)
    await f.until(lambda: f.link_events(uplink, "up", t1), 10, "health: uplink up again")
    for s in streams:
        await asyncio.to_thread(s.wait)
    await f.pathcomp.replanned()
    await asyncio.sleep(1.5)  # hold-down and a reconcile, with room to spare
    assert f.overridden() == {}, f.timeline(t0)
