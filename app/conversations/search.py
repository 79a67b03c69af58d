"""Search as the ``search`` frame and ``GET /search`` answer it: the store's matches, each
conversation passed through the one access decision (:mod:`app.access.conversations`).

Contract: :func:`search` returns only messages ``identity`` may read now. With a conversation
named, that conversation is checked first (refused as any frame about it is: ``not_found``
for a private room one is not a member of and for a room nobody uses, ``forbidden`` outside
the token's rooms claim).
Without one, the store narrows the candidates in SQL, and every conversation a page holds is
checked again before it is shown; a page may then hold fewer than ``limit`` results, and
``next_offset`` (None on the last page) says where the next one starts. Messages of the
users in ``hidden`` (whom the user mutes and blocks, :mod:`app.access.hiding`) are left out
in SQL. Raises
:class:`~app.conversations.rooms.RoomError` (``no_store`` without a store,
``store_unavailable`` while it cannot be read).
"""

from __future__ import annotations

from typing import Any

from app.access.auth import Identity
from app.access.conversations import ConversationAccess
from app.conversations.names import direct, is_direct, members_of_direct
from app.conversations.rooms import RoomDirectory, RoomError, room_not_found
from app.errors import ErrorCode
from app.store.database import StoreError
from app.store.search import Hit, Order, SearchStore


async def search(
    store: SearchStore | None,
    access: ConversationAccess,
    rooms: RoomDirectory,
    identity: Identity,
    query: str,
    room: str | None,
    peer: str | None,
    order: Order,
    limit: int,
    offset: int,
    hidden: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """The page of results (see the module's contract): ``{"q", "results", "next_offset"}``."""
    if store is None:  # no store, or CHAT_SEARCH_INDEX=false
        raise RoomError(ErrorCode.NO_STORE, "this server does not search its messages")
    user = identity.user
    conversation = room if room is not None else direct(user, peer) if peer is not None else None
    if conversation is not None:
        await access.conversation(identity, conversation)
        if room is not None and not await rooms.in_use(room):
            # As history answers: a room nobody uses and a private room one may not read
            # are one answer (docs/security.md).
            raise room_not_found(room)
    try:
        hits = await store.search(user, query, conversation, order, limit, offset, hidden)
    except StoreError as exc:
        raise RoomError(ErrorCode.STORE_UNAVAILABLE, "search unavailable, try again") from exc
    shown = await access.visible(identity, {hit.conversation for hit in hits})
    results = [result_of(hit, user) for hit in hits if hit.conversation in shown]
    more = len(hits) == limit
    return {"q": query, "results": results, "next_offset": offset + limit if more else None}


def result_of(hit: Hit, user: str) -> dict[str, Any]:
    """A hit as frames and the API show it: where (``room`` or ``with``), the message, and
    where the matched words are in its text (``highlights``: [start, end) in characters)."""
    where: dict[str, Any]
    if is_direct(hit.conversation):
        a, b = members_of_direct(hit.conversation)
        where = {"with": b if a == user else a}
    else:
        where = {"room": hit.conversation}
    return {
        **where, "id": hit.id, "user": hit.user, "ts": hit.ts_ms, "text": hit.text,
        "highlights": [list(span) for span in hit.highlights],
    }  # fmt: skip
