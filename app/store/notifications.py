"""What notifications keep in the store: each user's mentions, notification levels, pending
notifications and Web Push subscriptions (migration 0009).

Contract:
- The archiver records mentions and queues pending notifications as it stores messages
  (:func:`app.store.notify_queue.queue_notifications`).
- :meth:`NotificationStore.due` lists pending notifications whose time has come;
  :meth:`~NotificationStore.settle` records one as sent or dropped, and
  :meth:`~NotificationStore.defer` moves it later. Each compares the pending message id it
  was given: a notification queued meanwhile is never lost (it stays pending, due at once).
- Mentions are listed and counted only while their message is not deleted; the text is the
  newest edit's. The caller asks the one access decision about each conversation.
- Every call raises :class:`~app.store.database.StoreError` when the database fails.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Executable, and_, case, delete, exists, func, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.selectable import FromClause, Join

from app.conversations.lifecycle import Kind
from app.notify.rules import Level, Reason
from app.store.database import StoreError
from app.store.hidden import sent_by_none_of
from app.store.messages import DATABASE_ERRORS
from app.store.notify_queue import greatest
from app.store.schema import (
    members,
    mentions,
    messages,
    notification_levels,
    notify_state,
    participants,
    push_subscriptions,
    read_state,
)


@dataclass(frozen=True, slots=True)
class Mention:
    """A message that mentions the user: its conversation, id, author, text as it is now,
    time, and whether it is after the user's read position."""

    conversation: str
    id: int
    user: str
    text: str
    ts_ms: int
    unread: bool


@dataclass(frozen=True, slots=True)
class Pending:
    """A pending notification: for ``user`` in ``conversation``, of messages up to
    ``message_id`` (``count`` of them), for ``reason``; the last one sent at ``sent_ms``."""

    user: str
    conversation: str
    message_id: int
    reason: Reason
    count: int
    sent_ms: int


@dataclass(frozen=True, slots=True)
class LevelSetting:
    conversation: str
    level: Level
    muted_until_ms: int | None


@dataclass(frozen=True, slots=True)
class PushSubscriptionRow:
    endpoint: str
    p256dh: str
    auth: str


def _not_deleted(
    row_conversation: ColumnElement[str], row_id: ColumnElement[int]
) -> ColumnElement[bool]:
    gone = messages.alias("gone")
    return ~exists().where(
        gone.c.conversation == row_conversation,
        gone.c.target == row_id,
        gone.c.kind == Kind.DELETED,
    )


def _with_read_state(mentioned: FromClause) -> Join:
    """``mentioned`` (``mentions``, or a join from it) with the mentioned user's read position
    of each mention's conversation (NULL: nothing read)."""
    return mentioned.outerjoin(
        read_state,
        and_(
            read_state.c.user == mentions.c.user,
            read_state.c.conversation == mentions.c.conversation,
        ),
    )


class NotificationStore:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def _read(self, query: Executable, what: str) -> Sequence[Any]:
        """The rows of ``query``; StoreError (saying ``what`` failed) when the database does."""
        try:
            async with self._engine.connect() as connection:
                rows: Sequence[Any] = (await connection.execute(query)).all()
                return rows
        except DATABASE_ERRORS as exc:
            raise StoreError(f"{what} failed: {exc!r}") from exc

    # -- mentions -----------------------------------------------------------------------------

    async def mentions_of(
        self, user: str, before_ms: int | None, limit: int, hidden: frozenset[str] = frozenset()
    ) -> list[Mention]:
        """``user``'s mentions, newest first, sent before ``before_ms`` (None: all), at most
        ``limit``, but for those sent by the users in ``hidden``."""
        newest_edit = messages.alias("edit")
        text_now = func.coalesce(
            select(newest_edit.c.text)
            .where(
                newest_edit.c.conversation == mentions.c.conversation,
                newest_edit.c.target == mentions.c.id,
                newest_edit.c.kind == Kind.EDITED,
            )
            .order_by(newest_edit.c.id.desc())
            .limit(1)
            .scalar_subquery(),
            messages.c.text,
        )
        query = (
            select(
                mentions.c.conversation,
                mentions.c.id,
                messages.c.user,
                text_now,
                mentions.c.ts_ms,
                mentions.c.id > func.coalesce(read_state.c.last_read_id, 0),
            )
            .select_from(
                _with_read_state(
                    mentions.join(
                        messages,
                        and_(
                            messages.c.conversation == mentions.c.conversation,
                            messages.c.id == mentions.c.id,
                        ),
                    )
                )
            )
            .where(
                mentions.c.user == user,
                _not_deleted(mentions.c.conversation, mentions.c.id),
            )
            .order_by(mentions.c.ts_ms.desc(), mentions.c.id.desc())
            .limit(limit)
        )
        if before_ms is not None:
            query = query.where(mentions.c.ts_ms < before_ms)
        if hidden:
            query = query.where(messages.c.user.not_in(sorted(hidden)))
        rows = await self._read(query, "reading mentions")
        return [
            Mention(str(c), int(i), str(u), str(t), int(ts), bool(unread))
            for c, i, u, t, ts, unread in rows
        ]

    async def unread_mentions(
        self, user: str, cap: int, hidden: frozenset[str] = frozenset()
    ) -> dict[str, int]:
        """How many of ``user``'s mentions are after their read position, per conversation
        (those with any), each counted up to ``cap + 1``; none sent by the users in
        ``hidden``."""
        query = (
            select(mentions.c.conversation, func.count())
            .select_from(_with_read_state(mentions))
            .where(
                mentions.c.user == user,
                mentions.c.id > func.coalesce(read_state.c.last_read_id, 0),
                _not_deleted(mentions.c.conversation, mentions.c.id),
            )
            .group_by(mentions.c.conversation)
        )
        if hidden:
            query = query.where(sent_by_none_of(mentions, sorted(hidden)))
        rows = await self._read(query, "counting mentions")
        return {str(c): min(int(n), cap + 1) for c, n in rows}

    async def taking_part(self, conversation: str, users: Sequence[str]) -> set[str]:
        """Those of ``users`` who take part in ``conversation``: wrote in it or marked it read
        (``participants``), or are members of its room."""
        if not users:
            return set()
        query = (
            select(participants.c.user)
            .where(participants.c.conversation == conversation, participants.c.user.in_(users))
            .union(
                select(members.c.user).where(
                    members.c.room == conversation, members.c.user.in_(users)
                )
            )
        )
        return {str(row[0]) for row in await self._read(query, "reading participants")}

    # -- levels -------------------------------------------------------------------------------

    async def level_of(self, user: str, conversation: str) -> LevelSetting | None:
        """``user``'s chosen level of ``conversation`` (None: never chosen: the default)."""
        query = select(notification_levels.c.level, notification_levels.c.muted_until_ms).where(
            notification_levels.c.user == user, notification_levels.c.conversation == conversation
        )
        found = await self._read(query.limit(1), "reading a notification level")
        row = found[0] if found else None
        return None if row is None else LevelSetting(conversation, Level(row[0]), row[1])

    async def set_level(
        self, user: str, conversation: str, level: Level, muted_until_ms: int | None
    ) -> None:
        """Keep ``user``'s ``level`` and mute of ``conversation``."""
        row = {
            "user": user, "conversation": conversation, "level": int(level),
            "muted_until_ms": muted_until_ms,
        }  # fmt: skip
        insert = postgresql.insert if self._engine.dialect.name == "postgresql" else sqlite.insert
        new = insert(notification_levels).values(row)
        upsert = new.on_conflict_do_update(
            index_elements=[notification_levels.c.user, notification_levels.c.conversation],
            set_={"level": new.excluded.level, "muted_until_ms": new.excluded.muted_until_ms},
        )
        try:
            async with self._engine.begin() as connection:
                await connection.execute(upsert)
        except DATABASE_ERRORS as exc:
            raise StoreError(f"storing a notification level failed: {exc!r}") from exc

    async def levels(self, user: str, limit: int) -> list[LevelSetting]:
        """The conversations whose level ``user`` chose, by name, at most ``limit``."""
        query = (
            select(
                notification_levels.c.conversation,
                notification_levels.c.level,
                notification_levels.c.muted_until_ms,
            )
            .where(notification_levels.c.user == user)
            .order_by(notification_levels.c.conversation)
            .limit(limit)
        )
        rows = await self._read(query, "reading notification levels")
        return [LevelSetting(str(c), Level(level), muted) for c, level, muted in rows]

    # -- pending notifications ----------------------------------------------------------------

    async def due(self, now_ms: int, limit: int) -> list[Pending]:
        """Pending notifications due by ``now_ms``, the longest due first, at most ``limit``."""
        query = (
            select(
                notify_state.c.user,
                notify_state.c.conversation,
                notify_state.c.pending_id,
                notify_state.c.reason,
                notify_state.c.pending_count,
                notify_state.c.sent_ms,
            )
            .where(notify_state.c.due_ms <= now_ms, notify_state.c.pending_id.is_not(None))
            .order_by(notify_state.c.due_ms)
            .limit(limit)
        )
        rows = await self._read(query, "reading pending notifications")
        return [
            Pending(str(u), str(c), int(i), Reason(r), int(n), int(s)) for u, c, i, r, n, s in rows
        ]

    async def defer(self, pending: Pending, due_ms: int) -> None:
        """Make ``pending`` due at ``due_ms`` instead."""
        await self._update(pending, {"due_ms": due_ms})

    async def settle(self, pending: Pending, sent_ms: int | None, next_due_ms: int) -> None:
        """``pending`` was sent at ``sent_ms`` (None: dropped, not sent). A notification queued
        after it was read (a newer message) stays pending, due at ``next_due_ms``."""
        newer = notify_state.c.pending_id > pending.message_id
        changes: dict[str, object] = {
            "pending_id": case((newer, notify_state.c.pending_id), else_=None),
            "reason": case((newer, notify_state.c.reason), else_=None),
            "due_ms": case((newer, next_due_ms), else_=None),
            "pending_count": case((newer, notify_state.c.pending_count - pending.count), else_=0),
            "notified_id": greatest(
                self._engine.dialect.name, notify_state.c.notified_id, pending.message_id
            ),
        }
        if sent_ms is not None:
            changes["sent_ms"] = sent_ms
        try:
            async with self._engine.begin() as connection:
                await connection.execute(
                    update(notify_state)
                    .where(
                        notify_state.c.user == pending.user,
                        notify_state.c.conversation == pending.conversation,
                        notify_state.c.pending_id >= pending.message_id,
                    )
                    .values(changes)
                )
        except DATABASE_ERRORS as exc:
            raise StoreError(f"settling a notification failed: {exc!r}") from exc

    async def _update(self, pending: Pending, changes: dict[str, object]) -> None:
        try:
            async with self._engine.begin() as connection:
                await connection.execute(
                    update(notify_state)
                    .where(
                        notify_state.c.user == pending.user,
                        notify_state.c.conversation == pending.conversation,
                    )
                    .values(changes)
                )
        except DATABASE_ERRORS as exc:
            raise StoreError(f"updating a notification failed: {exc!r}") from exc

    async def read_position(self, user: str, conversation: str) -> int:
        """``user``'s read position in ``conversation`` (0: nothing read)."""
        query = select(read_state.c.last_read_id).where(
            read_state.c.user == user, read_state.c.conversation == conversation
        )
        found = await self._read(query, "reading a read position")
        return int(found[0][0]) if found else 0

    async def message_now(self, conversation: str, message_id: int) -> tuple[str, str, int] | None:
        """The author, text as it is now (newest edit) and time of a message; None when it
        is deleted or not stored."""
        query = select(messages.c.id, messages.c.kind, messages.c.user, messages.c.text,
                       messages.c.ts_ms).where(
            messages.c.conversation == conversation,
            or_(
                and_(messages.c.id == message_id, messages.c.kind == Kind.MESSAGE),
                and_(
                    messages.c.target == message_id,
                    messages.c.kind.in_([Kind.EDITED, Kind.DELETED]),
                ),
            ),
        ).order_by(messages.c.id)  # fmt: skip
        rows = await self._read(query, "reading a message")
        found: tuple[str, str, int] | None = None
        for _, kind, user, text, ts_ms in rows:
            if kind == Kind.MESSAGE:
                found = (str(user), str(text), int(ts_ms))
            elif kind == Kind.DELETED:
                return None
            elif found is not None:
                found = (found[0], str(text), found[2])
        return found

    # -- Web Push subscriptions ---------------------------------------------------------------

    async def subscribe(
        self, user: str, endpoint: str, p256dh: str, auth: str, now_ms: int, per_user_max: int
    ) -> None:
        """Keep ``user``'s subscription (an endpoint another user had becomes this user's: the
        browser changed hands); beyond ``per_user_max`` the user's oldest ones go."""
        row = {
            "endpoint": endpoint, "user": user, "p256dh": p256dh, "auth": auth,
            "created_ms": now_ms,
        }  # fmt: skip
        insert = postgresql.insert if self._engine.dialect.name == "postgresql" else sqlite.insert
        new = insert(push_subscriptions).values(row)
        upsert = new.on_conflict_do_update(
            index_elements=[push_subscriptions.c.endpoint],
            set_={
                "user": new.excluded.user, "p256dh": new.excluded.p256dh,
                "auth": new.excluded.auth, "created_ms": new.excluded.created_ms,
            },
        )  # fmt: skip
        keep = (
            select(push_subscriptions.c.endpoint)
            .where(push_subscriptions.c.user == user)
            .order_by(push_subscriptions.c.created_ms.desc(), push_subscriptions.c.endpoint)
            .limit(per_user_max)
        )
        try:
            async with self._engine.begin() as connection:
                await connection.execute(upsert)
                kept = [row[0] for row in (await connection.execute(keep)).all()]
                await connection.execute(
                    delete(push_subscriptions).where(
                        push_subscriptions.c.user == user,
                        push_subscriptions.c.endpoint.not_in(kept),
                    )
                )
        except DATABASE_ERRORS as exc:
            raise StoreError(f"storing a push subscription failed: {exc!r}") from exc

    async def unsubscribe(self, endpoint: str, user: str | None = None) -> bool:
        """Forget the subscription at ``endpoint`` (only ``user``'s, if given); whether there
        was one."""
        condition = push_subscriptions.c.endpoint == endpoint
        if user is not None:
            condition = and_(condition, push_subscriptions.c.user == user)
        try:
            async with self._engine.begin() as connection:
                result = await connection.execute(delete(push_subscriptions).where(condition))
        except DATABASE_ERRORS as exc:
            raise StoreError(f"removing a push subscription failed: {exc!r}") from exc
        return bool(result.rowcount)

    async def subscriptions_of(self, user: str) -> list[PushSubscriptionRow]:
        query = select(
            push_subscriptions.c.endpoint, push_subscriptions.c.p256dh, push_subscriptions.c.auth
        ).where(push_subscriptions.c.user == user)
        rows = await self._read(query, "reading push subscriptions")
        return [PushSubscriptionRow(str(e), str(p), str(a)) for e, p, a in rows]
