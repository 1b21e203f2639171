"""`thorn-topology`: run the topology service."""

from __future__ import annotations

from thorn.config import Settings
from thorn.service import serve, start_logging
from thorn_topology.app import create_app


def main() -> None:
    settings = Settings.from_environment("thorn-topology")
    start_logging(settings)
    serve(create_app(settings), settings)


if __name__ == "__main__":
    main()
