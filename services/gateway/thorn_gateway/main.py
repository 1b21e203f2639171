"""`thorn-gateway`: the entry point, one URL for every service (THORN_UPSTREAMS)."""

from __future__ import annotations

import sys

from thorn.config import Settings
from thorn.service import refuse_tls, serve, start_logging
from thorn.tls import TlsSettingError
from thorn_gateway.app import create_app


def main() -> None:
    settings = Settings.from_environment("thorn-gateway")
    start_logging(settings)
    try:
        settings.upstream_urls  # noqa: B018 - a misconfiguration stops the start, named
    except ValueError as exc:
        sys.exit(f"thorn-gateway: {exc}")
    try:
        settings.upstream_tls  # noqa: B018 - THORN_TLS_CA, checked before anything listens
    except TlsSettingError as exc:
        refuse_tls(exc)
    # X-Forwarded-For is the guard's to read (THORN_GATEWAY_TRUSTED_PROXIES), not uvicorn's.
    serve(create_app(settings), settings, trusted_proxies="")


if __name__ == "__main__":
    main()
