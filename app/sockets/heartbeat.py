"""Heartbeat: one task per worker that pings every connection and closes the silent ones.

Browsers cannot see WebSocket protocol pings, and uvicorn's default WebSocket implementation
never sends them, so the heartbeat is in the application protocol: every
``heartbeat_interval_s`` each connection gets ``{"type":"ping"}``; a connection that has sent
no frame at all (a ``pong`` or anything else) within ``heartbeat_timeout_s`` of that ping is
closed with 4009. One task serves every connection: no per-connection timer. Only
connections that have their ``hello`` are pinged (sockets still to authenticate have their
own timeout, see :mod:`app.access.pending`).

The pings are spread over the interval: the worker keeps its connections in ``SLICES``
groups (:class:`app.sockets.slices.Slices`), and each tick of ``interval / SLICES`` (at least
:data:`MIN_TICK_S`: several groups a tick under a short interval) pings one group and checks
the group pinged ``timeout`` before, visiting those groups' connections only. A worker with
10,000 sockets sends ~10 pings a tick (every ~24 ms at the default 25 s), and gets as many
pongs back, which arrive together: each costs what any frame read costs, so the pings of a
tick are what the loop is held for. Pinging every socket in one loop iteration stalled every
message of that moment ~100 ms (the small-rooms benchmark); 50 slices, each tick walking every
connection, still held the loop a few ms three times a second, the p99 of small rooms; 256
slices, a tick's 40 pongs.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Collection
from typing import TYPE_CHECKING, Final

from app.errors import CloseCode
from app.protocol import PING_FRAME
from app.sockets.slices import SLICES

if TYPE_CHECKING:
    from app.sockets.hub import Hub

MIN_TICK_S: Final = 0.01


async def run_heartbeat(hub: Hub, interval_s: float, timeout_s: float) -> None:
    """Run until cancelled. Requires ``timeout_s < interval_s``.

    Every ``interval_s / SLICES`` the next group of connections is pinged (the next groups,
    as many as make a tick :data:`MIN_TICK_S` long), and those of the groups pinged
    ``timeout_s`` ago that stayed silent are closed."""
    loop = asyncio.get_running_loop()
    nbytes = len(PING_FRAME)
    per_tick = max(1, math.ceil(SLICES * MIN_TICK_S / interval_s))
    tick = interval_s * per_tick / SLICES
    due: deque[tuple[float, int, float]] = deque()  # (check at, slice, pinged at)
    part = 0
    while True:
        await asyncio.sleep(tick)
        now = loop.time()
        checks: dict[int, float] = {}  # slice -> when it was pinged
        while due and due[0][0] <= now:
            _, checked, pinged_at = due.popleft()
            checks[checked] = pinged_at
        parts = [(part + n) % SLICES for n in range(per_tick)]
        _tick(hub, parts, checks, nbytes)
        due.extend((now + timeout_s, pinged, now) for pinged in parts)
        part = (part + per_tick) % SLICES


def _tick(hub: Hub, parts: Collection[int], checks: dict[int, float], nbytes: int) -> None:
    """Ping the groups ``parts``; close the connections of the groups in ``checks`` silent since
    their ping. A function of its own, so that no connection stays referenced by a loop
    variable between ticks (a closed connection must be freed at once).

    Only greeted connections count. One greeted after its group's ping was not pinged, and
    its ``last_seen`` (set at its greeting) is after that ping: it is spared."""
    for checked, pinged_at in checks.items():
        if checked in parts:  # pinged again now (a timeout of a whole interval): not judged
            continue
        for conn in hub.slices.group(checked):
            if conn.greeted and conn.last_seen < pinged_at:
                conn.close(CloseCode.HEARTBEAT_TIMEOUT, "heartbeat timeout")
    for part in parts:
        for conn in hub.slices.group(part):
            if conn.greeted:
                conn.offer(PING_FRAME, nbytes)
