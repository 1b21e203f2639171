"""A nats-server in operator mode (THORN's decentralised auth) for tests, and clients that
connect to it as one THORN identity each, keeping the errors the server sends them."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import nats
import nats.errors
from nats.aio.client import Client as NatsClient

from thorn.bus import Bus
from thorn.natsauth.files import AuthDir
from thorn.natsauth.identity import inbox_of
from thorn.natsauth.permissions import Permissions
from thorn.natsd import EmbeddedNats


@dataclass
class Client:
    """One connection as one identity: `errors` are what the server told it asynchronously
    (a refused publish or subscription arrives so: 'Permissions Violation for ...')."""

    nc: NatsClient
    bus: Bus
    errors: list[str] = field(default_factory=list)

    def refused(self, subject: str) -> bool:
        """The server refused `subject` (nats-py hands the error over in lower case)."""
        wanted = f'"{subject.lower()}"'
        return any("permissions violation" in e.lower() and wanted in e.lower()
                   for e in self.errors)  # fmt: skip

    async def wait_refused(self, subject: str, within: float = 5.0) -> bool:
        """True once the server has said it refused `subject` (bounded wait)."""
        deadline = time.monotonic() + within
        while not self.refused(subject):
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.02)
        return True


class AuthServer:
    """An embedded nats-server trusting a fresh THORN operator (debug logging on, so an
    expired JWT's refusal is logged with its reason)."""

    def __init__(self, base: Path) -> None:
        self.auth = AuthDir.open(base / "auth")
        self.auth.write_server_config(now=time.time())
        self.server = EmbeddedNats(log_dir=base / "log", auth=self.auth.server_config)

    @property
    def url(self) -> str:
        return self.server.url

    def log(self) -> str:
        path = self.server.log_path
        return path.read_text(errors="replace") if path is not None else ""

    def creds(
        self, permissions: Permissions, *, lifetime: float | None = 3600, now: float | None = None
    ) -> Path:
        name = f"{permissions.role}-{permissions.identity}"
        return self.auth.write_creds(
            permissions, now=time.time() if now is None else now, lifetime=lifetime, name=name
        )

    @contextlib.asynccontextmanager
    async def client(
        self, permissions: Permissions, *, requests_within: float = 1.0
    ) -> AsyncIterator[Client]:
        """A connection as `permissions`' identity, its JetStream requests timing out after
        `requests_within` s (a refused request is never answered)."""
        creds = self.creds(permissions)
        errors: list[str] = []

        async def on_error(exc: Exception) -> None:
            errors.append(str(exc))

        prefix = inbox_of(creds)
        nc = await nats.connect(
            self.url, user_credentials=str(creds), error_cb=on_error, allow_reconnect=False,
            **({"inbox_prefix": prefix} if prefix else {}),
        )  # fmt: skip
        try:
            yield Client(nc, Bus(nc, permissions.identity, requests_within), errors)
        finally:
            with contextlib.suppress(nats.errors.Error):
                await nc.close()
