"""A message's life after it is sent: edits, deletion and reactions.

Each change is an *event*: a numbered frame in the conversation's log, with its own id from the
same sequence as messages (``edited``, ``deleted``, ``reaction``; see ``docs/protocol.md``).
So events are ordered with the messages they touch, always after them; a join with ``since``
replays them; they are archived into the store beside the messages; and every guarantee a
message has (ack with ``cid``, dedup of retries, the sender's message quota, at-least-once
archiving) an event has too.

Besides the log, each conversation keeps the *current state* of the messages events touched,
so that a page of history shows messages as they are now: the Redis broker in a hash per
room, the memory broker in a dict, the store by folding a page's events (:func:`fold`). A
state is a JSON object with any of ``text`` and ``edited`` (the newest edit and its time),
``deleted`` (true: a tombstone, its text gone) and ``reactions`` (emoji → the users who
reacted with it, in order; an emoji nobody reacts with any more is absent). The Redis
script builds the same objects in Lua (:data:`app.broker.redis_scripts.EVENT`).

Who may do what (checked by :class:`app.sockets.session.Session` before publishing): the author
edits;
the author or a moderator deletes; anyone who may read the conversation reacts and replies.
Nothing changes a deleted message: an event on one is refused (``not_found``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Final, TypeVar

import orjson

K = TypeVar("K")


class Kind(IntEnum):
    """What a row of the store holds (column ``kind``): a message or one of its events."""

    MESSAGE = 0
    EDITED = 1
    DELETED = 2
    REACTION_ON = 3
    REACTION_OFF = 4


# The frame ``type`` of each kind.
FRAME_TYPES: Final = {
    Kind.MESSAGE: "message",
    Kind.EDITED: "edited",
    Kind.DELETED: "deleted",
    Kind.REACTION_ON: "reaction",
    Kind.REACTION_OFF: "reaction",
}
# The frames that carry an id: messages and events, numbered in one sequence per conversation.
NUMBERED_TYPES: Final = frozenset(FRAME_TYPES.values())


@dataclass(frozen=True, slots=True)
class Target:
    """A message an event or a reply refers to, as found: its author, and its current state
    (None when nothing changed it yet)."""

    user: str
    state: dict[str, Any] | None = None

    @property
    def deleted(self) -> bool:
        return bool(self.state and self.state.get("deleted"))


@dataclass(frozen=True, slots=True)
class Change:
    """An event to publish: ``user`` edits (``kind`` EDITED, with ``text``), deletes, or
    toggles reaction ``text`` (``kind`` REACTION_ON: the broker decides on or off) on message
    ``target``."""

    kind: Kind
    target: int
    user: str
    text: str = ""


def reacted(state: dict[str, Any] | None, emoji: str, user: str) -> bool:
    """Whether ``user`` has reacted with ``emoji`` in ``state``."""
    return bool(state) and user in state.get("reactions", {}).get(emoji, ())  # type: ignore[union-attr]


def apply(
    state: dict[str, Any] | None, kind: Kind, user: str, text: str, ts_ms: int
) -> dict[str, Any]:
    """The state after one event (a new dict; ``state`` is left as it is)."""
    new: dict[str, Any] = dict(state or {})
    if kind is Kind.EDITED:
        new["text"], new["edited"] = text, ts_ms
    elif kind is Kind.DELETED:
        return {"deleted": True}
    elif kind in (Kind.REACTION_ON, Kind.REACTION_OFF):
        reactions = {emoji: list(users) for emoji, users in new.get("reactions", {}).items()}
        users = [u for u in reactions.get(text, ()) if u != user]
        if kind is Kind.REACTION_ON:
            users.append(user)
        if users:
            reactions[text] = users
        else:
            reactions.pop(text, None)
        if reactions:
            new["reactions"] = reactions
        else:
            new.pop("reactions", None)
    return new


def fold(events: Iterable[tuple[K, Kind, str, str, int]]) -> dict[K, dict[str, Any]]:
    """The states events leave: ``events`` are (target, kind, user, text, ts_ms) in id order;
    the target is whatever names a message (its id, or (conversation, id))."""
    states: dict[K, dict[str, Any]] = {}
    for target, kind, user, text, ts_ms in events:
        states[target] = apply(states.get(target), kind, user, text, ts_ms)
    return states


def with_state(frame: bytes, state: dict[str, Any] | None) -> bytes:
    """A ``message`` frame as it is now: ``text`` edited (with ``edited``, the time of the
    edit), or emptied with ``deleted: true``; ``reactions`` when there are any."""
    if not state:
        return frame
    message: dict[str, Any] = orjson.loads(frame)
    if state.get("deleted"):
        message["text"] = ""
        message["deleted"] = True
        message.pop("reply_to", None)
        return orjson.dumps(message)
    if "text" in state:
        message["text"] = state["text"]
        message["edited"] = state["edited"]
    if state.get("reactions"):
        message["reactions"] = state["reactions"]
    return orjson.dumps(message)
