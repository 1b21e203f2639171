"""Running a service process: logging, the HTTP edge and uvicorn, the same for every service."""

from __future__ import annotations

import structlog
import uvicorn
from fastapi import FastAPI

from thorn.config import Settings
from thorn.telemetry import configure_logging


def serve(app: FastAPI, settings: Settings) -> None:
    """Serve until SIGINT/SIGTERM; uvicorn drains requests and runs the lifespan's cleanup."""
    host, port = settings.host_port
    uvicorn.run(app, host=host, port=port, log_config=None, access_log=False)


def start_logging(settings: Settings) -> None:
    configure_logging(settings.log_level, settings.log_format)
    if unknown := Settings.unknown_environment():
        structlog.get_logger("thorn").warning("unknown_settings_ignored", variables=unknown)
