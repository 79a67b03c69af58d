"""Heartbeat: one task per worker that pings every connection and closes the silent ones.

Browsers cannot see WebSocket protocol pings, and uvicorn's default WebSocket implementation
never sends them, so the heartbeat is in the application protocol: every
``heartbeat_interval_s`` each connection gets ``{"type":"ping"}``; a connection that has sent
no frame at all (a ``pong`` or anything else) within ``heartbeat_timeout_s`` of that ping is
closed with 4009. One task serves every connection: no per-connection timer.
"""

from __future__ import annotations

import asyncio

from app.errors import CloseCode
from app.hub import Hub
from app.protocol import PING_FRAME


async def run_heartbeat(hub: Hub, interval_s: float, timeout_s: float) -> None:
    """Run until cancelled. Requires ``timeout_s < interval_s``."""
    loop = asyncio.get_running_loop()
    nbytes = len(PING_FRAME)
    while True:
        await asyncio.sleep(interval_s - timeout_s)
        pinged_at = loop.time()
        for conn in hub.connections:
            conn.offer(PING_FRAME, nbytes)
        await asyncio.sleep(timeout_s)
        for conn in list(hub.connections):
            if conn.last_seen < pinged_at:
                conn.close(CloseCode.HEARTBEAT_TIMEOUT, "heartbeat timeout")
