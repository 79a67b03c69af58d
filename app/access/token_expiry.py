"""Token expiry of open connections (``jwt`` mode): one task per worker, no timer per socket.

Once a second it looks at every connection with a token: ``CHAT_TOKEN_REFRESH_BEFORE_S``
before expiry the connection gets one ``{"type":"refresh","exp":…}`` frame; a connection whose
token has expired without an ``auth`` frame bringing a new one is closed with 4002.
"""

from __future__ import annotations

import asyncio
import time

from app.errors import CloseCode
from app.protocol import refresh_frame
from app.sockets.hub import Hub

CHECK_INTERVAL_S = 1.0


def check_tokens(hub: Hub, refresh_before_s: float, now: float) -> None:
    for conn in list(hub.connections):
        expires_at = conn.identity.expires_at
        if expires_at is None or conn.closing:
            continue
        if now >= expires_at:
            conn.close(CloseCode.TOKEN_EXPIRED, "token expired: reconnect with a new one")
        elif now >= expires_at - refresh_before_s and not conn.refresh_asked:
            conn.refresh_asked = True
            conn.offer(refresh_frame(expires_at))


async def run_token_expiry(hub: Hub, refresh_before_s: float) -> None:
    """Run until cancelled."""
    while True:
        await asyncio.sleep(CHECK_INTERVAL_S)
        check_tokens(hub, refresh_before_s, time.time())
