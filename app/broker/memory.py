"""MemoryBroker: the embedded, in-process broker for one worker (``make run``, tests)."""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from app.access.buckets import TokenBuckets
from app.broker import BrokerHandler, BrokerStats, History, Message, PublishDone, Published
from app.broker.dedup import RecentIds
from app.conversations.lifecycle import Change, Kind, Target, apply, reacted, with_state
from app.conversations.names import addressed, direct, is_direct, members_of_direct
from app.errors import BrokerUnavailable, MessageGone, QuotaExceeded
from app.protocol import event_frame_parts, is_message_frame, message_frame, message_frame_parts
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
    messages: deque[Message] = field(default_factory=deque)  # messages and events, in order
    authors: dict[int, str] = field(default_factory=dict)  # of the messages in `messages`
    states: dict[int, dict[str, Any]] = field(
        default_factory=dict
    )  # see app.conversations.lifecycle

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
        self._worker_id = secrets.token_hex(6)
        self._archiver = archiver
        self._handler: BrokerHandler | None = None
        self._rooms: set[str] = set()
        self._users: set[str] = set()
        self._logs: OrderedDict[str, _RoomLog] = OrderedDict()
        self._private: set[str] = set()
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
        return self._publish_message(
            room, user, text, cid, reply_to, quota, attachments, mentions, traceparent
        )

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
        conversation = direct(sender, to)
        return self._publish_message(
            conversation, sender, text, cid, reply_to, quota, attachments, mentions, traceparent
        )

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
        """Published at once: ``done`` is called before this returns."""
        conversation = room if room is not None else direct(user, to or "")
        try:
            published = self._publish_message(
                conversation, user, text, cid, None, None, traceparent=traceparent
            )
        except Exception as exc:  # refused (quota), or a bug: for the caller to answer
            done(exc)
            return
        done(published)

    def _publish_message(
        self,
        conversation: str,
        user: str,
        text: str,
        cid: str | int | None,
        reply_to: int | None,
        quota: tuple[float, int] | None,
        attachments: str | None = None,
        mentions: str | None = None,
        traceparent: str | None = None,
    ) -> Published:
        handler = self._running()
        if quota is None:
            self._take_token(user)
        elif not self._quota.take_at(quota, user):
            raise QuotaExceeded(f"message quota of {user}")
        key = None if cid is None else ("r", conversation, user, cid)
        log = self._log(conversation)  # first: a new log's origin is below the id this gets
        message_id, ts_ms, duplicate = self._next_id(key)
        if duplicate:
            return Published(message_id, duplicate=True)
        target, name = addressed(conversation, user)
        parts = message_frame_parts(
            target, name, user, text, reply_to, attachments, mentions, traceparent
        )
        payload = message_frame(parts, message_id, ts_ms)
        self._remember(conversation, message_id, payload)
        log.authors[message_id] = user
        if self._archiver is not None:
            self._archiver.offer(
                StoredMessage(
                    conversation,
                    message_id,
                    user,
                    text,
                    ts_ms,
                    Kind.MESSAGE,
                    reply_to,
                    attachments,
                    mentions,
                )
            )
        self._deliver(handler, conversation, message_id, payload)
        return Published(message_id, ts_ms)

    async def publish_event(
        self,
        conversation: str,
        change: Change,
        cid: str | int | None,
        known: dict[str, Any] | None = None,
    ) -> Published:
        handler = self._running()
        self._take_token(change.user)
        key = None if cid is None else ("r", conversation, change.user, cid)
        if key is not None and (first := self._recent.get(key, self._clock())) is not None:
            return Published(first, duplicate=True)
        log = self._log(conversation)
        state = log.states.get(change.target, known)
        if state is not None and state.get("deleted"):
            raise MessageGone(conversation)
        kind = change.kind
        if kind in (Kind.REACTION_ON, Kind.REACTION_OFF):
            on = not reacted(state, change.text, change.user)
            kind = Kind.REACTION_ON if on else Kind.REACTION_OFF
        message_id, ts_ms, _ = self._next_id(key)
        target, name = addressed(conversation, change.user)
        parts = event_frame_parts(kind, target, name, change.target, change.user, change.text)
        payload = message_frame(parts, message_id, ts_ms)
        self._remember(conversation, message_id, payload)
        log.states[change.target] = apply(state, kind, change.user, change.text, ts_ms)
        if len(log.states) > 2 * (self._settings.history_size + 1):
            log.states = {i: s for i, s in log.states.items() if i >= log.trimmed}
        if self._archiver is not None:
            self._archiver.offer(
                StoredMessage(conversation, message_id, change.user, change.text, ts_ms, kind,
                              change.target)
            )  # fmt: skip
        self._deliver(handler, conversation, message_id, payload)
        return Published(message_id, ts_ms)

    def _deliver(
        self, handler: BrokerHandler, conversation: str, message_id: int | None, payload: bytes
    ) -> None:
        if not is_direct(conversation):
            if conversation in self._rooms:
                handler.deliver_room(conversation, message_id, payload)
            return
        for user in members_of_direct(conversation):
            if user in self._users:
                handler.deliver_user(user, message_id, payload)

    async def notify_user(self, user: str, payload: bytes) -> None:
        handler = self._running()
        if user in self._users:
            handler.deliver_user(user, None, payload)

    async def find(self, conversation: str, message_id: int) -> Target | None:
        self._running()
        log = self._logs.get(conversation)
        if log is None or message_id not in log.authors:
            return None
        return Target(log.authors[message_id], log.states.get(message_id))

    async def states(self, conversation: str, ids: list[int]) -> dict[int, dict[str, Any]]:
        self._running()
        log = self._logs.get(conversation)
        if log is None:
            return {}
        return {i: log.states[i] for i in ids if i in log.states}

    @property
    def worker_id(self) -> str:
        return self._worker_id

    async def route_to_worker(self, worker: str, payload: bytes) -> bool:
        if worker != self._worker_id:
            return False
        self._running().deliver_routed(payload)
        return True

    async def census(self, record: bytes, ttl_ms: int) -> dict[str, bytes]:
        self._running()
        return {self._worker_id: record}  # one process: the only worker

    async def forget_workers(self, workers: list[str]) -> None:
        pass

    async def kick(self, user: str, reason: str) -> None:
        self._running().kick(user, reason)

    async def room_changed(self, room: str) -> None:
        self._running().room_changed(room)

    async def mark_private(self, room: str, private: bool) -> None:
        if private:
            self._private.add(room)
        else:
            self._private.discard(room)

    async def is_private(self, room: str) -> bool:
        return room in self._private

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
            log.authors.pop(log.trimmed, None)
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
        page = [Message(m.id, with_state(m.payload, log.states.get(m.id))) for m in after[:limit]]
        return History(True, page, len(after) > limit)

    async def last_id(self, room: str) -> int:
        self._running()
        return self._log(room).last

    async def room_exists(self, room: str) -> bool:
        self._running()
        return room in self._logs

    def existence_key(self, room: str) -> str | None:
        return None

    async def history_before(self, room: str, before: int | None, limit: int) -> list[Message]:
        self._running()
        log = self._logs.get(room)
        if log is None:
            return []
        older = [
            m for m in log.messages
            if (before is None or m.id < before) and is_message_frame(m.payload)
        ]  # fmt: skip
        page = older[-limit:] if limit else []
        return [Message(m.id, with_state(m.payload, log.states.get(m.id))) for m in page]
