"""`thorn-programmer`: the per-node agent that programs the datapath from desired state."""

from __future__ import annotations

from thorn.config import Settings
from thorn.service import serve, start_logging
from thorn_programmer.app import create_app


def main() -> None:
    settings = Settings.from_environment("thorn-programmer")
    start_logging(settings)
    # asyncio's own loop: uvloop cannot carry netlink sockets ("invalid family 16").
    serve(create_app(settings), settings, loop="asyncio")


if __name__ == "__main__":
    main()
