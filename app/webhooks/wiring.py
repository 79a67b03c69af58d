"""Connecting webhooks to what they report: presence (online/offline), room membership."""

from __future__ import annotations

import os
import socket

from app.conversations.rooms import RoomDirectory
from app.presence import Presence
from app.redisio.clients import command_client
from app.settings import Settings
from app.sockets.hub import Hub
from app.webhooks import ONLINE_ROOM
from app.webhooks.dispatcher import WebhookDispatcher
from app.webhooks.queue import WebhookQueue


def connect_webhooks(
    settings: Settings, presence: Presence, hub: Hub, rooms: RoomDirectory
) -> WebhookDispatcher | None:
    """With ``CHAT_WEBHOOK_URL``: queue member changes and online/offline transitions, and
    return this worker's dispatcher (to run); None without webhooks. (``message.created`` is
    queued by the PUBLISH script.)"""
    if settings.webhook_url is None:
        return None
    redis = command_client(settings)
    queue = WebhookQueue(redis, settings)
    if queue.wants("user.online") or queue.wants("user.offline"):
        hub.online_room = ONLINE_ROOM

        async def online(room: str, event: str, user: str) -> None:
            if room != ONLINE_ROOM:
                return
            if event == "join":
                await queue.user_arrived(user)
            else:
                await queue.user_left(user)

        presence.on_internal(online)

    async def member(event: str, room: str, user: str, role: str | None, by: str | None) -> None:
        await queue.enqueue(event, {"room": room, "user": user, "role": role, "by": by})

    rooms.member_listener = member
    consumer = f"{socket.gethostname()}:{os.getpid()}"
    return WebhookDispatcher(redis, queue, settings, consumer)
