"""The bus's Prometheus counters, labelled by connection name: created once per process,
whatever number of Bus objects or test modules exist."""

from __future__ import annotations

from prometheus_client import REGISTRY, Counter


def _counter(name: str, documentation: str) -> Counter:
    """A labelled Counter registered once: a second call returns the registered one."""
    try:
        return Counter(name, documentation, ["connection"])
    except ValueError:  # already registered (module reloaded, or two copies imported)
        collectors = getattr(REGISTRY, "_names_to_collectors", {})
        existing = collectors.get(name) or collectors.get(f"{name}_total")
        if isinstance(existing, Counter):
            return existing
        raise


RECONNECTS = _counter("thorn_bus_reconnects", "NATS reconnections, by connection name")
DISCONNECTS = _counter("thorn_bus_disconnects", "NATS disconnections, by connection name")
PUBLISH_ERRORS = _counter("thorn_bus_publish_errors", "failed event publishes, by connection")
DECODE_ERRORS = _counter("thorn_bus_decode_errors", "received messages that did not decode")
HANDLER_ERRORS = _counter("thorn_bus_handler_errors", "event handlers that raised")
ASYNC_ERRORS = _counter("thorn_bus_async_errors", "asynchronous errors reported by the client")
REPLICAS_REFUSED = _counter(
    "thorn_bus_replicas_refused",
    "stream and bucket set-ups refused: more replicas asked for than the NATS cluster holds",
)
