"""Presence announcements, throttled for big rooms.

Up to ``presence_max_members`` present users, every arrival and departure is announced with the
user's name. Above it, announcing each change would cost O(members) frames per join (a room
filling up to N members would send ~N²/2 frames), so only the count is announced, at most once
per ``presence_count_interval_s`` per room and worker; changes in between are folded into one
trailing announcement with the count as it is then.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

import orjson

from app.protocol import presence_frame

logger = logging.getLogger(__name__)


class PresenceAnnouncer:
    """Sends ``presence`` frames through ``publish(room, payload)``; ``count(room)`` is the
    current number of present users."""

    def __init__(
        self,
        publish: Callable[[str, bytes], Awaitable[None]],
        count: Callable[[str], Awaitable[int]],
        max_members: int,
        count_interval_s: float,
    ) -> None:
        self._publish = publish
        self._count = count
        self._max_members = max_members
        self._interval = count_interval_s
        self._last_count_sent: dict[str, float] = {}
        self._trailing: dict[str, asyncio.Task[None]] = {}
        # Told of every transition of an internal room (a name starting with "~", which no
        # client room has): who is online anywhere, for webhooks (app.webhooks).
        self.internal_listener: Callable[[str, str, str], Awaitable[None]] | None = None

    async def announce(self, room: str, event: str, user: str) -> None:
        if room.startswith("~"):  # internal: nobody to tell in the room
            if self.internal_listener is not None:
                await self.internal_listener(room, event, user)
            return
        count = await self._count(room)
        if count <= self._max_members:
            await self._publish(room, orjson.dumps(presence_frame(room, event, user, count)))
            return
        wait = self._last_count_sent.get(room, 0.0) + self._interval - time.monotonic()
        if wait <= 0:
            await self._send_count(room, count)
        elif room not in self._trailing:
            self._trailing[room] = asyncio.create_task(self._send_later(room, wait))

    async def _send_count(self, room: str, count: int) -> None:
        self._last_count_sent[room] = time.monotonic()
        await self._publish(room, orjson.dumps(presence_frame(room, "", None, count)))

    async def _send_later(self, room: str, wait: float) -> None:
        try:
            await asyncio.sleep(wait)
            await self._send_count(room, await self._count(room))
        except Exception as exc:  # a lost count update is harmless; the next change resends
            logger.warning("presence count for %s not sent: %r", room, exc)
        finally:
            self._trailing.pop(room, None)

    def forget(self, room: str) -> None:
        """The room has no local members any more: drop its throttling state."""
        self._last_count_sent.pop(room, None)

    async def close(self) -> None:
        tasks = list(self._trailing.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
