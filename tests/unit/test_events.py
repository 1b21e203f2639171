"""Subjects, streams and event schemas of the bus (pure: no NATS needed)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from pydantic import ValidationError

from thorn.events import (
    DESIRED_STATE_KV,
    EVENT_TYPES,
    STREAM_FAILOVER,
    STREAM_HEALTH,
    STREAM_PATHS,
    STREAM_TOPOLOGY,
    STREAMS,
    AgentRegistration,
    AgentReport,
    BfdReport,
    CarrierReport,
    Change,
    CountersReport,
    CredentialsChanged,
    CredentialsRenewal,
    DatapathApplied,
    Event,
    EventDecodeError,
    FailoverEvent,
    FlipCommand,
    KeyValueSpec,
    LinkHealthChanged,
    OffloadReport,
    PathsChanged,
    StreamSpec,
    TopologyChanged,
    Trace,
    UnknownSubjectError,
    agent_applied_subject,
    agent_report_subject,
    decode,
    encode,
    failover_subject,
    health_link_subject,
    model_for_subject,
    new_trace_id,
    stream_for_subject,
    subject_matches,
    utcnow,
)
from thorn.observed import (
    HeardNeighbour,
    NodeObservation,
    ObservedPort,
    ObservedVf,
    RdmaObservation,
)

AT = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def sample_events() -> list[Event]:
    return [
        TopologyChanged(
            revision=4,
            at=AT,
            actor="admin",
            changes=[Change(kind="link", op="delete", key="leaf1:eth1-spine1:eth1")],
        ),
        PathsChanged(revision=2, topology_revision=4, at=AT),
        LinkHealthChanged(link_id=17, state="down", previous="up", at=AT, source="bfd"),
        FailoverEvent(
            node="host-a",
            peers=["host-b"],
            from_colour="red",
            to_colour="blue",
            at=AT,
            reason="bfd",
            tier="source",
        ),
        FlipCommand(
            node="host-a",
            peers=["host-b"],
            colour="blue",
            element="link 3",
            plan_revision=7,
            trace=Trace(id="00c0ffee00c0ffee").then("health_decided", "health", at=AT),
        ),
        AgentReport(
            node="leaf1",
            seq=3,
            sent_at=AT,
            items=[
                CarrierReport(
                    port="swp3", admin_up=True, carrier=False, oper_state="down", detected_at=AT
                ),
                BfdReport(
                    local="10.0.0.1",
                    peer="10.0.0.0",
                    port="swp1",
                    state="down",
                    diag=1,
                    detected_at=AT,
                ),
                CountersReport(
                    port="swp3",
                    rx_packets=10,
                    tx_packets=12,
                    rx_errors=0,
                    tx_errors=0,
                    rx_dropped=1,
                    tx_dropped=0,
                    at=AT,
                ),
            ],
        ),
        AgentRegistration(
            node="host-a",
            run="r1",
            seq=4,
            sent_at=AT,
            observed=NodeObservation(
                ports=[
                    ObservedPort(
                        name="eth1",
                        mac="02:00:00:00:00:01",
                        admin_up=True,
                        carrier=True,
                        speed_mbps=10000,
                        addresses=["10.0.0.0/31"],
                    )
                ],  # type: ignore[list-item]
                vfs=[ObservedVf(name="vf0", representor="vf0_rep")],
                rdma=RdmaObservation(unavailable="RDMA unavailable: Failed to get devices list"),
                neighbours=[HeardNeighbour(port="eth1", chassis="leaf1", port_id="swp1")],
            ),
        ),
        CredentialsChanged(node="host-a", vnis=[100], reason="vni 100 joined", at=AT),
        CredentialsRenewal(node="host-a", jwt="eyJ.a.b", sent_at=AT),
        DatapathApplied(
            node="host-a",
            driver="emulation",
            key_revision=9,
            plan_revision=3,
            changes=12,
            errors=["device 'vf7_rep' does not exist"],
            seconds=0.012,
            at=AT,
        ),
        DatapathApplied(
            node="host-b",
            driver="flower",
            key_revision=9,
            plan_revision=3,
            changes=4,
            seconds=0.004,
            at=AT,
            offload=OffloadReport(
                policy="auto",
                mode="software",
                reason="vf0_rep: not a switchdev port (no phys_switch_id)",
                devices={"vf0_rep": "not a switchdev port (no phys_switch_id)"},
                filters=3,
                not_in_hw=3,
                actions=1,
            ),
        ),
    ]


# ------------------------------------------------------------------------------- subjects


def test_subject_builders_put_the_id_or_node_in_the_last_tokens() -> None:
    assert health_link_subject(17) == "health.link.17"
    assert failover_subject("leaf1") == "failover.leaf1"
    assert agent_report_subject("host-a") == "agent.report.host-a"
    assert agent_applied_subject("host-a") == "agent.applied.host-a"


@pytest.mark.parametrize("bad", ["", "a b", "*", ">", "a.*", "a..b", ".a", "a."])
def test_a_node_name_that_would_break_the_subject_is_rejected(bad: str) -> None:
    with pytest.raises(ValueError, match="subject"):
        failover_subject(bad)
    with pytest.raises(ValueError, match="subject"):
        agent_report_subject(bad)


@pytest.mark.parametrize("bad", [-1, True])
def test_a_link_id_must_be_a_non_negative_integer(bad: int) -> None:
    with pytest.raises(ValueError, match="link id"):
        health_link_subject(bad)


@pytest.mark.parametrize(
    ("pattern", "subject", "expected"),
    [
        ("topology.changed", "topology.changed", True),
        ("topology.changed", "topology.changed.x", False),
        ("health.link.*", "health.link.3", True),
        ("health.link.*", "health.link.3.x", False),
        ("health.link.*", "health.link", False),
        ("failover.>", "failover.leaf1", True),
        ("failover.>", "failover.rack1.leaf1", True),
        ("failover.>", "failover", False),
        ("*.changed", "paths.changed", True),
    ],
)
def test_subject_matching_follows_nats_wildcards(
    pattern: str, subject: str, expected: bool
) -> None:
    assert subject_matches(pattern, subject) is expected


# -------------------------------------------------------------------------------- streams


def test_every_event_subject_is_stored_by_its_stream() -> None:
    expected: dict[type[Event], StreamSpec | None] = {
        TopologyChanged: STREAM_TOPOLOGY,
        PathsChanged: STREAM_PATHS,
        LinkHealthChanged: STREAM_HEALTH,
        FailoverEvent: STREAM_FAILOVER,
        DatapathApplied: None,  # the latest per node matters: core NATS, not stored
        FlipCommand: None,  # urgent: core NATS, straight to the agent
        AgentReport: None,  # a request that health answers: core NATS
        AgentRegistration: None,  # a request topology answers, stored in SQL by topology
        CredentialsChanged: None,  # topology to one agent: renew now
        CredentialsRenewal: None,  # a request topology answers with a new JWT
    }
    for event in sample_events():
        assert stream_for_subject(event.subject) is expected[type(event)]


def test_agent_reports_are_not_stored_by_any_stream() -> None:
    assert stream_for_subject(agent_report_subject("host-a")) is None
    assert stream_for_subject(agent_applied_subject("host-a")) is None


def test_streams_have_distinct_names_and_non_overlapping_subjects() -> None:
    assert len({s.name for s in STREAMS}) == len(STREAMS)
    subjects = [p for s in STREAMS for p in s.subjects]
    assert len(set(subjects)) == len(subjects)


def test_failover_history_is_kept_thirty_days_within_a_byte_bound() -> None:
    assert STREAM_FAILOVER.max_age == 30 * 24 * 3600
    assert STREAM_FAILOVER.max_bytes > 0


def test_desired_state_bucket_keeps_one_to_five_revisions_per_node() -> None:
    assert DESIRED_STATE_KV.bucket == "thorn-desired-state"
    assert 1 <= DESIRED_STATE_KV.history <= 5
    with pytest.raises(ValueError, match="history"):
        KeyValueSpec(bucket="x", description="", history=6, max_value_size=1, max_bytes=1)


# -------------------------------------------------------------------------------- schemas


def test_every_event_round_trips_through_its_wire_form() -> None:
    for event in sample_events():
        decoded = decode(event.subject, encode(event))
        assert type(decoded) is type(event)
        assert decoded == event


def test_the_registry_maps_each_subject_to_its_model() -> None:
    for event in sample_events():
        assert model_for_subject(event.subject) is type(event)
    assert set(EVENT_TYPES.values()) == {
        TopologyChanged,
        PathsChanged,
        LinkHealthChanged,
        FailoverEvent,
        DatapathApplied,
        AgentReport,
        FlipCommand,
        AgentRegistration,
        CredentialsChanged,
        CredentialsRenewal,
    }


def test_timestamps_are_normalised_to_utc() -> None:
    plus_two = timezone(timedelta(hours=2))
    event = PathsChanged(
        revision=1, topology_revision=1, at=datetime(2026, 1, 1, 14, tzinfo=plus_two)
    )
    assert event.at == datetime(2026, 1, 1, 12, tzinfo=UTC)
    assert event.at.utcoffset() == timedelta(0)
    assert utcnow().tzinfo is not None


def test_a_naive_timestamp_is_rejected() -> None:
    with pytest.raises(ValidationError):
        PathsChanged(revision=1, topology_revision=1, at=datetime(2026, 1, 1, 12))


def test_a_negative_topology_revision_is_rejected() -> None:
    with pytest.raises(ValidationError):
        TopologyChanged(revision=-1, at=AT, actor="x", changes=[])


def test_a_change_op_outside_create_update_delete_replace_is_rejected() -> None:
    with pytest.raises(ValidationError):
        Change(kind="link", op="upsert", key="k")


def test_events_are_immutable_and_refuse_unknown_fields() -> None:
    event = PathsChanged(revision=1, topology_revision=1, at=AT)
    with pytest.raises(ValidationError):
        event.revision = 2  # type: ignore[misc]
    with pytest.raises(ValidationError):
        PathsChanged(revision=1, topology_revision=1, at=AT, extra="no")  # type: ignore[call-arg]


def test_an_event_knows_its_concrete_subject() -> None:
    link = LinkHealthChanged(link_id=5, state="up", previous=None, at=AT, source="carrier")
    assert link.subject == "health.link.5"
    flip = FailoverEvent(
        node="h1", peers=["h2"], from_colour="red", to_colour="blue", at=AT, reason="",
        tier="central",
    )  # fmt: skip
    assert flip.subject == "failover.h1"
    command = FlipCommand(node="h1", peers=["h2"], colour="blue", element="x", plan_revision=1)
    assert command.subject == "agent.flip.h1"


def test_a_trace_keeps_its_hops_in_order_each_naming_its_clock() -> None:
    trace = Trace(id=new_trace_id()).then("detected", "spine1", at=AT)
    trace = trace.then("health_decided", "health")
    assert [(h.step, h.clock) for h in trace.hops] == [
        ("detected", "spine1"), ("health_decided", "health")]  # fmt: skip
    with pytest.raises(ValidationError):
        Trace(id="not hex!")


# ------------------------------------------------------------------------------- decoding


def test_a_payload_that_is_not_json_raises_a_decode_error_naming_the_subject() -> None:
    with pytest.raises(EventDecodeError) as info:
        decode("health.link.3", b"not json")
    assert info.value.subject == "health.link.3"
    assert "health.link.3" in str(info.value)


def test_a_payload_missing_fields_raises_a_decode_error_naming_the_model() -> None:
    with pytest.raises(EventDecodeError, match="LinkHealthChanged") as info:
        decode("health.link.3", b'{"link_id": 3}')
    assert info.value.subject == "health.link.3"


def test_an_unregistered_subject_raises_unknown_subject() -> None:
    with pytest.raises(UnknownSubjectError) as info:
        decode("agent.gossip.host-a", b"{}")
    assert isinstance(info.value, EventDecodeError)
    assert info.value.subject == "agent.gossip.host-a"


def test_an_event_received_on_another_entitys_subject_is_rejected() -> None:
    link = LinkHealthChanged(link_id=5, state="up", previous=None, at=AT, source="carrier")
    with pytest.raises(EventDecodeError, match=r"health\.link\.5"):
        decode("health.link.6", encode(link))


def test_a_malformed_agent_report_is_refused_naming_the_field() -> None:
    bad = (
        b'{"node": "leaf1", "seq": 1, "sent_at": "2026-01-01T00:00:00Z", "items": '
        b'[{"kind": "bfd", "local": "10.0.0.1", "peer": "10.0.0.0", "state": "sideways", '
        b'"diag": 1, "detected_at": "2026-01-01T00:00:00Z"}]}'
    )
    with pytest.raises(EventDecodeError, match=r"items\.0\.bfd\.state"):
        decode("agent.report.leaf1", bad)
    with pytest.raises(EventDecodeError, match="items"):
        decode("agent.report.leaf1", b'{"node": "leaf1", "seq": 1, '
               b'"sent_at": "2026-01-01T00:00:00Z", "items": []}')  # fmt: skip
