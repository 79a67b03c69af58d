"""Uvicorn options derived from the settings, shared by ``python -m app`` and Gunicorn."""

from __future__ import annotations

from typing import Any

from app.settings import Settings


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """Keyword arguments for :class:`uvicorn.Config` that the chat service depends on."""
    return {
        "loop": "uvloop",
        "http": "httptools",
        # The sans-I/O implementation: the fastest here, and it leaves pings to our heartbeat.
        "ws": "websockets-sansio",
        "ws_max_size": settings.max_frame_bytes,
        "ws_per_message_deflate": settings.ws_per_message_deflate,
        "ws_ping_interval": None,
        "ws_ping_timeout": None,
        "lifespan": "on",
        "server_header": False,
    }
