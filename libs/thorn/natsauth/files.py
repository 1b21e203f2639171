"""THORN's NATS trust material on disk: what `thorn-run` and `thornctl bus init` write, what
the servers, the services and the issuer read.

    <dir>/operator.seed  system.seed  account.seed      the keys (0600; the operator's is
    <dir>/signing.seed                                   needed only to change the account)
    <dir>/nats-auth.conf                                 operator mode, for nats-server
    <dir>/creds/<name>.creds                             one identity each (0600)

Keys are made once and kept: JetStream keeps a stream under its account's public key, so a
new THORN account would start with no streams. Users are issued again whenever asked.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from thorn.natsauth.issue import Trust, new_trust, server_config, user_creds
from thorn.natsauth.jwt import JwtError, Key, key_from_seed, new_key, read_creds
from thorn.natsauth.permissions import Permissions, inbox_prefix

SERVER_CONFIG = "nats-auth.conf"
_SEEDS = ("operator", "system", "account", "signing")


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
        trust = Trust(keys["operator"], keys["system"], keys["account"], (keys["signing"],))
        return cls(path, trust)

    @property
    def server_config(self) -> Path:
        return self.path / SERVER_CONFIG

    def creds_path(self, name: str) -> Path:
        return self.path / "creds" / f"{name}.creds"

    def write_server_config(self, *, now: float) -> Path:
        """The operator-mode lines for nats-server (`include` them, or pass with -c)."""
        write_secret(self.server_config, server_config(self.trust, now=now))
        return self.server_config

    def write_creds(
        self, permissions: Permissions, *, now: float, lifetime: float | None, name: str
    ) -> Path:
        """A new identity with `permissions`, as `creds/<name>.creds`."""
        path = self.creds_path(name)
        write_secret(path, user_creds(permissions, self.trust, now=now, lifetime=lifetime))
        return path

    def revoking(self, public: str, at: float) -> AuthDir:
        """The same directory with one more user key revoked (from `at` on)."""
        revoked = {**self.trust.revoked, public: int(at)}
        return replace(self, trust=replace(self.trust, revoked=revoked))

    def with_new_signing_key(self) -> AuthDir:
        """Rotation: a new signing key users are issued with from now on, the old one still
        trusted (listed second) until every user issued with it has been renewed."""
        rotated = (new_key("account"), *self.trust.signing_keys)
        return replace(self, trust=replace(self.trust, signing_keys=rotated))


def identity_of(creds_file: Path) -> tuple[str, str]:
    """(role, name) of the identity in a creds file, from its JWT's name `role:name`."""
    from thorn.natsauth.jwt import decode

    token, _ = read_creds(creds_file.read_text())
    role, sep, name = decode(token).name.partition(":")
    if not sep:
        raise JwtError(f"{creds_file}: its JWT is not one THORN issued (no role in its name)")
    return role, name


def inbox_of(creds_file: Path) -> str | None:
    """The inbox prefix the identity in `creds_file` may receive on (None: an admin, who may
    use nats-py's default)."""
    role, name = identity_of(creds_file)
    if role == "admin":
        return None
    return inbox_prefix(role, name)  # type: ignore[arg-type]
