"""Drain: how a worker lets go of its clients on deploy, without a reconnect storm."""

from __future__ import annotations

import asyncio
import logging
import random

from app.errors import CloseCode
from app.sockets.hub import Hub

logger = logging.getLogger(__name__)

# A batch at most every 100 ms: finer pacing buys nothing and costs wake-ups.
_MIN_BATCH_INTERVAL_S = 0.1


async def drain(hub: Hub, window_s: float, close_timeout_s: float) -> None:
    """Stop being ready, then close every connection with 1012 over ``window_s``.

    Readiness (``/readyz``) fails at once and new upgrades are refused with 1012. Open
    connections are closed in random order, in equal batches spaced evenly over the window,
    so their reconnects reach the other workers spread out rather than all at once. Returns
    when every connection is gone, or ``close_timeout_s`` after the last batch.
    """
    hub.draining = True
    conns = list(hub.connections)
    random.shuffle(conns)
    logger.info("draining %d connections over %.1f s", len(conns), window_s)
    batches = max(1, min(len(conns), int(window_s / _MIN_BATCH_INTERVAL_S)))
    interval = window_s / batches
    for n in range(batches):
        for conn in conns[n * len(conns) // batches : (n + 1) * len(conns) // batches]:
            conn.close(CloseCode.SERVICE_RESTART, "draining: reconnect")
        if n + 1 < batches:
            await asyncio.sleep(interval)
    try:
        async with asyncio.timeout(close_timeout_s + 1):
            while hub.connections:  # noqa: ASYNC110 - a few polls, once per process lifetime
                await asyncio.sleep(0.05)
    except TimeoutError:
        logger.warning("drain: %d connections still open at the deadline", len(hub.connections))
    logger.info("drained")
