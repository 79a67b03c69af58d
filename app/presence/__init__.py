"""Presence: who is in a room across every worker, and the announcements of arrivals and
departures (``presence`` frames, through the broker's :meth:`~app.broker.Broker.broadcast`).

The interface is a :class:`typing.Protocol`; :func:`create_presence` picks the implementation
the way :func:`~app.broker.create_broker` picks the broker: :class:`~app.presence.redis.
RedisPresence` with ``CHAT_REDIS_URL``, :class:`~app.presence.memory.MemoryPresence` without.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from app.broker import Broker
from app.settings import Settings


@dataclass(frozen=True, slots=True)
class RoomPresence:
    """Who is in a room across all workers: ``users`` is None above the member threshold."""

    count: int
    users: list[str] | None


class Presence(Protocol):
    """Who is present in each room, across every worker.

    Contract:
    - :meth:`join`/:meth:`leave` are called once per (room, user) transition on this worker
      (the Hub counts a user's tabs); a user's first arrival and last departure across all
      workers is announced with a ``presence`` frame on the room (only the count above
      ``CHAT_PRESENCE_MAX_MEMBERS``, throttled, see :mod:`app.presence.announcer`).
    - A worker that dies leaves nothing behind for longer than ``CHAT_PRESENCE_TTL_S``: its
      entries expire, and the survivors announce those users' departure. A user lingering
      (see :meth:`leave`) on a worker that stops or dies is swept out the same way once its
      grace has passed.
    - Calls raise :class:`~app.errors.BrokerUnavailable` when the backend cannot be reached.
    """

    async def start(self) -> None:
        """Start background upkeep (refreshing this worker's entries); returns at once."""
        ...

    async def stop(self) -> None:
        """Stop upkeep and withdraw this worker's entries (best effort: they expire anyway)."""
        ...

    async def join(self, room: str, user: str) -> RoomPresence:
        """``user`` arrives in ``room`` on this worker; who is in it then, as :meth:`of`
        would say (with Redis, read in the same call)."""
        ...

    async def leave(self, room: str, user: str, linger: bool = False) -> None:
        """``user`` leaves ``room`` on this worker. With ``linger`` (its connection ended
        without a ``leave``), it stays present for ``CHAT_PRESENCE_LEAVE_GRACE_S``: a
        :meth:`join` within it, on any worker, announces nothing, and neither does the end of
        the grace; else the departure is announced when the grace ends. Internal rooms
        (``~``) never linger."""
        ...

    async def of(self, room: str) -> RoomPresence:
        """Who is in ``room`` now."""
        ...

    async def is_present(self, room: str, user: str) -> bool:
        """Whether ``user`` is in ``room`` now, on any worker."""
        ...

    @property
    def lingering(self) -> int:
        """Users lingering on this worker (see :meth:`leave`): their grace running, or its
        end being settled."""
        ...

    def on_internal(self, listener: Callable[[str, str, str], Awaitable[None]]) -> None:
        """Call ``listener(room, "join" | "leave", user)`` for every arrival and departure in
        an internal room (a name starting with ``~``: who is online, for webhooks) instead of
        announcing it."""
        ...


def create_presence(settings: Settings, broker: Broker) -> Presence:
    """The presence the settings ask for, announcing through ``broker``."""
    if settings.uses_redis:
        from app.presence.redis import RedisPresence

        return RedisPresence(settings, broker)
    from app.presence.memory import MemoryPresence

    return MemoryPresence(settings, broker)
