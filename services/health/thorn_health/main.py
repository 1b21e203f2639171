"""`thorn-health`: turns agent reports into link health (`health.link.<id>`) and history."""

from __future__ import annotations

from thorn.config import Settings
from thorn.service import serve, start_logging
from thorn_health.app import create_app


def main() -> None:
    settings = Settings.from_environment("thorn-health")
    start_logging(settings)
    serve(create_app(settings), settings)


if __name__ == "__main__":
    main()
