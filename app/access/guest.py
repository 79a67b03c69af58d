"""Guest identities (``CHAT_AUTH_MODE=guest``): chat without accounts, where nobody can take
over somebody else's identity.

A guest says who it is with a display name and a key of its own, a random secret its
browser keeps, in its first frame (``{"type":"auth","name":…,"guest":…}`` after connecting
with ``?auth=frame``; old clients still send ``?name=`` and ``?guest=`` in the URL, which the
logs redact); without a key the server makes one and hands it back in ``hello``. The user is
the name plus the first 16 hex digits of the key's SHA-256: the same browser is the same user
on every reconnect, worker and pod (no server state, no shared secret), and a second ``bob``
is another user, who does not get the first one's direct messages. Forging a given user means
finding a key for a 64-bit hash prefix.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from typing import Final

NAME_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9_.]{0,14}$"  # no '-': it ends the name
KEY_PATTERN: Final = r"^[A-Za-z0-9_-]{16,128}$"
_NAME, _KEY = re.compile(NAME_PATTERN), re.compile(KEY_PATTERN)
_SUFFIX_HEX: Final = 16


@dataclass(frozen=True, slots=True)
class Guest:
    """A guest's user id, and its key when the server made it (to hand back in ``hello``)."""

    user: str
    new_key: str | None = None


class GuestError(ValueError):
    """A name or key that cannot make a guest identity; the message says which."""


def guest_user(name: str, key: str) -> str:
    """The user id of display name ``name`` with key ``key``."""
    digest = hashlib.sha256(b"hubbub-guest\x00" + key.encode()).hexdigest()
    return f"{name}-{digest[:_SUFFIX_HEX]}"


def display_name(user: str) -> str:
    """The display name part of a guest user id (the id itself for other users)."""
    name, dash, suffix = user.rpartition("-")
    return name if dash and len(suffix) == _SUFFIX_HEX else user


def identify_guest(name: str | None, key: str | None) -> Guest:
    """The guest identity for a name and a key (from the first frame or the URL); raises
    :class:`GuestError`, whose message never holds the key."""
    name = name or "guest"
    if not _NAME.fullmatch(name):
        raise GuestError("invalid name: 1-15 letters, digits, '_' or '.'")
    if key is None:
        key = secrets.token_urlsafe(24)
        return Guest(guest_user(name, key), new_key=key)
    if not _KEY.fullmatch(key):
        raise GuestError("invalid guest key: 16-128 letters, digits, '_' or '-'")
    return Guest(guest_user(name, key))
