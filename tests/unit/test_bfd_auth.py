"""RFC 5880 authentication, Keyed SHA1 and Meticulous Keyed SHA1 (§4.4, §6.7.4, §6.8.6), in
the pure codec and session: the section's format, signing, and every reception check with
the reason a packet is discarded. Sessions are joined by an in-memory link that signs, encodes,
decodes and authenticates every packet, driven by a fake clock.

Each test is named after the rule it checks.
"""

from __future__ import annotations

import hashlib
import random
import struct

import pytest

from thorn_programmer.bfd.auth import (
    AUTH_DIGEST,
    AUTH_KEY_ID,
    AUTH_MISSING,
    AUTH_PRESENT,
    AUTH_SEQUENCE,
    AUTH_TYPE,
    AuthKey,
    AuthType,
    BfdAuth,
    sequence_acceptable,
)
from thorn_programmer.bfd.codec import AuthSection, ControlPacket, State, decode
from thorn_programmer.bfd.events import DROP_REASONS
from thorn_programmer.bfd.session import Send, Session, SessionConfig, StateChange

SECRET = b"thorn-bfd-secret"  # 16 bytes
KEYED, METICULOUS = AuthType.KEYED_SHA1, AuthType.METICULOUS_KEYED_SHA1
FAST_US = 10_000


def auth(kind: AuthType = METICULOUS, *keys: tuple[int, bytes], send: int = 1) -> BfdAuth:
    chosen = keys or ((1, SECRET),)
    return BfdAuth(kind, tuple(AuthKey(i, s) for i, s in chosen), send)


def config(disc: int, with_auth: BfdAuth | None, mult: int = 3) -> SessionConfig:
    return SessionConfig(disc, f"10.0.0.{disc}", desired_min_tx_us=FAST_US,
                         required_min_rx_us=FAST_US, detect_mult=mult, auth=with_auth)  # fmt: skip


def wire(session: Session, packet: ControlPacket | None = None) -> bytes:
    """What the runtime sends for this session's packet (encode, then seal)."""
    return session.seal((packet or session.packet()).encode())


def deliver(dst: Session, data: bytes, now: float) -> str | None:
    """What the runtime does with a datagram demultiplexed to `dst`: authenticate, then
    receive; the drop reason, or None."""
    packet = decode(data)
    reason = dst.authenticate(packet, data, now)
    if reason is None:
        dst.receive(packet, now)
    return reason


class Link:
    """Two sessions joined by a lossless zero-delay link that signs and authenticates."""

    def __init__(self, a: SessionConfig, b: SessionConfig) -> None:
        self.now = 0.0
        self.sessions = {"a": Session(a, 0.0, random.Random(1)),
                         "b": Session(b, 0.0, random.Random(2))}  # fmt: skip
        self.drops: list[tuple[str, str]] = []  # (receiver, reason)
        self.wire: list[tuple[float, str, bytes]] = []  # (when, sender, datagram)

    def _carry(self, src: str, actions: list[Send | StateChange]) -> None:
        queue = [(src, actions)]
        while queue:
            sender, acts = queue.pop(0)
            for action in acts:
                if not isinstance(action, Send):
                    continue
                data = self.sessions[sender].seal(action.packet.encode())
                self.wire.append((self.now, sender, data))
                dst = "b" if sender == "a" else "a"
                packet = decode(data)
                reason = self.sessions[dst].authenticate(packet, data, self.now)
                if reason is not None:
                    self.drops.append((dst, reason))
                    continue
                queue.append((dst, self.sessions[dst].receive(packet, self.now)))

    def run_until(self, end: float) -> None:
        while True:
            due = [(d, n) for n, s in self.sessions.items() if (d := s.next_deadline()) is not None]
            if not due or min(due)[0] > end:
                break
            self.now, name = min(due)
            self._carry(name, self.sessions[name].tick(self.now))
        self.now = end


def last_from_a(link: Link) -> bytes:
    return next(d for _, s, d in reversed(link.wire) if s == "a")


def up_pair(kind: AuthType = METICULOUS) -> tuple[Session, Session, Link]:
    link = Link(config(1, auth(kind)), config(2, auth(kind)))
    link.run_until(5.0)
    a, b = link.sessions["a"], link.sessions["b"]
    assert a.state == b.state == State.UP and link.drops == []
    return a, b, link


# ---------------------------------------------------------------------------------------------
# §4.4 and §6.7.4 transmission
# ---------------------------------------------------------------------------------------------


def test_an_authenticated_session_sets_the_a_bit_and_a_length_of_52() -> None:
    session = Session(config(1, auth()), 0.0, random.Random(1))
    data = wire(session)
    assert len(data) == 52
    assert data[1] & 0x04  # A bit
    assert data[3] == 52  # Length covers both sections (§4.1)


def test_the_section_is_type_len_key_id_reserved_sequence_hash() -> None:
    session = Session(config(1, auth(KEYED, (7, SECRET), send=7)), 0.0, random.Random(1))
    data = wire(session)
    auth_type, auth_len, key_id, reserved, _sequence = struct.unpack_from("!BBBBI", data, 24)
    assert (auth_type, auth_len, key_id, reserved) == (4, 28, 7, 0)


def test_the_hash_is_sha1_of_the_packet_with_the_key_zero_padded_in_its_place() -> None:
    session = Session(config(1, auth()), 0.0, random.Random(1))
    data = wire(session)
    assert hashlib.sha1(data[:32] + SECRET + bytes(4)).digest() == data[32:]
    assert SECRET not in data  # §6.7.4: the key is never carried


@pytest.mark.parametrize("kind", [KEYED, METICULOUS])
def test_every_packet_sent_takes_the_next_sequence_number(kind: AuthType) -> None:
    session = Session(config(1, auth(kind)), 0.0, random.Random(1))
    sequences = [struct.unpack_from("!I", wire(session), 28)[0] for _ in range(4)]
    first = sequences[0]
    assert sequences == [(first + i) & 0xFFFFFFFF for i in range(4)]


def test_the_first_sequence_number_is_random() -> None:
    starts = {
        struct.unpack_from("!I", wire(Session(config(1, auth()), 0.0, random.Random(s))), 28)[0]
        for s in range(5)
    }
    assert len(starts) == 5


def test_the_sequence_number_wraps_around_32_bits() -> None:
    session = Session(config(1, auth()), 0.0, random.Random(1))
    session._xmit_auth_seq = 0xFFFFFFFF  # the state §6.8.1 calls bfd.XmitAuthSeq
    sequences = [struct.unpack_from("!I", wire(session), 28)[0] for _ in range(2)]
    assert sequences == [0xFFFFFFFF, 0]


def test_a_session_without_authentication_sends_the_plain_24_bytes() -> None:
    session = Session(config(1, None), 0.0, random.Random(1))
    data = wire(session)
    assert len(data) == 24 and not data[1] & 0x04


# ---------------------------------------------------------------------------------------------
# Codec: the section's framing
# ---------------------------------------------------------------------------------------------


def test_an_authenticated_packet_decodes_with_its_sections_fields() -> None:
    session = Session(config(1, auth(KEYED, (9, SECRET), send=9)), 0.0, random.Random(1))
    data = wire(session)
    packet = decode(data)
    sequence = struct.unpack_from("!I", data, 28)[0]
    assert packet.auth and packet.length == 52
    assert packet.auth_section == AuthSection(auth_type=4, key_id=9, sequence=sequence)


def test_a_section_of_another_type_is_framed_and_left_to_the_session() -> None:
    mandatory = Session(config(1, auth()), 0.0, random.Random(1)).packet()
    md5 = mandatory.encode()[:3] + bytes([48]) + mandatory.encode()[4:]  # Length 24 + 24
    packet = decode(md5 + struct.pack("!BBBBI", 2, 24, 3, 0, 1) + bytes(16))
    assert packet.auth_section == AuthSection(auth_type=2, key_id=3)


# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: BfdAuth(KEYED, (), 1), "at least one key"),
        (lambda: auth(KEYED, (1, b"a"), (1, b"b")), "key ids repeat"),
        (lambda: auth(KEYED, (1, b"a"), send=2), "send key 2 is not among"),
        (lambda: AuthKey(1, bytes(21)), "1 to 20 bytes, not 21"),
        (lambda: AuthKey(1, b""), "1 to 20 bytes, not 0"),
        (lambda: AuthKey(256, b"a"), "key id 256"),
    ],
)
def test_authentication_config_refuses_what_the_rfc_cannot_carry(
    build: object, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        build()  # type: ignore[operator]


def test_a_20_byte_secret_is_the_longest_taken() -> None:
    assert AuthKey(1, bytes(range(20))).padded == bytes(range(20))


def test_no_repr_or_description_shows_the_secret() -> None:
    cfg = config(1, auth(KEYED, (1, SECRET), (2, b"second-secret"), send=2))
    text = repr(cfg) + str(cfg) + cfg.auth.describe()  # type: ignore[union-attr]
    assert "secret" not in text.replace("auth=", "")
    assert cfg.auth.describe() == "keyed-sha1, sends key 2, accepts 1, 2"  # type: ignore[union-attr]


def test_every_auth_reason_is_a_counted_drop_reason() -> None:
    reasons = {AUTH_PRESENT, AUTH_MISSING, AUTH_TYPE, AUTH_KEY_ID, AUTH_SEQUENCE, AUTH_DIGEST}
    assert reasons <= set(DROP_REASONS)
    assert "auth_malformed" in DROP_REASONS


# ---------------------------------------------------------------------------------------------
# §6.8.6 and §6.7.4 reception
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [KEYED, METICULOUS])
def test_two_authenticated_sessions_come_up_and_stay_up(kind: AuthType) -> None:
    a, b, link = up_pair(kind)
    link.run_until(15.0)
    assert a.state == b.state == State.UP
    assert link.drops == []
    assert all(len(data) == 52 for _, _, data in link.wire)


def test_a_session_without_authentication_drops_a_packet_with_the_a_bit() -> None:
    plain = Session(config(2, None), 0.0)
    signed = wire(Session(config(1, auth()), 0.0))
    assert deliver(plain, signed, 0.0) == AUTH_PRESENT
    assert plain.state == State.DOWN


def test_an_authenticating_session_drops_a_packet_without_the_a_bit() -> None:
    session = Session(config(2, auth()), 0.0)
    plain = wire(Session(config(1, None), 0.0))
    assert deliver(session, plain, 0.0) == AUTH_MISSING
    assert session.state == State.DOWN


def test_another_auth_type_is_dropped() -> None:
    session = Session(config(2, auth(METICULOUS)), 0.0)
    assert deliver(session, wire(Session(config(1, auth(KEYED)), 0.0)), 0.0) == AUTH_TYPE


def test_an_unknown_key_id_is_dropped() -> None:
    session = Session(config(2, auth(METICULOUS, (1, SECRET))), 0.0)
    sender = Session(config(1, auth(METICULOUS, (5, SECRET), send=5)), 0.0)
    assert deliver(session, wire(sender), 0.0) == AUTH_KEY_ID


def test_another_secret_under_the_same_key_id_fails_the_digest() -> None:
    session = Session(config(2, auth(METICULOUS, (1, SECRET))), 0.0)
    sender = Session(config(1, auth(METICULOUS, (1, b"another-secret"))), 0.0)
    assert deliver(session, wire(sender), 0.0) == AUTH_DIGEST
    assert session.state == State.DOWN


@pytest.mark.parametrize("offset", [1, 4, 12, 30, 40, 51], ids=lambda o: f"byte_{o}")
def test_any_altered_byte_fails_the_digest(offset: int) -> None:
    session = Session(config(2, auth()), 0.0)
    data = bytearray(wire(Session(config(1, auth()), 0.0)))
    # Altered so it still decodes: flip a low bit of the state byte, a discriminator byte,
    # a timer, the reserved byte or the hash itself.
    data[offset] ^= 0x40 if offset == 1 else 0x01
    assert deliver(session, bytes(data), 0.0) == AUTH_DIGEST


def test_two_sessions_with_different_secrets_never_come_up() -> None:
    link = Link(config(1, auth(KEYED, (1, b"one"))), config(2, auth(KEYED, (1, b"two"))))
    link.run_until(10.0)
    assert {s.state for s in link.sessions.values()} == {State.DOWN}
    assert {reason for _, reason in link.drops} == {AUTH_DIGEST}


def _next_from(sender: Session, sequence: int, packet: ControlPacket | None = None) -> bytes:
    sender._xmit_auth_seq = sequence & 0xFFFFFFFF  # bfd.XmitAuthSeq
    return wire(sender, packet)


def test_a_replayed_packet_is_dropped_and_a_down_from_the_past_cannot_end_the_session() -> None:
    _a, b, link = up_pair(METICULOUS)
    first_down = next(d for _, s, d in link.wire if s == "a" and decode(d).state == State.DOWN)
    assert deliver(b, first_down, link.now) == AUTH_SEQUENCE
    assert b.state == State.UP


@pytest.mark.parametrize(("kind", "taken"), [(KEYED, True), (METICULOUS, False)])
def test_the_last_sequence_number_again_is_taken_by_keyed_and_dropped_by_meticulous(
    kind: AuthType, taken: bool
) -> None:
    _a, b, link = up_pair(kind)
    last = last_from_a(link)
    assert deliver(b, last, link.now) == (None if taken else AUTH_SEQUENCE)


@pytest.mark.parametrize(("ahead", "taken"), [(1, True), (9, True), (10, False), (-1, False)])
def test_the_window_is_the_last_number_up_to_three_times_detect_mult(
    ahead: int, taken: bool
) -> None:
    a, b, link = up_pair(METICULOUS)
    last = struct.unpack_from("!I", last_from_a(link), 28)[0]
    data = _next_from(a, last + ahead)  # detect mult 3: up to 9 ahead
    assert deliver(b, data, link.now) == (None if taken else AUTH_SEQUENCE)


def test_the_window_is_circular_over_32_bits() -> None:
    assert sequence_acceptable(1, 0xFFFFFFFE, 3, meticulous=True)
    assert sequence_acceptable(0xFFFFFFFF, 0xFFFFFFFE, 3, meticulous=True)
    assert not sequence_acceptable(0xFFFFFFFD, 0xFFFFFFFE, 3, meticulous=False)
    assert not sequence_acceptable(8, 0xFFFFFFFE, 3, meticulous=False)  # 10 ahead


def test_a_forged_packet_does_not_move_the_window() -> None:
    """RFC 5880 errata 7083: bfd.RcvAuthSeq changes only for a packet whose hash matches."""
    a, b, link = up_pair(METICULOUS)
    last = struct.unpack_from("!I", last_from_a(link), 28)[0]
    forger = Session(config(1, auth(METICULOUS, (1, b"guessed"))), 0.0)
    forged = _next_from(forger, last + 9, a.packet())
    assert deliver(b, forged, link.now) == AUTH_DIGEST
    assert deliver(b, _next_from(a, last + 1), link.now) is None  # still the old window


def test_the_window_is_forgotten_after_twice_the_detection_time_without_a_packet() -> None:
    """§6.8.1: a peer that restarted (a new random sequence number) is heard again."""
    a, b, link = up_pair(METICULOUS)
    heard, _, data = next(w for w in reversed(link.wire) if w[1] == "a")
    last = struct.unpack_from("!I", data, 28)[0]
    twice = 2 * b.detection_time_us / 1e6
    restarted = last + 1_000_000
    assert deliver(b, _next_from(a, restarted), heard + twice * 0.9) == AUTH_SEQUENCE
    assert deliver(b, _next_from(a, restarted), heard + twice * 1.01) is None


# ---------------------------------------------------------------------------------------------
# Keys changed on a running session (a rotation)
# ---------------------------------------------------------------------------------------------


def test_a_key_rotation_keeps_the_session_up() -> None:
    """Both ends accept keys 1 and 2, then send with 2, then drop key 1: no packet is
    refused and the session never leaves Up."""
    link = Link(config(1, auth(METICULOUS, (1, SECRET))), config(2, auth(METICULOUS, (1, SECRET))))
    link.run_until(5.0)
    both = ((1, SECRET), (2, b"next-secret"))
    steps = [auth(METICULOUS, *both, send=1), auth(METICULOUS, *both, send=2),
             auth(METICULOUS, (2, b"next-secret"), send=2)]  # fmt: skip
    for step in steps:
        for session in link.sessions.values():
            session.set_auth(step)
        link.run_until(link.now + 2.0)
    assert {s.state for s in link.sessions.values()} == {State.UP}
    assert link.drops == []
    assert decode(link.wire[-1][2]).auth_section.key_id == 2  # type: ignore[union-attr]


def test_a_key_removed_at_one_end_only_is_refused_by_it() -> None:
    a, b, link = up_pair(METICULOUS)
    b.set_auth(auth(METICULOUS, (2, b"next-secret"), send=2))
    assert deliver(b, wire(a), link.now) == AUTH_KEY_ID


def test_switching_authentication_on_changes_what_the_session_sends() -> None:
    session = Session(config(1, None), 0.0, random.Random(1))
    assert len(wire(session)) == 24
    session.set_auth(auth())
    assert len(wire(session)) == 52
    session.set_auth(None)
    assert len(wire(session)) == 24
