"""Conversation names: a room is its own name; the direct messages between two users are the
conversation ``@<a>:<b>`` (the two names in order). No room name can start with ``@`` and no
user name can hold ``:`` (:data:`app.protocol.ROOM_PATTERN`, :data:`~app.protocol.USER_PATTERN`),
so a name means one conversation only: nobody can join a room that reads someone's DMs.

Room notices (:meth:`app.broker.Broker.room_changed`) also carry ``!hidden:<user>``: whom that
user hides changed (:mod:`app.access.hiding`). No room name starts with ``!``.
"""

from __future__ import annotations


def direct(user: str, other: str) -> str:
    """The conversation of ``user`` and ``other`` (the same from either side)."""
    a, b = sorted((user, other))
    return f"@{a}:{b}"


def is_direct(conversation: str) -> bool:
    return conversation.startswith("@")


def members_of_direct(conversation: str) -> tuple[str, str]:
    """The two users of a direct conversation."""
    a, _, b = conversation[1:].partition(":")
    return a, b


def addressed(conversation: str, user: str) -> tuple[str, str]:
    """How a frame ``user`` sends in ``conversation`` names it: (``"room"``, the room), or
    (``"to"``, the other user) in a direct conversation."""
    if is_direct(conversation):
        return "to", peer(conversation, user)
    return "room", conversation


def peer(conversation: str, user: str) -> str:
    """The other user of a direct conversation ``user`` is in."""
    a, b = members_of_direct(conversation)
    return b if a == user else a


_HIDDEN_NOTICE = "!hidden:"


def hidden_notice(user: str) -> str:
    """The room notice that says whom ``user`` hides changed."""
    return _HIDDEN_NOTICE + user


def notice_user(notice: str) -> str | None:
    """The user a room notice is about (None: it is about a room)."""
    return notice[len(_HIDDEN_NOTICE) :] if notice.startswith(_HIDDEN_NOTICE) else None
