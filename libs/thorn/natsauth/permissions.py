"""What each THORN identity may publish and subscribe to on NATS: pure functions of the role
(and, for an agent, its node and its VNIs), turned into user JWT claims by `thorn.natsauth`.

The server enforces these per connection. Subject allow lists only: anything not listed is
refused (the server logs a "Permissions Violation" and the client gets an error).

- An agent reads its own desired-state key, the VNI documents of its VNIs and its own
  commands, and publishes only its own reports, applied acks, registrations, failover events
  and credential renewals. Its KV reads are JetStream consumers whose create request names
  the filter in the subject (`$JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>`); the server
  refuses a request whose body filters on anything else, so allowing that subject per key is
  what limits the agent to its keys. The unfiltered create subjects are never allowed, nor
  message gets (their body names the key).
- Every identity receives replies and deliveries only under its own inbox prefix, so none
  can read the replies meant for another.
- Services get their subjects and the JetStream calls on their streams; each may create and
  update THORN's streams and buckets (each starts in any order and makes what it needs), none
  may delete or purge them. Replies to requests go through `resp` (allowed only to a request
  the service received), not through a publish right on anyone's inbox.
- The admin identity may do anything in the THORN account.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from thorn.desired import node_key
from thorn.events import (
    AGENT_APPLIED_ALL,
    AGENT_CREDS_ALL,
    AGENT_FLIP_ALL,
    AGENT_REGISTER_ALL,
    AGENT_RENEW_ALL,
    AGENT_REPORT_ALL,
    DESIRED_STATE_KV,
    FAILOVER_ALL,
    HEALTH_LINK_ALL,
    PATHCOMP_RECOMPUTE,
    PATHS_CHANGED,
    STREAM_FAILOVER,
    STREAM_HEALTH,
    STREAM_PATHS,
    STREAM_TOPOLOGY,
    STREAMS,
    TOPOLOGY_CHANGED,
    agent_applied_subject,
    agent_creds_subject,
    agent_flip_subject,
    agent_register_subject,
    agent_renew_subject,
    agent_report_subject,
    failover_subject,
)
from thorn.leader.lease import LEASES_KV
from thorn.natsauth.identity import INBOX_ROOT, inbox_prefix

Role = Literal["agent", "topology", "health", "pathcomp", "admin"]
SERVICES: tuple[Role, ...] = ("topology", "health", "pathcomp")

DESIRED_STREAM = f"KV_{DESIRED_STATE_KV.bucket}"
LEASES_STREAM = f"KV_{LEASES_KV.bucket}"
_API = "$JS.API"
RESPONSE_WINDOW_NS = 60 * 10**9  # a service may answer a request for a minute after it


@dataclass(frozen=True, slots=True)
class Permissions:
    """One identity's allow lists; `respond`: it may answer requests it received."""

    identity: str
    role: Role
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    respond: bool = False

    @property
    def inbox(self) -> str:
        return inbox_prefix(self.role, self.identity)

    def claims(self) -> dict[str, Any]:
        """The `pub`, `sub` and `resp` fields of a user JWT's `nats` claims."""
        out: dict[str, Any] = {
            "pub": {"allow": list(self.publish)},
            "sub": {"allow": list(self.subscribe)},
        }
        if self.respond:
            out["resp"] = {"max": 1, "ttl": RESPONSE_WINDOW_NS}
        return out


def _kv_key(bucket: str, key: str) -> str:
    return f"$KV.{bucket}.{key}"


def _stream_admin(streams: Iterable[str]) -> list[str]:
    """Look at, create and update these streams (never delete or purge)."""
    return [f"{_API}.STREAM.{verb}.{s}" for s in streams for verb in ("INFO", "CREATE", "UPDATE")]


def _consume(stream: str, filters: Iterable[str] | None = None) -> list[str]:
    """Consume from `stream`: create consumers (on `filters` only, when given), look at,
    pull from and delete them, acknowledge and answer flow control."""
    creates = (
        [f"{_API}.CONSUMER.CREATE.{stream}.*.{f}" for f in filters]
        if filters is not None
        else [f"{_API}.CONSUMER.CREATE.{stream}", f"{_API}.CONSUMER.CREATE.{stream}.>"]
    )
    return [
        *creates,
        f"{_API}.CONSUMER.INFO.{stream}.*",
        f"{_API}.CONSUMER.DELETE.{stream}.*",
        f"{_API}.CONSUMER.MSG.NEXT.{stream}.*",
        f"$JS.ACK.{stream}.>",
        f"$JS.FC.{stream}.>",
    ]


def _all_streams() -> list[str]:
    return [s.name for s in STREAMS] + [DESIRED_STREAM, LEASES_STREAM]


def _lease(election: str) -> list[str]:
    """Hold the leader lease `election` (its key only) and watch it."""
    return [
        _kv_key(LEASES_KV.bucket, election),
        f"{_API}.STREAM.MSG.GET.{LEASES_STREAM}",
        *_consume(LEASES_STREAM),
    ]


def agent(node: str, vnis: Iterable[int] = ()) -> Permissions:
    """A node's programmer agent: its own key, its VNIs' documents, its own subjects."""
    key_filters = [_kv_key(DESIRED_STATE_KV.bucket, node_key(node))]
    key_filters += [_kv_key(DESIRED_STATE_KV.bucket, f"vni.{int(v)}.*") for v in sorted(set(vnis))]
    publish = [
        agent_report_subject(node),
        agent_applied_subject(node),
        agent_register_subject(node),
        agent_renew_subject(node),
        failover_subject(node),
        f"{_API}.STREAM.INFO.{DESIRED_STREAM}",
        *[f"{_API}.CONSUMER.CREATE.{DESIRED_STREAM}.*.{f}" for f in key_filters],
        f"{_API}.CONSUMER.INFO.{DESIRED_STREAM}.*",
        f"$JS.FC.{DESIRED_STREAM}.>",
    ]
    subscribe = [
        agent_flip_subject(node),
        agent_creds_subject(node),
        f"{inbox_prefix('agent', node)}.>",
    ]
    return Permissions(node, "agent", tuple(publish), tuple(subscribe))


def topology() -> Permissions:
    """Topology: announces topology changes, takes registrations and applied reports, serves
    the live event feed, issues and renews agents' credentials."""
    publish = [
        TOPOLOGY_CHANGED,
        AGENT_CREDS_ALL,
        *_stream_admin(_all_streams()),
        f"{_API}.STREAM.MSG.GET.{STREAM_TOPOLOGY.name}",
    ]
    subscribe = [
        AGENT_REGISTER_ALL, AGENT_APPLIED_ALL, AGENT_RENEW_ALL,
        TOPOLOGY_CHANGED, PATHS_CHANGED, HEALTH_LINK_ALL, FAILOVER_ALL,  # the event feed
        f"{inbox_prefix('topology', 'topology')}.>",
    ]  # fmt: skip
    return Permissions("topology", "topology", tuple(publish), tuple(subscribe), respond=True)


def health() -> Permissions:
    """Health: takes agents' reports, publishes link health, records failovers, and holds
    its active replica's lease."""
    publish = [
        HEALTH_LINK_ALL,
        *_stream_admin(_all_streams()),
        f"{_API}.STREAM.MSG.GET.{STREAM_HEALTH.name}",
        *_consume(STREAM_FAILOVER.name, [FAILOVER_ALL]),
        *_lease("health"),
    ]
    subscribe = [TOPOLOGY_CHANGED, AGENT_REPORT_ALL, f"{inbox_prefix('health', 'health')}.>"]
    return Permissions("health", "health", tuple(publish), tuple(subscribe), respond=True)


def pathcomp() -> Permissions:
    """Pathcomp: writes every node's desired state, sends urgent flips, records
    re-protection, publishes plans, and holds the leader lease."""
    publish = [
        PATHS_CHANGED,
        AGENT_FLIP_ALL,
        failover_subject("pathcomp"),
        PATHCOMP_RECOMPUTE,
        f"$KV.{DESIRED_STATE_KV.bucket}.>",
        *_stream_admin(_all_streams()),
        f"{_API}.STREAM.MSG.GET.{STREAM_PATHS.name}",
        f"{_API}.STREAM.MSG.GET.{DESIRED_STREAM}",
        *_consume(DESIRED_STREAM),
        *_lease("pathcomp"),
    ]
    subscribe = [
        TOPOLOGY_CHANGED, HEALTH_LINK_ALL, AGENT_APPLIED_ALL, PATHCOMP_RECOMPUTE,
        f"{inbox_prefix('pathcomp', 'pathcomp')}.>",
    ]  # fmt: skip
    return Permissions("pathcomp", "pathcomp", tuple(publish), tuple(subscribe), respond=True)


def admin(name: str = "admin") -> Permissions:
    """An operator's identity (thornctl, the `nats` CLI): everything in the THORN account.
    (Its inbox is nats-py's default unless the client is told the prefix: it may read any.)"""
    return Permissions(name, "admin", (">",), (">",), respond=True)


def service(role: Role) -> Permissions:
    """The permissions of a service role by name."""
    makers = {"topology": topology, "health": health, "pathcomp": pathcomp, "admin": admin}
    if role not in makers:
        raise ValueError(f"no service role {role!r}: expected one of {', '.join(makers)}")
    return makers[role]()


__all__ = [
    "INBOX_ROOT",
    "SERVICES",
    "Permissions",
    "Role",
    "admin",
    "agent",
    "health",
    "inbox_prefix",
    "pathcomp",
    "service",
    "topology",
]
