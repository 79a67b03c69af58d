"""The archiver's half of notifications: as a batch of messages is stored, in the same
transaction, each mention is recorded (``mentions``; the conversation joins the mentioned
user's inbox) and a pending notification is queued per
(user, conversation) a message is for (:class:`app.notify.rules.Reason`; never its sender),
due ``grace_ms`` after the first one pending (``notify_state``). Idempotent: a batch archived
again adds no mention twice and queues nothing already notified (``notified_id``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from sqlalchemy import func, literal, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import ColumnElement

from app.conversations.lifecycle import Kind
from app.conversations.names import is_direct, members_of_direct
from app.notify.mentions import from_stored
from app.notify.rules import Level, Reason
from app.store.schema import mentions, notification_levels, notify_state, participants


class StoredMessage(Protocol):
    """What this module reads of a stored row (app.store.messages.StoredMessage)."""

    @property
    def conversation(self) -> str: ...
    @property
    def id(self) -> int: ...
    @property
    def user(self) -> str: ...
    @property
    def ts_ms(self) -> int: ...
    @property
    def kind(self) -> int: ...
    @property
    def mentions(self) -> str | None: ...


def greatest(engine_name: str, *values: ColumnElement[int] | int) -> ColumnElement[int]:
    """The SQL ``greatest`` of ``values`` in the dialect named ``engine_name``."""
    sql = [literal(v) if isinstance(v, int) else v for v in values]
    return func.greatest(*sql) if engine_name == "postgresql" else func.max(*sql)


async def queue_notifications(
    connection: AsyncConnection, batch: Sequence[StoredMessage], grace_ms: int
) -> None:
    """Record the mentions of ``batch``'s messages and queue their pending notifications (see
    the module's docstring), in ``connection``'s transaction."""
    dialect = connection.dialect.name
    said = [m for m in batch if m.kind == Kind.MESSAGE]
    if not said:
        return
    mention_rows: list[dict[str, object]] = []
    wanted: dict[tuple[str, str], list[int]] = {}  # (user, conversation) -> [id, reason, count, ts]

    def want(user: str, message: StoredMessage, reason: Reason) -> None:
        key = (user, message.conversation)
        seen = wanted.get(key)
        if seen is None:
            wanted[key] = [message.id, reason, 1, message.ts_ms]
        else:
            seen[0] = max(seen[0], message.id)
            seen[1] = max(seen[1], reason)
            seen[2] += 1
            seen[3] = min(seen[3], message.ts_ms)

    rooms = sorted({m.conversation for m in said if not is_direct(m.conversation)})
    listeners: dict[str, list[str]] = {}
    if rooms:
        found = await connection.execute(
            select(notification_levels.c.conversation, notification_levels.c.user).where(
                notification_levels.c.conversation.in_(rooms),
                notification_levels.c.level == Level.ALL,
            )
        )
        for conversation, user in found.all():
            listeners.setdefault(conversation, []).append(user)
    for message in said:
        mentioned, _ = from_stored(message.mentions)
        for user in mentioned:
            if user != message.user:
                mention_rows.append({
                    "user": user, "conversation": message.conversation, "id": message.id,
                    "ts_ms": message.ts_ms,
                })  # fmt: skip
                want(user, message, Reason.MENTION)
        if is_direct(message.conversation):
            for user in members_of_direct(message.conversation):
                if user != message.user:
                    want(user, message, Reason.DIRECT)
        for user in listeners.get(message.conversation, ()):
            if user != message.user:
                want(user, message, Reason.ALL)
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    if mention_rows:
        await connection.execute(insert(mentions).on_conflict_do_nothing(), mention_rows)
        # A conversation someone is mentioned in is in their inbox.
        taking_part = sorted({(str(r["user"]), str(r["conversation"])) for r in mention_rows})
        await connection.execute(
            insert(participants).on_conflict_do_nothing(),
            [{"user": u, "conversation": c} for u, c in taking_part],
        )
    if not wanted:
        return
    rows = [
        {"user": user, "conversation": conversation, "pending_id": message_id,
         "reason": reason, "pending_count": count, "due_ms": ts_ms + grace_ms}
        for (user, conversation), (message_id, reason, count, ts_ms) in sorted(wanted.items())
    ]  # fmt: skip
    new = insert(notify_state)
    await connection.execute(
        new.on_conflict_do_update(
            index_elements=[notify_state.c.user, notify_state.c.conversation],
            set_={
                "pending_id": greatest(
                    dialect, func.coalesce(notify_state.c.pending_id, 0), new.excluded.pending_id
                ),
                "reason": greatest(
                    dialect, func.coalesce(notify_state.c.reason, 0), new.excluded.reason
                ),
                "due_ms": func.coalesce(notify_state.c.due_ms, new.excluded.due_ms),
                "pending_count": notify_state.c.pending_count + new.excluded.pending_count,
            },
            where=new.excluded.pending_id > notify_state.c.notified_id,
        ),
        rows,
    )
