"""MemoryBroker: the embedded, in-process broker for one worker (``make run``, tests)."""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from app.access.buckets import TokenBuckets
from app.broker import BrokerHandler, BrokerStats, History, Message, Published
from app.broker.dedup import RecentIds
from app.conversation import direct
from app.errors import BrokerUnavailable, QuotaExceeded
from app.protocol import message_frame, message_frame_parts
from app.settings import Settings
from app.store.archiver import Archiver
from app.store.messages import StoredMessage


@dataclass(slots=True)
class _RoomLog:
    """A room's history in this process: complete after ``origin`` (when the log was made:
    nothing from before, e.g. before a restart or an eviction, can be vouched for) minus what
    trimming took (up to ``trimmed``)."""

    origin: int
    last: int = 0
    trimmed: int = 0
    messages: deque[Message] = field(default_factory=deque)

    def __post_init__(self) -> None:
        self.last = self.trimmed = self.origin


class MemoryBroker:
    """A :class:`~app.broker.Broker` that lives in this process only.

    ``publish`` delivers synchronously, before it returns, so the publisher's own ``message``
    frame is always queued before its ``ack``. Ids come from one counter for all rooms that is
    never below ``1000 * (ms since the epoch)``: they increase within every room and, as long
    as the clock does not go back, across restarts too. History lives in this process (lost on
    restart; with a store, every message is archived there too, conversations' direct
    messages included). Only valid with a single worker: other processes never see these
    messages, and Gunicorn refuses to start several workers with it.
    """

    def __init__(
        self,
        settings: Settings,
        clock: Callable[[], float] = time.time,
        archiver: Archiver | None = None,
    ) -> None:
        """``archiver``: where every published message goes to be stored (with a store)."""
        self._settings = settings
        self._archiver = archiver
        self._handler: BrokerHandler | None = None
        self._rooms: set[str] = set()
        self._users: set[str] = set()
        self._logs: OrderedDict[str, _RoomLog] = OrderedDict()
        self._last_id = 0
        self._recent = RecentIds(settings.dedup_ttl_s, settings.dedup_max_entries)
        self._clock = clock
        self._quota = TokenBuckets(
            {"message": (settings.user_messages_per_s, settings.user_message_burst)}
        )

    @property
    def ready(self) -> bool:
        return self._handler is not None

    @property
    def stats(self) -> BrokerStats:
        return BrokerStats()  # in-process: nothing to lose, no lag

    async def start(self, handler: BrokerHandler) -> None:
        self._handler = handler

    async def stop(self) -> None:
        self._handler = None

    async def subscribe_room(self, room: str) -> None:
        self._rooms.add(room)

    async def unsubscribe_room(self, room: str) -> None:
        self._rooms.discard(room)

    async def subscribe_user(self, user: str) -> None:
        self._users.add(user)

    async def unsubscribe_user(self, user: str) -> None:
        self._users.discard(user)

    def _running(self) -> BrokerHandler:
        if self._handler is None:
            raise BrokerUnavailable("the broker is not running")
        return self._handler

    def _next_id(self, key: tuple[str, str, str, str | int] | None) -> tuple[int, int, bool]:
        """(id, ts_ms, duplicate) for a new message; a known dedup key returns its first id."""
        now = self._clock()
        if key is not None:
            first = self._recent.get(key, now)
            if first is not None:
                return first, 0, True
        ts_ms = int(now * 1000)
        message_id = self._last_id = max(self._last_id + 1, ts_ms * 1000)
        if key is not None:
            self._recent.add(key, message_id, now)
        return message_id, ts_ms, False

    def _take_token(self, user: str) -> None:
        if not self._quota.take("message", user):
            raise QuotaExceeded(f"message quota of {user}")

    async def publish(self, room: str, user: str, text: str, cid: str | int | None) -> Published:
        handler = self._running()
        self._take_token(user)
        key = None if cid is None else ("r", room, user, cid)
        self._log(room)  # first: a new log's origin is below the id this message gets
        message_id, ts_ms, duplicate = self._next_id(key)
        if duplicate:
            return Published(message_id, duplicate=True)
        payload = message_frame(message_frame_parts("room", room, user, text), message_id, ts_ms)
        self._remember(room, message_id, payload)
        if self._archiver is not None:
            self._archiver.offer(StoredMessage(room, message_id, user, text, ts_ms))
        if room in self._rooms:
            handler.deliver_room(room, message_id, payload)
        return Published(message_id, ts_ms)

    async def publish_direct(
        self, sender: str, to: str, text: str, cid: str | int | None
    ) -> Published:
        handler = self._running()
        self._take_token(sender)
        conversation = direct(sender, to)
        key = None if cid is None else ("r", conversation, sender, cid)
        self._log(conversation)
        message_id, ts_ms, duplicate = self._next_id(key)
        if duplicate:
            return Published(message_id, duplicate=True)
        payload = message_frame(message_frame_parts("to", to, sender, text), message_id, ts_ms)
        self._remember(conversation, message_id, payload)
        if self._archiver is not None:
            self._archiver.offer(StoredMessage(conversation, message_id, sender, text, ts_ms))
        for user in {to, sender}:
            if user in self._users:
                handler.deliver_user(user, message_id, payload)
        return Published(message_id, ts_ms)

    async def kick(self, user: str, reason: str) -> None:
        self._running().kick(user, reason)

    async def broadcast(self, room: str, payload: bytes) -> None:
        handler = self._running()
        if room in self._rooms:
            handler.deliver_room(room, None, payload)

    def _log(self, room: str) -> _RoomLog:
        """The room's log, made (with its origin: the newest id handed out so far) if none."""
        log = self._logs.get(room)
        if log is None:
            log = self._logs[room] = _RoomLog(max(self._last_id, int(self._clock() * 1000) * 1000))
            self._last_id = log.origin
            if len(self._logs) > self._settings.memory_history_max_rooms:
                self._logs.popitem(last=False)
        else:
            self._logs.move_to_end(room)
        return log

    def _remember(self, room: str, message_id: int, payload: bytes) -> None:
        size = self._settings.history_size
        log = self._log(room)
        log.last = message_id
        if size == 0:
            log.trimmed = message_id
            return
        if len(log.messages) >= size:
            log.trimmed = log.messages.popleft().id
        log.messages.append(Message(message_id, payload))

    async def history_since(self, room: str, since: int, limit: int) -> History:
        self._running()
        log = self._log(room)
        if since > log.last or since < log.origin:
            return History(False, [])
        if since < log.trimmed:
            archived = 0 if self._archiver is None else self._archiver.archived(room)
            if archived >= log.trimmed:
                return History(False, [], store_upto=log.trimmed)
            return History(False, [])
        after = [message for message in log.messages if message.id > since]
        if len(after) > self._settings.recovery_max_messages:
            return History(False, [])
        return History(True, after[:limit], len(after) > limit)

    async def last_id(self, room: str) -> int:
        self._running()
        return self._log(room).last

    async def room_exists(self, room: str) -> bool:
        self._running()
        return room in self._logs

    async def history_before(self, room: str, before: int | None, limit: int) -> list[Message]:
        self._running()
        log = self._logs.get(room)
        if log is None:
            return []
        older = [m for m in log.messages if before is None or m.id < before]
        return older[-limit:] if limit else []
