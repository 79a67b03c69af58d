"""MemoryPresence: presence for one process (with the memory broker)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from app.broker import Broker
from app.errors import BrokerUnavailable
from app.presence import RoomPresence
from app.presence.announcer import PresenceAnnouncer
from app.presence.graces import Graces
from app.settings import Settings

logger = logging.getLogger(__name__)


class MemoryPresence:
    """A :class:`~app.presence.Presence` that lives in this process only. A lingering user
    (see :meth:`~app.presence.Presence.leave`) stays in its room's set until its grace ends
    or it comes back."""

    def __init__(self, settings: Settings, broker: Broker) -> None:
        self._max_members = settings.presence_max_members
        self._grace_s = settings.presence_leave_grace_s
        self._present: dict[str, set[str]] = {}
        self._graces = Graces()
        self._announcer = PresenceAnnouncer(
            broker.broadcast,
            self._count,
            settings.presence_max_members,
            settings.presence_count_interval_s,
            settings.presence_coalesce_s,
        )

    def on_internal(self, listener: Callable[[str, str, str], Awaitable[None]]) -> None:
        self._announcer.internal_listener = listener

    @property
    def lingering(self) -> int:
        """Users lingering on this worker: their grace running, or its end being settled."""
        return len(self._graces)

    async def start(self) -> None:
        return None  # nothing can outlive this process: no upkeep

    async def stop(self) -> None:
        """Drop the graces still running (nobody is left to tell), then send what waits."""
        await self._graces.close()
        await self._announcer.close()

    async def join(self, room: str, user: str) -> RoomPresence:
        if self._graces.cancel(room, user):  # back within its grace: nothing to say
            return await self.of(room)
        self._present.setdefault(room, set()).add(user)
        await self._announcer.announce(room, "join", user)
        return await self.of(room)

    async def leave(self, room: str, user: str, linger: bool = False) -> None:
        if linger and self._grace_s > 0 and not room.startswith("~"):
            self._graces.start(room, user, self._grace_s, self._lapse)
            return
        self._graces.cancel(room, user)
        await self._depart(room, user)

    def _lapse(self, room: str, user: str) -> None:
        """The grace of ``user`` in ``room`` ended without its return: it departs now (a
        join from here on is an arrival), announced as soon as the loop lets it."""
        self._withdraw(room, user)
        self._graces.settle(self._announce_late(room, user))

    def _withdraw(self, room: str, user: str) -> None:
        users = self._present.get(room, set())
        users.discard(user)
        if not users:
            self._present.pop(room, None)
            self._announcer.forget(room)

    async def _depart(self, room: str, user: str) -> None:
        self._withdraw(room, user)
        await self._announcer.announce(room, "leave", user)

    async def _announce_late(self, room: str, user: str) -> None:
        try:
            await self._announcer.announce(room, "leave", user)
        except BrokerUnavailable as exc:  # as every announcement: best effort
            logger.warning("departure of %s from %s not announced: %r", user, room, exc)

    async def _count(self, room: str) -> int:
        return len(self._present.get(room, ()))

    async def is_present(self, room: str, user: str) -> bool:
        return user in self._present.get(room, ())

    async def of(self, room: str) -> RoomPresence:
        users = self._present.get(room, set())
        if len(users) > self._max_members:
            return RoomPresence(len(users), None)
        return RoomPresence(len(users), sorted(users))
