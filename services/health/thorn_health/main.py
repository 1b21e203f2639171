"""`thorn-health`: health: turns agent reports into link state (core: issue 5)."""

from __future__ import annotations

from thorn.config import Settings
from thorn.events import AGENT_REPORT_ALL
from thorn.service import serve, start_logging
from thorn.shell import shell_app


def main() -> None:
    settings = Settings()
    start_logging(settings)
    serve(shell_app("health", settings, [AGENT_REPORT_ALL]), settings)


if __name__ == "__main__":
    main()
