"""The ASGI application: :func:`create_app` wires settings, broker, hub and heartbeat.

Uvicorn: ``uvicorn --factory app.main:create_app``; ``python -m app`` does that with the
WebSocket options taken from the settings (see :mod:`app.server`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from fastapi import FastAPI

from app import __version__
from app.abort import AbortableWebSockets
from app.api import router
from app.broker import create_broker
from app.heartbeat import run_heartbeat
from app.hub import Hub
from app.settings import Settings, load_settings
from app.state import ChatState

logger = logging.getLogger(__name__)


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app. ``settings`` defaults to the ``CHAT_*`` environment."""
    settings = settings or load_settings()
    logging.getLogger("app").setLevel(settings.log_level.upper())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        broker = create_broker(settings)
        hub = Hub(broker, settings.max_connections)
        state = ChatState(settings, broker, hub)
        app.state.chat = state
        await broker.start(hub)
        heartbeat = asyncio.create_task(
            run_heartbeat(hub, settings.heartbeat_interval_s, settings.heartbeat_timeout_s),
            name="heartbeat",
        )
        logger.info("hubbub %s ready (broker=%s)", __version__, type(broker).__name__)
        try:
            yield
        finally:
            hub.draining = True
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat
            await hub.close()
            await broker.stop()

    app = FastAPI(title="Hubbub", version=__version__, lifespan=lifespan, docs_url=None)
    app.include_router(router)
    app.add_middleware(AbortableWebSockets)
    return app
