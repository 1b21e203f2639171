"""BFD authentication over real UDP sockets on loopback, no root needed: two runtimes with
Keyed SHA1 sessions talk through a relay in the middle (the attacker's position on the
path): it carries every datagram, keeps a copy, and can replay or forge one. Each refused
datagram is dropped, counted under its reason (in `counters()` and on the Prometheus
metric), and the session stays Up.

    A 127.0.0.1 (peer .2) --> relay .2:3784 --(from .4)--> B 127.0.0.3 (peer .4)
    A 127.0.0.1 <--(from .2)-- relay .4:3784 <------------ B 127.0.0.3

Each runtime sees its peer at the address it was configured with, so only authentication
stands between a relayed datagram and the session.
"""

from __future__ import annotations

import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from prometheus_client import REGISTRY

from thorn_programmer.bfd import (
    AuthKey,
    AuthType,
    BfdAuth,
    BfdEvent,
    BfdManager,
    SessionConfig,
    State,
    decode,
)
from thorn_programmer.bfd.auth import sign

A, A_PEER, B, B_PEER = "127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4"
PORT = 3784
WAIT_S = 5.0
SECRET = b"loopback-secret"


def keyed(kind: AuthType, secret: bytes = SECRET, key_id: int = 1) -> BfdAuth:
    return BfdAuth(kind, (AuthKey(key_id, secret),), key_id)


def wait_until(check: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.005)


class Relay:
    """Carries A's datagrams to B and B's to A from the addresses each expects, and keeps
    every one A sent; `to_b` sends a datagram of the test's own to B as if from A."""

    def __init__(self) -> None:
        self.from_a = self._socket(A_PEER, PORT)
        self.from_b = self._socket(B_PEER, PORT)
        self.as_a = self._socket(B_PEER, 0)  # B hears A's datagrams from its peer .4
        self.as_b = self._socket(A_PEER, 0)  # A hears B's from its peer .2
        self.sent_by_a: list[bytes] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bfd-relay", daemon=True)
        self._thread.start()

    @staticmethod
    def _socket(address: str, port: int) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, 255)  # RFC 5881 §5: single hop
        sock.bind((address, port))
        return sock

    def _run(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self.from_a, self.from_b], [], [], 0.05)
            for sock in ready:
                data = sock.recv(512)
                if sock is self.from_a:
                    with self._lock:
                        self.sent_by_a.append(data)
                    self.as_a.sendto(data, (B, PORT))
                else:
                    self.as_b.sendto(data, (A, PORT))

    def a_datagrams(self) -> list[bytes]:
        with self._lock:
            return list(self.sent_by_a)

    def to_b(self, data: bytes) -> None:
        self.as_a.sendto(data, (B, PORT))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2.0)
        for sock in (self.from_a, self.from_b, self.as_a, self.as_b):
            sock.close()


class Events:
    def __init__(self) -> None:
        self.events: list[BfdEvent] = []

    def __call__(self, event: BfdEvent) -> None:
        self.events.append(event)

    def downs(self) -> list[BfdEvent]:
        return [e for e in self.events if e.old == State.UP]


@dataclass
class Pair:
    a: BfdManager
    b: BfdManager
    b_events: Events
    relay: Relay
    kind: AuthType


def fast(disc: int, peer: str, local: str, auth: BfdAuth | None) -> SessionConfig:
    """50 ms x 3: a loaded machine's stalls must not end a session these tests keep Up."""
    return SessionConfig(disc, peer, local, desired_min_tx_us=50_000,
                         required_min_rx_us=50_000, detect_mult=3, auth=auth)  # fmt: skip


def up(manager: BfdManager) -> bool:
    return all(s.state == State.UP and s.detection_time_us < 1_000_000 for s in manager.sessions())


@pytest.fixture(params=[AuthType.KEYED_SHA1, AuthType.METICULOUS_KEYED_SHA1], ids=str)
def pair(request: pytest.FixtureRequest) -> Iterator[Pair]:
    kind: AuthType = request.param
    relay = Relay()
    events = Events()
    a = BfdManager(name="auth-a")
    b = BfdManager(events, name="auth-b")
    a.start()
    b.start()
    try:
        a.add(fast(1, A_PEER, A, keyed(kind)))
        b.add(fast(2, B_PEER, B, keyed(kind)))
        wait_until(lambda: up(a) and up(b), "both sessions Up at the fast timers")
        yield Pair(a, b, events, relay, kind)
    finally:
        a.close(admin_down=False)
        b.close(admin_down=False)
        relay.close()


def dropped(manager: BfdManager, reason: str) -> float | None:
    return REGISTRY.get_sample_value(
        "thorn_bfd_packets_dropped_total", {"manager": manager.name, "reason": reason}
    )


def assert_dropped_and_still_up(pair: Pair, reason: str) -> None:
    wait_until(lambda: pair.b.counters().dropped.get(reason, 0) >= 1, f"a drop for {reason}")
    assert set(pair.b.counters().dropped) == {reason}
    assert dropped(pair.b, reason) == pair.b.counters().dropped[reason]
    assert pair.b_events.downs() == []
    assert [s.state for s in pair.b.sessions()] == [State.UP]


def test_authenticated_sessions_come_up_and_say_how_they_authenticate(pair: Pair) -> None:
    kind = pair.a.sessions()[0].auth
    assert kind is not None and kind.endswith("sends key 1, accepts 1")
    assert SECRET.decode() not in kind
    datagrams = pair.relay.a_datagrams()
    assert datagrams and all(len(d) == 52 and decode(d).auth for d in datagrams)
    assert pair.a.counters().dropped == {} and pair.b.counters().dropped == {}


def test_a_replayed_down_packet_is_dropped_and_counted(pair: Pair) -> None:
    """A's first packets, sent while it was Down, replayed to B once it is Up: without
    authentication they would bring B's session Down (§6.8.6, Up receiving Down)."""
    first = pair.relay.a_datagrams()[0]
    assert decode(first).state == State.DOWN
    pair.relay.to_b(first)
    assert_dropped_and_still_up(pair, "auth_sequence")


def test_a_forged_packet_is_dropped_and_counted(pair: Pair) -> None:
    """A's latest packet with its state changed to Down and the next sequence number, the
    rest of its section kept: the hash no longer matches."""
    latest = bytearray(pair.relay.a_datagrams()[-1])
    latest[1] = (State.DOWN << 6) | (latest[1] & 0x3F)
    (sequence,) = struct.unpack_from("!I", latest, 28)
    struct.pack_into("!I", latest, 28, sequence + 1)
    pair.relay.to_b(bytes(latest))
    assert_dropped_and_still_up(pair, "auth_digest")


def test_a_packet_signed_with_a_guessed_secret_is_dropped_and_counted(pair: Pair) -> None:
    latest = pair.relay.a_datagrams()[-1]
    kind = AuthType(latest[24])
    (sequence,) = struct.unpack_from("!I", latest, 28)
    down = bytes([latest[0], (State.DOWN << 6) | (latest[1] & 0x3F)]) + latest[2:24]
    pair.relay.to_b(sign(down, keyed(kind, b"guessed"), sequence + 1))
    assert_dropped_and_still_up(pair, "auth_digest")


def test_a_packet_without_authentication_is_dropped_and_counted(pair: Pair) -> None:
    latest = pair.relay.a_datagrams()[-1]
    plain = bytes([latest[0], latest[1] & ~0x04 & 0xFF, latest[2], 24]) + latest[4:24]
    pair.relay.to_b(plain)
    assert_dropped_and_still_up(pair, "auth_missing")


def test_a_packet_under_an_unknown_key_id_is_dropped_and_counted(pair: Pair) -> None:
    latest = pair.relay.a_datagrams()[-1]
    kind = AuthType(latest[24])
    (sequence,) = struct.unpack_from("!I", latest, 28)
    pair.relay.to_b(sign(latest[:24], keyed(kind, SECRET, key_id=9), sequence + 1))
    assert_dropped_and_still_up(pair, "auth_key_id")


def wait_for_packets(relay: Relay, count: int) -> None:
    seen = len(relay.a_datagrams())
    wait_until(lambda: len(relay.a_datagrams()) >= seen + count, f"{count} more packets")


def test_keys_rotated_on_both_running_sessions_keep_them_up(pair: Pair) -> None:
    kind = AuthType(pair.relay.a_datagrams()[-1][24])
    both = (AuthKey(1, SECRET), AuthKey(2, b"rotated-secret"))
    for step in (BfdAuth(kind, both, 1), BfdAuth(kind, both, 2),
                 BfdAuth(kind, (both[1],), 2)):  # fmt: skip
        pair.b.set_auth(2, step)
        pair.a.set_auth(1, step)
        wait_for_packets(pair.relay, 4)
    assert pair.relay.a_datagrams()[-1][26] == 2  # Key ID
    assert pair.a.counters().dropped == {} and pair.b.counters().dropped == {}
    assert pair.b_events.downs() == []
    assert up(pair.a) and up(pair.b)


def test_different_secrets_never_come_up_and_every_packet_is_counted() -> None:
    relay = Relay()
    a, b = BfdManager(name="auth-a-wrong"), BfdManager(name="auth-b-wrong")
    a.start()
    b.start()
    try:
        a.add(fast(1, A_PEER, A, keyed(AuthType.KEYED_SHA1, b"one secret")))
        b.add(fast(2, B_PEER, B, keyed(AuthType.KEYED_SHA1, b"another secret")))
        wait_until(lambda: b.counters().dropped.get("auth_digest", 0) >= 2, "two refusals")
        assert [s.state for s in a.sessions() + b.sessions()] == [State.DOWN, State.DOWN]
        assert set(b.counters().dropped) == {"auth_digest"}
    finally:
        a.close(admin_down=False)
        b.close(admin_down=False)
        relay.close()


def test_a_peer_restarted_with_new_sequence_numbers_is_heard_again(pair: Pair) -> None:
    """B's session dies without a word and is started again at once, from a new random
    sequence number: A refuses it as out of its window (it could be a replay), goes Down by
    detection, forgets the window after twice the detection time (§6.8.1), and both come Up
    again."""
    pair.b.remove(2, admin_down=False)
    pair.b.add(fast(2, B_PEER, B, keyed(pair.kind)))
    wait_until(lambda: pair.a.counters().dropped.get("auth_sequence", 0) >= 1,
               "A refusing the restarted B")  # fmt: skip
    wait_until(lambda: up(pair.a) and up(pair.b), "both Up again", timeout=10.0)
    assert set(pair.a.counters().dropped) == {"auth_sequence"}
