"""Inboxes and read state: the conversations each user takes part in, the newest message of
each, and how many they have not read.

Contract:
- A user's read position in a conversation only moves forward: :meth:`Inbox.mark_read` with
  an id below the stored one changes nothing. Marking a conversation read makes it part of
  the user's inbox.
- Unread counts are the stored messages after the read position, counted no further than
  ``unread_cap + 1`` (a client shows "N+"). They follow the archive: a message not archived
  yet (see the archive lag metric) is not counted yet.
- Messages of the users a user hides (``hidden``: muted and blocked, app.access.hiding) are
  neither counted (unread, mentions) nor shown as a conversation's newest message.
- Every call raises :class:`~app.store.database.StoreError` when the database fails.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, exists, func, select, tuple_
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncEngine

from app.conversations.lifecycle import Kind, fold
from app.conversations.names import is_direct
from app.store.database import StoreError
from app.store.hidden import sent_by_none_of
from app.store.messages import DATABASE_ERRORS, StoredMessage, insert_ignoring_duplicates
from app.store.schema import mentions, messages, participants, read_state


@dataclass(frozen=True, slots=True)
class InboxEntry:
    """One conversation of an inbox: its newest stored message (None: none stored yet), the
    user's read position (0: nothing read), how many stored messages follow it, and (direct
    conversations) the other user's read position."""

    conversation: str
    last: StoredMessage | None
    last_read: int
    unread: int
    peer_read: int = 0
    last_state: dict[str, Any] | None = (
        None  # what events did to ``last`` (app.conversations.lifecycle)
    )
    mentions: int = 0  # of the unread messages, how many mention the user


class Inbox:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def mark_read(self, user: str, conversation: str, message_id: int) -> int:
        """Move ``user``'s read position in ``conversation`` up to ``message_id``; returns the
        position now stored (higher than ``message_id`` when it already was)."""
        row = {"user": user, "conversation": conversation, "last_read_id": message_id}
        if self._engine.dialect.name == "postgresql":
            upsert_pg = postgresql.insert(read_state).values(row)
            upsert: postgresql.Insert | sqlite.Insert = upsert_pg.on_conflict_do_update(
                index_elements=[read_state.c.user, read_state.c.conversation],
                set_={"last_read_id": func.greatest(read_state.c.last_read_id, message_id)},
            )
        else:
            upsert = (
                sqlite.insert(read_state)
                .values(row)
                .on_conflict_do_update(
                    index_elements=[read_state.c.user, read_state.c.conversation],
                    set_={"last_read_id": func.max(read_state.c.last_read_id, message_id)},
                )
            )
        try:
            async with self._engine.begin() as connection:
                await connection.execute(upsert)
                await connection.execute(
                    insert_ignoring_duplicates(self._engine, participants),
                    [{"user": user, "conversation": conversation}],
                )
                stored = await connection.execute(
                    select(read_state.c.last_read_id).where(
                        read_state.c.user == user, read_state.c.conversation == conversation
                    )
                )
                return int(stored.scalar_one())
        except DATABASE_ERRORS as exc:
            raise StoreError(f"storing a read position failed: {exc!r}") from exc

    async def entries(
        self, user: str, limit: int, unread_cap: int, hidden: frozenset[str] = frozenset()
    ) -> list[InboxEntry]:
        """``user``'s conversations, the most recently active first, at most ``limit``,
        leaving out what the users in ``hidden`` sent."""
        shown = sorted(hidden)
        newest = messages.alias("newest")
        last_id = (
            select(func.max(newest.c.id))
            .where(
                newest.c.conversation == participants.c.conversation,
                newest.c.kind == Kind.MESSAGE,
                *([newest.c.user.not_in(shown)] if hidden else []),
            )
            .scalar_subquery()
        )
        after = messages.alias("after_read")
        unread_rows = (
            select(after.c.id)
            .where(
                after.c.conversation == participants.c.conversation,
                after.c.id > func.coalesce(read_state.c.last_read_id, 0),
                after.c.kind == Kind.MESSAGE,
                *([after.c.user.not_in(shown)] if hidden else []),
            )
            .limit(unread_cap + 1)
            .correlate(participants, read_state)  # a FROM subquery is not correlated unasked
            .subquery()
        )
        unread = select(func.count()).select_from(unread_rows).scalar_subquery()
        gone = messages.alias("gone")
        mentioned_rows = (
            select(mentions.c.id)
            .where(
                mentions.c.user == participants.c.user,
                mentions.c.conversation == participants.c.conversation,
                mentions.c.id > func.coalesce(read_state.c.last_read_id, 0),
                ~exists().where(
                    gone.c.conversation == mentions.c.conversation,
                    gone.c.target == mentions.c.id,
                    gone.c.kind == Kind.DELETED,
                ),
                *([sent_by_none_of(mentions, shown)] if hidden else []),
            )
            .limit(unread_cap + 1)
            .correlate(participants, read_state)
            .subquery()
        )
        mentioned = select(func.count()).select_from(mentioned_rows).scalar_subquery()
        query = (
            select(
                participants.c.conversation,
                func.coalesce(read_state.c.last_read_id, 0),
                last_id,
                unread,
                mentioned,
            )
            .select_from(
                participants.outerjoin(
                    read_state,
                    and_(
                        read_state.c.user == participants.c.user,
                        read_state.c.conversation == participants.c.conversation,
                    ),
                )
            )
            .where(participants.c.user == user)
            .order_by(last_id.desc().nulls_last(), participants.c.conversation)
            .limit(limit)
        )
        try:
            async with self._engine.connect() as connection:
                rows = (await connection.execute(query)).all()
                keys = [(row[0], row[2]) for row in rows if row[2] is not None]
                last: dict[str, StoredMessage] = {}
                states: dict[tuple[str, int], dict[str, Any]] = {}
                if keys:
                    found = await connection.execute(
                        select(messages).where(
                            tuple_(messages.c.conversation, messages.c.id).in_(keys)
                        )
                    )
                    last = {row[0]: StoredMessage._make(row) for row in found.all()}
                    events = await connection.execute(
                        select(messages)
                        .where(
                            tuple_(messages.c.conversation, messages.c.target).in_(keys),
                            messages.c.kind != Kind.MESSAGE,
                        )
                        .order_by(messages.c.id)
                    )
                    rows_of_events = [StoredMessage._make(row) for row in events.all()]
                    states = fold(
                        ((e.conversation, e.target or 0), Kind(e.kind), e.user, e.text, e.ts_ms)
                        for e in rows_of_events
                    )
                direct = [row[0] for row in rows if is_direct(row[0])]
                peers: dict[str, int] = {}
                if direct:
                    found = await connection.execute(
                        select(read_state.c.conversation, read_state.c.last_read_id).where(
                            read_state.c.conversation.in_(direct), read_state.c.user != user
                        )
                    )
                    peers = {str(c): int(i) for c, i in found.all()}
        except DATABASE_ERRORS as exc:
            raise StoreError(f"reading the inbox of {user!r} failed: {exc!r}") from exc
        return [
            InboxEntry(
                conversation,
                last.get(conversation),
                int(read),
                int(count),
                peers.get(conversation, 0),
                states.get((conversation, newest)) if newest is not None else None,
                int(mentioned_count),
            )
            for conversation, read, newest, count, mentioned_count in rows
        ]

    async def positions(self, conversation: str, limit: int) -> dict[str, int]:
        """Where the users who read ``conversation`` are: user → read position, the ``limit``
        furthest along."""
        query = (
            select(read_state.c.user, read_state.c.last_read_id)
            .where(read_state.c.conversation == conversation)
            .order_by(read_state.c.last_read_id.desc())
            .limit(limit)
        )
        try:
            async with self._engine.connect() as connection:
                rows = (await connection.execute(query)).all()
        except DATABASE_ERRORS as exc:
            raise StoreError(
                f"reading the read positions of {conversation!r} failed: {exc!r}"
            ) from exc
        return {str(user): int(position) for user, position in rows}
