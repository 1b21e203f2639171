"""BFD control packet codec, RFC 5880 §4.1 (mandatory section only).

Decoding applies the reception checks of §6.8.6 that depend on the packet alone and says why a
packet is refused. The authentication section (§4.2-§4.4) is not supported: a packet with the
A bit is refused. Demultiplexing by Your Discriminator is the manager's job.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import Enum, IntEnum

VERSION = 1
CONTROL_PACKET_LENGTH = 24

# Vers/Diag, Sta/flags, Detect Mult, Length, then five 32-bit fields (§4.1).
_HEADER = struct.Struct("!BBBBIIIII")

_POLL = 0x20
_FINAL = 0x10
_CPI = 0x08
_AUTH = 0x04
_DEMAND = 0x02
_MULTIPOINT = 0x01

_U32 = 0xFFFFFFFF


class State(IntEnum):
    """Session state as carried in the Sta field (§4.1)."""

    ADMIN_DOWN = 0
    DOWN = 1
    INIT = 2
    UP = 3


class Diag(IntEnum):
    """Diagnostic codes (§4.1); the field is 5 bits, values above 8 are reserved."""

    NONE = 0
    CONTROL_DETECTION_TIME_EXPIRED = 1
    ECHO_FUNCTION_FAILED = 2
    NEIGHBOR_SIGNALED_SESSION_DOWN = 3
    FORWARDING_PLANE_RESET = 4
    PATH_DOWN = 5
    CONCATENATED_PATH_DOWN = 6
    ADMINISTRATIVELY_DOWN = 7
    REVERSE_CONCATENATED_PATH_DOWN = 8


class Refusal(Enum):
    """Why a received datagram is discarded (§6.8.6)."""

    TOO_SHORT = "too_short"
    BAD_VERSION = "bad_version"
    BAD_LENGTH = "bad_length"
    ZERO_DETECT_MULT = "zero_detect_mult"
    MULTIPOINT = "multipoint"
    ZERO_MY_DISCRIMINATOR = "zero_my_discriminator"
    ZERO_YOUR_DISCRIMINATOR = "zero_your_discriminator"
    AUTH_PRESENT = "auth_present"


class DecodeError(ValueError):
    """A datagram refused by the §6.8.6 checks; `reason` says which one."""

    def __init__(self, reason: Refusal, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason


_U32 = (1 << 32) - 1


def _check_range(name: str, value: int, bits: int) -> None:
    if not 0 <= value < (1 << bits):
        raise ValueError(f"{name} {value} does not fit in {bits} bits")


@dataclass(frozen=True, slots=True)
class ControlPacket:
    """The mandatory section of a BFD control packet; intervals are in microseconds."""

    state: State
    detect_mult: int
    my_discriminator: int
    your_discriminator: int
    desired_min_tx_us: int
    required_min_rx_us: int
    required_min_echo_rx_us: int = 0
    diag: int = Diag.NONE
    poll: bool = False
    final: bool = False
    control_plane_independent: bool = False
    auth: bool = False
    demand: bool = False
    multipoint: bool = False
    version: int = VERSION
    length: int = CONTROL_PACKET_LENGTH

    def __post_init__(self) -> None:
        # Refuse values the wire cannot carry rather than silently truncating them. One
        # comparison chain first: this runs for every packet sent and received.
        if (
            0 <= self.version < 8
            and 0 <= self.diag < 32
            and 0 <= self.detect_mult < 256
            and 0 <= self.length < 256
            and 0 <= self.my_discriminator <= _U32
            and 0 <= self.your_discriminator <= _U32
            and 0 <= self.desired_min_tx_us <= _U32
            and 0 <= self.required_min_rx_us <= _U32
            and 0 <= self.required_min_echo_rx_us <= _U32
        ):
            return
        _check_range("version", self.version, 3)
        _check_range("diag", self.diag, 5)
        _check_range("detect_mult", self.detect_mult, 8)
        _check_range("length", self.length, 8)
        for name in (
            "my_discriminator",
            "your_discriminator",
            "desired_min_tx_us",
            "required_min_rx_us",
            "required_min_echo_rx_us",
        ):
            _check_range(name, getattr(self, name), 32)

    def encode(self) -> bytes:
        flags = (
            (_POLL if self.poll else 0)
            | (_FINAL if self.final else 0)
            | (_CPI if self.control_plane_independent else 0)
            | (_AUTH if self.auth else 0)
            | (_DEMAND if self.demand else 0)
            | (_MULTIPOINT if self.multipoint else 0)
        )
        return _HEADER.pack(
            (self.version << 5) | self.diag,
            (int(self.state) << 6) | flags,
            self.detect_mult,
            self.length,
            self.my_discriminator,
            self.your_discriminator,
            self.desired_min_tx_us,
            self.required_min_rx_us,
            self.required_min_echo_rx_us,
        )


def decode(data: bytes) -> ControlPacket:
    """Parse a datagram, applying the packet-only checks of §6.8.6 in the RFC's order."""
    if len(data) < CONTROL_PACKET_LENGTH:
        raise DecodeError(Refusal.TOO_SHORT, f"{len(data)} bytes < {CONTROL_PACKET_LENGTH}")
    (vers_diag, sta_flags, mult, length, my_d, your_d, tx, rx, echo) = _HEADER.unpack_from(data)
    version = vers_diag >> 5
    if version != VERSION:
        raise DecodeError(Refusal.BAD_VERSION, f"version {version}")
    auth = bool(sta_flags & _AUTH)
    # With the A bit the minimum is 26 (§6.8.6); auth is refused below in any case.
    if length < CONTROL_PACKET_LENGTH or length > len(data):
        raise DecodeError(Refusal.BAD_LENGTH, f"length {length}, datagram {len(data)}")
    if mult == 0:
        raise DecodeError(Refusal.ZERO_DETECT_MULT, "detect mult 0")
    if sta_flags & _MULTIPOINT:
        raise DecodeError(Refusal.MULTIPOINT, "M bit set")
    if my_d == 0:
        raise DecodeError(Refusal.ZERO_MY_DISCRIMINATOR, "my discriminator 0")
    state = State(sta_flags >> 6)
    if your_d == 0 and state not in (State.DOWN, State.ADMIN_DOWN):
        raise DecodeError(Refusal.ZERO_YOUR_DISCRIMINATOR, f"your discriminator 0 in {state.name}")
    if auth:
        raise DecodeError(Refusal.AUTH_PRESENT, "authentication is not supported")
    return ControlPacket(
        state=state,
        detect_mult=mult,
        my_discriminator=my_d,
        your_discriminator=your_d,
        desired_min_tx_us=tx,
        required_min_rx_us=rx,
        required_min_echo_rx_us=echo,
        diag=vers_diag & 0x1F,
        poll=bool(sta_flags & _POLL),
        final=bool(sta_flags & _FINAL),
        control_plane_independent=bool(sta_flags & _CPI),
        demand=bool(sta_flags & _DEMAND),
        version=version,
        length=length,
    )
