"""Running the app under uvicorn: options from the settings, and a server that drains.

Shared by ``python -m app`` and the Gunicorn worker (:mod:`app.worker`).
"""

from __future__ import annotations

import asyncio
import signal
from types import FrameType
from typing import Any

import uvicorn

from app.settings import Settings
from app.sockets.drain import drain
from app.state import ChatState
from app.transport.uvicorn_seam import HTTP_PROTOCOL, WS_PROTOCOL, defer_signal


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """Keyword arguments for :class:`uvicorn.Config` that the chat service depends on."""
    return {
        "loop": "uvloop",
        "http": HTTP_PROTOCOL,  # httptools, without a reference cycle per upgrade
        # uvicorn's sans-I/O implementation (the fastest here, and it leaves pings to our
        # heartbeat), exposing its transport for direct writes and aborts.
        "ws": WS_PROTOCOL,
        "ws_max_size": settings.max_frame_bytes,
        "ws_per_message_deflate": settings.ws_per_message_deflate,
        "ws_ping_interval": None,
        "ws_ping_timeout": None,
        "lifespan": "on",
        "server_header": False,
        # The client address from X-Forwarded-For, when the peer is a trusted proxy.
        "proxy_headers": True,
        "forwarded_allow_ips": settings.trusted_proxies,
        "access_log": False,  # one line per request is the proxy's job; app.ops.logs has the events
        # Past the drain, uvicorn closes what is left with 1012 and waits this long for tasks.
        "timeout_graceful_shutdown": settings.close_timeout_s + 1,
    }


class DrainingServer(uvicorn.Server):
    """A uvicorn server whose first SIGTERM drains (:func:`app.sockets.drain.drain`) before it
    stops.

    A second SIGTERM, or SIGINT, stops at once the way uvicorn does (every socket gets 1012).
    """

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task[None] | None = None

    async def serve(self, sockets: Any = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets=sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        state = getattr(getattr(self.config.app, "state", None), "chat", None)
        if (
            sig == signal.SIGTERM
            and self._drain_task is None
            and self._loop is not None
            and isinstance(state, ChatState)
        ):
            defer_signal(self, sig)  # re-raised after shutdown, as uvicorn does
            self._loop.call_soon_threadsafe(self._start_drain, state)
            return
        super().handle_exit(sig, frame)

    def _start_drain(self, state: ChatState) -> None:
        if self._drain_task is None:
            self._drain_task = asyncio.create_task(self._drain_then_exit(state))

    async def _drain_then_exit(self, state: ChatState) -> None:
        settings = state.settings
        try:
            await drain(state.hub, settings.drain_window_s, settings.close_timeout_s)
        finally:
            self.should_exit = True
