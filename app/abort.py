"""Aborting a WebSocket's TCP connection, which ASGI has no message for.

A peer that stopped reading never takes our close frame, and a plain transport close waits for
the write buffer to drain, so a stuck socket would hold its buffers forever. Uvicorn hands the
app the bound ``send`` of its protocol object, which holds the asyncio (or uvloop) transport.
:class:`AbortableWebSockets`, the outermost middleware, finds that transport before any other
middleware wraps ``send`` and leaves its ``abort`` in the scope for :func:`abort`, and the
protocol object itself for :mod:`app.direct`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket

logger = logging.getLogger(__name__)
SCOPE_KEY: Final = "hubbub.abort"
# The server's protocol object for this socket, for :mod:`app.direct`.
PROTOCOL_KEY: Final = "hubbub.protocol"


class AbortableWebSockets:
    """ASGI middleware: puts the transport's ``abort`` in each WebSocket scope when it can."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            protocol = getattr(send, "__self__", None)
            abort = getattr(getattr(protocol, "transport", None), "abort", None)
            if callable(abort):
                scope[SCOPE_KEY] = abort
                scope[PROTOCOL_KEY] = protocol
        await self.app(scope, receive, send)


def abort(ws: WebSocket) -> None:
    """Drop the TCP connection under ``ws`` at once (no closing handshake)."""
    transport_abort: Callable[[], None] | None = ws.scope.get(SCOPE_KEY)
    if transport_abort is None:
        logger.warning("cannot abort a stuck WebSocket: the server exposes no transport")
        return
    transport_abort()
