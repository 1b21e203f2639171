"""`thorn-health`: health: turns agent reports into link state (core: issue 5)."""

from __future__ import annotations

from thorn.config import Settings
from thorn.events import TOPOLOGY_CHANGED
from thorn.service import serve, start_logging
from thorn.shell import shell_app


def main() -> None:
    settings = Settings()
    start_logging(settings)
    serve(shell_app("health", settings, [TOPOLOGY_CHANGED]), settings)


if __name__ == "__main__":
    main()
