"""BFD session state machine, RFC 5880 §6.2 and §6.8, asynchronous mode only.

A pure object: time is an argument (seconds, any monotonic origin) and the handlers return what
to do (send a packet, report a state change). Intervals are in microseconds, as on the wire.
Multihop (RFC 5883) changes nothing here; it is carried for the manager's TTL check.

Authentication (§6.7.4, optional per session) keeps its sequence numbers here: `seal` signs
each packet sent with the next bfd.XmitAuthSeq, `authenticate` checks a received one against
the keys and bfd.RcvAuthSeq before `receive` may act on it.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

from thorn_programmer.bfd import auth as bfd_auth
from thorn_programmer.bfd.auth import BfdAuth
from thorn_programmer.bfd.codec import CONTROL_PACKET_LENGTH, ControlPacket, Diag, State

# §6.8.3: DesiredMinTxInterval is at least one second while the session is not Up.
SLOW_TX_US = 1_000_000
_US = 1_000_000.0


@dataclass(frozen=True, slots=True)
class SessionConfig:
    """What an operator configures for one session."""

    local_discriminator: int
    peer: str
    local_address: str | None = None
    desired_min_tx_us: int = 300_000
    required_min_rx_us: int = 300_000
    detect_mult: int = 3
    multihop: bool = False
    # Multihop: the lowest TTL accepted (FRR's `minimum-ttl`); None: 254, one router away.
    min_ttl: int | None = None
    # Keyed SHA1 authentication (§6.7.4); None: the session neither sends nor accepts it.
    auth: BfdAuth | None = None

    def __post_init__(self) -> None:
        if not 0 < self.local_discriminator <= 0xFFFFFFFF:
            raise ValueError("local_discriminator must be a nonzero 32-bit value (§6.8.1)")
        if not 0 < self.detect_mult <= 0xFF:
            raise ValueError("detect_mult must be 1..255")
        if not 0 < self.desired_min_tx_us <= 0xFFFFFFFF:
            raise ValueError("desired_min_tx_us must be a nonzero 32-bit value (§6.8.1)")
        if not 0 <= self.required_min_rx_us <= 0xFFFFFFFF:
            raise ValueError("required_min_rx_us must be a 32-bit value")
        if self.min_ttl is not None and (not self.multihop or not 1 <= self.min_ttl <= 255):
            raise ValueError("min_ttl is for multihop sessions, 1..255 (single hop needs 255)")


@dataclass(frozen=True, slots=True)
class Send:
    """Transmit this packet to the session's peer now."""

    packet: ControlPacket


@dataclass(frozen=True, slots=True)
class StateChange:
    """The session moved from `old` to `new` at time `at` for reason `diag`."""

    old: State
    new: State
    diag: Diag
    at: float


Action = Send | StateChange


def jittered_interval_us(interval_us: int, detect_mult: int, rng: random.Random) -> int:
    """§6.8.7: reduce each interval randomly by 0-25%, or by 10-25% when detect mult is 1."""
    high = 0.90 if detect_mult == 1 else 1.0
    return int(interval_us * rng.uniform(0.75, high))


class Session:
    """One BFD session (§6.8.1 state variables, §6.8.6 reception, §6.8.7 transmission)."""

    def __init__(self, config: SessionConfig, now: float, rng: random.Random | None = None) -> None:
        self.config = config
        self._rng = rng if rng is not None else random.Random()
        self._state = State.DOWN
        self._diag = Diag.NONE
        self._remote_state = State.DOWN
        self._remote_discriminator = 0
        # §6.8.1: RemoteMinRxInterval starts at 1 us; the others are unknown until a packet.
        self._remote_min_rx_us = 1
        self._remote_desired_tx_us = 0
        self._remote_detect_mult = 0
        self._desired_tx_us = max(config.desired_min_tx_us, SLOW_TX_US)
        # The value actually used for transmission: lags the advertised one during a Poll
        # sequence while Up (§6.8.3).
        self._active_tx_us = self._desired_tx_us
        self._poll = False
        self._last_rx: float | None = None
        self._excused = 0.0  # seconds of the peer's silence excused since _last_rx
        # The last packet built, and what it was built from: most packets repeat it.
        self._packet_key: tuple[object, ...] = ()
        self._packet: ControlPacket | None = None
        # Send the first packet at once: the peer learns our discriminator sooner.
        self._next_tx = now
        # §6.8.1 bfd.XmitAuthSeq (random at first use), bfd.RcvAuthSeq, bfd.AuthSeqKnown,
        # and when an authenticated packet was last accepted (to forget RcvAuthSeq).
        self._xmit_auth_seq: int | None = None
        self._rcv_auth_seq = 0
        self._auth_seq_known = False
        self._auth_heard: float | None = None

    # What a manager needs: demux keys, state, negotiated timers.

    @property
    def local_discriminator(self) -> int:
        return self.config.local_discriminator

    @property
    def remote_discriminator(self) -> int:
        return self._remote_discriminator

    @property
    def peer(self) -> str:
        return self.config.peer

    @property
    def state(self) -> State:
        return self._state

    @property
    def diag(self) -> Diag:
        return self._diag

    @property
    def remote_state(self) -> State:
        return self._remote_state

    @property
    def poll_in_progress(self) -> bool:
        return self._poll

    @property
    def desired_min_tx_us(self) -> int:
        """bfd.DesiredMinTxInterval: the target, announced in Poll packets until a Final."""
        return self._desired_tx_us

    @property
    def tx_interval_us(self) -> int:
        """§6.8.7: max(DesiredMinTxInterval in use, RemoteMinRxInterval), before jitter."""
        return max(self._active_tx_us, self._remote_min_rx_us)

    @property
    def detection_time_us(self) -> int:
        """§6.8.4 async mode: remote Detect Mult x max(RequiredMinRx, remote DesiredMinTx)."""
        return self._remote_detect_mult * max(
            self.config.required_min_rx_us, self._remote_desired_tx_us
        )

    def detection_deadline(self) -> float | None:
        """When the session goes Down if nothing more arrives; None when not armed."""
        if self._state not in (State.INIT, State.UP) or self._last_rx is None:
            return None
        return self._last_rx + self.detection_time_us / _US

    def next_deadline(self) -> float | None:
        """The earliest time `tick` has something to do; None when nothing is scheduled."""
        pending = (self._next_tx_deadline(), self.detection_deadline())
        deadlines = [d for d in pending if d is not None]
        return min(deadlines) if deadlines else None

    def _next_tx_deadline(self) -> float | None:
        # §6.8.7: no periodic transmission while the remote asks for none.
        return None if self._remote_min_rx_us == 0 else self._next_tx

    def packet(self, *, final: bool = False) -> ControlPacket:
        """The control packet this session would send now (§6.8.7); the same object as last
        time while nothing it is made of changed (the runtime reuses its encoding)."""
        polling = self._poll and not final
        # A new value is announced only in Poll packets, as FRR's bfdd does: otherwise a
        # Final or periodic packet would shrink the peer's detection time while we still
        # transmit at the old interval (§6.8.3 timing mismatch).
        tx_us = self._desired_tx_us if polling else self._active_tx_us
        auth = self.config.auth is not None
        key = (self._state, self._diag, self._remote_discriminator, tx_us, polling, final, auth)
        if key == self._packet_key and self._packet is not None:
            return self._packet
        self._packet_key = key
        self._packet = ControlPacket(
            state=self._state,
            diag=self._diag,
            detect_mult=self.config.detect_mult,
            my_discriminator=self.config.local_discriminator,
            your_discriminator=self._remote_discriminator,
            desired_min_tx_us=tx_us,
            required_min_rx_us=self.config.required_min_rx_us,
            # §4.1: P and F are never both set; a Final answer carries F only.
            poll=polling,
            final=final,
            auth=auth,
            length=bfd_auth.SHA1_PACKET_LENGTH if auth else CONTROL_PACKET_LENGTH,
        )
        return self._packet

    def seal(self, encoded: bytes) -> bytes:
        """The datagram to send for an encoded packet of this session: as it is, or with the
        authentication section signed with the next sequence number (§6.7.4). Both types
        take a new number for every packet: required of Meticulous, allowed of Keyed SHA1,
        and a replayed packet then never passes as the latest."""
        auth = self.config.auth
        if auth is None:
            return encoded
        sequence = self._xmit_auth_seq
        if sequence is None:
            sequence = self._rng.getrandbits(32)
        self._xmit_auth_seq = (sequence + 1) & 0xFFFFFFFF
        return bfd_auth.sign(encoded, auth, sequence)

    def authenticate(self, packet: ControlPacket, data: bytes, now: float) -> str | None:
        """§6.8.6 (the A bit against the configuration) and §6.7.4 for a packet demultiplexed
        to this session, before `receive`: None if it may be processed, else why it is
        discarded (`auth.AUTH_DROP_REASONS`). `data` is the datagram as received."""
        auth = self.config.auth
        section = packet.auth_section
        if auth is None:
            return bfd_auth.AUTH_PRESENT if packet.auth else None
        if section is None:
            return bfd_auth.AUTH_MISSING
        if section.auth_type != auth.type:
            return bfd_auth.AUTH_TYPE
        key = auth.key(section.key_id)
        if key is None:
            return bfd_auth.AUTH_KEY_ID
        if (
            self._auth_seq_known
            and self._auth_heard is not None
            and now - self._auth_heard >= 2 * self.detection_time_us / _US
        ):
            # §6.8.1: forgotten after twice the Detection Time without a packet, so a peer
            # that restarted with a new random sequence number is heard again.
            self._auth_seq_known = False
        if self._auth_seq_known and not bfd_auth.sequence_acceptable(
            section.sequence, self._rcv_auth_seq, packet.detect_mult, auth.meticulous
        ):
            return bfd_auth.AUTH_SEQUENCE
        if not bfd_auth.digest_matches(data, packet.length, key):
            return bfd_auth.AUTH_DIGEST
        # Only an authentic packet moves the window (RFC 5880 errata 7083).
        self._auth_seq_known = True
        self._rcv_auth_seq = section.sequence
        self._auth_heard = now
        return None

    def set_auth(self, auth: BfdAuth | None) -> None:
        """New keys (a rotation) keep the sequence numbers; a new type, or authentication
        switched on or off, starts the received ones afresh."""
        old = self.config.auth
        self.config = dataclasses.replace(self.config, auth=auth)
        if old is None or auth is None or old.type != auth.type:
            self._auth_seq_known = False

    def receive(self, packet: ControlPacket, now: float) -> list[Action]:
        """§6.8.6 for a packet that passed the codec checks and was demuxed to this session."""
        if packet.your_discriminator not in (0, self.config.local_discriminator):
            return []
        old_interval = self.tx_interval_us
        self._remote_discriminator = packet.my_discriminator
        self._remote_state = packet.state
        self._remote_min_rx_us = packet.required_min_rx_us
        self._remote_desired_tx_us = packet.desired_min_tx_us
        self._remote_detect_mult = packet.detect_mult
        self._last_rx = now
        self._excused = 0.0
        if packet.final and self._poll:
            # §6.8.3: the new interval takes effect once the Poll sequence terminates.
            self._poll = False
            self._active_tx_us = self._desired_tx_us
        if self.tx_interval_us < old_interval:
            # Do not wait out an old, longer interval: the peer now times us out sooner.
            self._next_tx = min(self._next_tx, now + self._jittered_s())

        actions: list[Action] = []
        if self._state != State.ADMIN_DOWN:
            self._transition(packet.state, now, actions)
        if packet.poll:
            # §6.8.7: answer a Poll with Final at once, regardless of timers and state.
            actions.append(Send(self.packet(final=True)))
        return actions

    def _transition(self, remote: State, now: float, actions: list[Action]) -> None:
        """The §6.2 diagram, as written out in §6.8.6."""
        if remote == State.ADMIN_DOWN:
            if self._state != State.DOWN:
                self._set_state(State.DOWN, Diag.NEIGHBOR_SIGNALED_SESSION_DOWN, now, actions)
        elif self._state == State.DOWN:
            if remote == State.DOWN:
                self._set_state(State.INIT, Diag.NONE, now, actions)
            elif remote == State.INIT:
                self._set_state(State.UP, Diag.NONE, now, actions)
        elif self._state == State.INIT:
            if remote in (State.INIT, State.UP):
                self._set_state(State.UP, Diag.NONE, now, actions)
        elif self._state == State.UP and remote == State.DOWN:
            self._set_state(State.DOWN, Diag.NEIGHBOR_SIGNALED_SESSION_DOWN, now, actions)

    def _set_state(self, new: State, diag: Diag, now: float, actions: list[Action]) -> None:
        old = self._state
        self._state = new
        self._diag = diag
        actions.append(StateChange(old, new, diag, now))
        if new == State.UP:
            self._set_desired_tx(self.config.desired_min_tx_us)
        elif old == State.UP:
            # Leaving Up: back to slow transmission at once; §6.8.3 only holds the old
            # interval for a Poll sequence while Up, and there is nothing left to poll.
            self._poll = False
            self._set_desired_tx(max(self.config.desired_min_tx_us, SLOW_TX_US))

    def _set_desired_tx(self, value: int) -> None:
        if value == self._desired_tx_us:
            return
        self._desired_tx_us = value
        if self._state == State.UP:
            # §6.8.3: a timer change while Up starts a Poll sequence; apply after Final.
            self._poll = True
        else:
            self._active_tx_us = value

    def excuse_until(self, when: float) -> float:
        """Do not declare the peer down before `when`: the peer could not have been heard
        until shortly before it (see `BfdManager`: a stall of a runtime that holds both
        ends). Only a detection deadline earlier than `when` moves, and only to `when`: a
        peer that fell silent for real is still found down at most that late. Returns the
        seconds of silence excused."""
        deadline = self.detection_deadline()
        if deadline is None or self._last_rx is None or deadline >= when:
            return 0.0
        shift = when - deadline
        self._last_rx += shift
        self._excused += shift
        return shift

    @property
    def excused_s(self) -> float:
        """Silence excused since the last packet heard (`excuse_until`); kept past a
        detection time expiry, so the Down can say how much later it came for it."""
        return self._excused

    def tick(self, now: float) -> list[Action]:
        """Run the detection timer (§6.8.4) and periodic transmission (§6.8.7) up to `now`."""
        actions: list[Action] = []
        detect = self.detection_deadline()
        if detect is not None and now >= detect:
            self._set_state(State.DOWN, Diag.CONTROL_DETECTION_TIME_EXPIRED, now, actions)
            # §6.8.1: RemoteDiscr is zeroed when the Detection Time expires.
            self._remote_discriminator = 0
            self._remote_state = State.DOWN
            self._last_rx = None
        tx = self._next_tx_deadline()
        if tx is not None and now >= tx:
            actions.append(Send(self.packet()))
            self._next_tx = now + self._jittered_s()
        return actions

    def _jittered_s(self) -> float:
        return jittered_interval_us(self.tx_interval_us, self.config.detect_mult, self._rng) / _US
