"""The link monitor's parser on crafted rtnetlink messages (no root, no kernel)."""

from __future__ import annotations

import struct

from thorn_programmer.monitor import (
    LinkCounters,
    LinkEvent,
    OperState,
    counter_deltas,
    parse_counters,
    parse_link,
)
from thorn_programmer.monitor.parse import (
    IFF_LOWER_UP,
    IFF_UP,
    IFLA_CARRIER,
    IFLA_CARRIER_CHANGES,
    IFLA_IFNAME,
    IFLA_OPERSTATE,
    IFLA_STATS64,
    RTM_DELLINK,
    RTM_GETLINK,
    RTM_NEWLINK,
    SCM_TIMESTAMPNS,
    error_code,
    getlink_dump,
    messages,
    timestamp_ns,
)

NLA_F_NESTED = 1 << 15


def nla(atype: int, value: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(value), atype) + value
    return raw + b"\0" * (-len(raw) % 4)


def ifinfo(index: int, flags: int, *attrs: bytes) -> bytes:
    return struct.pack("=BxHiII", 0, 1, index, flags, 0xFFFFFFFF) + b"".join(attrs)


def nlmsg(mtype: int, payload: bytes, flags: int = 0, seq: int = 0) -> bytes:
    raw = struct.pack("=IHHII", 16 + len(payload), mtype, flags, seq, 0) + payload
    return raw + b"\0" * (-len(raw) % 4)


def link_payload(
    name: str = "eth1",
    index: int = 7,
    flags: int = IFF_UP | IFF_LOWER_UP,
    oper: int = 6,
    carrier: int | None = 1,
    changes: int | None = 4,
) -> bytes:
    attrs = [nla(IFLA_IFNAME, name.encode() + b"\0"), nla(IFLA_OPERSTATE, bytes([oper]))]
    if carrier is not None:
        attrs.append(nla(IFLA_CARRIER, bytes([carrier])))
    if changes is not None:
        attrs.append(nla(IFLA_CARRIER_CHANGES, struct.pack("=I", changes)))
    return ifinfo(index, flags, *attrs)


def test_newlink_up() -> None:
    event = parse_link(RTM_NEWLINK, link_payload(), at_ns=123)
    assert event == LinkEvent("eth1", 7, True, True, OperState.UP, False, 123, 4)


def test_carrier_loss_with_admin_up() -> None:
    payload = link_payload(flags=IFF_UP, oper=OperState.LOWERLAYERDOWN, carrier=0, changes=5)
    event = parse_link(RTM_NEWLINK, payload, at_ns=1)
    assert event is not None
    assert event.admin_up and not event.carrier
    assert event.oper_state is OperState.LOWERLAYERDOWN
    assert event.carrier_changes == 5


def test_dellink_is_marked_deleted() -> None:
    event = parse_link(RTM_DELLINK, link_payload(flags=0, oper=2, carrier=0), at_ns=9)
    assert event is not None and event.deleted and not event.admin_up


def test_carrier_falls_back_to_lower_up_without_the_attribute() -> None:
    up = parse_link(RTM_NEWLINK, link_payload(carrier=None, changes=None), at_ns=0)
    down = parse_link(RTM_NEWLINK, link_payload(flags=IFF_UP, carrier=None), at_ns=0)
    assert up is not None and up.carrier and up.carrier_changes is None
    assert down is not None and not down.carrier


def test_carrier_attribute_wins_over_flags() -> None:
    # lo reports IFLA_CARRIER 1 while admin down (no IFF_LOWER_UP): the attribute is the fact.
    event = parse_link(RTM_NEWLINK, link_payload(flags=0, oper=2, carrier=1), at_ns=0)
    assert event is not None and event.carrier and not event.admin_up


def test_unknown_operstate_and_flagged_attribute_types() -> None:
    payload = ifinfo(
        3,
        IFF_UP,
        nla(IFLA_IFNAME | NLA_F_NESTED, b"x\0"),  # flag bits are stripped from the type
        nla(IFLA_OPERSTATE, bytes([42])),
    )
    event = parse_link(RTM_NEWLINK, payload, at_ns=0)
    assert event is not None
    assert event.ifname == "x" and event.oper_state is OperState.UNKNOWN


def test_not_a_link_message_or_incomplete() -> None:
    assert parse_link(RTM_GETLINK, link_payload(), at_ns=0) is None
    assert parse_link(RTM_NEWLINK, link_payload()[:10], at_ns=0) is None
    assert parse_link(RTM_NEWLINK, ifinfo(1, IFF_UP), at_ns=0) is None  # no name
    # A truncated trailing attribute is ignored, the ones before it kept.
    cut = link_payload(changes=None)[:-3]
    event = parse_link(RTM_NEWLINK, cut, at_ns=0)
    assert event is not None and event.ifname == "eth1"


def test_messages_walks_a_datagram() -> None:
    data = (
        nlmsg(RTM_NEWLINK, link_payload("a", 1))
        + nlmsg(RTM_DELLINK, link_payload("bb", 2), seq=5)
        + nlmsg(3, struct.pack("=i", 0), flags=2, seq=5)
    )
    got = list(messages(data))
    assert [(t, s) for t, _f, s, _p in got] == [(RTM_NEWLINK, 0), (RTM_DELLINK, 5), (3, 5)]
    events = [parse_link(t, p, 0) for t, _f, _s, p in got]
    assert [e.ifname for e in events if e] == ["a", "bb"]
    assert error_code(got[2][3]) == 0


def test_messages_stops_at_a_corrupt_length() -> None:
    good = nlmsg(RTM_NEWLINK, link_payload())
    bad = struct.pack("=IHHII", 4, RTM_NEWLINK, 0, 0, 0)
    assert len(list(messages(good + bad + good))) == 1
    assert list(messages(good[:-8])) == []


def test_error_code() -> None:
    assert error_code(struct.pack("=i", -105)) == 105
    assert error_code(b"") == 0


def test_getlink_dump_request() -> None:
    raw = getlink_dump(77)
    length, mtype, flags, seq, pid = struct.unpack_from("=IHHII", raw)
    assert (length, mtype, flags, seq, pid) == (32, RTM_GETLINK, 0x301, 77, 0)
    assert len(raw) == 32


def stats64(*head: int) -> bytes:
    return struct.pack("=24Q", *head, *([0] * (24 - len(head))))


def test_parse_counters() -> None:
    # rx/tx packets, rx/tx bytes, rx/tx errors, rx/tx dropped
    payload = ifinfo(
        4, IFF_UP, nla(IFLA_IFNAME, b"eth2\0"), nla(IFLA_STATS64, stats64(*range(1, 9)))
    )
    assert parse_counters(RTM_NEWLINK, payload) == ("eth2", LinkCounters(1, 2, 5, 6, 7, 8))
    assert parse_counters(RTM_NEWLINK, link_payload()) is None  # no IFLA_STATS64
    assert parse_counters(RTM_DELLINK, payload) is None
    short = ifinfo(4, 0, nla(IFLA_IFNAME, b"e\0"), nla(IFLA_STATS64, b"\0" * 16))
    assert parse_counters(RTM_NEWLINK, short) is None


def test_counter_deltas_and_gray_hint() -> None:
    before = {
        "eth1": LinkCounters(100, 100, 0, 0, 0, 0),
        "eth2": LinkCounters(50, 50, 1, 0, 0, 0),
        "gone": LinkCounters(1, 1, 1, 1, 1, 1),
    }
    after = {
        "eth1": LinkCounters(150, 160, 0, 0, 0, 0),
        "eth2": LinkCounters(60, 70, 4, 0, 0, 2),
        "new": LinkCounters(9, 9, 9, 9, 9, 9),
    }
    deltas = counter_deltas(before, after)
    assert deltas == {
        "eth1": LinkCounters(50, 60, 0, 0, 0, 0),
        "eth2": LinkCounters(10, 20, 3, 0, 0, 2),
    }
    assert deltas["eth1"].faults == 0
    assert deltas["eth2"].faults == 5


def test_counter_reset_counts_from_zero() -> None:
    before = LinkCounters(1000, 1000, 10, 0, 0, 0)
    after = LinkCounters(5, 1200, 2, 0, 0, 0)
    assert after.since(before) == LinkCounters(5, 200, 2, 0, 0, 0)


def test_timestamp_from_cmsg_or_fallback() -> None:
    stamp = struct.pack("=qq", 12, 345)
    assert timestamp_ns([(1, SCM_TIMESTAMPNS, stamp)], fallback=7) == 12_000_000_345
    assert timestamp_ns([(270, SCM_TIMESTAMPNS, stamp)], fallback=7) == 7
    assert timestamp_ns([], fallback=7) == 7
