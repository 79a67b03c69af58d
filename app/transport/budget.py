"""The worker's memory budget for undelivered frames, shared by every connection's outbox.

Each outbox is bounded (``CHAT_OUTBOX_MAX_BYTES``), but 20,000 of them full would be gigabytes:
far above what a pod may use. The budget counts the bytes queued in all of a worker's outboxes
(``CHAT_WORKER_OUTBOX_MAX_BYTES``); when a frame takes it over, the worker cuts the slowest
consumers — those with the most queued — with 4008 until it is back under nine tenths of it.
Readers that keep up hold next to nothing, so they are never the ones cut.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class OutboxBudget:
    """Bytes queued in a worker's outboxes (``used``, kept by the outboxes), against
    ``limit``. ``over`` is called (soon, once per crossing) after a put took ``used`` above
    ``limit``; it must bring it back down."""

    __slots__ = ("_over", "_shedding", "limit", "used")

    def __init__(self, limit: int, over: Callable[[], None]) -> None:
        self.limit = limit
        self.used = 0
        self._over = over
        self._shedding = False

    def exceeded(self) -> None:
        """Called by an outbox whose put took ``used`` above ``limit`` (outboxes update
        ``used`` themselves: a put is per recipient, a method call there would cost)."""
        if not self._shedding:
            self._shedding = True
            asyncio.get_running_loop().call_soon(self._shed)

    def _shed(self) -> None:
        self._shedding = False
        if self.used > self.limit:
            self._over()
