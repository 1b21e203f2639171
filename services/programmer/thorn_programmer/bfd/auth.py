"""BFD authentication, RFC 5880 §6.7.4: Keyed SHA1 and Meticulous Keyed SHA1 (pure).

What a session is configured with (`BfdAuth`: the type, its keys by Key ID, the key it sends
with), how a packet is signed and checked (§4.4 section format, §6.7.4), and the sequence
number window. The per-session state (bfd.XmitAuthSeq, bfd.RcvAuthSeq, bfd.AuthSeqKnown)
lives in `Session`; the codec parses the section (`AuthSection`).

Secrets never appear in a repr, so a logged config or status cannot leak one.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass, field
from enum import IntEnum

from thorn_programmer.bfd.codec import CONTROL_PACKET_LENGTH, SHA1_AUTH_LEN

SHA1_PACKET_LENGTH = CONTROL_PACKET_LENGTH + SHA1_AUTH_LEN
MAX_SECRET_BYTES = 20  # §6.7.4: the key is a binary string of up to 20 bytes
_HASH_BYTES = 20
_SECTION_HEAD = struct.Struct("!BBBBI")  # type, len, key id, reserved (0), sequence number
_U32 = 0xFFFFFFFF

# Why an authenticated session (or a packet claiming authentication) is discarded: §6.8.6
# (A bit against the configuration) and §6.7.4 (the section's checks), counted per reason.
AUTH_PRESENT = "auth_present"  # A bit set, the session does not authenticate
AUTH_MISSING = "auth_missing"  # A bit clear, the session authenticates
AUTH_TYPE = "auth_type"  # another Auth Type than the session's
AUTH_KEY_ID = "auth_key_id"  # a Key ID the session has no key for
AUTH_SEQUENCE = "auth_sequence"  # sequence number outside the window: replayed, old, too far
AUTH_DIGEST = "auth_digest"  # the hash does not match: forged, altered or another secret
AUTH_DROP_REASONS = (AUTH_PRESENT, AUTH_MISSING, AUTH_TYPE, AUTH_KEY_ID, AUTH_SEQUENCE,
                     AUTH_DIGEST)  # fmt: skip


class AuthType(IntEnum):
    """The Auth Types THORN speaks (§4.1); 1-3 (simple password, MD5) are refused."""

    KEYED_SHA1 = 4
    METICULOUS_KEYED_SHA1 = 5

    @property
    def label(self) -> str:
        return "keyed-sha1" if self is AuthType.KEYED_SHA1 else "meticulous-keyed-sha1"

    @classmethod
    def from_label(cls, label: str) -> AuthType:
        for member in cls:
            if member.label == label:
                return member
        raise ValueError(f"unknown authentication type {label!r}: keyed-sha1 or "
                         "meticulous-keyed-sha1")  # fmt: skip


@dataclass(frozen=True, slots=True)
class AuthKey:
    """One key: its Key ID on the wire and the secret (shown nowhere)."""

    key_id: int
    secret: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if not 0 <= self.key_id <= 255:
            raise ValueError(f"key id {self.key_id} is not 0..255")
        if not 1 <= len(self.secret) <= MAX_SECRET_BYTES:
            raise ValueError(
                f"key {self.key_id}: a keyed SHA1 secret is 1 to {MAX_SECRET_BYTES} bytes, "
                f"not {len(self.secret)}"
            )

    @property
    def padded(self) -> bytes:
        """§4.4: the key as it stands in the Auth Key/Hash field while hashing."""
        return self.secret.ljust(_HASH_BYTES, b"\0")


@dataclass(frozen=True, slots=True)
class BfdAuth:
    """A session's authentication: its type, the keys it accepts (several while a key is
    rotated, §4.4 "multiple keys to be active simultaneously"), and the one it sends with."""

    type: AuthType
    keys: tuple[AuthKey, ...]
    send_key_id: int

    def __post_init__(self) -> None:
        ids = [k.key_id for k in self.keys]
        if not ids:
            raise ValueError("authentication needs at least one key")
        if len(set(ids)) != len(ids):
            raise ValueError(f"key ids repeat: {sorted(ids)}")
        if self.send_key_id not in ids:
            raise ValueError(f"send key {self.send_key_id} is not among the keys {sorted(ids)}")

    @property
    def meticulous(self) -> bool:
        return self.type is AuthType.METICULOUS_KEYED_SHA1

    @property
    def send_key(self) -> AuthKey:
        return next(k for k in self.keys if k.key_id == self.send_key_id)

    def key(self, key_id: int) -> AuthKey | None:
        for k in self.keys:
            if k.key_id == key_id:
                return k
        return None

    def describe(self) -> str:
        """For status pages and logs: the type and key ids, never a secret."""
        accepted = ", ".join(str(k.key_id) for k in sorted(self.keys, key=lambda k: k.key_id))
        return f"{self.type.label}, sends key {self.send_key_id}, accepts {accepted}"


def sign(mandatory: bytes, auth: BfdAuth, sequence: int) -> bytes:
    """The datagram for an encoded mandatory section (A bit set, Length 52), §6.7.4: the
    section with the key in the hash field, SHA1 over the whole packet, the hash in place of
    the key."""
    key = auth.send_key
    head = mandatory + _SECTION_HEAD.pack(auth.type, SHA1_AUTH_LEN, key.key_id, 0, sequence)
    return head + hashlib.sha1(head + key.padded).digest()


def digest_matches(data: bytes, length: int, key: AuthKey) -> bool:
    """§6.7.4 reception: the received hash replaced by the key, SHA1 over the whole packet
    (Length bytes; the codec has checked that the section ends there)."""
    start = length - _HASH_BYTES
    computed = hashlib.sha1(data[:start] + key.padded).digest()
    return hmac.compare_digest(computed, data[start:length])


def sequence_acceptable(sequence: int, last: int, detect_mult: int, meticulous: bool) -> bool:
    """§6.7.4: within bfd.RcvAuthSeq to bfd.RcvAuthSeq + 3 x Detect Mult (from + 1 when
    meticulous), in 32-bit circular number space. Anything else is a replay, old, or too far
    ahead to be the peer's next packets."""
    ahead = (sequence - last) & _U32
    return (1 if meticulous else 0) <= ahead <= 3 * detect_mult
