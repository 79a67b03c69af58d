"""Broker: where every published message goes, and where each worker's Hub hears it from.

The interface is a :class:`typing.Protocol` so mypy checks each implementation structurally.
:func:`create_broker` picks the implementation from the settings: ``CHAT_REDIS_URL`` set means
:class:`~app.broker.redis.RedisBroker`, unset the embedded
:class:`~app.broker.memory.MemoryBroker`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from app.conversations.lifecycle import Change, Target
from app.settings import Settings

if TYPE_CHECKING:
    from app.store.archiver import Archiver


class BrokerHandler(Protocol):
    """What a broker delivers to (the Hub). Every call must return at once, never block."""

    def deliver_room(self, room: str, message_id: int | None, payload: bytes) -> None:
        """``payload`` (one encoded frame) for ``room``'s members: a ``message`` numbered
        ``message_id``, or a frame without an id (None: presence, typing)."""
        ...

    def deliver_user(self, user: str, message_id: int | None, payload: bytes) -> None:
        """A frame of a direct conversation for ``user``'s connections: a ``message`` or an
        event numbered ``message_id``, or a frame without an id (None: a read receipt)."""
        ...

    def link_lost(self) -> None:
        """The broker's subscription ended (an error, or found deaf): live messages published
        from now on may never be delivered. Called before anything a later subscription
        delivers, and possibly more than once per outage."""
        ...

    def rooms_lost(self, rooms: Collection[str]) -> None:
        """The subscription of these ``rooms`` only ended (Redis Cluster: their master was
        lost); the others are delivered live as ever. Called before anything a later
        subscription of theirs delivers."""
        ...

    def rooms_back(self, rooms: Collection[str]) -> None:
        """These rooms are subscribed again after :meth:`rooms_lost`: messages published to
        them from now on are delivered live."""
        ...

    def notices_missed(self) -> None:
        """Direct messages, and notices of room changes, published for a while may never
        have been delivered (Redis Cluster: the connection for them was lost and replaced;
        rooms were delivered all along)."""
        ...

    def resubscribed(self) -> None:
        """The broker is subscribed again after :meth:`link_lost`, to every room and user it
        was asked for: messages published from now on are delivered live."""
        ...

    def room_changed(self, room: str) -> None:
        """``room``'s record (privacy, members, title) changed on some server: forget what
        was read of it (and recheck who may be in it). Missed while the subscription was
        lost: :meth:`resubscribed` stands for every room."""
        ...

    def kick(self, user: str, reason: str, issued_at: float | None = None) -> None:
        """Close every local connection of ``user`` (moderation, from any server); with
        ``issued_at`` (epoch seconds: a kick this worker missed live and learns of later),
        only those opened before it."""
        ...

    def deliver_routed(self, payload: bytes) -> None:
        """``payload`` was routed to this worker (:meth:`Broker.route_to_worker`): a POST of
        the HTTP fallback transport for a stream this worker holds."""
        ...


class Message(NamedTuple):
    """A stored message: its id and its encoded ``message`` frame
    (:func:`app.protocol.message_frame`)."""

    id: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class Published:
    """What a publish assigned: the message id and its timestamp (ms since the epoch, 0 for a
    duplicate), and whether it was a retried duplicate."""

    id: int
    ts_ms: int = 0
    duplicate: bool = False


# What a started publish (Broker.publish_soon) comes to: what publish would return or raise.
PublishDone = Callable[[Published | Exception], None]


@dataclass(frozen=True, slots=True)
class History:
    """A page of the messages after a client's ``since``, oldest first: ``recovered`` is False
    when some are gone (or more than the replay limit), and then ``messages`` is empty and the
    client must resync; ``more`` is True when messages after the page's last one follow.

    A broker whose history no longer holds ``since`` but knows the store holds every message
    up to ``store_upto`` (and it holds every one after that) answers not recovered with
    ``store_upto`` set: :class:`app.conversations.history.ConversationHistory` reads that part from
    the
    store."""

    recovered: bool
    messages: list[Message]
    more: bool = False
    store_upto: int | None = None


@dataclass(frozen=True, slots=True)
class BrokerStats:
    """Health counters for the metrics: subscription losses since start (``deaf_reconnects``
    of them found by the canary, ``failovers`` moves to a new master the Sentinels named,
    not errors), publishes refused because too few replicas confirmed them
    (``not_replicated``) and those acked all the same while the master had too few
    (``acked_without_replicas``, CHAT_REDIS_WAIT_POLICY=available), the latest pub/sub round
    trip, and the backend's memory."""

    reconnects: int = 0
    deaf_reconnects: int = 0
    failovers: int = 0
    not_replicated: int = 0
    acked_without_replicas: int = 0
    pubsub_lag_s: float = 0.0
    # The backend's memory, as last read (Redis INFO): used, and its maxmemory (0: none).
    memory_used_bytes: int = 0
    memory_max_bytes: int = 0


class Broker(Protocol):
    """Publish/subscribe and history for rooms, shared by every worker of a backend
    (presence is :mod:`app.presence`).

    Contract:
    - ``publish`` takes a token from the sender's message quota (``CHAT_USER_MESSAGES_PER_S``,
      shared by every worker), gives the message an id that increases within its room, stores
      it in the room's bounded history, and delivers the ``message`` frame (built by
      :func:`app.protocol.message_frame`, the same bytes from every broker) with its id to
      every worker subscribed to the room, the publisher's own included, in id order: every
      subscriber of a room sees the same order. All of it is one atomic step.
    - Live delivery is at most once: a message published while a worker is disconnected from
      the backend does not reach it live. The broker says so (``link_lost``, then
      ``resubscribed``), and the Hub recovers what its rooms missed from history.
    - A publish carrying a ``cid`` the same user already used in that room (or to that user)
      within the dedup window returns the first id with ``duplicate=True`` and delivers nothing.
    - ``subscribe_*``/``unsubscribe_*`` take effect in call order and are remembered: after a
      reconnect the broker resubscribes everything. ``subscribe_room`` returns once messages
      published from then on will be delivered (when the broker is ready).
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
        reply_to: int | None = None,
        quota: tuple[float, int] | None = None,
        attachments: str | None = None,
        mentions: str | None = None,
        traceparent: str | None = None,
    ) -> Published:
        """Number, store and deliver a message (``reply_to``: the message it answers, which
        the caller checked; ``attachments``: its files, as :mod:`app.files.attachments` made
        them; ``mentions``: who it mentions, as :mod:`app.notify.mentions` keeps them;
        ``traceparent``: the trace context of a traced message, which its frame carries,
        :mod:`app.ops.tracing`).
        Raises :class:`~app.errors.QuotaExceeded` (nothing is published)
        when ``user`` has no message token left (``quota``: its rate per second and burst,
        the users' by default)."""
        ...

    async def publish_direct(
        self,
        sender: str,
        to: str,
        text: str,
        cid: str | int | None,
        reply_to: int | None = None,
        quota: tuple[float, int] | None = None,
        attachments: str | None = None,
        mentions: str | None = None,
        traceparent: str | None = None,
    ) -> Published:
        """As :meth:`publish`, in the direct conversation of ``sender`` and ``to``
        (:func:`app.conversations.names.direct`: ids, history and archiving like a room's),
        delivered
        to ``to``'s connections and ``sender``'s."""
        ...

    def publish_soon(
        self,
        room: str | None,
        to: str | None,
        user: str,
        text: str,
        cid: str | int | None,
        traceparent: str | None,
        done: PublishDone,
    ) -> None:
        """Start publishing a message with no reply, files or mentions: in ``room``, as
        :meth:`publish` does, or else to ``to``, as :meth:`publish_direct` does (with the
        users' quota). ``done`` is called once, with what that would return or raise
        (:class:`~app.errors.QuotaExceeded`, :class:`~app.errors.BrokerUnavailable`, or an
        unexpected error): before this returns when the broker publishes at once (the
        embedded one), else from a later pass of the loop. Nothing here needs a task, nor
        runs in one: ``done`` must not wait. Publishes started one after another reach the
        broker, and are numbered, in that order, as awaited ones would be."""
        ...

    async def publish_event(
        self,
        conversation: str,
        change: Change,
        cid: str | int | None,
        known: dict[str, Any] | None = None,
    ) -> Published:
        """As :meth:`publish`, for an event on a message of ``conversation`` (a room, or a
        direct one), which the caller found and checked the user may change
        (:mod:`app.conversations.lifecycle`). In the same atomic step the message's current state is
        changed (a reaction toggles: the frame says whether it is ``on``); ``known`` is that
        state as the store has it, for a message :meth:`find` did not find. Raises
        :class:`~app.errors.MessageGone` (nothing is published) when the message is deleted.
        """
        ...

    async def find(self, conversation: str, message_id: int) -> Target | None:
        """Message ``message_id`` of ``conversation`` if the broker's history holds it (None:
        not there; the store may have it)."""
        ...

    async def states(self, conversation: str, ids: list[int]) -> dict[int, dict[str, Any]]:
        """The current state of those of the messages ``ids`` that events changed and the
        broker still knows of (:mod:`app.conversations.lifecycle`)."""
        ...

    async def broadcast(self, room: str, payload: bytes) -> None:
        """Deliver ``payload`` (an encoded frame without an id: ``typing``, ``presence``) to
        the room's members on every worker: not stored, not numbered, at most once."""
        ...

    async def notify_user(self, user: str, payload: bytes) -> None:
        """Deliver ``payload`` (an encoded frame without an id: a read receipt) to ``user``'s
        connections on every worker: not stored, not numbered, at most once."""
        ...

    async def room_changed(self, room: str) -> None:
        """Tell every worker (this one too) that ``room``'s record changed
        (:meth:`BrokerHandler.room_changed`): at most once; a worker that misses it while
        unsubscribed learns it from :meth:`BrokerHandler.resubscribed`."""
        ...

    async def mark_private(self, room: str, private: bool) -> None:
        """Remember (for every worker) whether ``room`` is private: what workers go by while
        the store cannot be read (:mod:`app.conversations.rooms`)."""
        ...

    async def is_private(self, room: str) -> bool:
        """Whether ``room`` was marked private."""
        ...

    @property
    def worker_id(self) -> str:
        """This worker, as :meth:`route_to_worker` names it (opaque, unguessable)."""
        ...

    async def route_to_worker(self, worker: str, payload: bytes) -> bool:
        """Hand ``payload`` to the worker named ``worker`` (:meth:`BrokerHandler.deliver_routed`):
        at most once, and in call order for one caller. False when no such worker listens (it
        is gone); True when one does or, on Redis Cluster, where that cannot be told."""
        ...

    async def census(self, record: bytes, ttl_ms: int) -> dict[str, bytes]:
        """Publish this worker's ``record`` (what :mod:`app.sockets.rebalance` says of it) and
        return every worker's, this one's included, by worker id: those that reported in
        the last ``ttl_ms`` at least (older ones may linger; the caller reads their age in
        the records and :meth:`forget_workers` them). Raises :class:`BrokerUnavailable`."""
        ...

    async def forget_workers(self, workers: list[str]) -> None:
        """Drop the census records of ``workers`` (gone: they stopped reporting)."""
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

    def existence_key(self, room: str) -> str | None:
        """The Redis key that exists while ``room`` has a history (what :meth:`room_exists`
        reads), for a caller that asks Redis in its own call
        (:meth:`app.access.quotas.Quotas.allow_join`); None for a broker without Redis."""
        ...

    async def history_before(self, room: str, before: int | None, limit: int) -> list[Message]:
        """Up to ``limit`` stored messages of ``room`` with ids below ``before``, oldest
        first, each as it is now (edited, deleted, reactions); events are not part of it."""
        ...


def create_broker(
    settings: Settings,
    archiver: Archiver | None = None,
    on_reply: Callable[[], None] = lambda: None,
) -> Broker:
    """The broker the settings ask for; the memory broker hands every message to
    ``archiver`` (the Redis broker's are archived from Redis: app.store.stream_archiver).
    ``on_reply``: called each time the Redis broker's replies have been handed to the calls
    waiting for them (:class:`app.redisio.autopipeline.AutoPipeline`); the memory broker
    answers at once and never calls it."""
    if settings.uses_redis:
        from app.broker.redis import RedisBroker

        return RedisBroker(settings, on_reply)
    from app.broker.memory import MemoryBroker

    return MemoryBroker(settings, archiver=archiver)
