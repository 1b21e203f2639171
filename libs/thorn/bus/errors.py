"""The bus's own errors, and the JetStream error codes it reacts to."""

from __future__ import annotations

# JetStream API error codes the bus reacts to.
_ERR_STREAM_NAME_IN_USE = 10058  # a stream exists with a different configuration
_ERR_WRONG_LAST_SEQUENCE = (10071, 10164)
# The cluster cannot hold the replicas asked for: no suitable peers for placement (10005),
# insufficient resources (10023), replicas > 1 not supported in non-clustered mode (10074).
_ERR_REPLICAS = (10005, 10023, 10074)


class BusError(Exception):
    """Base of the bus's own errors."""


class BusConnectError(BusError):
    """No NATS server could be reached within the connect timeout."""


class PublishError(BusError):
    """An event could not be published (or JetStream did not acknowledge it)."""

    def __init__(self, subject: str, cause: BaseException) -> None:
        super().__init__(f"publish to {subject!r} failed: {type(cause).__name__}: {cause}")
        self.subject = subject


class StreamConfigError(BusError):
    """A THORN stream or bucket exists with a configuration that cannot be updated in place."""


class ReplicasError(StreamConfigError):
    """The NATS cluster cannot hold the replica count asked for (THORN_NATS_REPLICAS)."""

    def __init__(self, message: str, *, replicas: int, cluster_size: int | None) -> None:
        super().__init__(message)
        self.replicas = replicas
        self.cluster_size = cluster_size


class DesiredStateConflict(BusError):
    """A compare-and-set on a node's desired state lost: the key moved past `expected`."""

    def __init__(self, node: str, expected: int, detail: str = "") -> None:
        what = "not to exist" if expected == 0 else f"at revision {expected}"
        super().__init__(
            f"desired state of {node!r} was expected {what} but has changed"
            + (f" ({detail})" if detail else "")
        )
        self.node = node
        self.expected = expected
