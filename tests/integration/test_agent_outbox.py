"""An agent's failover events while NATS is away, against a real nats-server: a flip must
never wait for the bus, and the failover history must not lose what happened meanwhile."""

from __future__ import annotations

import asyncio
from pathlib import Path

from prometheus_client import REGISTRY

from thorn.bus import Bus
from thorn.events import STREAM_FAILOVER, FailoverEvent, utcnow
from thorn.natsd import EmbeddedNats
from thorn_programmer.agent import NodeAgent


def flip(n: int) -> FailoverEvent:
    return FailoverEvent(node="host1", peers=[f"host{n}"], from_colour="red", to_colour="blue",
                         at=utcnow(), reason=f"flip {n}", tier="source")  # fmt: skip


def unsent() -> float:
    labels = {"node": "host1", "kind": "failover"}
    return REGISTRY.get_sample_value("thorn_programmer_events_unsent_total", labels) or 0.0


async def test_failover_events_nats_did_not_take_are_sent_in_order_once_it_is_back(
    tmp_path: Path,
) -> None:
    server = EmbeddedNats(store_dir=tmp_path / "js")
    await server.astart()
    try:
        bus = await Bus.connect(server.url, name="test-outbox", reconnect_time_wait=0.05,
                                publish_timeout=0.5)  # fmt: skip
        async with bus:
            await bus.ensure_streams()
            agent = NodeAgent("host1", None, bus, None)  # type: ignore[arg-type]
            before = unsent()
            server.kill()  # as a crash: the store directory stays
            await agent._publish_failover(flip(2))
            await agent._publish_failover(flip(3))
            assert [e.reason for _, e in agent.outbox] == ["flip 2", "flip 3"]
            assert unsent() - before >= 2  # counted and logged, not swallowed

            await server.astart()  # same port, same store
            await bus.wait_connected()
            # the next ones send what waited first, however many go at once
            await asyncio.gather(*(agent._publish_failover(flip(n)) for n in (4, 5, 6)))
            assert not agent.outbox

            # once each: the client may have sent a timed-out publish on reconnect too
            stored = await bus.js.stream_info(STREAM_FAILOVER.name)
            assert stored.state.messages == 5
            reasons = []
            for seq in range(stored.state.first_seq, stored.state.last_seq + 1):
                message = await bus.js.get_msg(STREAM_FAILOVER.name, seq)
                assert message.data is not None
                reasons.append(FailoverEvent.model_validate_json(message.data).reason)
            assert reasons == ["flip 2", "flip 3", "flip 4", "flip 5", "flip 6"]
    finally:
        await server.astop()
