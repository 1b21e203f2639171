"""Bus subjects, JetStream streams, the desired-state KV bucket and event schemas, defined once.

Everything here is pure (no I/O): `thorn.bus` moves these events over NATS, services import the
subjects and models from here and never spell a subject string themselves.

Subjects (NATS tokens are separated by '.'; a node name that contains '.' spans several tokens,
which is why the per-node wildcards use '>'):

    topology.changed            TopologyChanged     stream THORN_TOPOLOGY
    health.link.<link_id>       LinkHealthChanged   stream THORN_HEALTH
    paths.changed               PathsChanged        stream THORN_PATHS
    failover.<node>             FailoverEvent       stream THORN_FAILOVER (failover history)
    agent.report.<node>         AgentReport         (core NATS request; health replies)
    agent.applied.<node>        DatapathApplied     (core NATS only: a datapath reconciled)
    agent.flip.<node>           FlipCommand         (core NATS: pathcomp's urgent flips)
    agent.register.<node>       AgentRegistration   (core NATS request; topology replies)
    agent.creds.<node>          CredentialsChanged  (core NATS: topology to an agent, renew now)
    agent.renew.<node>          CredentialsRenewal  (core NATS request; topology replies)
    pathcomp.recompute          (core NATS request: a follower asks the leader to plan)

Wire format: the model's JSON (`encode`), decoded by subject through `EVENT_TYPES` (`decode`).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field, ValidationError

from thorn.model import Colour
from thorn.observed import NodeObservation

# --------------------------------------------------------------------------------------------
# Subjects
# --------------------------------------------------------------------------------------------

TOPOLOGY_CHANGED = "topology.changed"
PATHS_CHANGED = "paths.changed"
HEALTH_LINK_PREFIX = "health.link"
HEALTH_LINK_ALL = "health.link.*"
FAILOVER_PREFIX = "failover"
FAILOVER_ALL = "failover.>"
AGENT_REPORT_PREFIX = "agent.report"
AGENT_REPORT_ALL = "agent.report.>"
AGENT_APPLIED_PREFIX = "agent.applied"
AGENT_APPLIED_ALL = "agent.applied.>"  # ">": a node name may span tokens
AGENT_FLIP_PREFIX = "agent.flip"
AGENT_FLIP_ALL = "agent.flip.>"
AGENT_REGISTER_PREFIX = "agent.register"
AGENT_REGISTER_ALL = "agent.register.>"
AGENT_CREDS_PREFIX = "agent.creds"
AGENT_CREDS_ALL = "agent.creds.>"
AGENT_RENEW_PREFIX = "agent.renew"
AGENT_RENEW_ALL = "agent.renew.>"
PATHCOMP_RECOMPUTE = "pathcomp.recompute"

# What a node name may look like inside a subject: the domain model's Name (letters, digits,
# '.', '_', '-'), so never a wildcard, whitespace or an empty token.
_SUBJECT_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*(\.[A-Za-z0-9][A-Za-z0-9_-]*)*$")


def _subject_name(value: str, what: str) -> str:
    if not _SUBJECT_NAME_RE.match(value):
        raise ValueError(
            f"{what} {value!r} cannot be used in a subject: expected letters, digits, '_', '-'"
            " and non-empty '.'-separated parts"
        )
    return value


def health_link_subject(link_id: int) -> str:
    """`health.link.<link_id>`: where health publishes one link's state changes."""
    if isinstance(link_id, bool) or not isinstance(link_id, int) or link_id < 0:
        raise ValueError(f"link id must be a non-negative integer, got {link_id!r}")
    return f"{HEALTH_LINK_PREFIX}.{link_id}"


def failover_subject(node: str) -> str:
    """`failover.<node>`: where a node's programmer reports a local failover."""
    return f"{FAILOVER_PREFIX}.{_subject_name(node, 'node name')}"


def agent_report_subject(node: str) -> str:
    """`agent.report.<node>`: where a node's agent sends carrier/BFD/counter reports."""
    return f"{AGENT_REPORT_PREFIX}.{_subject_name(node, 'node name')}"


def agent_applied_subject(node: str) -> str:
    """`agent.applied.<node>`: a node's agent tells what it made of its desired state."""
    return f"{AGENT_APPLIED_PREFIX}.{_subject_name(node, 'node name')}"


def agent_flip_subject(node: str) -> str:
    """`agent.flip.<node>`: pathcomp's urgent commands to a host's agent."""
    return f"{AGENT_FLIP_PREFIX}.{_subject_name(node, 'node name')}"


def agent_register_subject(node: str) -> str:
    """`agent.register.<node>`: a node's agent registers what it observes with topology."""
    return f"{AGENT_REGISTER_PREFIX}.{_subject_name(node, 'node name')}"


def agent_creds_subject(node: str) -> str:
    """`agent.creds.<node>`: topology tells a node's agent its credentials changed."""
    return f"{AGENT_CREDS_PREFIX}.{_subject_name(node, 'node name')}"


def agent_renew_subject(node: str) -> str:
    """`agent.renew.<node>`: a node's agent asks topology for renewed credentials."""
    return f"{AGENT_RENEW_PREFIX}.{_subject_name(node, 'node name')}"


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: `*` matches one token, a final `>` matches one or more tokens."""
    p_tokens = pattern.split(".")
    s_tokens = subject.split(".")
    for i, p in enumerate(p_tokens):
        if p == ">":
            return i == len(p_tokens) - 1 and len(s_tokens) > i
        if i >= len(s_tokens):
            return False
        if p != "*" and p != s_tokens[i]:
            return False
    return len(p_tokens) == len(s_tokens)


# --------------------------------------------------------------------------------------------
# JetStream streams and the desired-state KV bucket
# --------------------------------------------------------------------------------------------

_DAY = 24 * 60 * 60.0
_MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class StreamSpec:
    """A JetStream stream THORN owns. `max_age` in seconds; limits discard the oldest first."""

    name: str
    subjects: tuple[str, ...]
    description: str
    max_age: float
    max_bytes: int
    storage: Literal["file", "memory"] = "file"
    duplicate_window: float = 120.0

    def covers(self, subject: str) -> bool:
        return any(subject_matches(pattern, subject) for pattern in self.subjects)


STREAM_TOPOLOGY = StreamSpec(
    name="THORN_TOPOLOGY",
    subjects=("topology.>",),
    description="topology change notifications (the SQL store is the source of truth)",
    max_age=7 * _DAY,
    max_bytes=256 * _MIB,
)
STREAM_HEALTH = StreamSpec(
    name="THORN_HEALTH",
    subjects=("health.>",),
    description="link and session health state changes",
    max_age=7 * _DAY,
    max_bytes=512 * _MIB,
)
STREAM_FAILOVER = StreamSpec(
    name="THORN_FAILOVER",
    subjects=("failover.>",),
    description="failover history: every local or central path flip",
    max_age=30 * _DAY,
    max_bytes=1024 * _MIB,
)
STREAM_PATHS = StreamSpec(
    name="THORN_PATHS",
    subjects=("paths.>",),
    description="path plan revisions",
    max_age=7 * _DAY,
    max_bytes=256 * _MIB,
)
STREAMS: tuple[StreamSpec, ...] = (STREAM_TOPOLOGY, STREAM_HEALTH, STREAM_FAILOVER, STREAM_PATHS)


def stream_for_subject(subject: str) -> StreamSpec | None:
    """The THORN stream that stores messages published on `subject`, if any."""
    for spec in STREAMS:
        if spec.covers(subject):
            return spec
    return None


@dataclass(frozen=True, slots=True)
class KeyValueSpec:
    """A JetStream KV bucket THORN owns. `history` is kept per key (1..5 here).
    `max_consumers`: the watches its stream allows at once (each watch is a consumer); None
    leaves the server's default, which since nats-server 2.15 is 1,000 per stream."""

    bucket: str
    description: str
    history: int
    max_value_size: int
    max_bytes: int
    storage: Literal["file", "memory"] = "file"
    max_consumers: int | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.history <= 5:
            raise ValueError(f"KV history must be 1..5, got {self.history}")
        if self.max_consumers is not None and self.max_consumers < 1:
            raise ValueError(f"KV max_consumers must be at least 1, got {self.max_consumers}")


DESIRED_STATE_KV = KeyValueSpec(
    bucket="thorn-desired-state",
    description="per-node desired datapath state, one key per node, written by pathcomp",
    # Only the newest document counts (agents reconcile to it). With 5 kept, a k=32 fabric's
    # staged rollouts (its documents ~225 MB a set) filled the 1 GiB and every write was
    # refused ('maximum bytes exceeded'); one set fits up to k=40 (~540 MB).
    history=1,
    max_value_size=8 * _MIB,
    max_bytes=1024 * _MIB,
    # Every node's agent watches its key, and a host each of its VNIs: the server's default
    # of 1,000 consumers per stream stopped the 1,001st agent's watch (the scale benchmark,
    # docs/benchmarks.md). A bound still: far above nodes x (1 + VNIs per host) of any fabric.
    max_consumers=1_000_000,
)


# --------------------------------------------------------------------------------------------
# Event schemas
# --------------------------------------------------------------------------------------------


def _to_utc(value: datetime) -> datetime:
    return value.astimezone(UTC)


UtcDatetime = Annotated[
    AwareDatetime,
    AfterValidator(_to_utc),
    Field(description="timezone-aware timestamp, normalised to UTC"),
]


def utcnow() -> datetime:
    """The current time as an aware UTC datetime, for the events' `at` fields."""
    return datetime.now(UTC)


class Event(BaseModel):
    """Base of every bus event: immutable, strict about unknown fields, knows its subject."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # The subject pattern this event type is published under (registry key).
    subject_pattern: ClassVar[str] = ""

    @property
    def subject(self) -> str:
        """The concrete subject this event is published on."""
        raise NotImplementedError


class Change(BaseModel):
    """One entity touched by a topology change: its kind (e.g. "link"), the operation, its key
    and, for a create or an update, its new row."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str = Field(min_length=1)
    op: Literal["create", "update", "delete", "replace"]
    key: str = Field(min_length=1)
    # The row as the store wrote it (creates and updates): lets a consumer apply the change
    # to its own copy of the fabric (`Fabric.replay`) instead of reloading the whole store.
    value: dict[str, Any] | None = None


class TopologyChanged(Event):
    """The topology store committed `revision`; `changes` says what moved."""

    subject_pattern: ClassVar[str] = TOPOLOGY_CHANGED

    revision: int = Field(ge=0)
    at: UtcDatetime
    actor: str
    changes: list[Change] = Field(default_factory=list)

    @property
    def subject(self) -> str:
        return TOPOLOGY_CHANGED


class PathsChanged(Event):
    """Pathcomp published path plan `revision`, computed from `topology_revision`."""

    subject_pattern: ClassVar[str] = PATHS_CHANGED

    revision: int = Field(ge=0)
    topology_revision: int = Field(ge=0)
    at: UtcDatetime

    @property
    def subject(self) -> str:
        return PATHS_CHANGED


class Hop(BaseModel):
    """One step of a failover, timed by the clock of `clock` (a node or a service name):
    hops read on different clocks are never subtracted silently."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    step: str = Field(min_length=1, max_length=64)
    at: UtcDatetime
    clock: str = Field(min_length=1, max_length=64)


def new_trace_id() -> str:
    """A fresh failover trace id (64 random bits, hex)."""
    return uuid.uuid4().hex[:16]


class Trace(BaseModel):
    """A failover's trace: its id and the hops so far, in order. Every event of one
    failover (health's decision, pathcomp's flips, each agent's apply) carries the same id."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=r"^[0-9a-f]{8,32}$")
    hops: list[Hop] = Field(default_factory=list, max_length=64)

    def then(self, step: str, clock: str, at: datetime | None = None) -> Trace:
        """This trace with one more hop (now, unless `at` is given)."""
        hop = Hop(step=step, at=at or utcnow(), clock=clock)
        return self.model_copy(update={"hops": [*self.hops, hop][-64:]})


class LinkHealthChanged(Event):
    """Health moved link `link_id` from `previous` (None: first seen) to `state`."""

    subject_pattern: ClassVar[str] = HEALTH_LINK_ALL

    link_id: int = Field(ge=0)
    state: str = Field(min_length=1)
    previous: str | None = None
    at: UtcDatetime
    source: str
    trace: Trace | None = Field(None, description="detection, report and decision hops")

    @property
    def subject(self) -> str:
        return health_link_subject(self.link_id)


# "reprotection": not a move of traffic but pathcomp's word that the re-planned state for a
# failure is written and applied by every agent it changed (the trace's last hop).
FailoverTier = Literal["switch", "source", "central", "reprotection"]


class FailoverEvent(Event):
    """Node `node` moved its traffic towards `peers` to colour `to_colour` (source: the
    agent's own BFD; central: pathcomp's urgent flip), or a switch repaired locally. Tier
    "reprotection" is pathcomp's record that the failure's re-planned documents are applied
    (`node` "pathcomp", `peers` the nodes it rewrote, `to_colour` "planned")."""

    subject_pattern: ClassVar[str] = FAILOVER_ALL

    node: str
    peers: list[str] = Field(min_length=1, max_length=100_000)
    from_colour: str | None = Field(None, description="null: the peers were on both")
    to_colour: str
    at: UtcDatetime
    reason: str
    tier: FailoverTier
    kernel_ms: float = Field(0.0, ge=0, description="time the kernel change took")
    trace: Trace | None = None

    @property
    def subject(self) -> str:
        return failover_subject(self.node)


class FlipCommand(Event):
    """Pathcomp to a host's agent, urgent: send traffic toward `peers` on `colour` now
    (their active colour crosses `element`, which failed). `plan_revision` is the plan the
    flip was decided on; `reprotected`: the plan at that revision makes the flipped peers'
    preferred colour safe again (a revertive agent moves back after its hold-down), or with
    `every_peer` all of them (a new leader's word: at k=32 a host's peer list is 8,191
    names, and one per host was ~800 MB)."""

    subject_pattern: ClassVar[str] = AGENT_FLIP_ALL

    node: str
    kind: Literal["flip", "reprotected"] = "flip"
    peers: list[str] = Field(default_factory=list, max_length=100_000)
    every_peer: bool = False
    colour: Colour | None = None
    element: str = Field(min_length=1, max_length=128)
    plan_revision: int = Field(ge=0)
    trace: Trace | None = None

    @property
    def subject(self) -> str:
        return agent_flip_subject(self.node)


class OffloadReport(BaseModel):
    """Where a host's TC rules run: the node's policy, the mode the agent chose, why it is not
    what the policy asked for (a fallback, the kernel's refusal), and what the kernel says of
    THORN's rules when read back (TCA_CLS_FLAGS_IN_HW / NOT_IN_HW, TCA_FLOWER_IN_HW_COUNT)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    policy: Literal["auto", "hardware", "software"]
    mode: Literal["hardware", "software"] = Field(
        description="hardware: rules carry skip_sw; software: skip_hw"
    )
    reason: str | None = Field(
        None, description="why the mode is not the NIC (auto's fallback) or the NIC refused "
        "(hardware: the kernel's words); null: as the policy asked"
    )  # fmt: skip
    devices: dict[str, str] = Field(
        default_factory=dict,
        description="each representor carrying rules: 'switchdev', or why it is not one",
    )
    filters: int = Field(0, ge=0, description="THORN's flower filters read back")
    in_hw: int = Field(0, ge=0, description="... of which the kernel reports in_hw")
    not_in_hw: int = Field(0, ge=0, description="... of which it reports not_in_hw")
    in_hw_count: int = Field(0, ge=0, description="sum of the filters' in_hw_count")
    actions: int = Field(0, ge=0, description="THORN's shared tunnel actions read back")
    actions_in_hw: int = Field(0, ge=0, description="... of which with in_hw_count > 0")


class DatapathApplied(Event):
    """Node `node`'s agent reconciled its datapath to desired-state key revision
    `key_revision` (plan `plan_revision`): how many kernel changes it made, and what failed.
    Core NATS (not stored): the latest one per node is what matters, and the agent sends one
    after every reconcile."""

    subject_pattern: ClassVar[str] = AGENT_APPLIED_ALL

    node: str
    driver: str
    key_revision: int = Field(ge=0)
    plan_revision: int = Field(ge=0)
    changes: int = Field(ge=0)
    errors: list[str] = Field(default_factory=list)
    seconds: float = Field(ge=0)
    at: UtcDatetime
    offload: OffloadReport | None = Field(None, description="hosts on the flower driver")

    @property
    def subject(self) -> str:
        return agent_applied_subject(self.node)


class _Report(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CarrierReport(_Report):
    """A port's link state changed, as the node's kernel told its agent."""

    kind: Literal["carrier"] = "carrier"
    port: str = Field(min_length=1, max_length=64)
    admin_up: bool
    carrier: bool
    oper_state: str = Field(max_length=32)
    detected_at: UtcDatetime = Field(description="when the agent read the kernel's event")


class BfdReport(_Report):
    """A BFD session of the node changed state (RFC 5880 states and diagnostic codes)."""

    kind: Literal["bfd"] = "bfd"
    local: str = Field(min_length=1, max_length=64)
    peer: str = Field(min_length=1, max_length=64)
    port: str | None = Field(None, description="single-hop: the port; multihop: none")
    multihop: bool = False
    state: Literal["admin_down", "down", "init", "up"]
    diag: int = Field(ge=0, le=31)
    detected_at: UtcDatetime
    tx_interval_ms: float | None = Field(
        None, ge=0, description="negotiated transmit interval (RFC 5880 6.8.7, before jitter)"
    )
    detect_time_ms: float | None = Field(
        None, ge=0, description="negotiated detection time (6.8.4): silence this long is Down"
    )


class CountersReport(_Report):
    """A port's counters (since boot): health derives loss from successive reports."""

    kind: Literal["counters"] = "counters"
    port: str = Field(min_length=1, max_length=64)
    rx_packets: int = Field(ge=0)
    tx_packets: int = Field(ge=0)
    rx_errors: int = Field(ge=0)
    tx_errors: int = Field(ge=0)
    rx_dropped: int = Field(ge=0)
    tx_dropped: int = Field(ge=0)
    at: UtcDatetime


ReportItem = Annotated[CarrierReport | BfdReport | CountersReport, Field(discriminator="kind")]


class AgentReport(Event):
    """What node `node`'s agent observed; sent as a request on `agent.report.<node>`, and
    health answers with an `AgentReportReply` (a malformed report is refused, not applied).
    `seq` rises by one per report of an agent's run: health notices gaps, and applies a
    report retried with the same (run, seq) once (a reply lost to a timeout)."""

    subject_pattern: ClassVar[str] = AGENT_REPORT_ALL

    node: str
    seq: int = Field(ge=0)
    run: str = Field("", max_length=32, description="the agent's run: a restart starts a new one")
    sent_at: UtcDatetime
    items: list[ReportItem] = Field(min_length=1, max_length=1000)

    @property
    def subject(self) -> str:
        return agent_report_subject(self.node)


class AgentReportReply(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    ok: bool
    applied: int = Field(ge=0, description="items applied")
    error: str | None = None


class AgentRegistration(Event):
    """What node `node`'s agent observes (ports, VFs, RDMA devices, neighbours heard), sent
    as a request on `agent.register.<node>` on change and periodically; topology keeps the
    latest per node and answers with a `RegistrationReply`. `seq` rises per registration
    of an agent's run."""

    subject_pattern: ClassVar[str] = AGENT_REGISTER_ALL

    node: str
    run: str = Field("", max_length=32)
    seq: int = Field(ge=0)
    sent_at: UtcDatetime
    observed: NodeObservation

    @property
    def subject(self) -> str:
        return agent_register_subject(self.node)


class RegistrationReply(BaseModel):
    """Topology's answer: `ok` (stored; `mismatches` found against the declared node) or
    the error that refused it (nothing stored; the last good registration stays)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ok: bool
    error: str | None = None
    mismatches: int = Field(0, ge=0)


class CredentialsChanged(Event):
    """Topology to node `node`'s agent: what its NATS credentials must allow has changed (its
    VNIs are now `vnis`); the agent asks for renewed credentials at once (`CredentialsRenewal`)."""

    subject_pattern: ClassVar[str] = AGENT_CREDS_ALL

    node: str
    vnis: list[int] = Field(default_factory=list, max_length=100_000)
    reason: str = Field(max_length=256)
    at: UtcDatetime

    @property
    def subject(self) -> str:
        return agent_creds_subject(self.node)


class CredentialsRenewal(Event):
    """Node `node`'s agent asks topology for a new user JWT for the key of `jwt` (its current
    one, issued by THORN): sent as a request on `agent.renew.<node>`, which only that node's
    credentials may publish on. Topology answers with a `CredentialsReply`."""

    subject_pattern: ClassVar[str] = AGENT_RENEW_ALL

    node: str
    jwt: str = Field(min_length=1, max_length=65_536)
    sent_at: UtcDatetime

    @property
    def subject(self) -> str:
        return agent_renew_subject(self.node)


class CredentialsReply(BaseModel):
    """Topology's answer to a renewal: the new user JWT (its key is the asker's: the seed never
    travels) and when it expires, or why it was refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ok: bool
    jwt: str | None = None
    expires_at: UtcDatetime | None = None
    vnis: list[int] = Field(default_factory=list)
    error: str | None = None


# Subject pattern -> event model. A consumer decodes any message by its subject through this.
EVENT_TYPES: Mapping[str, type[Event]] = {
    TOPOLOGY_CHANGED: TopologyChanged,
    HEALTH_LINK_ALL: LinkHealthChanged,
    PATHS_CHANGED: PathsChanged,
    FAILOVER_ALL: FailoverEvent,
    AGENT_APPLIED_ALL: DatapathApplied,
    AGENT_FLIP_ALL: FlipCommand,
    AGENT_REPORT_ALL: AgentReport,
    AGENT_REGISTER_ALL: AgentRegistration,
    AGENT_CREDS_ALL: CredentialsChanged,
    AGENT_RENEW_ALL: CredentialsRenewal,
}


class EventDecodeError(ValueError):
    """A message could not be turned into a typed event. Names the subject and the reason."""

    def __init__(self, subject: str, reason: str) -> None:
        super().__init__(f"cannot decode event on subject {subject!r}: {reason}")
        self.subject = subject
        self.reason = reason


class UnknownSubjectError(EventDecodeError):
    """No event schema is registered for the subject."""

    def __init__(self, subject: str) -> None:
        super().__init__(subject, "no event schema is registered for this subject")


def model_for_subject(subject: str) -> type[Event]:
    """The event model registered for a concrete subject; `UnknownSubjectError` if none."""
    for pattern, model in EVENT_TYPES.items():
        if subject_matches(pattern, subject):
            return model
    raise UnknownSubjectError(subject)


def encode(event: Event) -> bytes:
    """The wire form of an event: its JSON."""
    return event.model_dump_json().encode()


def decode(subject: str, data: bytes) -> Event:
    """Decode a message to the event type registered for its subject.

    Raises `EventDecodeError` (naming the subject) for an unknown subject, a payload that is not
    a valid event of that type, or an event whose own subject differs from the one it came on.
    """
    model = model_for_subject(subject)
    try:
        event = model.model_validate_json(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '<payload>'}: {err['msg']}"
            for err in exc.errors()
        )
        raise EventDecodeError(subject, f"not a valid {model.__name__}: {problems}") from exc
    if event.subject != subject:
        raise EventDecodeError(
            subject, f"{model.__name__} belongs on {event.subject!r}, not on this subject"
        )
    return event


__all__ = [
    "AGENT_APPLIED_ALL",
    "AGENT_APPLIED_PREFIX",
    "AGENT_CREDS_ALL",
    "AGENT_CREDS_PREFIX",
    "AGENT_FLIP_ALL",
    "AGENT_FLIP_PREFIX",
    "AGENT_REGISTER_ALL",
    "AGENT_REGISTER_PREFIX",
    "AGENT_RENEW_ALL",
    "AGENT_RENEW_PREFIX",
    "AGENT_REPORT_ALL",
    "AGENT_REPORT_PREFIX",
    "DESIRED_STATE_KV",
    "EVENT_TYPES",
    "FAILOVER_ALL",
    "FAILOVER_PREFIX",
    "HEALTH_LINK_ALL",
    "HEALTH_LINK_PREFIX",
    "PATHCOMP_RECOMPUTE",
    "PATHS_CHANGED",
    "STREAMS",
    "STREAM_FAILOVER",
    "STREAM_HEALTH",
    "STREAM_PATHS",
    "STREAM_TOPOLOGY",
    "TOPOLOGY_CHANGED",
    "AgentRegistration",
    "AgentReport",
    "AgentReportReply",
    "BfdReport",
    "CarrierReport",
    "Change",
    "CountersReport",
    "CredentialsChanged",
    "CredentialsRenewal",
    "CredentialsReply",
    "DatapathApplied",
    "Event",
    "EventDecodeError",
    "FailoverEvent",
    "FailoverTier",
    "FlipCommand",
    "Hop",
    "KeyValueSpec",
    "LinkHealthChanged",
    "OffloadReport",
    "PathsChanged",
    "RegistrationReply",
    "StreamSpec",
    "TopologyChanged",
    "Trace",
    "UnknownSubjectError",
    "UtcDatetime",
    "agent_applied_subject",
    "agent_creds_subject",
    "agent_flip_subject",
    "agent_register_subject",
    "agent_renew_subject",
    "agent_report_subject",
    "decode",
    "encode",
    "failover_subject",
    "health_link_subject",
    "model_for_subject",
    "new_trace_id",
    "stream_for_subject",
    "subject_matches",
    "utcnow",
]
