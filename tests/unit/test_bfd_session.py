"""RFC 5880 §6.2 state machine and §6.8 timers, as specifications, with a fake clock.

Two sessions are wired back to back through an in-memory, zero-delay link that encodes and
decodes every packet; time only moves when the test says so. Each test is named after the rule
it checks.
"""

from __future__ import annotations

import itertools
import random

import pytest

from thorn_programmer.bfd.codec import ControlPacket, Diag, State, decode
from thorn_programmer.bfd.session import (
    SLOW_TX_US,
    Action,
    Send,
    Session,
    SessionConfig,
    StateChange,
    jittered_interval_us,
)

FAST_US = 10_000


def config(
    discriminator: int,
    desired_min_tx_us: int = FAST_US,
    required_min_rx_us: int = FAST_US,
    detect_mult: int = 3,
) -> SessionConfig:
    return SessionConfig(
        local_discriminator=discriminator,
        peer=f"10.0.0.{discriminator}",
        desired_min_tx_us=desired_min_tx_us,
        required_min_rx_us=required_min_rx_us,
        detect_mult=detect_mult,
    )


class Link:
    """Sessions `a` and `b` joined by a lossless zero-delay link driven by a fake clock."""

    def __init__(self, a: SessionConfig, b: SessionConfig, seed: int = 7) -> None:
        self.now = 0.0
        self.sessions = {
            "a": Session(a, self.now, random.Random(seed)),
            "b": Session(b, self.now, random.Random(seed + 1)),
        }
        self.silenced: set[str] = set()  # senders whose packets the link drops
        self.sent: list[tuple[float, str, ControlPacket]] = []
        self.received: list[tuple[float, str, ControlPacket]] = []
        self.changes: list[tuple[str, StateChange]] = []

    @property
    def a(self) -> Session:
        return self.sessions["a"]

    @property
    def b(self) -> Session:
        return self.sessions["b"]

    def _carry(self, source: str, actions: list[Action]) -> None:
        queue = [(source, actions)]
        while queue:
            src, acts = queue.pop(0)
            for action in acts:
                if isinstance(action, StateChange):
                    self.changes.append((src, action))
                    continue
                self.sent.append((self.now, src, action.packet))
                if src in self.silenced:
                    continue
                dst = "b" if src == "a" else "a"
                packet = decode(action.packet.encode())
                self.received.append((self.now, dst, packet))
                queue.append((dst, self.sessions[dst].receive(packet, self.now)))

    def run_until(self, end: float) -> None:
        while True:
            due = [
                (deadline, name)
                for name, session in self.sessions.items()
                if (deadline := session.next_deadline()) is not None
            ]
            if not due or min(due)[0] > end:
                break
            self.now, name = min(due)
            self._carry(name, self.sessions[name].tick(self.now))
        self.now = end

    def sends(self, name: str, since: float = 0.0) -> list[tuple[float, ControlPacket]]:
        return [(t, p) for t, src, p in self.sent if src == name and t >= since]

    def time_up(self, name: str) -> float:
        return next(c.at for n, c in self.changes if n == name and c.new == State.UP)


def up_link() -> Link:
    link = Link(config(1), config(2))
    link.run_until(5.0)
    assert link.a.state == link.b.state == State.UP
    return link


def packet_from_peer(state: State, **fields: int | bool) -> ControlPacket:
    values: dict[str, int | bool] = {
        "detect_mult": 3,
        "my_discriminator": 99,
        "your_discriminator": 0 if state in (State.DOWN, State.ADMIN_DOWN) else 1,
        "desired_min_tx_us": SLOW_TX_US,
        "required_min_rx_us": FAST_US,
    }
    return ControlPacket(state=state, **(values | fields))  # type: ignore[arg-type]


def changes(actions: list[Action]) -> list[StateChange]:
    return [a for a in actions if isinstance(a, StateChange)]


def sends(actions: list[Action]) -> list[ControlPacket]:
    return [a.packet for a in actions if isinstance(a, Send)]


def session_in(state: State, now: float = 0.0) -> Session:
    session = Session(config(1), now, random.Random(1))
    if state == State.INIT:
        session.receive(packet_from_peer(State.DOWN), now)
    elif state == State.UP:
        session.receive(packet_from_peer(State.INIT), now)
    assert session.state == state
    return session


# §6.2 transitions


def test_a_new_session_starts_down_and_sends_at_once() -> None:
    session = Session(config(1), 10.0, random.Random(1))
    assert session.state == State.DOWN
    assert session.next_deadline() == 10.0
    (packet,) = sends(session.tick(10.0))
    assert packet.state == State.DOWN and packet.your_discriminator == 0


def test_down_receiving_down_goes_init() -> None:
    session = Session(config(1), 0.0, random.Random(1))
    (change,) = changes(session.receive(packet_from_peer(State.DOWN), 0.5))
    assert change == StateChange(State.DOWN, State.INIT, Diag.NONE, 0.5)
    assert session.remote_discriminator == 99


def test_down_receiving_init_goes_up() -> None:
    session = Session(config(1), 0.0, random.Random(1))
    (change,) = changes(session.receive(packet_from_peer(State.INIT), 0.5))
    assert (change.old, change.new) == (State.DOWN, State.UP)


def test_down_receiving_up_stays_down() -> None:
    session = Session(config(1), 0.0, random.Random(1))
    assert changes(session.receive(packet_from_peer(State.UP), 0.5)) == []
    assert session.state == State.DOWN


@pytest.mark.parametrize("remote", [State.INIT, State.UP])
def test_init_receiving_init_or_up_goes_up(remote: State) -> None:
    session = session_in(State.INIT)
    (change,) = changes(session.receive(packet_from_peer(remote), 0.5))
    assert (change.old, change.new) == (State.INIT, State.UP)


def test_up_receiving_down_goes_down_with_diag_neighbor_signaled_session_down() -> None:
    session = session_in(State.UP)
    (change,) = changes(session.receive(packet_from_peer(State.DOWN), 0.5))
    assert change == StateChange(State.UP, State.DOWN, Diag.NEIGHBOR_SIGNALED_SESSION_DOWN, 0.5)
    assert session.packet().diag == Diag.NEIGHBOR_SIGNALED_SESSION_DOWN


@pytest.mark.parametrize("local", [State.INIT, State.UP])
def test_remote_admin_down_brings_the_session_down_with_diag_3(local: State) -> None:
    session = session_in(local)
    (change,) = changes(session.receive(packet_from_peer(State.ADMIN_DOWN), 0.5))
    assert (change.new, change.diag) == (State.DOWN, Diag.NEIGHBOR_SIGNALED_SESSION_DOWN)


def test_packet_for_another_discriminator_is_ignored() -> None:
    session = session_in(State.UP)
    assert session.receive(packet_from_peer(State.DOWN, your_discriminator=2), 0.5) == []
    assert session.state == State.UP


def test_two_sessions_come_up_through_the_three_way_handshake() -> None:
    link = up_link()
    allowed = {
        (State.DOWN, State.INIT),
        (State.DOWN, State.UP),
        (State.INIT, State.UP),
    }
    assert {(c.old, c.new) for _, c in link.changes} <= allowed
    assert link.a.remote_discriminator == 2 and link.b.remote_discriminator == 1
    # Within the slow-start interval: Down, Init and Up each take at most one 1 s interval.
    assert max(link.time_up("a"), link.time_up("b")) <= 2.0


# §6.8.3 slow start and the Poll sequence


def test_desired_min_tx_is_at_least_one_second_until_up() -> None:
    link = up_link()
    before_up = [p for _, src, p in link.sent if p.state != State.UP]
    assert before_up
    assert all(p.desired_min_tx_us >= SLOW_TX_US for p in before_up)
    first_up = min(link.time_up("a"), link.time_up("b"))
    for name in ("a", "b"):
        times = [t for t, p in link.sends(name) if not p.final and t <= first_up]
        assert all(later - earlier >= 0.75 for earlier, later in itertools.pairwise(times))


def test_a_lone_session_keeps_sending_at_the_slow_interval() -> None:
    session = Session(config(1), 0.0, random.Random(3))
    times = []
    now = 0.0
    for _ in range(20):
        deadline = session.next_deadline()
        assert deadline is not None
        now = deadline
        (packet,) = sends(session.tick(now))
        assert packet.desired_min_tx_us == SLOW_TX_US
        times.append(now)
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert all(0.75 <= gap <= 1.0 for gap in gaps)


def test_going_up_starts_a_poll_advertising_the_configured_interval() -> None:
    session = session_in(State.UP)
    assert session.poll_in_progress
    (packet,) = sends(session.tick(session.next_deadline() or 0.0))
    assert packet.poll and not packet.final
    assert packet.desired_min_tx_us == FAST_US


def test_the_new_interval_applies_only_after_the_final() -> None:
    session = session_in(State.UP, now=0.0)
    # Still transmitting at the old interval while the Poll is outstanding.
    assert session.tx_interval_us == SLOW_TX_US
    now = session.next_deadline() or 0.0
    session.tick(now)
    assert (session.next_deadline() or 0.0) - now >= 0.75
    assert session.receive(packet_from_peer(State.UP, final=True), now + 0.001) == []
    assert not session.poll_in_progress
    assert session.tx_interval_us == FAST_US
    # The next packet comes at the new interval, not after the rest of the old one.
    assert (session.next_deadline() or 0.0) <= now + 0.001 + FAST_US / 1e6
    (packet,) = sends(session.tick(session.next_deadline() or 0.0))
    assert not packet.poll


def test_a_final_without_an_outstanding_poll_changes_nothing() -> None:
    session = session_in(State.INIT)
    session.receive(packet_from_peer(State.INIT, final=True), 0.1)
    assert session.tx_interval_us == SLOW_TX_US


def test_linked_sessions_lower_the_interval_after_the_poll_final_exchange() -> None:
    link = up_link()
    for name, session in link.sessions.items():
        assert not session.poll_in_progress
        assert session.tx_interval_us == FAST_US
        up = link.time_up(name)
        final_at = min(t for t, dst, p in link.received if dst == name and p.final and t >= up)
        polls = [t for t, p in link.sends(name, since=up) if p.poll]
        assert polls and polls[0] <= final_at
        # Between Up and the Final the session kept the slow interval.
        periodic = [t for t, p in link.sends(name, since=up) if not p.final and t < final_at]
        assert all(b - a >= 0.75 for a, b in itertools.pairwise(periodic))
        # Once the Final is in, it sends at the fast interval.
        after = [t for t, p in link.sends(name, since=final_at + 0.5) if not p.final]
        assert after and all(b - a <= FAST_US / 1e6 for a, b in itertools.pairwise(after))


def test_a_new_interval_is_announced_only_in_poll_packets() -> None:
    session = session_in(State.UP)
    # A Final answer during our own Poll still carries the interval in use...
    (final,) = sends(session.receive(packet_from_peer(State.UP, poll=True), 0.1))
    assert final.desired_min_tx_us == SLOW_TX_US
    # ...and only the Poll packets carry the new one.
    (poll,) = sends(session.tick(session.next_deadline() or 0.0))
    assert poll.poll and poll.desired_min_tx_us == FAST_US


@pytest.mark.parametrize("seed", range(20))
def test_linked_sessions_come_up_and_stay_up_without_flapping(seed: int) -> None:
    link = Link(config(1), config(2), seed=seed)
    link.run_until(10.0)
    assert link.a.state == link.b.state == State.UP
    assert all(c.new != State.DOWN for _, c in link.changes)


def test_leaving_up_returns_to_the_slow_interval_at_once() -> None:
    session = session_in(State.UP)
    session.receive(packet_from_peer(State.UP, final=True), 0.01)
    assert session.tx_interval_us == FAST_US
    session.receive(packet_from_peer(State.DOWN), 0.02)
    assert session.desired_min_tx_us == SLOW_TX_US
    assert session.tx_interval_us == SLOW_TX_US
    assert not session.poll_in_progress


# §6.8.7 answering a Poll


@pytest.mark.parametrize("state", [State.DOWN, State.INIT, State.UP])
def test_a_received_poll_is_answered_with_final_at_once_in_any_state(state: State) -> None:
    session = session_in(state)
    deadline_before = session.next_deadline()
    remote = State.UP if state == State.UP else State.DOWN
    replies = sends(session.receive(packet_from_peer(remote, poll=True), 0.3))
    assert [p.final for p in replies] == [True]
    assert not replies[0].poll  # §4.1: never P and F together
    assert session.next_deadline() == deadline_before  # the answer is outside the schedule


# §6.8.2 and §6.8.4 timer negotiation


def test_tx_interval_and_detection_time_are_negotiated() -> None:
    link = Link(
        config(1, desired_min_tx_us=10_000, required_min_rx_us=20_000, detect_mult=3),
        config(2, desired_min_tx_us=30_000, required_min_rx_us=15_000, detect_mult=5),
    )
    link.run_until(5.0)
    assert link.a.state == link.b.state == State.UP
    # TX interval = max(local desired min TX, remote required min RX).
    assert link.a.tx_interval_us == max(10_000, 15_000)
    assert link.b.tx_interval_us == max(30_000, 20_000)
    # Detection time = remote mult x max(local required min RX, remote desired min TX).
    assert link.a.detection_time_us == 5 * max(20_000, 30_000)
    assert link.b.detection_time_us == 3 * max(15_000, 10_000)


def test_no_periodic_packets_while_the_remote_requires_none() -> None:
    session = session_in(State.INIT)
    session.receive(packet_from_peer(State.INIT, required_min_rx_us=0), 0.1)
    assert session.next_deadline() == session.detection_deadline()


# §6.8.4 detection


def test_remote_silence_is_detected_after_detect_mult_intervals_and_not_before() -> None:
    link = up_link()
    link.silenced.add("b")
    last_rx = max(t for t, dst, _ in link.received if dst == "a")
    detection = link.a.detection_time_us / 1e6
    assert link.a.detection_time_us == 3 * FAST_US
    link.run_until(last_rx + detection - 1e-6)
    assert [c for n, c in link.changes if n == "a" and c.at > last_rx] == []
    link.run_until(last_rx + detection)
    change = next(c for n, c in link.changes if n == "a" and c.new == State.DOWN)
    assert change == StateChange(
        State.UP, State.DOWN, Diag.CONTROL_DETECTION_TIME_EXPIRED, last_rx + detection
    )
    # §6.8.1: the remote discriminator is forgotten when the Detection Time expires.
    assert link.a.remote_discriminator == 0


def test_the_silent_side_learns_neighbor_signaled_session_down() -> None:
    link = up_link()
    link.silenced.add("a")
    link.run_until(link.now + 0.1)
    b_down = next(c for n, c in link.changes if n == "b" and c.new == State.DOWN)
    assert b_down.diag == Diag.CONTROL_DETECTION_TIME_EXPIRED
    link.silenced.clear()
    link.run_until(link.now + 2.0)
    a_down = next(c for n, c in link.changes if n == "a" and c.new == State.DOWN)
    assert a_down.diag == Diag.NEIGHBOR_SIGNALED_SESSION_DOWN
    # And then they come back Up through the handshake again.
    assert link.a.state == link.b.state == State.UP


def test_an_excuse_moves_only_a_deadline_due_before_it_and_only_up_to_it() -> None:
    """A runtime's own stall is excused to the session up to a point in time, never by
    the stall's length: a peer silent for real is found down at most that late."""
    session = session_in(State.UP, now=1.0)
    deadline = session.detection_deadline()
    assert deadline is not None
    assert session.excuse_until(deadline - 0.001) == 0.0  # due after it already: untouched
    assert session.detection_deadline() == deadline
    assert session.excuse_until(deadline + 0.005) == pytest.approx(0.005)
    assert session.detection_deadline() == pytest.approx(deadline + 0.005)
    assert changes(session.tick(deadline + 0.004)) == []
    (down,) = changes(session.tick(deadline + 0.005))
    assert down.diag == Diag.CONTROL_DETECTION_TIME_EXPIRED
    assert session.excused_s == pytest.approx(0.005)  # what the Down reports


def test_a_packet_heard_ends_what_was_excused() -> None:
    session = session_in(State.UP, now=1.0)
    session.excuse_until(10.0)
    assert session.excused_s > 0
    session.receive(packet_from_peer(State.UP), 5.0)
    assert session.excused_s == 0.0


def test_detection_is_not_armed_while_down() -> None:
    session = Session(config(1), 0.0, random.Random(1))
    assert session.detection_deadline() is None
    assert changes(session.tick(100.0)) == []


# §6.8.7 jitter


@pytest.mark.parametrize("seed", range(5))
def test_jitter_reduces_each_interval_by_0_to_25_percent(seed: int) -> None:
    rng = random.Random(seed)
    samples = [jittered_interval_us(FAST_US, 3, rng) for _ in range(2000)]
    assert all(0.75 * FAST_US <= s <= FAST_US for s in samples)
    assert min(samples) < 0.76 * FAST_US and max(samples) > 0.99 * FAST_US


@pytest.mark.parametrize("seed", range(5))
def test_jitter_with_detect_mult_1_keeps_intervals_within_75_to_90_percent(seed: int) -> None:
    rng = random.Random(seed)
    samples = [jittered_interval_us(FAST_US, 1, rng) for _ in range(2000)]
    assert all(0.75 * FAST_US <= s <= 0.90 * FAST_US for s in samples)


@pytest.mark.parametrize(("mult", "high"), [(3, 1.0), (1, 0.90)])
def test_periodic_transmission_is_jittered_within_bounds(mult: int, high: float) -> None:
    link = Link(config(1, detect_mult=mult), config(2, detect_mult=mult))
    link.run_until(5.0)
    assert link.a.state == State.UP
    periodic = [t for t, p in link.sends("a", since=3.0) if not p.final]
    gaps = [b - a for a, b in itertools.pairwise(periodic)]
    interval = link.a.tx_interval_us / 1e6
    assert len(gaps) > 100
    assert all(0.75 * interval - 1e-9 <= gap <= high * interval + 1e-9 for gap in gaps)


def test_the_random_source_is_injectable_so_runs_repeat() -> None:
    first, second = up_link(), up_link()
    assert first.sent == second.sent


def test_multihop_is_carried_in_the_config_only() -> None:
    hop = SessionConfig(local_discriminator=5, peer="192.0.2.1", multihop=True)
    session = Session(hop, 0.0, random.Random(1))
    assert session.config.multihop and session.peer == "192.0.2.1"
    assert session.local_discriminator == 5


@pytest.mark.parametrize(
    "bad",
    [
        {"local_discriminator": 0},
        {"detect_mult": 0},
        {"desired_min_tx_us": 0},
        {"required_min_rx_us": -1},
    ],
)
def test_config_refuses_values_the_protocol_forbids(bad: dict[str, int]) -> None:
    values: dict[str, int] = {"local_discriminator": 1} | bad
    with pytest.raises(ValueError):
        SessionConfig(
            local_discriminator=values["local_discriminator"],
            peer="192.0.2.1",
            desired_min_tx_us=values.get("desired_min_tx_us", FAST_US),
            required_min_rx_us=values.get("required_min_rx_us", FAST_US),
            detect_mult=values.get("detect_mult", 3),
        )
