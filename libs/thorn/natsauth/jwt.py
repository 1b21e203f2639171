"""NATS JWTs (decentralised auth, claims version 2): keys, signing, decoding, creds files.

A NATS JWT is `base64url(header).base64url(claims).base64url(ed25519 signature)`, the header
`{"typ":"JWT","alg":"ed25519-nkey"}`, signed by the issuer's nkey: the operator signs
accounts, an account (or one of its signing keys) signs users. The claims' `nats` object
holds what the server enforces (type, permissions, limits, signing keys). Pure: the clock is
an argument, keys come from `nkeys` (Ed25519 via PyNaCl), nothing is read or written here.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any, Literal

import nacl.exceptions
import nacl.signing
import nkeys

Kind = Literal["operator", "account", "user"]

_PREFIX: dict[Kind, int] = {
    "operator": nkeys.PREFIX_BYTE_OPERATOR,
    "account": nkeys.PREFIX_BYTE_ACCOUNT,
    "user": nkeys.PREFIX_BYTE_USER,
}
_LETTER: dict[Kind, str] = {"operator": "O", "account": "A", "user": "U"}
_HEADER = {"typ": "JWT", "alg": "ed25519-nkey"}
CLAIMS_VERSION = 2


class JwtError(ValueError):
    """A token, key or creds file that is malformed, wrongly signed or of the wrong kind."""


# --------------------------------------------------------------------------------------------
# Keys
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Key:
    """An nkey pair: its seed (secret, `S...`) and its public key (`O...`, `A...`, `U...`)."""

    seed: str
    public: str

    @property
    def kind(self) -> Kind:
        return kind_of(self.public)

    def sign(self, data: bytes) -> bytes:
        pair = nkeys.from_seed(self.seed.encode())
        try:
            signature: bytes = pair.sign(data)
        finally:
            pair.wipe()
        return signature

    def __repr__(self) -> str:  # never the seed, in a log or a traceback
        return f"Key(public={self.public!r})"


def new_key(kind: Kind, entropy: bytes | None = None) -> Key:
    """A fresh key pair of `kind` (32 random bytes, or `entropy` for repeatable tests)."""
    raw = entropy if entropy is not None else os.urandom(32)
    return key_from_seed(nkeys.encode_seed(raw, _PREFIX[kind]).decode())


def key_from_seed(seed: str) -> Key:
    """The key pair of an encoded seed; `JwtError` for anything else."""
    try:
        pair = nkeys.from_seed(seed.strip().encode())
        public = pair.public_key.decode()
        pair.wipe()
    except (nkeys.ErrInvalidSeed, nkeys.ErrInvalidPrefixByte, binascii.Error, ValueError) as exc:
        raise JwtError("not an nkey seed") from exc
    return Key(seed=seed.strip(), public=public)


def kind_of(public: str) -> Kind:
    """The kind of a public nkey, checked (prefix letter, length, checksum)."""
    raw = _decode_public(public)
    for kind, prefix in _PREFIX.items():
        if raw[0] == prefix:
            return kind
    raise JwtError(f"{public[:8]}... is not an operator, account or user key")


def _decode_public(public: str) -> bytes:
    try:
        raw = base64.b32decode(public + "=" * (-len(public) % 8))
    except (binascii.Error, ValueError) as exc:
        raise JwtError("public key is not base32") from exc
    if len(raw) != 35:
        raise JwtError("public key has the wrong length")
    body, crc = raw[:-2], int.from_bytes(raw[-2:], "little")
    if nkeys.crc16(bytearray(body)) != crc:
        raise JwtError("public key checksum does not match")
    return body


def verify(public: str, data: bytes, signature: bytes) -> bool:
    """Whether `signature` is `public`'s Ed25519 signature of `data`."""
    try:
        nacl.signing.VerifyKey(_decode_public(public)[1:]).verify(data, signature)
    except (nacl.exceptions.BadSignatureError, JwtError, ValueError):
        return False
    return True


# --------------------------------------------------------------------------------------------
# Tokens
# --------------------------------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _compact(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class Claims:
    """A decoded token: who issued it about whom, when it expires, and its `nats` object."""

    subject: str
    issuer: str
    name: str
    issued_at: int
    expires: int | None
    nats: dict[str, Any]
    id: str

    @property
    def type(self) -> str:
        return str(self.nats.get("type", ""))

    def expired(self, now: float) -> bool:
        return self.expires is not None and now > self.expires


def encode(
    kind: Kind,
    subject: str,
    name: str,
    nats: dict[str, Any],
    signer: Key,
    *,
    now: float,
    expires: float | None = None,
) -> str:
    """A signed JWT of `kind` about `subject` (a public key of that kind), issued at `now`
    (seconds since the epoch), valid until `expires` (None: never). `nats` holds the type's
    fields; `type` and `version` are filled in."""
    if kind_of(subject) != kind:
        raise JwtError(f"a {kind} JWT's subject must be a {kind} key, not {subject[:8]}...")
    allowed: dict[Kind, tuple[Kind, ...]] = {
        "operator": ("operator",), "account": ("operator", "account"), "user": ("account",),
    }  # fmt: skip
    if signer.kind not in allowed[kind]:
        raise JwtError(f"a {signer.kind} key cannot sign a {kind} JWT")
    claims: dict[str, Any] = {"iat": int(now), "iss": signer.public, "name": name, "sub": subject}
    if expires is not None:
        claims["exp"] = int(expires)
    # jti: a hash of the claims without it, as the Go library makes it (unique per token).
    claims["jti"] = base64.b32encode(hashlib.new("sha512_256", _compact(claims)).digest())
    claims["jti"] = claims["jti"].decode().rstrip("=")
    claims["nats"] = {**nats, "type": kind, "version": CLAIMS_VERSION}
    signed = f"{_b64(_compact(_HEADER))}.{_b64(_compact(claims))}"
    return f"{signed}.{_b64(signer.sign(signed.encode()))}"


def decode(token: str, *, trusted: tuple[str, ...] | None = None) -> Claims:
    """Parse a JWT and check its signature against its own issuer (and, with `trusted`, that
    the issuer is one of those keys). Expiry is the caller's to judge (`Claims.expired`)."""
    parts = token.strip().split(".")
    if len(parts) != 3:
        raise JwtError("a JWT has three dot-separated parts")
    try:
        header = json.loads(_unb64(parts[0]))
        body = json.loads(_unb64(parts[1]))
        signature = _unb64(parts[2])
    except (binascii.Error, ValueError) as exc:
        raise JwtError("JWT parts are not base64url JSON") from exc
    if not isinstance(header, dict) or header.get("alg") != _HEADER["alg"]:
        raise JwtError("JWT is not signed with ed25519-nkey")
    if not isinstance(body, dict) or not isinstance(body.get("nats"), dict):
        raise JwtError("JWT has no nats claims")
    issuer = str(body.get("iss", ""))
    if trusted is not None and issuer not in trusted:
        raise JwtError("JWT is signed by a key this issuer does not trust")
    if not verify(issuer, f"{parts[0]}.{parts[1]}".encode(), signature):
        raise JwtError("JWT signature does not verify")
    expires = body.get("exp")
    return Claims(
        subject=str(body.get("sub", "")),
        issuer=issuer,
        name=str(body.get("name", "")),
        issued_at=int(body.get("iat", 0)),
        expires=int(expires) if expires is not None else None,
        nats=body["nats"],
        id=str(body.get("jti", "")),
    )


# --------------------------------------------------------------------------------------------
# Creds files (what nats-py's user_credentials reads: the user JWT and its seed)
# --------------------------------------------------------------------------------------------

_JWT_BEGIN, _JWT_END = "-----BEGIN NATS USER JWT-----", "------END NATS USER JWT------"
_SEED_BEGIN, _SEED_END = "-----BEGIN USER NKEY SEED-----", "------END USER NKEY SEED------"


def creds(token: str, user: Key) -> str:
    """A .creds file: the user's JWT and its seed, in the layout every NATS client reads."""
    if user.kind != "user":
        raise JwtError("a creds file holds a user key")
    return (
        f"{_JWT_BEGIN}\n{token}\n{_JWT_END}\n\n"
        "************************* IMPORTANT *************************\n"
        "NKEY Seed printed below can be used to sign and prove identity.\n"
        "NKEYs are sensitive and should be treated as secrets.\n\n"
        f"{_SEED_BEGIN}\n{user.seed}\n{_SEED_END}\n\n"
        "*************************************************************\n"
    )


def read_creds(text: str) -> tuple[str, Key]:
    """The JWT and the user key in a .creds file's text; `JwtError` naming what is missing."""

    def between(begin: str, end: str, what: str) -> str:
        start = text.find(begin)
        stop = text.find(end, start + len(begin)) if start >= 0 else -1
        if start < 0 or stop < 0:
            raise JwtError(f"creds file has no {what}")
        return text[start + len(begin) : stop].strip()

    token = between(_JWT_BEGIN, _JWT_END, "user JWT")
    user = key_from_seed(between(_SEED_BEGIN, _SEED_END, "user seed"))
    if user.kind != "user":
        raise JwtError("creds file's seed is not a user key")
    return token, user
