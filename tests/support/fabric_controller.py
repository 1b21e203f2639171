"""An emulated fabric under THORN's control, for end-to-end tests (fabric lane, root):
pathcomp plans, one programmer agent per lab node follows its desired state in JetStream KV
(a bucket of the test's own), and agents' reports pace pathcomp's staged writes.

The lab is `leaf_spine(2, 3, 2)`: host1 and host2 on leaf1, host3 and host4 on leaf2,
host5 and host6 on leaf3, two spines. Import the `controller` fixture into a test module
to use it (it needs the fabric lane's `make_lab`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from thorn.bus import Bus, DesiredStateStore
from thorn.desired import node_key
from thorn.events import AGENT_APPLIED_ALL, DESIRED_STATE_KV, DatapathApplied
from thorn.fabric import Fabric
from thorn.generators import leaf_spine
from thorn.store import Store
from thorn.store.store import sqlite_url
from thorn_lab import traffic
from thorn_lab.handle import Lab
from thorn_pathcomp.service import PathService
from thorn_programmer.agent import NodeAgent
from thorn_programmer.drivers import open_driver


class Controller:
    """pathcomp and one agent per lab node, on a KV bucket of this test's own."""

    def __init__(self, lab: Lab, store: Store, bus: Bus, kv: DesiredStateStore) -> None:
        self.lab, self.store, self.bus, self.kv = lab, store, bus, kv
        self.service = PathService(store, kv, bus)  # type: ignore[arg-type]
        self.agents = {
            node: NodeAgent(node, kv, bus, lambda kind, ns: open_driver(kind, ns, "emulation"), ns)
            for node, ns in lab.namespaces().items()
        }

    async def settled(self, within: float = 20) -> None:
        """Every agent has applied the latest document written for its node."""
        await self.service.replanned(within)
        for _ in range(int(within / 0.05)):
            late = []
            for node, agent in self.agents.items():
                entry = await self.kv.get(node_key(node))
                if entry is None or agent.status.key_revision < entry.revision:
                    late.append(node)
            if not late:
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"agents behind their desired state: {late}")

    def red_link(self, src: str, dst: str) -> int:
        """A switch-to-switch link on the red path src -> dst."""
        assert self.service.plan is not None
        red = self.service.plan.pair(src, dst).red
        assert red is not None
        return red.links[1]

    def pair_avoiding(self, link_id: int) -> tuple[str, str]:
        """Hosts on two different leaves whose red path does not use `link_id`."""
        plan = self.service.plan
        assert plan is not None
        hosts = sorted(plan.graph.attachments)
        for src in hosts:
            for dst in hosts:
                red = plan.pair(src, dst).red if src != dst else None
                if red and link_id not in red.links and red.nodes[1] != red.nodes[-2]:
                    return src, dst
        raise AssertionError("no host pair avoids the link")

    def lab_link(self, link_id: int) -> str:
        link = self.lab_fabric.links[link_id]
        return f"{link.a.node}:{link.a.port}"

    lab_fabric: Fabric


@pytest.fixture
async def controller(
    make_lab: Callable[..., Lab], nats_url: str, tmp_path: Path
) -> AsyncIterator[Controller]:
    doc = leaf_spine(2, 3, 2)
    lab = await asyncio.to_thread(make_lab, doc)  # pyroute2's sync API runs its own loop
    async with AsyncExitStack() as stack:
        store = await Store.open(sqlite_url(tmp_path))
        stack.push_async_callback(store.close)
        fabric = Fabric.from_document(doc)
        await store.replace(fabric, expected_revision=0, actor="test", detail={})
        bus = await stack.enter_async_context(await Bus.connect(nats_url, name="test-e2e"))
        await bus.ensure_streams()
        spec = dataclasses.replace(DESIRED_STATE_KV, bucket=f"test-e2e-{uuid.uuid4().hex[:8]}")
        kv = await bus.desired_state(spec)
        c = Controller(lab, store, bus, kv)
        c.lab_fabric = await store.load()

        async def ack(event: DatapathApplied) -> None:
            await c.service.acks.on_applied(event)

        await bus.subscribe(AGENT_APPLIED_ALL, ack, model=DatapathApplied)
        tasks = [asyncio.create_task(a.run()) for a in c.agents.values()]
        await c.service.recompute("test")
        await c.settled()
        try:
            yield c
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def stream(lab: Lab, src: str, dst: str, count: int, port: int) -> traffic.Stream:
    spec = traffic.StreamSpec(src=f"{src}-vf0", dst=f"{dst}-vf0", rate_pps=1000, count=count,
                              duration_s=count / 1000 + 1, port=port)  # fmt: skip
    return traffic.start(lab, spec)
