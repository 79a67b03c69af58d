"""MemoryPresence: presence for one process (with the memory broker)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from app.broker import Broker
from app.presence import RoomPresence
from app.presence.announcer import PresenceAnnouncer
from app.settings import Settings


class MemoryPresence:
    """A :class:`~app.presence.Presence` that lives in this process only."""

    def __init__(self, settings: Settings, broker: Broker) -> None:
        self._max_members = settings.presence_max_members
        self._present: dict[str, set[str]] = {}
        self._announcer = PresenceAnnouncer(
            broker.broadcast,
            self._count,
            settings.presence_max_members,
            settings.presence_count_interval_s,
            settings.presence_coalesce_s,
        )

    def on_internal(self, listener: Callable[[str, str, str], Awaitable[None]]) -> None:
        self._announcer.internal_listener = listener

    async def start(self) -> None:
        return None  # nothing can outlive this process: no upkeep

    async def stop(self) -> None:
        await self._announcer.close()

    async def join(self, room: str, user: str) -> RoomPresence:
        self._present.setdefault(room, set()).add(user)
        await self._announcer.announce(room, "join", user)
        return await self.of(room)

    async def leave(self, room: str, user: str) -> None:
        users = self._present.get(room, set())
        users.discard(user)
        if not users:
            self._present.pop(room, None)
            self._announcer.forget(room)
        await self._announcer.announce(room, "leave", user)

    async def _count(self, room: str) -> int:
        return len(self._present.get(room, ()))

    async def is_present(self, room: str, user: str) -> bool:
        return user in self._present.get(room, ())

    async def of(self, room: str) -> RoomPresence:
        users = self._present.get(room, set())
        if len(users) > self._max_members:
            return RoomPresence(len(users), None)
        return RoomPresence(len(users), sorted(users))
