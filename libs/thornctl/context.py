"""What every thornctl command shares: the run's state (one API client over --url), paging
options, and the time formats of API data."""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

import typer

from thorn.tls import TlsSettingError, client_context
from thornctl.client import Client
from thornctl.errors import CliError, ExitCode
from thornctl.render import Out

DEFAULT_URL = "http://127.0.0.1:8080"
DEFAULT_TIMEOUT = 60.0


@dataclass
class State:
    """The global options, and the one client every command talks to: the entry point
    serves every service's API under one URL."""

    url: str
    token: str | None
    timeout: float
    out: Out
    verify: ssl.SSLContext | bool = True  # how an https:// URL's certificate is checked
    _client: Client | None = field(default=None, init=False)

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = Client(self.url, self.token, self.timeout, verify=self.verify)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


def verify_with(ca: Path | None) -> ssl.SSLContext:
    """--ca: a TLS context trusting that CA file (checked now: a missing or non-PEM file is
    a CliError, exit 66); None: the system's CAs (OpenSSL's default paths, SSL_CERT_FILE)."""
    try:
        return client_context(ca, ca_variable="--ca")
    except TlsSettingError as exc:
        raise CliError(str(exc), ExitCode.NOINPUT) from None


def state_of(ctx: typer.Context) -> State:
    state = ctx.find_object(State)
    assert state is not None, "main() sets the state before any command runs"
    return state


Limit = Annotated[
    int | None, typer.Option("--limit", min=1, max=1000, help="Page size (server default 100).")
]
Offset = Annotated[int | None, typer.Option("--offset", min=0, help="Items to skip.")]
All = Annotated[bool, typer.Option("--all", help="Fetch every page.")]


def fetch_page(
    state: State, path: str, limit: int | None, offset: int | None, everything: bool, /, **q: Any
) -> dict[str, Any]:
    """One page of a list (or, with --all, every page as one); `q`: the query filters."""
    if everything and (limit is not None or offset is not None):
        raise typer.BadParameter("cannot be combined with --limit or --offset", param_hint="--all")
    return state.client.pages(path, limit=limit, offset=offset, everything=everything, **q)


_AGO = re.compile(r"^(\d{1,6})([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def since_value(value: str | None, now: datetime | None = None) -> str | None:
    """`--since`: `15m`, `2h`, `7d` before now, or an ISO 8601 time with a timezone (the API
    checks that one and names `since` if it is not)."""
    if value is None:
        return None
    ago = _AGO.match(value.strip())
    if ago is None:
        return value
    delta = timedelta(**{_UNITS[ago.group(2)]: int(ago.group(1))})
    return ((now or datetime.now(UTC)) - delta).isoformat()


def when(iso: str | None, fmt: str = "%Y-%m-%d %H:%M:%S.%fZ") -> str:
    """An API timestamp in UTC, always to the microsecond (failover hops are that close)."""
    if iso is None:
        return "-"
    return datetime.fromisoformat(iso).astimezone(UTC).strftime(fmt)


Since = Annotated[
    str | None,
    typer.Option("--since", help="Started after: 15m, 2h, 7d ago, or an ISO 8601 time."),
]
