"""Message templates: encode a rule once, then stamp out copies with a few fields patched.

A host installs thousands of encap rules and tunnel actions that differ only in a MAC, an
action index, two addresses and a VNI. Encoding each through the models costs ~130 us; a
template encodes one with placeholder values, remembers where those values sit in the
bytes, and patches copies (~2 us). A template is only built when every placeholder occurs
exactly once, and tests hold a patched copy byte-identical to a full encoding.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass

_U32 = struct.Struct("=I")
PLACEHOLDER_MAC = "02:de:ad:be:ef:5a"
PLACEHOLDER_INDEX = 0x5448FFFE  # inside THORN's action band, never allocated
PLACEHOLDER_SRC = "198.51.100.241"
PLACEHOLDER_DST = "198.51.100.242"
PLACEHOLDER_VNI = 0xBEEF5A


def mac_bytes(mac: str) -> bytes:
    return bytes.fromhex(mac.replace(":", ""))


def ipv4_bytes(address: str) -> bytes:
    return bytes(int(part) for part in address.split("."))


# How each patchable field is written: the field's placeholder bytes and its encoder.
FIELDS: Mapping[str, tuple[bytes, Callable[[object], bytes]]] = {
    "mac": (mac_bytes(PLACEHOLDER_MAC), lambda v: mac_bytes(str(v))),
    "index": (struct.pack("=I", PLACEHOLDER_INDEX), lambda v: struct.pack("=I", int(str(v)))),
    "src": (ipv4_bytes(PLACEHOLDER_SRC), lambda v: ipv4_bytes(str(v))),
    "dst": (ipv4_bytes(PLACEHOLDER_DST), lambda v: ipv4_bytes(str(v))),
    "vni": (struct.pack("!I", PLACEHOLDER_VNI), lambda v: struct.pack("!I", int(str(v)))),
}


@dataclass(frozen=True, slots=True)
class Template:
    raw: bytes
    offsets: Mapping[str, int]

    @classmethod
    def of(cls, raw: bytes, fields: tuple[str, ...]) -> Template | None:
        """The template of `raw` (encoded with the placeholders of `fields`), or None when a
        placeholder is not found exactly once (then encode each message in full)."""
        offsets: dict[str, int] = {}
        for name in fields:
            needle = FIELDS[name][0]
            if raw.count(needle) != 1:
                return None
            offsets[name] = raw.index(needle)
        return cls(raw, offsets)

    def stamp_encap(self, mac: str, index: int) -> bytes:
        """The hot path of `stamp` for an encap rule (a MAC and an action index)."""
        buf = bytearray(self.raw)
        at = self.offsets["mac"]
        buf[at : at + 6] = bytes.fromhex(mac.replace(":", ""))
        _U32.pack_into(buf, self.offsets["index"], index)
        return bytes(buf)

    def stamp(self, **values: object) -> bytes:
        buf = bytearray(self.raw)
        for name, value in values.items():
            at = self.offsets[name]
            data = FIELDS[name][1](value)
            buf[at : at + len(data)] = data
        return bytes(buf)
