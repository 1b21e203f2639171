"""Which BFD sessions authenticate, and with which keys: the agent's authentication file.

`THORN_BFD_AUTH_FILE` names a TOML file of rules, tried in order; the first whose match keys
all fit a session decides its authentication (no rule fits: none). Keys stay on the node, as
in a router's own configuration: they never travel through the API, the database or NATS.

    [[rule]]                       # every key below `type` is optional
    nodes = ["leaf1", "spine1"]    # the agent's node (a lab agent serves several)
    ports = ["eth1"]               # single-hop sessions on these ports
    peers = ["10.0.0.0/8"]         # peer addresses or prefixes
    multihop = false
    type = "meticulous-keyed-sha1" # or "keyed-sha1", or "none"
    send_key = 2                   # optional with a single key
    keys = [
      { id = 1, secret = "old secret" },          # ASCII/UTF-8, 1-20 bytes
      { id = 2, secret_hex = "8f3a...20 bytes" }, # or any bytes, in hex
    ]

Parsing is pure (`parse_policy`); errors name the rule and the field, never a secret.
"""

from __future__ import annotations

import ipaddress
import stat
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator

from thorn_programmer.bfd.auth import MAX_SECRET_BYTES, AuthKey, AuthType, BfdAuth

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class AuthPolicyError(ValueError):
    """The file cannot be read or says something invalid; the message has no secret."""


class _KeyIn(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: int = Field(ge=0, le=255)
    secret: SecretStr | None = None
    secret_hex: SecretStr | None = None

    @model_validator(mode="after")
    def _one_secret(self) -> _KeyIn:
        if (self.secret is None) == (self.secret_hex is None):
            raise ValueError("give exactly one of secret and secret_hex")
        size = len(self.value())
        if not 1 <= size <= MAX_SECRET_BYTES:
            raise ValueError(f"the secret is {size} bytes; keyed SHA1 takes 1 to 20")
        return self

    def value(self) -> bytes:
        if self.secret is not None:
            return self.secret.get_secret_value().encode()
        assert self.secret_hex is not None
        try:
            return bytes.fromhex(self.secret_hex.get_secret_value())
        except ValueError:
            raise ValueError("secret_hex is not hexadecimal") from None


class _RuleIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    nodes: list[str] | None = None
    ports: list[str] | None = None
    peers: list[str] | None = None
    multihop: bool | None = None
    type: Literal["none", "keyed-sha1", "meticulous-keyed-sha1"]
    send_key: int | None = Field(None, ge=0, le=255)
    keys: list[_KeyIn] = []

    @model_validator(mode="after")
    def _keys_fit_type(self) -> _RuleIn:
        if self.type == "none":
            if self.keys or self.send_key is not None:
                raise ValueError('type "none" takes no keys and no send_key')
        elif not self.keys:
            raise ValueError(f"type {self.type!r} needs at least one key")
        elif self.send_key is None and len(self.keys) > 1:
            raise ValueError("send_key: say which of the keys is sent")
        return self


class _PolicyIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rule: list[_RuleIn] = []


@dataclass(frozen=True, slots=True)
class AuthRule:
    """One rule: its match keys (None: any) and the authentication it gives (None: none)."""

    auth: BfdAuth | None
    nodes: frozenset[str] | None = None
    ports: frozenset[str] | None = None
    peers: tuple[Network, ...] | None = None
    multihop: bool | None = None

    def matches(self, node: str, peer: str, port: str | None, multihop: bool) -> bool:
        if self.nodes is not None and node not in self.nodes:
            return False
        if self.ports is not None and port not in self.ports:
            return False
        if self.multihop is not None and multihop != self.multihop:
            return False
        if self.peers is not None:
            address = ipaddress.ip_address(peer)
            return any(address in net for net in self.peers)
        return True

    def describe(self) -> str:
        match = [
            f"{name} {', '.join(sorted(str(v) for v in values))}"
            for name, values in (("nodes", self.nodes), ("ports", self.ports),
                                 ("peers", self.peers))
            if values is not None
        ]  # fmt: skip
        if self.multihop is not None:
            match.append("multihop" if self.multihop else "single hop")
        gives = self.auth.describe() if self.auth is not None else "none"
        return f"{'; '.join(match) or 'every session'}: {gives}"


@dataclass(frozen=True, slots=True)
class AuthPolicy:
    rules: tuple[AuthRule, ...] = ()

    def for_session(self, node: str, peer: str, port: str | None, multihop: bool) -> BfdAuth | None:
        for rule in self.rules:
            if rule.matches(node, peer, port, multihop):
                return rule.auth
        return None

    def describe(self) -> list[str]:
        """One line per rule, for the start-up log: what it matches and gives, no secret."""
        return [f"rule {i}: {r.describe()}" for i, r in enumerate(self.rules, 1)]


def _rule(index: int, rule: _RuleIn) -> AuthRule:
    peers: tuple[Network, ...] | None = None
    if rule.peers is not None:
        try:
            peers = tuple(ipaddress.ip_network(p, strict=False) for p in rule.peers)
        except ValueError as exc:
            raise AuthPolicyError(f"rule {index}: peers: {exc}") from None
    auth = None
    if rule.type != "none":
        try:
            keys = tuple(AuthKey(k.id, k.value()) for k in rule.keys)
            send = rule.send_key if rule.send_key is not None else keys[0].key_id
            auth = BfdAuth(AuthType.from_label(rule.type), keys, send)
        except ValueError as exc:
            raise AuthPolicyError(f"rule {index}: {exc}") from None
    return AuthRule(
        auth=auth,
        nodes=frozenset(rule.nodes) if rule.nodes is not None else None,
        ports=frozenset(rule.ports) if rule.ports is not None else None,
        peers=peers,
        multihop=rule.multihop,
    )


def parse_policy(text: str) -> AuthPolicy:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise AuthPolicyError(f"not TOML: {exc}") from None
    try:
        policy = _PolicyIn.model_validate(raw)
    except ValidationError as exc:
        # Location and message only: pydantic's own text would quote the input (a secret).
        first = exc.errors()[0]
        where = _where(first["loc"])
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        message = first["msg"].removeprefix("Value error, ")
        raise AuthPolicyError(f"{where}: {message}{more}") from None
    return AuthPolicy(tuple(_rule(i, r) for i, r in enumerate(policy.rule, 1)))


def _where(loc: tuple[int | str, ...]) -> str:
    """("rule", 0, "keys", 1, "secret") -> "rule 1, keys 2, secret" (counted from 1)."""
    parts: list[str] = []
    for part in loc:
        if isinstance(part, int) and parts:
            parts[-1] += f" {part + 1}"
        else:
            parts.append(str(part))
    return ", ".join(parts) or "the file"


def load_policy(path: Path) -> AuthPolicy:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise AuthPolicyError(f"cannot read it: {exc}") from None
    return parse_policy(text)


class AuthFile:
    """The file and what it said when last read: `changed` re-reads it when its mtime, size
    or inode moved (an editor's rename, a Kubernetes secret's symlink swap)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen = self._stamp()
        self.policy = load_policy(path)

    def _stamp(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def changed(self) -> AuthPolicy | None:
        """The new policy if the file changed since the last look, else None. Raises
        AuthPolicyError (once per change) if the new contents are invalid: the old policy
        stays in force."""
        stamp = self._stamp()
        if stamp == self._seen:
            return None
        self._seen = stamp
        self.policy = load_policy(self.path)
        return self.policy


def readable_by_others(path: Path) -> bool:
    """Group or world may read the file: its secrets are then not only the agent's."""
    try:
        return bool(path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO))
    except OSError:
        return False
