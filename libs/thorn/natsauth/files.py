"""THORN's NATS trust material on disk: what `thorn-run` and `thornctl bus init` write, what
the servers, the services and the issuer read.

    <dir>/operator.seed  system.seed  account.seed      the keys (0600; the operator's is
    <dir>/signing.seed                                   needed only to change the account)
    <dir>/signing-previous.seed                          while rotating: still trusted
    <dir>/issuer.seeds                                   both, the current first: topology's
    <dir>/revoked.json                                   user keys refused, {key: since}
    <dir>/operator.jwt  nats-auth.conf                   operator mode, for nats-server
    <dir>/nats-auth-values.yaml                          ... for the NATS Helm chart
    <dir>/creds/<name>.creds                             one identity each (0600)

Keys are made once and kept: JetStream keeps a stream under its account's public key, so a
new THORN account would start with no streams. Users are issued again whenever asked.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from thorn.natsauth.issue import (
    Signer,
    Trust,
    new_trust,
    operator_jwt,
    server_config,
    server_settings,
    user_creds,
)
from thorn.natsauth.jwt import (
    JwtError,
    Key,
    decode,
    key_from_seed,
    kind_of,
    new_key,
    read_creds,
)
from thorn.natsauth.permissions import Permissions

SERVER_CONFIG = "nats-auth.conf"
_SEEDS = ("operator", "system", "account", "signing")
PREVIOUS_SIGNING = "signing-previous.seed"
ISSUER_SEEDS = "issuer.seeds"  # THORN_NATS_ISSUER_SEED of topology
OPERATOR_JWT = "operator.jwt"
CHART_VALUES = "nats-auth-values.yaml"
REVOKED = "revoked.json"


def write_secret(path: Path, text: str) -> None:
    """Write `text` to `path` readable by its owner only, atomically (a reader sees the old
    file or the new one, never half of one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(partial, 0o600)
        os.replace(partial, path)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise


def read_seed(path: Path, variable: str | None = None) -> Key:
    """An nkey seed from a file; `JwtError` naming the file (and setting) otherwise."""
    where = f"{variable}={path}" if variable else str(path)
    try:
        return key_from_seed(path.read_text())
    except OSError as exc:
        raise JwtError(f"{where}: cannot read the seed ({exc.strerror})") from None
    except JwtError:
        raise JwtError(f"{where}: not an nkey seed") from None


@dataclass(frozen=True, slots=True)
class AuthDir:
    """A directory of trust material, its keys loaded."""

    path: Path
    trust: Trust

    @classmethod
    def open(cls, path: Path, *, create: bool = True) -> AuthDir:
        """Load the keys under `path`, making any that are missing when `create` (a new
        directory gets all four)."""
        keys: dict[str, Key] = {}
        fresh = new_trust()
        made = {"operator": fresh.operator, "system": fresh.system, "account": fresh.account,
                "signing": fresh.issuer}  # fmt: skip
        for name in _SEEDS:
            file = path / f"{name}.seed"
            if file.exists():
                keys[name] = read_seed(file)
            elif create:
                write_secret(file, made[name].seed + "\n")
                keys[name] = made[name]
            else:
                raise JwtError(f"{file}: missing (run `thornctl bus init {path}`)")
        signing = [keys["signing"]]
        if (path / PREVIOUS_SIGNING).exists():
            signing.append(read_seed(path / PREVIOUS_SIGNING))
        revoked: dict[str, int] = {}
        if (path / REVOKED).exists():
            revoked = {str(k): int(v) for k, v in json.loads((path / REVOKED).read_text()).items()}
        trust = Trust(keys["operator"], keys["system"], keys["account"], tuple(signing), revoked)
        made_dir = cls(path, trust)
        made_dir._write_issuer()
        return made_dir

    @property
    def issuer_seeds(self) -> Path:
        """The signing keys' seeds, the current one first: topology's THORN_NATS_ISSUER_SEED."""
        return self.path / ISSUER_SEEDS

    def _write_issuer(self) -> None:
        text = "".join(key.seed + "\n" for key in self.trust.signing_keys)
        if not self.issuer_seeds.exists() or self.issuer_seeds.read_text() != text:
            write_secret(self.issuer_seeds, text)

    @property
    def server_config(self) -> Path:
        return self.path / SERVER_CONFIG

    def creds_path(self, name: str) -> Path:
        return self.path / "creds" / f"{name}.creds"

    @property
    def operator_jwt(self) -> Path:
        return self.path / OPERATOR_JWT

    def write_server_config(self, *, now: float) -> Path:
        """The operator-mode lines for nats-server (`include` them, or pass with -c). The
        operator's JWT is written once and kept: a running server reloads a new account JWT
        (a revocation, a signing key) but refuses another operator."""
        if not self.operator_jwt.exists():
            write_secret(self.operator_jwt, operator_jwt(self.trust, now=now) + "\n")
        token = self.operator_jwt.read_text().strip()
        write_secret(self.server_config, server_config(self.trust, now=now, operator=token))
        # The same for the official NATS Helm chart (1.x), merged into its nats.conf.
        merge = server_settings(self.trust, now=now, operator=token)
        write_secret(self.chart_values, json.dumps({"config": {"merge": merge}}, indent=1) + "\n")
        return self.server_config

    @property
    def chart_values(self) -> Path:
        """Helm values (JSON is YAML) giving the NATS chart the operator-mode settings."""
        return self.path / CHART_VALUES

    def write_creds(
        self, permissions: Permissions, *, now: float, lifetime: float | None, name: str
    ) -> Path:
        """A new identity with `permissions`, as `creds/<name>.creds`."""
        path = self.creds_path(name)
        write_secret(path, user_creds(permissions, self.trust, now=now, lifetime=lifetime))
        return path

    def revoke(self, public: str, *, at: float) -> AuthDir:
        """Refuse user key `public` from `at` on (every JWT issued for it until then). The
        servers learn it from their configuration: write it and reload them."""
        kind_of(public)  # a user key, checked
        revoked = {**self.trust.revoked, public: int(at)}
        write_secret(self.path / REVOKED, json.dumps(revoked, indent=1) + "\n")
        return replace(self, trust=replace(self.trust, revoked=revoked))

    def rotate_signing_key(self) -> AuthDir:
        """A new signing key users are issued with from now on; the current one stays trusted
        (signing-previous.seed) until `retire_previous_signing_key`, once every identity
        issued with it has new credentials."""
        current = self.trust.issuer
        fresh = new_key("account")
        write_secret(self.path / PREVIOUS_SIGNING, current.seed + "\n")
        write_secret(self.path / "signing.seed", fresh.seed + "\n")
        rotated = replace(self, trust=replace(self.trust, signing_keys=(fresh, current)))
        rotated._write_issuer()
        return rotated

    def retire_previous_signing_key(self) -> AuthDir:
        """Stop trusting the signing key before the last rotation (its users are refused)."""
        (self.path / PREVIOUS_SIGNING).unlink(missing_ok=True)
        retired = replace(self, trust=replace(self.trust, signing_keys=self.trust.signing_keys[:1]))
        retired._write_issuer()
        return retired


def read_signer(seeds: Path, creds: Path) -> Signer:
    """Topology's issuer: the signing key seeds in `seeds` (THORN_NATS_ISSUER_SEED: one per
    line, the first signs; a rotation's previous one may follow) and the THORN account they
    sign for, read from topology's own creds (THORN_NATS_CREDS: its JWT names its account)."""
    try:
        lines = [line.strip() for line in seeds.read_text().splitlines() if line.strip()]
    except OSError as exc:
        raise JwtError(f"THORN_NATS_ISSUER_SEED={seeds}: cannot read it ({exc.strerror})") from None
    try:
        keys = tuple(key_from_seed(line) for line in lines)
    except JwtError:
        raise JwtError(f"THORN_NATS_ISSUER_SEED={seeds}: a line is not an nkey seed") from None
    if not keys or any(key.kind != "account" for key in keys):
        raise JwtError(f"THORN_NATS_ISSUER_SEED={seeds}: expected account signing key seeds")
    try:
        token, _ = read_creds(creds.read_text())
        account = str(decode(token).nats.get("issuer_account", ""))
    except (OSError, JwtError) as exc:
        raise JwtError(f"THORN_NATS_CREDS={creds}: cannot tell the account ({exc})") from None
    if not account:
        raise JwtError(f"THORN_NATS_CREDS={creds}: its JWT names no issuing account")
    return Signer(account, keys)
