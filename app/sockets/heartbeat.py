"""Heartbeat: one task per worker that pings every connection and closes the silent ones.

Browsers cannot see WebSocket protocol pings, and uvicorn's default WebSocket implementation
never sends them, so the heartbeat is in the application protocol: every
``heartbeat_interval_s`` each connection gets ``{"type":"ping"}``; a connection that has sent
no frame at all (a ``pong`` or anything else) within ``heartbeat_timeout_s`` of that ping is
closed with 4009. One task serves every connection: no per-connection timer. Only
connections that have their ``hello`` are pinged (sockets still to authenticate have their
own timeout, see :mod:`app.access.pending`).

The pings are spread over the interval, in :data:`SLICES` groups of connections: a worker
with 20,000 sockets sends ~400 pings at a time, and gets as many pongs back, instead of
20,000 of each in one loop iteration (a stall of ~100 ms that every message of that moment
waited for, measured in the small-rooms benchmark).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Final

from app.errors import CloseCode
from app.protocol import PING_FRAME
from app.sockets.hub import Hub

SLICES: Final = 50


async def run_heartbeat(hub: Hub, interval_s: float, timeout_s: float) -> None:
    """Run until cancelled. Requires ``timeout_s < interval_s``.

    Every ``interval_s / SLICES`` the next slice of connections (by identity hash) is pinged,
    and those of the slices pinged ``timeout_s`` ago that stayed silent are closed: one pass
    over the connections a tick."""
    loop = asyncio.get_running_loop()
    nbytes = len(PING_FRAME)
    tick = interval_s / SLICES
    due: deque[tuple[float, int, float]] = deque()  # (check at, slice, pinged at)
    part = 0
    while True:
        await asyncio.sleep(tick)
        now = loop.time()
        checks: dict[int, float] = {}  # slice -> when it was pinged
        while due and due[0][0] <= now:
            _, checked, pinged_at = due.popleft()
            checks[checked] = pinged_at
        _tick(hub, part, checks, nbytes)
        due.append((now + timeout_s, part, now))
        part = (part + 1) % SLICES


def _tick(hub: Hub, part: int, checks: dict[int, float], nbytes: int) -> None:
    """Ping slice ``part``; close the connections of the slices in ``checks`` silent since
    their ping. A function of its own, so that no connection stays referenced by a loop
    variable between ticks (a closed connection must be freed at once).

    Only greeted connections count. One greeted after its slice's ping was not pinged, and
    its ``last_seen`` (set at its greeting) is after that ping: it is spared."""
    for conn in list(hub.connections):
        if not conn.greeted:
            continue
        which = hash(conn) % SLICES
        if which == part:
            conn.offer(PING_FRAME, nbytes)
        elif which in checks and conn.last_seen < checks[which]:
            conn.close(CloseCode.HEARTBEAT_TIMEOUT, "heartbeat timeout")
