"""Webhooks: what happens in the chat, POSTed to the application's backend.

Events (``type``): ``message.created`` (a message in a room or a direct conversation),
``member.added`` / ``member.removed`` (a room's members, :mod:`app.conversations.rooms`),
``user.online`` /
``user.offline`` (a user's first connection anywhere, and the end of its last one, after a
grace period: a reconnect or a deploy's drain within ``CHAT_WEBHOOK_OFFLINE_GRACE_S`` fires
nothing).

Delivery: at least once, from a durable queue — a Redis stream (``queue`` of
:func:`webhook_keys`) that producers append to in the same step as what they announce (the
PUBLISH script for messages), read through a consumer group by every worker
(:mod:`app.webhooks.dispatcher`). An event is removed from the queue only once the backend
answered 2xx; a worker that dies leaves its events pending, and another takes them over.
Each request is signed (:mod:`app.webhooks.signing`). Not ordered: receivers deduplicate by
the event's ``id`` and order by its ``ts``.
"""

from __future__ import annotations

from typing import Final

from app.settings import WEBHOOK_EVENTS

EVENTS: Final = WEBHOOK_EVENTS
# The pseudo-room every connected user is present in while webhooks are on (a name no client
# room can have: app.protocol.ROOM_PATTERN); its presence says who is online anywhere.
ONLINE_ROOM: Final = "~online"


def webhook_keys(prefix: str) -> tuple[str, str, str]:
    """The queue stream, the count of events not queued (the backlog was full), and the
    users whose ``user.offline`` waits for its grace period (a sorted set: user -> due ms).
    One hash tag: one cluster slot."""
    return f"{prefix}:{{wh}}:queue", f"{prefix}:{{wh}}:dropped", f"{prefix}:{{wh}}:offline"
