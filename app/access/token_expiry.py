"""Token expiry of open connections (``jwt`` mode): one task per worker, no timer per socket.

Once a second it looks at every connection with a token: ``CHAT_TOKEN_REFRESH_BEFORE_S``
before expiry the connection gets one ``{"type":"refresh","exp":…}`` frame; a connection whose
token has expired without an ``auth`` frame bringing a new one is closed with 4002. It looks
at :data:`CHUNK` connections at a time, letting the loop run between: one walk of 10,000 held
it about a millisecond, which every message of that moment waited for.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Final

from app.errors import CloseCode
from app.protocol import refresh_frame
from app.sockets.hub import Hub

if TYPE_CHECKING:
    from app.sockets.connection import Connection

CHECK_INTERVAL_S = 1.0
CHUNK: Final = 1000


def check_tokens(conns: Iterable[Connection], refresh_before_s: float, now: float) -> None:
    """Ask ``conns`` due for a refresh for one; close those whose token has expired."""
    for conn in conns:
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
        conns = list(hub.connections)
        for start in range(0, len(conns), CHUNK):
            if start:
                await asyncio.sleep(0)
            check_tokens(conns[start : start + CHUNK], refresh_before_s, time.time())
