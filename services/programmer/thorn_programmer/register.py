"""A node's registration with topology: what the agent observes, on change and periodically.

The agent reads its ports and VFs (`observe`), its RDMA devices (`rdma`, through pyverbs)
and what its neighbour probe hears (`neighbours`), and sends them as `AgentRegistration` on
`agent.register.<node>`. It sends when the observation differs from the last one topology
took (a neighbour heard or gone wakes it at once; ports and addresses are read every
`check` seconds), and at least every `period` seconds (topology keeps the latest per node,
so a restarted topology or a lost reply is made good). A refusal is logged with topology's
reason and sent again only after `period` (it is the node's or the topology's to fix).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import structlog
from prometheus_client import Counter
from pydantic import ValidationError

from thorn.bus import Bus, BusError
from thorn.events import AgentRegistration, RegistrationReply, utcnow
from thorn.observed import NodeObservation, RdmaObservation
from thorn_programmer import observe, rdma
from thorn_programmer.neighbours import NeighbourProbe

log = structlog.get_logger("thorn.programmer.register")

REGISTRATIONS = Counter(
    "thorn_programmer_registrations_total", "Registrations sent to topology, by outcome",
    ["node", "outcome"],
)  # fmt: skip


@functools.cache
def _reader() -> ThreadPoolExecutor:
    """One thread for every registrar of the process: their reads (a few ms each, every few
    seconds per node) queue here, never in the default pool the BFD arming and the
    reporters' samples use."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="register")


def rdma_of_namespace(seen: RdmaObservation, netdevs: set[str]) -> RdmaObservation:
    """The devices bound to one of `netdevs`. RDMA devices are not per network namespace
    (rdma's shared mode): where one process serves several nodes, each in a namespace of
    its own (a lab), a node reports the devices on its own netdevs, not all of them."""
    devices = [d for d in seen.devices if d.netdev in netdevs]
    return seen.model_copy(update={"devices": devices})


class Registrar:
    def __init__(
        self,
        node: str,
        bus: Bus,
        netns: str | None,
        *,
        period: float = 30.0,
        probe_interval: float = 1.0,
        check: float = 5.0,
        timeout: float = 2.0,
        discover_rdma: Callable[[], RdmaObservation] = rdma.discover,
    ) -> None:
        self.node = node
        self.bus = bus
        self.netns = netns
        self.period = period
        self.check = min(check, period)
        self.timeout = timeout
        self.discover_rdma = discover_rdma
        self.run_id = uuid.uuid4().hex[:16]
        self.seq = 0
        self._probe_ports: list[str] = []
        self.probe = NeighbourProbe(node, netns, self.probe_ports, interval=probe_interval,
                                    on_change=self.changed)  # fmt: skip
        self.last_reply: RegistrationReply | None = None
        self.last_sent: NodeObservation | None = None
        self.unanswered = 0  # registrations in a row nobody answered
        self._taken: NodeObservation | None = None  # the last observation topology took
        self._sent_at = 0.0
        self._rdma: RdmaObservation | None = None
        self._rdma_at = 0.0
        self._wake = asyncio.Event()

    def probe_ports(self) -> list[str]:
        return self._probe_ports

    def changed(self) -> None:
        self._wake.set()

    async def observe(self) -> NodeObservation:
        loop = asyncio.get_running_loop()
        ports, vfs = await loop.run_in_executor(_reader(), observe.read_ports, self.netns)
        self._probe_ports = observe.probe_ports(ports, vfs)
        now = time.monotonic()
        if self._rdma is None or now - self._rdma_at >= self.period:  # devices rarely change
            self._rdma = await loop.run_in_executor(_reader(), self.discover_rdma)
            self._rdma_at = now
        rdma_seen = self._rdma
        if self.netns is not None:
            rdma_seen = rdma_of_namespace(rdma_seen, {p.name for p in ports})
        return NodeObservation(ports=ports, vfs=vfs, rdma=rdma_seen,
                               neighbours=self.probe.neighbours())  # fmt: skip

    async def run(self) -> None:
        await self.observe()  # the probe starts on the ports there are
        prober = asyncio.create_task(self.probe.run(), name=f"probe-{self.node}")
        try:
            while True:
                observation = await self.observe()
                due = time.monotonic() - self._sent_at >= self.period
                if due or observation != self._taken:
                    await self.send(observation)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.check):
                        await self._wake.wait()
                self._wake.clear()
        finally:
            prober.cancel()
            await asyncio.gather(prober, return_exceptions=True)

    async def send(self, observation: NodeObservation) -> RegistrationReply | None:
        event = AgentRegistration(node=self.node, run=self.run_id, seq=self.seq,
                                  sent_at=utcnow(), observed=observation)  # fmt: skip
        try:
            raw = await self.bus.request(event, reply_within=self.timeout)
        except BusError as exc:  # topology away: the next check sends again
            REGISTRATIONS.labels(self.node, "unanswered").inc()
            self.unanswered += 1  # said once, then quietly until topology answers again
            level = log.warning if self.unanswered == 1 else log.debug
            level("registration_unanswered", node=self.node, error=str(exc))
            return None
        self.unanswered = 0
        self.seq += 1
        self._sent_at = time.monotonic()
        try:
            reply = RegistrationReply.model_validate_json(raw)
        except ValidationError:
            REGISTRATIONS.labels(self.node, "bad_reply").inc()
            log.error("registration_bad_reply", node=self.node, reply=raw[:200])
            return None
        self.last_reply, self.last_sent = reply, observation
        if reply.ok:
            REGISTRATIONS.labels(self.node, "taken").inc()
            self._taken = observation
            rdma_seen = observation.rdma.unavailable or len(observation.rdma.devices)
            log.info("registered", node=self.node, seq=event.seq, mismatches=reply.mismatches,
                     neighbours=len(observation.neighbours), rdma=rdma_seen)  # fmt: skip
        else:
            REGISTRATIONS.labels(self.node, "refused").inc()
            self._taken = observation  # not again until it changes or the period is up
            log.error("registration_refused", node=self.node, seq=event.seq, error=reply.error)
        return reply
