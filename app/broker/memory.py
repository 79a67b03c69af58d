"""MemoryBroker: the embedded, in-process broker for one worker (``make run``, tests)."""

from __future__ import annotations

import time
from collections.abc import Callable

from app.broker import OnMessage, Published
from app.dedup import RecentIds
from app.errors import BrokerUnavailable
from app.protocol import encode_message


class MemoryBroker:
    """A :class:`~app.broker.Broker` that lives in this process only.

    ``publish`` delivers synchronously, before it returns, so the publisher's own ``message``
    frame is always queued before its ``ack``. Ids come from one counter for all rooms that is
    never below ``1000 * (ms since the epoch)``: they increase within every room and, as long
    as the clock does not go back, across restarts too. Only valid with a single worker: other
    processes never see these messages (the app refuses to start several workers with it).
    """

    def __init__(
        self,
        dedup_ttl_s: float,
        dedup_max_entries: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._on_message: OnMessage | None = None
        self._subscribed: set[str] = set()
        self._last_id = 0
        self._recent = RecentIds(dedup_ttl_s, dedup_max_entries)
        self._clock = clock

    @property
    def ready(self) -> bool:
        return self._on_message is not None

    async def start(self, on_message: OnMessage) -> None:
        self._on_message = on_message

    async def stop(self) -> None:
        self._on_message = None
        self._subscribed.clear()

    async def subscribe(self, room: str) -> None:
        self._subscribed.add(room)

    async def unsubscribe(self, room: str) -> None:
        self._subscribed.discard(room)

    async def publish(self, room: str, user: str, text: str, cid: str | int | None) -> Published:
        if self._on_message is None:
            raise BrokerUnavailable("the broker is not running")
        now = self._clock()
        key = (room, user, cid)
        if cid is not None:
            first = self._recent.get(key, now)
            if first is not None:
                return Published(first, duplicate=True)
        ts_ms = int(now * 1000)
        message_id = self._last_id = max(self._last_id + 1, ts_ms * 1000)
        if cid is not None:
            self._recent.add(key, message_id, now)
        if room in self._subscribed:
            self._on_message(room, encode_message(room, message_id, user, text, ts_ms))
        return Published(message_id)
