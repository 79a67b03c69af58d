"""The notifier: decides each pending notification when it is due, and sends it as Web Push
and as the ``notification.needed`` webhook. It runs on the worker that archives (one per
deployment), every ``CHAT_NOTIFY_POLL_S``.

Contract (docs/protocol.md, "Mentions and notifications"): a due notification is sent only
if, at that moment, the user's level and mute want it (:func:`app.notify.rules.wanted`),
the user has not read its message, may still read the conversation (the one access
decision), the message is not deleted, and no connection of the user is visible
(:data:`app.notify.VISIBLE_ROOM`), and its author is not one the user mutes or blocks
(:mod:`app.access.hiding`); else it is dropped. One due within
``CHAT_NOTIFY_INTERVAL_S`` of the last one sent for that user and conversation waits for the
interval's end. The text it carries is read then, as it is then (newest edit), cut to
``CHAT_PUSH_TEXT_MAX_CHARS``. Sent: to every Web Push subscription of the user (one the push
service says is gone is removed) and, with webhooks, queued as ``notification.needed``.
Recorded as sent only after: a crash in between sends it again (at least once). While the
webhook's queue (Redis) cannot be reached, nothing is sent: it is tried again later.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from app.access.auth import Identity
from app.access.conversations import ConversationAccess
from app.access.hiding import HiddenUsers
from app.conversations.rooms import RoomError
from app.errors import BrokerUnavailable, ErrorCode
from app.notify import VISIBLE_ROOM
from app.notify.rules import REASON_NAMES, Level, default_level, wanted
from app.notify.service import named_conversation
from app.notify.webpush import PushOutcome, Subscription, WebPushSender
from app.ops.metrics import Metrics
from app.presence import Presence
from app.settings import Settings
from app.store.database import StoreError
from app.store.notifications import NotificationStore, Pending, PushSubscriptionRow

logger = logging.getLogger(__name__)

# A notification whose webhook could not be queued (Redis down) is tried again this much later.
_RETRY_MS = 5_000
# Queues ``notification.needed`` with its data (app.webhooks.queue.WebhookQueue.enqueue).
Enqueue = Callable[[str, dict[str, Any]], Awaitable[bool]]


class Notifier:
    def __init__(
        self,
        settings: Settings,
        store: NotificationStore,
        access: ConversationAccess,
        presence: Presence,
        metrics: Metrics,
        sender: WebPushSender | None,
        enqueue: Enqueue | None,
        leading: Callable[[], bool],
        hidden: HiddenUsers,
    ) -> None:
        self._settings = settings
        self._hidden = hidden
        self._store = store
        self._access = access
        self._presence = presence
        self._metrics = metrics
        self._sender = sender
        self._enqueue = enqueue
        self._leading = leading

    async def run(self) -> None:
        """Decide what is due, every ``CHAT_NOTIFY_POLL_S``, while this worker archives; until
        cancelled (store errors are logged and retried; anything else is logged with its
        traceback, and the notifier goes on)."""
        while True:
            decided = 0
            if self._leading():
                try:
                    decided = await self.decide_due()
                except StoreError as exc:
                    logger.warning("notifications: %s", exc)
                except Exception:
                    logger.exception("notifications: deciding what is due failed")
            if decided < self._settings.notify_batch_max:
                await asyncio.sleep(self._settings.notify_poll_s)

    async def decide_due(self) -> int:
        """Decide the notifications due now (at most ``CHAT_NOTIFY_BATCH_MAX``); how many."""
        now_ms = int(time.time() * 1000)
        due = await self._store.due(now_ms, self._settings.notify_batch_max)
        for pending in due:
            await self._decide(pending, now_ms)
        return len(due)

    async def _decide(self, pending: Pending, now_ms: int) -> None:
        outcome = await self._outcome(pending, now_ms)
        interval_ms = int(self._settings.notify_interval_s * 1000)
        if outcome == "deferred":
            await self._store.defer(pending, pending.sent_ms + interval_ms)
        elif outcome is not None:
            await self._store.settle(pending, None, now_ms)
        else:
            payload = await self._payload(pending)
            if payload is None:
                outcome = "deleted"
                await self._store.settle(pending, None, now_ms)
            elif payload["user"] in (await self._hidden.of(pending.user)).users:
                outcome = "hidden"  # its author is muted or blocked: never notified
                await self._store.settle(pending, None, now_ms)
            elif await self._send(pending.user, payload):
                outcome = "sent"
                await self._store.settle(pending, now_ms, now_ms + interval_ms)
            else:  # the webhook could not be queued: nothing was sent, all of it again later
                outcome = "deferred"
                await self._store.defer(pending, now_ms + _RETRY_MS)
        self._metrics.notifications.labels(outcome).inc()

    async def _outcome(self, pending: Pending, now_ms: int) -> str | None:
        """Why ``pending`` is not sent now (None: it is)."""
        user, conversation = pending.user, pending.conversation
        chosen = await self._store.level_of(user, conversation)
        level: Level = chosen.level if chosen else default_level(conversation)
        muted = chosen.muted_until_ms if chosen else None
        if not wanted(level, muted, pending.reason, now_ms):
            return "unwanted"
        if await self._store.read_position(user, conversation) >= pending.message_id:
            return "read"
        try:
            await self._access.conversation(Identity(user), conversation)
        except RoomError as exc:
            if exc.code is ErrorCode.STORE_UNAVAILABLE:
                raise StoreError(exc.message) from None
            return "forbidden"
        try:
            if await self._presence.is_present(VISIBLE_ROOM, user):
                return "visible"
        except BrokerUnavailable:
            # Not knowing is not a reason to push to someone who may be looking: later.
            return "deferred"
        if pending.sent_ms + int(self._settings.notify_interval_s * 1000) > now_ms:
            return "deferred"
        return None

    async def _payload(self, pending: Pending) -> dict[str, Any] | None:
        """The notification, as pushed (None: its message is deleted or gone)."""
        message = await self._store.message_now(pending.conversation, pending.message_id)
        if message is None:
            return None
        author, text, ts_ms = message
        payload: dict[str, Any] = {
            "type": "notification", **named_conversation(pending.conversation, pending.user),
            "id": pending.message_id, "user": author, "ts": ts_ms,
            "reason": REASON_NAMES[pending.reason], "count": max(pending.count, 1),
        }  # fmt: skip
        settings = self._settings
        if settings.push_text:
            most = settings.push_text_max_chars
            payload["text"] = text if len(text) <= most else text[: max(most - 1, 0)] + "…"
        return payload

    async def _send(self, user: str, payload: dict[str, Any]) -> bool:
        """Queue the webhook, then push; False (nothing sent) when the webhook's queue (Redis)
        cannot be reached."""
        if self._enqueue is not None:
            try:
                await self._enqueue("notification.needed", {"recipient": user, **payload})
            except BrokerUnavailable:
                return False
        if self._sender is None:
            return True
        subscriptions = await self._store.subscriptions_of(user)
        if not subscriptions:
            return True
        body = orjson.dumps(payload)
        outcomes = await asyncio.gather(*(self._push(s, body) for s in subscriptions))
        for subscription, outcome in zip(subscriptions, outcomes, strict=True):
            self._metrics.pushes.labels(outcome.value).inc()
            if outcome is PushOutcome.GONE:
                await self._store.unsubscribe(subscription.endpoint)
        return True

    async def _push(self, row: PushSubscriptionRow, body: bytes) -> PushOutcome:
        assert self._sender is not None
        try:
            subscription = Subscription(row.endpoint, row.p256dh, row.auth)
        except ValueError:  # keys that do not parse: it can never be delivered
            return PushOutcome.GONE
        return await self._sender.send(subscription, body)
