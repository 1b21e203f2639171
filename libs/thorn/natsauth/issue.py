"""Issuing THORN's NATS identities (pure: keys and the clock come in, JWTs and text go out).

The trust chain, as nats-server's operator mode wants it:

    operator (THORN's own)  --signs-->  account THORN (JetStream on)  and  account SYS
    account THORN's signing key  --signs-->  every user: services, agents, admins

The servers are given the operator JWT and both account JWTs (`server_config`): they trust
any user JWT signed by a signing key the THORN account lists, until it expires or its key is
revoked in the account JWT. The issuer (thorn-run's provisioning, and topology for agents)
holds the signing key's seed, never the operator's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from thorn.natsauth.jwt import Claims, JwtError, Key, creds, decode, encode, new_key
from thorn.natsauth.permissions import Permissions

DAY = 24 * 60 * 60
SERVICE_LIFETIME = 365 * DAY  # re-issued at each thorn-run start; deployments rotate yearly
ADMIN_LIFETIME = 30 * DAY
AGENT_LIFETIME = 7 * DAY  # a node down for up to a week comes back on its own credentials
RENEW_AFTER = 0.5  # an agent renews once half its credentials' lifetime has passed

_UNLIMITED = {"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
              "wildcards": True, "conn": -1, "leaf": -1}  # fmt: skip
_JETSTREAM = {"mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1}

THORN_ACCOUNT = "THORN"
SYSTEM_ACCOUNT = "SYS"


@dataclass(frozen=True, slots=True)
class Trust:
    """The keys behind THORN's NATS identities. `signing_keys`: the THORN account's, the
    first being the one users are issued with now (more than one while rotating);
    `revoked`: user public keys refused from the given time (seconds since the epoch) on."""

    operator: Key
    system: Key
    account: Key
    signing_keys: tuple[Key, ...]
    revoked: Mapping[str, int] = field(default_factory=dict)

    @property
    def issuer(self) -> Key:
        return self.signing_keys[0]

    @property
    def signer(self) -> Signer:
        return Signer(self.account.public, self.signing_keys, self.revoked)


@dataclass(frozen=True, slots=True)
class Signer:
    """What issues users: the THORN account's public key and its signing keys, the first
    signing, all of them trusted when a JWT comes back for renewal (a rotation's old one
    too); `revoked` as in `Trust`. Topology holds one of these, never the account's key."""

    account: str
    keys: tuple[Key, ...]
    revoked: Mapping[str, int] = field(default_factory=dict)


def new_trust() -> Trust:
    """Fresh keys: an operator, the system account, the THORN account and its signing key."""
    return Trust(
        operator=new_key("operator"),
        system=new_key("account"),
        account=new_key("account"),
        signing_keys=(new_key("account"),),
    )


def operator_jwt(trust: Trust, *, now: float) -> str:
    nats = {"system_account": trust.system.public}
    return encode("operator", trust.operator.public, "THORN", nats, trust.operator, now=now)


def account_jwt(trust: Trust, *, now: float) -> str:
    """The THORN account: unlimited, JetStream on, its signing keys and revocations."""
    nats: dict[str, object] = {
        "limits": {**_UNLIMITED, **_JETSTREAM},
        "signing_keys": [key.public for key in trust.signing_keys],
        "default_permissions": {"pub": {}, "sub": {}},
    }
    if trust.revoked:
        nats["revocations"] = dict(trust.revoked)
    return encode("account", trust.account.public, THORN_ACCOUNT, nats, trust.operator, now=now)


def system_jwt(trust: Trust, *, now: float) -> str:
    nats = {"limits": dict(_UNLIMITED), "default_permissions": {"pub": {}, "sub": {}}}
    return encode("account", trust.system.public, SYSTEM_ACCOUNT, nats, trust.operator, now=now)


def server_settings(trust: Trust, *, now: float, operator: str | None = None) -> dict[str, Any]:
    """nats-server's operator-mode settings: the operator's JWT (`operator`: one signed
    before, which a running server must keep seeing; default a new one), the system account,
    and both accounts preloaded into a memory resolver (static: a change of account, such as
    a revocation, is a new configuration and a reload)."""
    return {
        "operator": operator if operator is not None else operator_jwt(trust, now=now),
        "system_account": trust.system.public,
        "resolver": "MEMORY",
        "resolver_preload": {
            trust.system.public: system_jwt(trust, now=now),
            trust.account.public: account_jwt(trust, now=now),
        },
    }


def server_config(trust: Trust, *, now: float, operator: str | None = None) -> str:
    """`server_settings` as lines of a nats-server configuration file."""
    settings = server_settings(trust, now=now, operator=operator)
    lines = [
        f"operator: {json.dumps(settings['operator'])}",
        f"system_account: {settings['system_account']}",
        f"resolver: {settings['resolver']}",
        "resolver_preload: {",
        *(f"  {public}: {json.dumps(token)}" for public, token in
          settings["resolver_preload"].items()),
        "}",
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


def user_jwt(
    permissions: Permissions,
    user: str,
    signer: Signer,
    *,
    now: float,
    lifetime: float | None,
    name: str | None = None,
) -> str:
    """A user JWT for public key `user` with `permissions`, signed by the THORN account's
    current signing key, expiring `lifetime` seconds from `now` (None: never)."""
    nats = {
        **permissions.claims(),
        "subs": -1, "data": -1, "payload": -1,
        "issuer_account": signer.account,
        "tags": [f"role:{permissions.role}"],
    }  # fmt: skip
    expires = now + lifetime if lifetime is not None else None
    label = name or f"{permissions.role}:{permissions.identity}"
    return encode("user", user, label, nats, signer.keys[0], now=now, expires=expires)


def user_creds(
    permissions: Permissions, trust: Trust, *, now: float, lifetime: float | None
) -> str:
    """A whole .creds file for a new key pair with `permissions` (the seed is in it)."""
    user = new_key("user")
    token = user_jwt(permissions, user.public, trust.signer, now=now, lifetime=lifetime)
    return creds(token, user)


def check_issued(token: str, signer: Signer, *, node: str) -> Claims:
    """A user JWT an agent presents for renewal: issued by one of the THORN account's signing
    keys, for the agent `node`, not revoked. Expiry is not checked: an agent may renew late
    (the server refuses an expired JWT; this one came over a connection it accepted)."""
    claims = decode(token, trusted=tuple(key.public for key in signer.keys))
    if claims.type != "user" or claims.nats.get("issuer_account") != signer.account:
        raise JwtError("not a user of the THORN account")
    if claims.name != f"agent:{node}":
        raise JwtError(f"issued for {claims.name!r}, not for agent {node!r}")
    revoked_at = signer.revoked.get(claims.subject)
    if revoked_at is not None and claims.issued_at <= revoked_at:
        raise JwtError("its key is revoked")
    return claims


def renew_at(claims: Claims) -> float | None:
    """When an agent holding `claims` should renew (None: they never expire)."""
    if claims.expires is None:
        return None
    return claims.issued_at + (claims.expires - claims.issued_at) * RENEW_AFTER


def vnis_of(claims: Claims) -> set[int]:
    """The VNIs an agent's JWT lets it read (from its consumer-create allowances)."""
    found: set[int] = set()
    for subject in claims.nats.get("pub", {}).get("allow", []):
        head, sep, tail = str(subject).partition(".vni.")
        if sep and head.startswith("$JS.API.CONSUMER.CREATE."):
            number = tail.split(".", 1)[0]
            if number.isdigit():
                found.add(int(number))
    return found


def agent_vnis(memberships: Iterable[tuple[str, int]], node: str) -> list[int]:
    """The VNIs `node` is a member of, from (host, vni) pairs (its workloads)."""
    return sorted({vni for host, vni in memberships if host == node})
