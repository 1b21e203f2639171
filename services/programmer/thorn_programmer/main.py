"""`thorn-programmer`: programmer: the per-node agent that programs the datapath (core: issue 4)."""

from __future__ import annotations

from thorn.config import Settings
from thorn.events import PATHS_CHANGED
from thorn.service import serve, start_logging
from thorn.shell import shell_app


def main() -> None:
    settings = Settings()
    start_logging(settings)
    serve(shell_app("programmer", settings, [PATHS_CHANGED]), settings)


if __name__ == "__main__":
    main()
