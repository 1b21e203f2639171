"""The THORN event bus: typed events over NATS core + JetStream, and the desired-state KV.

::

    async with await Bus.connect(url, name="pathcomp") as bus:
        await bus.ensure_streams()
        seq = await bus.publish(PathsChanged(revision=3, topology_revision=7, at=utcnow()))
        await bus.subscribe(HEALTH_LINK_ALL, on_link, model=LinkHealthChanged)
        store = await bus.desired_state()
        await store.put("leaf1", plan_model)

Subjects, streams and schemas come from `thorn.events`. The connection reconnects forever
(short wait between attempts); reconnects, disconnects and publish errors are logged through
structlog and counted in Prometheus counters (`thorn_bus_*_total{connection=<name>}`).

- `client`: `Bus`, the connection: publish, subscribe, request, streams and buckets;
- `consumer`: `DurableConsumer` and its `Delivery`s (JetStream pull, at-least-once);
- `kv`: `DesiredStateStore` (one key per node, compare-and-set) and `DesiredStateWatch`;
- `streams`: streams and buckets made to their specs with THORN_NATS_REPLICAS copies; a
  count the cluster cannot hold is refused (`ReplicasError`) before anything changes;
- `errors`, `metrics`: what they say.
"""

from thorn.bus.client import Bus
from thorn.bus.consumer import Delivery, DurableConsumer
from thorn.bus.errors import (
    BusConnectError,
    BusError,
    DesiredStateConflict,
    PublishError,
    ReplicasError,
    StreamConfigError,
)
from thorn.bus.kv import (
    CAUGHT_UP,
    CaughtUp,
    DesiredStateEntry,
    DesiredStateStore,
    DesiredStateWatch,
)
from thorn.bus.metrics import (
    DECODE_ERRORS,
    DISCONNECTS,
    PUBLISH_ERRORS,
    RECONNECTS,
    REPLICAS_REFUSED,
)
from thorn.bus.streams import ServerView

__all__ = [
    "CAUGHT_UP",
    "DECODE_ERRORS",
    "DISCONNECTS",
    "PUBLISH_ERRORS",
    "RECONNECTS",
    "REPLICAS_REFUSED",
    "Bus",
    "BusConnectError",
    "BusError",
    "CaughtUp",
    "Delivery",
    "DesiredStateConflict",
    "DesiredStateEntry",
    "DesiredStateStore",
    "DesiredStateWatch",
    "DurableConsumer",
    "PublishError",
    "ReplicasError",
    "ServerView",
    "StreamConfigError",
]
