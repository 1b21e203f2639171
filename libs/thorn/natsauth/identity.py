"""Who a creds file says its holder is, and where that identity receives its replies: what a
client needs to connect (no THORN module beyond the JWT reader, so the bus can import it)."""

from __future__ import annotations

from pathlib import Path

from thorn.natsauth.jwt import JwtError, decode, read_creds

INBOX_ROOT = "_I"


def inbox_prefix(role: str, name: str) -> str:
    """Where an identity gets its replies and deliveries: `_I.<role>.<name>`, the name one
    token (a node name's dots become '~', which no name contains, so node "a"'s inbox never
    covers node "a.b"'s; and an agent's role token keeps a node called "topology" out of the
    topology service's)."""
    return f"{INBOX_ROOT}.{role}.{name.replace('.', '~')}"


def identity_of(creds_file: Path) -> tuple[str, str]:
    """(role, name) of the identity in a creds file, from its JWT's name `role:name`;
    `JwtError` naming the file when it cannot be read or is not one THORN issued."""
    try:
        text = creds_file.read_text()
    except OSError as exc:
        raise JwtError(f"{creds_file}: cannot read it ({exc.strerror})") from None
    try:
        token, _ = read_creds(text)
        role, sep, name = decode(token).name.partition(":")
    except JwtError as exc:
        raise JwtError(f"{creds_file}: {exc}") from None
    if not sep:
        raise JwtError(f"{creds_file}: its JWT is not one THORN issued (no role in its name)")
    return role, name


def inbox_of(creds_file: Path) -> str | None:
    """The inbox prefix the identity in `creds_file` may receive on (None: an admin, who may
    use nats-py's default)."""
    role, name = identity_of(creds_file)
    return None if role == "admin" else inbox_prefix(role, name)
