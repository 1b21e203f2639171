"""RFC 5880 §4.1 control packet format and the packet-only reception checks of §6.8.6.

Each test is named after the rule it checks.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from thorn_programmer.bfd.codec import (
    CONTROL_PACKET_LENGTH,
    ControlPacket,
    DecodeError,
    Diag,
    Refusal,
    State,
    decode,
)

u32 = st.integers(min_value=0, max_value=0xFFFFFFFF)
nonzero_u32 = st.integers(min_value=1, max_value=0xFFFFFFFF)


@st.composite
def valid_packets(draw: st.DrawFn) -> ControlPacket:
    """Every packet the decoder accepts: no A or M bit, nonzero mult and My Discriminator."""
    state = draw(st.sampled_from(State))
    your_min = 0 if state in (State.DOWN, State.ADMIN_DOWN) else 1
    poll = draw(st.booleans())
    return ControlPacket(
        state=state,
        diag=draw(st.integers(min_value=0, max_value=31)),
        detect_mult=draw(st.integers(min_value=1, max_value=255)),
        my_discriminator=draw(nonzero_u32),
        your_discriminator=draw(st.integers(min_value=your_min, max_value=0xFFFFFFFF)),
        desired_min_tx_us=draw(u32),
        required_min_rx_us=draw(u32),
        required_min_echo_rx_us=draw(u32),
        poll=poll,
        final=draw(st.booleans()) and not poll,
        control_plane_independent=draw(st.booleans()),
        demand=draw(st.booleans()),
    )


def _raw(
    *,
    version: int = 1,
    diag: int = 0,
    state: State = State.UP,
    flags: int = 0,
    mult: int = 3,
    length: int = 24,
    my: int = 1,
    your: int = 2,
    tx: int = 1_000_000,
    rx: int = 1_000_000,
    echo: int = 0,
) -> bytes:
    return struct.pack(
        "!BBBBIIIII", version << 5 | diag, state << 6 | flags, mult, length, my, your, tx, rx, echo
    )


@given(valid_packets())
def test_every_valid_packet_round_trips(packet: ControlPacket) -> None:
    wire = packet.encode()
    assert len(wire) == CONTROL_PACKET_LENGTH
    assert decode(wire) == packet


def test_field_layout_matches_section_4_1() -> None:
    packet = ControlPacket(
        state=State.INIT,
        diag=Diag.NEIGHBOR_SIGNALED_SESSION_DOWN,
        detect_mult=5,
        my_discriminator=0x01020304,
        your_discriminator=0x05060708,
        desired_min_tx_us=10_000,
        required_min_rx_us=20_000,
        required_min_echo_rx_us=0,
        poll=True,
        demand=True,
    )
    wire = packet.encode()
    assert wire[0] == 0x20 | 3  # version 1 in the top 3 bits, diag below
    assert wire[1] == 0x80 | 0x20 | 0x02  # Init in the top 2 bits, then P and D
    assert wire[2:4] == bytes([5, 24])
    assert wire[4:12] == bytes(range(1, 9))
    assert struct.unpack("!III", wire[12:]) == (10_000, 20_000, 0)


def test_flags_decode_to_their_bits() -> None:
    assert decode(_raw(flags=0x20)).poll
    assert decode(_raw(flags=0x10)).final
    assert decode(_raw(flags=0x08)).control_plane_independent
    assert decode(_raw(flags=0x02)).demand


def test_trailing_bytes_beyond_the_length_field_are_ignored() -> None:
    assert decode(_raw() + b"\x00\x00") == decode(_raw())


def _refusal(data: bytes) -> Refusal:
    with pytest.raises(DecodeError) as caught:
        decode(data)
    return caught.value.reason


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        pytest.param(_raw()[:23], Refusal.TOO_SHORT, id="shorter_than_24_bytes"),
        pytest.param(b"", Refusal.TOO_SHORT, id="empty_datagram"),
        pytest.param(_raw(version=0), Refusal.BAD_VERSION, id="version_0"),
        pytest.param(_raw(version=2), Refusal.BAD_VERSION, id="version_2"),
        pytest.param(_raw(length=23), Refusal.BAD_LENGTH, id="length_field_below_24"),
        pytest.param(_raw(length=25), Refusal.BAD_LENGTH, id="length_field_beyond_datagram"),
        pytest.param(_raw(mult=0), Refusal.ZERO_DETECT_MULT, id="detect_mult_zero"),
        pytest.param(_raw(flags=0x01), Refusal.MULTIPOINT, id="multipoint_bit_set"),
        pytest.param(_raw(my=0), Refusal.ZERO_MY_DISCRIMINATOR, id="my_discriminator_zero"),
        pytest.param(
            _raw(your=0, state=State.UP), Refusal.ZERO_YOUR_DISCRIMINATOR, id="your_zero_in_up"
        ),
        pytest.param(
            _raw(your=0, state=State.INIT),
            Refusal.ZERO_YOUR_DISCRIMINATOR,
            id="your_zero_in_init",
        ),
        # §6.8.6: with the A bit the Length is at least 26 (the section's type and length).
        pytest.param(_raw(flags=0x04), Refusal.BAD_LENGTH, id="auth_bit_without_section"),
        pytest.param(
            _raw(flags=0x04, length=25) + b"\x04", Refusal.BAD_LENGTH, id="auth_length_25"
        ),
        # The section must end where Length says the packet does.
        pytest.param(
            _raw(flags=0x04, length=26) + b"\x04\x1c",
            Refusal.AUTH_MALFORMED,
            id="auth_len_beyond_length",
        ),
        pytest.param(
            _raw(flags=0x04, length=52) + b"\x04\x1a" + bytes(26),
            Refusal.AUTH_MALFORMED,
            id="auth_len_short_of_length",
        ),
        # §6.7.4: a Keyed SHA1 section is 28 bytes long, whatever Length says.
        pytest.param(
            _raw(flags=0x04, length=48) + b"\x05\x18" + bytes(22),
            Refusal.AUTH_MALFORMED,
            id="sha1_auth_len_24",
        ),
    ],
)
def test_malformed_packet_is_refused_with_its_reason(data: bytes, reason: Refusal) -> None:
    assert _refusal(data) == reason


@pytest.mark.parametrize("state", [State.DOWN, State.ADMIN_DOWN])
def test_your_discriminator_zero_is_accepted_in_down_and_admin_down(state: State) -> None:
    assert decode(_raw(your=0, state=state)).your_discriminator == 0


def test_refusal_message_names_the_reason() -> None:
    with pytest.raises(DecodeError, match="zero_detect_mult"):
        decode(_raw(mult=0))


@pytest.mark.parametrize(
    "field",
    [
        {"diag": 32},
        {"detect_mult": 256},
        {"my_discriminator": 1 << 32},
        {"desired_min_tx_us": -1},
        {"version": 8},
    ],
)
def test_values_the_wire_cannot_carry_are_refused_at_construction(field: dict[str, int]) -> None:
    base: dict[str, int] = {
        "detect_mult": 3,
        "my_discriminator": 1,
        "your_discriminator": 0,
        "desired_min_tx_us": 1,
        "required_min_rx_us": 1,
    }
    with pytest.raises(ValueError):
        ControlPacket(state=State.DOWN, **(base | field))  # type: ignore[arg-type]
