"""Presence announcements, coalesced, and throttled for big rooms.

Up to ``presence_max_members`` present users, every arrival and departure is announced with the
user's name. The announcements a worker makes for one room within ``presence_coalesce_s`` go
out together, as one broadcast of their frames separated by ``\n`` (which clients split, see
docs/protocol.md): when a room's members all come back at once (a reconnect storm), each
member gets their arrivals in a few writes rather than one broadcast per arrival. Above
``presence_max_members``, announcing each change would cost O(members) frames per join (a room
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
        coalesce_s: float = 0.0,
    ) -> None:
        self._publish = publish
        self._count = count
        self._max_members = max_members
        self._interval = count_interval_s
        self._coalesce_s = coalesce_s
        self._last_count_sent: dict[str, float] = {}
        self._trailing: dict[str, asyncio.Task[None]] = {}
        self._waiting: dict[str, list[bytes]] = {}  # room -> frames to go out together
        self._senders: dict[str, asyncio.Task[None]] = {}
        # Told of every transition of an internal room (a name starting with "~", which no
        # client room has): who is online anywhere, for webhooks (app.webhooks).
        self.internal_listener: Callable[[str, str, str], Awaitable[None]] | None = None

    async def announce(self, room: str, event: str, user: str, count: int | None = None) -> None:
        """``user`` arrived in (``event`` "join") or left ``room``; ``count``: the room's
        present users since (asked for when not given)."""
        if room.startswith("~"):  # internal: nobody to tell in the room
            if self.internal_listener is not None:
                await self.internal_listener(room, event, user)
            return
        if count is None:
            count = await self._count(room)
        if count <= self._max_members:
            await self._emit(room, orjson.dumps(presence_frame(room, event, user, count)))
            return
        wait = self._last_count_sent.get(room, 0.0) + self._interval - time.monotonic()
        if wait <= 0:
            await self._send_count(room, count)
        elif room not in self._trailing:
            self._trailing[room] = asyncio.create_task(self._send_later(room, wait))

    async def _emit(self, room: str, frame: bytes) -> None:
        """Publish ``frame`` now, or with the room's others after the window: every frame
        of a room goes the same way, so none overtakes another."""
        if self._coalesce_s <= 0:
            await self._publish(room, frame)
            return
        self._waiting.setdefault(room, []).append(frame)
        if room not in self._senders:
            self._senders[room] = asyncio.create_task(self._send_together(room))

    async def _send_together(self, room: str) -> None:
        """After the window, the room's waiting frames in one broadcast (best effort, as
        every announcement: a lost one is corrected by the next ``joined`` or count)."""
        try:
            await asyncio.sleep(self._coalesce_s)
        finally:  # cancelled: close() sends what waits
            self._senders.pop(room, None)
        await self._send_waiting(room, self._waiting.pop(room, []))

    async def _send_waiting(self, room: str, frames: list[bytes]) -> None:
        if frames:
            try:
                await self._publish(room, b"\n".join(frames))
            except Exception as exc:
                logger.warning("presence of %s not announced: %r", room, exc)

    async def _send_count(self, room: str, count: int) -> None:
        self._last_count_sent[room] = time.monotonic()
        await self._emit(room, orjson.dumps(presence_frame(room, "", None, count)))

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
        """Stop: the frames waiting in their window are sent now (best effort), the count
        updates held back by the interval are dropped (the next ``joined`` is right)."""
        tasks = [*self._trailing.values(), *self._senders.values()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        waiting, self._waiting = self._waiting, {}
        await asyncio.gather(
            *(self._send_waiting(room, frames) for room, frames in waiting.items())
        )
