"""What notifies whom: notification levels, the reasons a message is for someone, and the
rule that decides, when a pending notification is due, whether it is sent.

Contract (docs/protocol.md, "Mentions and notifications"):
- A level is per user and conversation: ``ALL`` (every message), ``MENTIONS`` (mentions and
  direct messages; the default of rooms) or ``NONE``; a direct conversation's default is
  ``ALL``. A mute silences a conversation until its time, whatever the level.
- A message is for a user for a :class:`Reason`: ``DIRECT`` (the other user of a direct
  message), ``MENTION`` (mentioned), or ``ALL`` (their level of the room is ``ALL``); pending
  reasons of one conversation fold into the strongest (the larger value).
- :func:`wanted` is the level and mute half of the decision; the notifier adds the other
  halves (read, access, visibility, interval).
"""

from __future__ import annotations

from enum import IntEnum

from app.conversations.names import is_direct


class Level(IntEnum):
    NONE = 0
    MENTIONS = 1
    ALL = 2


class Reason(IntEnum):
    ALL = 1
    DIRECT = 2
    MENTION = 3


LEVEL_NAMES: dict[Level, str] = {Level.NONE: "none", Level.MENTIONS: "mentions", Level.ALL: "all"}
LEVELS_BY_NAME: dict[str, Level] = {name: level for level, name in LEVEL_NAMES.items()}
REASON_NAMES: dict[Reason, str] = {
    Reason.ALL: "all", Reason.DIRECT: "direct", Reason.MENTION: "mention",
}  # fmt: skip


def default_level(conversation: str) -> Level:
    """What a user gets from ``conversation`` until they choose: all of a direct conversation,
    mentions of a room."""
    return Level.ALL if is_direct(conversation) else Level.MENTIONS


def wanted(level: Level, muted_until_ms: int | None, reason: Reason, now_ms: int) -> bool:
    """Whether a notification for ``reason`` is wanted at ``now_ms`` by a user with ``level``
    and ``muted_until_ms`` (None or past: not muted) for the conversation."""
    if muted_until_ms is not None and muted_until_ms > now_ms:
        return False
    if level is Level.NONE:
        return False
    if level is Level.MENTIONS:
        return reason in (Reason.MENTION, Reason.DIRECT)
    return True
