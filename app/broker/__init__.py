"""Broker: where every published message goes, and where each worker's Hub hears it from.

The interface is a :class:`typing.Protocol` so mypy checks each implementation structurally.
:func:`create_broker` picks the implementation from the settings: ``CHAT_REDIS_URL`` set means
:class:`~app.broker.redis.RedisBroker`, unset the embedded
:class:`~app.broker.memory.MemoryBroker`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from app.settings import Settings


class BrokerHandler(Protocol):
    """What a broker delivers to (the Hub). Both calls must return at once, never block."""

    def deliver_room(self, room: str, payload: bytes) -> None: ...

    def deliver_user(self, user: str, payload: bytes) -> None: ...

    def link_lost(self) -> None:
        """The broker's subscription ended (an error, or found deaf): live messages published
        from now on may never be delivered. Called before anything a later subscription
        delivers, and possibly more than once per outage."""
        ...

    def resubscribed(self) -> None:
        """The broker is subscribed again after :meth:`link_lost`, to every room and user it
        was asked for: messages published from now on are delivered live."""
        ...

    def kick(self, user: str, reason: str, issued_at: float | None = None) -> None:
        """Close every local connection of ``user`` (moderation, from any server); with
        ``issued_at`` (epoch seconds: a kick this worker missed live and learns of later),
        only those opened before it."""
        ...


@dataclass(frozen=True, slots=True)
class QuotaBucket:
    """A shared token bucket in Redis (see :mod:`app.access.quotas`) that a publish takes one token
    from, in the same script: one round trip per message instead of two."""

    key: str
    per_s: float
    burst: int


@dataclass(frozen=True, slots=True)
class Published:
    """What a publish assigned: the message id, and whether it was a retried duplicate."""

    id: int
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class History:
    """A page of the messages after a client's ``since``, oldest first: ``recovered`` is False
    when some are gone (or more than the replay limit), and then ``frames`` is empty and the
    client must resync; ``more`` is True when messages after the page's last one follow."""

    recovered: bool
    frames: list[bytes]
    more: bool = False


@dataclass(frozen=True, slots=True)
class BrokerStats:
    """Health counters for the metrics: subscription losses since start (``deaf_reconnects``
    of them found by the canary, not by an error), the latest pub/sub round trip, and the
    backend's memory."""

    reconnects: int = 0
    deaf_reconnects: int = 0
    pubsub_lag_s: float = 0.0
    # The backend's memory, as last read (Redis INFO): used, and its maxmemory (0: none).
    memory_used_bytes: int = 0
    memory_max_bytes: int = 0


@dataclass(frozen=True, slots=True)
class RoomPresence:
    """Who is in a room across all workers: ``users`` is None above the member threshold."""

    count: int
    users: list[str] | None


class Broker(Protocol):
    """Publish/subscribe, history and presence for rooms, shared by every worker of a backend.

    Contract:
    - ``publish`` gives each message an id that increases within its room, stores it in the
      room's bounded history, and delivers the encoded ``message`` frame to every worker
      subscribed to the room, the publisher's own included, in id order: every subscriber of a
      room sees the same order. Storing and publishing are one atomic step.
    - Live delivery is at most once: a message published while a worker is disconnected from
      the backend does not reach it live. The broker says so (``link_lost``, then
      ``resubscribed``), and the Hub recovers what its rooms missed from history.
    - A publish carrying a ``cid`` the same user already used in that room (or to that user)
      within the dedup window returns the first id with ``duplicate=True`` and delivers nothing.
    - ``subscribe_*``/``unsubscribe_*`` take effect in call order and are remembered: after a
      reconnect the broker resubscribes everything. ``subscribe_room`` returns once messages
      published from then on will be delivered (when the broker is ready).
    - ``presence_join``/``presence_leave`` are called once per (room, user) transition on this
      worker; the broker announces a user's first arrival and last departure across all
      workers with a ``presence`` frame on the room.
    - Calls that need the backend raise :class:`~app.errors.BrokerUnavailable` when it cannot
      be reached.
    """

    @property
    def ready(self) -> bool:
        """True while the broker can publish and deliver."""
        ...

    @property
    def stats(self) -> BrokerStats: ...

    async def start(self, handler: BrokerHandler) -> None: ...

    async def stop(self) -> None: ...

    async def subscribe_room(self, room: str) -> None: ...

    async def unsubscribe_room(self, room: str) -> None: ...

    async def subscribe_user(self, user: str) -> None: ...

    async def unsubscribe_user(self, user: str) -> None: ...

    async def publish(
        self,
        room: str,
        user: str,
        text: str,
        cid: str | int | None,
        quota: QuotaBucket | None = None,
    ) -> Published:
        """Number, store and deliver a message. With ``quota``, first take a token from it,
        atomically with the rest, and raise :class:`~app.errors.QuotaExceeded` when there is
        none (nothing is published). Only the Redis broker takes a quota (only
        :class:`~app.access.quotas.RedisQuotas` hands them out)."""
        ...

    async def publish_direct(
        self,
        sender: str,
        to: str,
        text: str,
        cid: str | int | None,
        quota: QuotaBucket | None = None,
    ) -> Published:
        """As :meth:`publish`, to one user (and the sender's other connections)."""
        ...

    async def broadcast(self, room: str, payload: bytes) -> None:
        """Deliver ``payload`` (an encoded frame without an id, e.g. ``typing``) to the room's
        members on every worker: not stored, not numbered, at most once."""
        ...

    async def kick(self, user: str, reason: str) -> None:
        """Have every worker close ``user``'s connections (:meth:`BrokerHandler.kick`), those
        that do not hear it live too: a worker that was not subscribed when it was issued
        learns of it when it is again."""
        ...

    async def history_since(self, room: str, since: int, limit: int) -> History:
        """The first ``limit`` messages of ``room`` after ``since`` (see :class:`History`).
        Not recovered when any message after ``since`` is gone: trimmed, expired, or lost
        with the backend's data (a restart, a failover), which a room's log incarnation
        tells apart; or when more than ``CHAT_RECOVERY_MAX_MESSAGES`` follow ``since``."""
        ...

    async def last_id(self, room: str) -> int:
        """The id of the newest message published to ``room`` (the start of its log
        incarnation when there is none): a ``since`` from which a later join recovers what
        was published in between."""
        ...

    async def room_exists(self, room: str) -> bool:
        """Whether ``room`` has a history (a join or a message made it, and it has not expired):
        a join of a room that does not is a room created, which users have a quota of."""
        ...

    async def history_before(self, room: str, before: int | None, limit: int) -> list[bytes]:
        """Up to ``limit`` stored frames of ``room`` with ids below ``before``, oldest first."""
        ...

    async def presence_join(self, room: str, user: str) -> None: ...

    async def presence_leave(self, room: str, user: str) -> None: ...

    async def presence(self, room: str) -> RoomPresence: ...


def create_broker(settings: Settings) -> Broker:
    """The broker the settings ask for."""
    if settings.redis_url:
        from app.broker.redis import RedisBroker

        return RedisBroker(settings)
    from app.broker.memory import MemoryBroker

    return MemoryBroker(settings)
