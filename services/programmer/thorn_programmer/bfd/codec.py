"""BFD control packet codec, RFC 5880 §4.1, with the authentication section's framing (§4.2-4.4).

Decoding applies the reception checks of §6.8.6 that depend on the packet alone and says why a
packet is refused. A packet with the A bit carries its section's fields (`AuthSection`);
whether the session authenticates, and the hash, are checked once the packet is demultiplexed
to its session (`Session.authenticate`, auth.py). Demultiplexing by Your Discriminator is the
manager's job.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import Enum, IntEnum

VERSION = 1
CONTROL_PACKET_LENGTH = 24
AUTH_MIN_LENGTH = 26  # §6.8.6: the least Length with the A bit (type and length bytes)
SHA1_AUTH_TYPES = (4, 5)  # Keyed SHA1, Meticulous Keyed SHA1 (§4.1)
SHA1_AUTH_LEN = 28  # §4.4

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
    # The section does not fit the packet, or a SHA1 section is not 28 bytes (§6.7.4).
    AUTH_MALFORMED = "auth_malformed"


class DecodeError(ValueError):
    """A datagram refused by the §6.8.6 checks; `reason` says which one."""

    def __init__(self, reason: Refusal, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason


@dataclass(frozen=True, slots=True)
class AuthSection:
    """The authentication section's fields (§4.2-4.4): the type, the Key ID (byte 3 of
    every type), and the sequence number of the keyed types (0 for the others)."""

    auth_type: int
    key_id: int
    sequence: int = 0


def _check_range(name: str, value: int, bits: int) -> None:
    if not 0 <= value < (1 << bits):
        raise ValueError(f"{name} {value} does not fit in {bits} bits")


@dataclass(frozen=True, slots=True)
class ControlPacket:
    """A BFD control packet's mandatory section (intervals in microseconds) and, decoded
    with the A bit, its authentication section's fields."""

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
    auth_section: AuthSection | None = None  # decoded packets with the A bit; not encoded

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
        """The mandatory section (24 bytes); an authenticated session appends its section
        to it (`auth.sign`), with `auth` and `length` set to say so."""
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
    if length < (AUTH_MIN_LENGTH if auth else CONTROL_PACKET_LENGTH) or length > len(data):
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
    section = _auth_section(data, length) if auth else None
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
        auth=auth,
        version=version,
        length=length,
        auth_section=section,
    )


def _auth_section(data: bytes, length: int) -> AuthSection:
    """The section after the mandatory one; it must end where Length says the packet does."""
    auth_type, auth_len = data[24], data[25]
    if CONTROL_PACKET_LENGTH + auth_len != length:
        raise DecodeError(Refusal.AUTH_MALFORMED, f"auth len {auth_len}, length {length}")
    if auth_type in SHA1_AUTH_TYPES:
        if auth_len != SHA1_AUTH_LEN:
            raise DecodeError(Refusal.AUTH_MALFORMED, f"auth len {auth_len} for type {auth_type}")
        (sequence,) = struct.unpack_from("!I", data, 28)
        return AuthSection(auth_type, data[26], sequence)
    return AuthSection(auth_type, data[26] if auth_len > 2 else 0)
