"""`thorn-pathcomp`: disjoint red/blue paths and per-node desired state (core: issue 3)."""

from __future__ import annotations

from thorn.config import Settings
from thorn.events import HEALTH_LINK_ALL, TOPOLOGY_CHANGED
from thorn.service import serve, start_logging
from thorn.shell import shell_app


def main() -> None:
    settings = Settings()
    start_logging(settings)
    serve(shell_app("pathcomp", settings, [TOPOLOGY_CHANGED, HEALTH_LINK_ALL]), settings)


if __name__ == "__main__":
    main()
