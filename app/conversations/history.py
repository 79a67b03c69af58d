"""ConversationHistory: a conversation's history from the broker's log (Redis, or the
process), continued into the durable store for what the log no longer holds.

Contract:
- :meth:`history_since` answers as :meth:`app.broker.Broker.history_since` does, reaching
  further back: when the broker's log no longer holds ``since`` but says the store holds
  every message up to where the log starts (``History.store_upto``), the page is read from
  the store, and the pages after it from the log again. Never a silent gap: a page from the
  store that comes back empty (retention deleted it), a ``since`` older than the retention,
  more than ``CHAT_RECOVERY_MAX_MESSAGES`` to replay, or a store that fails, answer
  ``recovered: false``.
- :meth:`history_before` pages backwards through the log, then the store: every message
  stored, however old, as it is now (edited, deleted, reactions: the store's events, then
  the broker's newer state, :mod:`app.conversations.lifecycle`). Raises :class:`HistoryUnavailable`
  when
  the store is needed and fails.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson

from app.broker import Broker, History, Message
from app.conversations.lifecycle import Kind, with_state
from app.conversations.names import addressed, is_direct, peer
from app.protocol import event_frame_parts, message_frame, message_frame_parts
from app.settings import Settings
from app.store.database import StoreError
from app.store.inbox import InboxEntry
from app.store.messages import MessageStore, StoredMessage

logger = logging.getLogger(__name__)


class HistoryUnavailable(Exception):
    """The store is needed for this page and cannot be read."""


def frame_of(message: StoredMessage) -> bytes:
    """The frame of a stored message or event: the same bytes the broker delivered (but for a
    deleted message's text)."""
    user = message.user
    target, name = addressed(message.conversation, user)
    if message.kind == Kind.MESSAGE:
        parts = message_frame_parts(
            target, name, user, message.text, message.target, message.attachments
        )
    else:
        assert message.target is not None  # every event has one
        parts = event_frame_parts(Kind(message.kind), target, name, message.target, user,
                                  message.text)  # fmt: skip
    return message_frame(parts, message.id, message.ts_ms)


class ConversationHistory:
    def __init__(self, broker: Broker, store: MessageStore | None, settings: Settings) -> None:
        self._broker = broker
        self._store = store
        self._settings = settings

    def _retained_since_id(self) -> int:
        """The lowest message id retention keeps (ids are 1000 times the publish time in ms)."""
        days = self._settings.retention_days
        return 0 if days == 0 else int((time.time() - days * 86_400) * 1_000_000)

    async def history_since(self, conversation: str, since: int, limit: int) -> History:
        page = await self._broker.history_since(conversation, since, limit)
        upto = page.store_upto
        if page.recovered or upto is None or self._store is None:
            return History(page.recovered, page.messages, page.more)
        if since < self._retained_since_id():
            return History(False, [])
        cap = self._settings.recovery_max_messages
        try:
            if await self._store.count_between(conversation, since, upto, cap) > cap:
                return History(False, [])
            stored = await self._store.between(conversation, since, upto, limit)
        except StoreError as exc:
            logger.warning("recovery of %s from the store failed: %s", conversation, exc)
            return History(False, [])
        if not stored:
            return History(False, [])
        return History(True, [Message(m.id, frame_of(m)) for m in stored], more=True)

    async def history_before(
        self, conversation: str, before: int | None, limit: int
    ) -> list[Message]:
        """Up to ``limit`` messages with ids below ``before`` (the newest without it), oldest
        first. Raises what the broker raises, and :class:`HistoryUnavailable`."""
        page = await self._broker.history_before(conversation, before, limit)
        if len(page) >= limit or self._store is None:
            return page
        older_than = page[0].id if page else before
        try:
            stored = await self._store.before(conversation, older_than, limit - len(page))
            ids = [m.id for m in stored]
            states = await self._store.states(conversation, ids)
        except StoreError as exc:
            raise HistoryUnavailable(str(exc)) from exc
        states.update(await self._broker.states(conversation, ids))  # newer than the store's
        older = [Message(m.id, with_state(frame_of(m), states.get(m.id))) for m in stored]
        return older + page


def inbox_entry(entry: InboxEntry, user: str) -> dict[str, Any]:
    """One conversation of an ``inbox`` frame, as ``user`` sees it."""
    conversation = entry.conversation
    item: dict[str, Any] = (
        {"with": peer(conversation, user)} if is_direct(conversation) else {"room": conversation}
    )
    last = None if entry.last is None else with_state(frame_of(entry.last), entry.last_state)
    item["last"] = None if last is None else orjson.loads(last)
    item["unread"] = entry.unread
    item["mentions"] = entry.mentions
    item["read"] = entry.last_read
    if is_direct(conversation):
        item["peer_read"] = entry.peer_read
    return item
