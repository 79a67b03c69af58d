"""Notifications: mentions, levels, Web Push and the notification.needed webhook."""

from typing import Final

# The internal presence room of users with a visible connection (``visibility`` frames): a
# name no room can have (``~``), never announced (app.presence).
VISIBLE_ROOM: Final = "~visible"
