"""Mentions in a message's text: ``@name`` and ``@here``, found by :func:`named`, and how a
message's mentions are kept (:func:`stored_form`, :func:`from_stored`).

Contract:
- ``@name`` is a user name (``app.protocol.USER_PATTERN``) after ``@`` that does not follow
  a word character or another ``@`` (so an e-mail address mentions no one); a trailing ``.``
  or ``-`` is punctuation, not part of the name. ``@here`` is always the room-wide mention
  (no user can be mentioned by the name ``here``).
- Which named users are mentioned (they may read the conversation and take part in it, at
  most ``CHAT_MENTIONS_PER_MESSAGE_MAX``, never the sender) is decided by the session with the
  one access decision: see ``app.sockets.session``.
- Stored (``messages.mentions``, and the archive's frame) as a JSON list of the mentioned
  users, with ``"@here"`` for ``here`` (a name no user can have).
"""

from __future__ import annotations

import re
from typing import Final

import orjson

HERE: Final = "here"
_STORED_HERE: Final = "@here"
_MENTION: Final = re.compile(r"(?<![\w@])@([A-Za-z0-9][A-Za-z0-9_.\-]{0,31})")


def named(text: str) -> tuple[list[str], bool]:
    """The distinct user names ``text`` mentions, in the order they first appear, and whether
    it mentions ``@here``."""
    if "@" not in text:
        return [], False
    names: list[str] = []
    here = False
    for match in _MENTION.finditer(text):
        name = match.group(1).rstrip(".-")
        if name == HERE:
            here = True
        elif name and name not in names:
            names.append(name)
    return names, here


def stored_form(users: list[str], here: bool) -> str | None:
    """A message's mentions as ``messages.mentions`` keeps them (None: none)."""
    if not users and not here:
        return None
    return orjson.dumps([*users, _STORED_HERE] if here else users).decode()


def from_stored(raw: str | None) -> tuple[list[str], bool]:
    """The mentioned users and ``here`` of a stored form (None: none)."""
    if raw is None:
        return [], False
    values = [str(value) for value in orjson.loads(raw)]
    return [value for value in values if value != _STORED_HERE], _STORED_HERE in values
