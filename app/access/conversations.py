"""ConversationAccess: the one answer to "may this user do this to this conversation now".

Every path that reads a conversation, writes in it, lists it or shows who is in it asks here:
the frames (``join``, ``history``, ``read``, ``send``, edits and reactions, ``describe``,
``invite``, ``remove``), the inbox (frame and HTTP), the HTTP history routes, and whatever
reads or writes conversations later (search, files, notifications). The answer comes from the
current state, not from what a connection was allowed when it joined.

Contract:
- **Token claims**: a room outside the identity's ``rooms`` claim is refused (``forbidden``:
  the caller's own token says so, nothing about the room is told).
- **Direct conversations** are their two users' only (a conversation id names both).
- **Rooms without a record, and public rooms**: anyone the token allows.
- **Private rooms**: their members only, decided on the room's record as stored now (not a
  worker's cached copy: a removal made through another server holds at once); while the store
  cannot be read, the last record this worker read is used.
- **Outsiders learn nothing**: to someone who may not see a private room, every answer about
  it is the one a room without a record gets (:func:`app.conversations.rooms.room_not_found`): "not
  allowed" and "does not exist" are one answer. Room names are one namespace, so ``create``
  of a taken name (``exists``) and a refused ``join`` where an unused name would make a new
  public room are the only signals, by design (docs/security.md).
- **Bans** hold on every path: sockets are refused and kicked (app.web.admin); the HTTP routes
  ask :meth:`ConversationAccess.require_not_banned`.
"""

from __future__ import annotations

from collections.abc import Iterable

from app.access.auth import Identity
from app.access.quotas import Quotas
from app.conversations.names import is_direct, members_of_direct
from app.conversations.rooms import RoomDirectory, RoomError, RoomRecord, room_not_found
from app.errors import ErrorCode


def claim_refusal(room: str) -> RoomError:
    """The answer to a room outside the token's ``rooms`` claim."""
    return RoomError(ErrorCode.FORBIDDEN, f"your token does not allow room {room!r}")


class ConversationAccess:
    """One per worker. Raises :class:`~app.conversations.rooms.RoomError` (its ``code`` is the error
    frame's;
    HTTP routes map it with :func:`http_status`)."""

    def __init__(self, rooms: RoomDirectory, quotas: Quotas) -> None:
        self._rooms = rooms
        self._quotas = quotas

    async def room(self, identity: Identity, room: str) -> RoomRecord | None:
        """Check that ``identity`` may read and write in ``room`` now (its members and record
        included); return the room's record (None: a room without one)."""
        if not identity.may_use(room):
            raise claim_refusal(room)
        record = await self._rooms.current(room)
        if record is not None and record.room.private and identity.user not in record.members:
            raise room_not_found(room)
        return record

    async def conversation(self, identity: Identity, conversation: str) -> None:
        """Check that ``identity`` may read and write in ``conversation`` (a room, or a
        direct conversation it is one of the two users of)."""
        if is_direct(conversation):
            if identity.user not in members_of_direct(conversation):
                raise RoomError(ErrorCode.NOT_FOUND, "conversation not found")
            return
        await self.room(identity, conversation)

    async def visible(self, identity: Identity, conversations: Iterable[str]) -> set[str]:
        """Those of ``conversations`` that ``identity`` may see listed now (the inbox)."""
        shown: set[str] = set()
        for conversation in conversations:
            try:
                await self.conversation(identity, conversation)
            except RoomError as exc:
                if exc.code is ErrorCode.STORE_UNAVAILABLE:
                    raise
                continue
            shown.add(conversation)
        return shown

    async def require_not_banned(self, user: str) -> None:
        """Refuse (``forbidden``) a user under a moderator's ban."""
        if await self._quotas.ban_of(user) is not None:
            raise RoomError(ErrorCode.FORBIDDEN, "you are banned")


_HTTP_STATUS = {
    ErrorCode.FORBIDDEN: 403,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.STORE_UNAVAILABLE: 503,
    ErrorCode.BROKER_UNAVAILABLE: 503,
}


def http_status(error: RoomError) -> int:
    """The HTTP status that answers ``error``."""
    return _HTTP_STATUS.get(error.code, 400)
