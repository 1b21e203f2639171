"""Probe packet formats of the traffic generator (pure).

Plain UDP (`Kind.udp`), network byte order, 28 bytes then zero padding::

    magic "THRN" | version u8 | kind u8 | reserved u16 | stream u32 | seq u64 | sent_ns u64

RoCEv2-shaped (`Kind.roce`, UDP destination port 4791): an InfiniBand Base Transport
Header as a RoCEv2 packet carries it, then the probe's own fields, padding, and a 4-byte
ICRC placeholder (zeros: no NIC checks it here)::

    BTH (12 bytes): opcode u8 (0x04 RC SEND Only) | SE/M/pad/TVer u8 | P_Key u16 (0xffff)
                    | reserved u8 | dest QP u24 | AckReq/reserved u8 | PSN u24
    magic "THRN" | stream u32 | sent_ns u64 | padding ... | ICRC u32

The PSN is 24 bits and wraps, as on a real queue pair; the meter unwraps it.
"""

from __future__ import annotations

import struct
from enum import StrEnum
from typing import NamedTuple

__all__ = [
    "MAGIC",
    "PSN_MODULUS",
    "ROCE_PORT",
    "Kind",
    "Probe",
    "decode",
    "encode_into",
    "min_size",
]

MAGIC = b"THRN"
VERSION = 1
ROCE_PORT = 4791
PSN_MODULUS = 1 << 24
OPCODE_RC_SEND_ONLY = 0x04
DEFAULT_PKEY = 0xFFFF
ICRC_SIZE = 4


class Kind(StrEnum):
    udp = "udp"
    roce = "roce"


_UDP = struct.Struct("!4sBBHIQQ")
_BTH = struct.Struct("!BBHII")  # reserved|destQP and AckReq|PSN as two 32-bit words
_ROCE_META = struct.Struct("!4sIQ")
_KIND_CODE = {Kind.udp: 1, Kind.roce: 2}


class Probe(NamedTuple):
    stream: int
    seq: int  # the sequence number, or for RoCE the 24-bit PSN as sent
    sent_ns: int


def min_size(kind: Kind) -> int:
    if kind == Kind.udp:
        return _UDP.size
    return _BTH.size + _ROCE_META.size + ICRC_SIZE


def encode_into(
    buf: bytearray, kind: Kind, stream: int, seq: int, sent_ns: int, qp: int = 0
) -> None:
    """Write one probe at the start of `buf` (its length is the payload size)."""
    if kind == Kind.udp:
        _UDP.pack_into(buf, 0, MAGIC, VERSION, _KIND_CODE[kind], 0, stream, seq, sent_ns)
        return
    psn = seq % PSN_MODULUS
    _BTH.pack_into(buf, 0, OPCODE_RC_SEND_ONLY, 0, DEFAULT_PKEY, qp & 0xFFFFFF, psn)
    _ROCE_META.pack_into(buf, _BTH.size, MAGIC, stream, sent_ns)


def decode(data: bytes, kind: Kind) -> Probe | None:
    """The probe in `data`, or None for anything that is not one of ours."""
    if kind == Kind.udp:
        if len(data) < _UDP.size:
            return None
        magic, version, code, _, stream, seq, sent = _UDP.unpack_from(data)
        if magic != MAGIC or version != VERSION or code != _KIND_CODE[kind]:
            return None
        return Probe(stream, seq, sent)
    if len(data) < min_size(kind):
        return None
    opcode, _, _, _, ack_psn = _BTH.unpack_from(data)
    magic, stream, sent = _ROCE_META.unpack_from(data, _BTH.size)
    if opcode != OPCODE_RC_SEND_ONLY or magic != MAGIC:
        return None
    return Probe(stream, ack_psn & 0xFFFFFF, sent)
