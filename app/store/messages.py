"""Messages in the store: written in batches, idempotently; read a page at a time.

Contract:
- :meth:`MessageStore.add` stores a batch in one transaction. A message already stored (same
  conversation and id) is left as it is, so archiving a batch again after a failure (the
  archiver is at-least-once) stores nothing twice. It returns how many rows were new.
- :meth:`MessageStore.add` also records who takes part in each conversation (both users of a
  direct one, a room message's author): the users' inboxes (:mod:`app.store.inbox`).
- Events on messages (edits, deletions, reactions: :mod:`app.conversations.lifecycle`) are rows
too, in the
  same id sequence. Storing a deletion also empties the text of the message it deletes and
  of that message's edits. :meth:`MessageStore.after`, :meth:`~MessageStore.between` and
  :meth:`~MessageStore.count_between` read the log (messages and events: a replay);
  :meth:`~MessageStore.before` and :meth:`~MessageStore.find` read messages, with the state
  the stored events leave them in.
- Reads return rows in id order (increasing), at most ``limit`` of them.
- Every call raises :class:`~app.store.database.StoreError` when the database fails; the
  caller decides whether to retry (the archiver) or answer ``store_unavailable`` (history).
  :meth:`MessageStore.add` raises its subclass :class:`RowsRefused` when the database refused
  the batch's data (a value it cannot hold: a NUL in PostgreSQL's TEXT, a number out of
  range), not because it is down: storing the same rows again would fail again.
  :meth:`MessageStore.add_isolating` stores every other row of such a batch and returns the
  refused ones, so that one bad row never holds back the rest (the archivers use it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, NamedTuple, cast

import orjson
from sqlalchemy import Select, Table, and_, exists, func, or_, select, tuple_, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql.dml import ReturningInsert

from app.conversations.lifecycle import Kind, Target, fold
from app.conversations.names import is_direct, members_of_direct
from app.notify.mentions import stored_form
from app.store.database import StoreError
from app.store.notify_queue import queue_notifications
from app.store.schema import mentions, messages, participants, search_documents

# What a failing database raises through SQLAlchemy and its drivers.
DATABASE_ERRORS = (SQLAlchemyError, OSError, TimeoutError)
# What a driver raises for a value it cannot even send (sqlite3: a lone surrogate in a text,
# an integer beyond 64 bits); asyncpg reports those as SQLSTATE 22000.
_UNSENDABLE = (UnicodeError, OverflowError)
# PostgreSQL's classes of errors about the data, not the database: 22 data exception (22021
# a character the encoding cannot hold: NUL; 22001 a string too long; 22003 a number out of
# range), 23 integrity constraint violation. Connection loss, shutdown, lock timeouts, a full
# disk or a read-only server are other classes (08, 57, 55, 53, 25): retried.
_DATA_SQLSTATE_CLASSES: Final = ("22", "23")


class RowsRefused(StoreError):
    """The database refused a batch for what it holds (a value it cannot store), not because
    it is unavailable: storing the same rows again fails the same way. ``reason`` says why,
    without the values."""

    def __init__(self, count: int, reason: str) -> None:
        super().__init__(f"storing {count} messages refused: {reason}")
        self.reason = reason


def _refusal(exc: BaseException) -> str | None:
    """Why the database refused the data of a batch, when ``exc`` says it did (None: the
    database failed, and a retry may succeed). Never the values themselves: they may be
    message texts, which are never logged (asyncpg's own messages quote them)."""
    if isinstance(exc, _UNSENDABLE):
        return f"a value the driver cannot send ({type(exc).__name__})"
    if isinstance(exc, DBAPIError):
        code = getattr(exc.orig, "sqlstate", None) or getattr(exc.orig, "pgcode", None)
        if isinstance(code, str) and code[:2] in _DATA_SQLSTATE_CLASSES:
            return f"a value the database cannot hold (SQLSTATE {code})"
        if isinstance(exc, DataError | IntegrityError):  # SQLite: sqlite3.DataError...
            return f"a value the database cannot hold ({type(exc.orig).__name__})"
    return None


class StoredMessage(NamedTuple):
    """A row of the log: a message (``target``: the message it replies to), or an event on
    message ``target`` (``text``: an edit's text, a reaction's emoji)."""

    conversation: str
    id: int
    user: str
    text: str
    ts_ms: int
    kind: int = Kind.MESSAGE
    target: int | None = None
    attachments: str | None = None  # a message's files: its frame's JSON list (app.files)
    mentions: str | None = None  # who a message mentions (app.notify.mentions.stored_form)


def row_of(conversation: str, frame: dict[str, Any]) -> StoredMessage:
    """The row of a numbered frame (a message or an event, decoded) of ``conversation``.
    Raises KeyError, ValueError or TypeError for a frame that is neither."""
    kind = _KINDS[frame["type"]]
    if kind is Kind.REACTION_ON and frame["on"] is False:
        kind = Kind.REACTION_OFF
    target = frame.get("reply_to") if kind is Kind.MESSAGE else frame["target"]
    text = (
        frame["emoji"] if kind in (Kind.REACTION_ON, Kind.REACTION_OFF) else frame.get("text", "")
    )
    attachments = frame.get("attachments") if kind is Kind.MESSAGE else None
    mentioned = (
        stored_form([str(u) for u in frame.get("mentions", ())], frame.get("here") is True)
        if kind is Kind.MESSAGE
        else None
    )
    return StoredMessage(
        conversation, int(frame["id"]), str(frame["user"]), str(text), int(frame["ts"]),
        int(kind), None if target is None else int(target),
        None if attachments is None else orjson.dumps(attachments).decode(), mentioned,
    )  # fmt: skip


# The rows the search indexer applies: messages, edits, deletions (not reactions).
_INDEXED: Final = frozenset({Kind.MESSAGE, Kind.EDITED, Kind.DELETED})
_QUEUE_SQLITE: Final = "INSERT INTO search_backlog (conversation, id, kind) VALUES (?, ?, ?)"

_KINDS: Final = {
    "message": Kind.MESSAGE, "edited": Kind.EDITED, "deleted": Kind.DELETED,
    "reaction": Kind.REACTION_ON,
}  # fmt: skip


class MessageStore:
    """Messages of every conversation, on ``engine`` (migrated: see
    :func:`app.store.database.migrate`)."""

    def __init__(
        self, engine: AsyncEngine, search_index: bool = True, notify_grace_ms: int | None = None
    ) -> None:
        self._engine = engine
        self._search_index = search_index  # queue new rows for the search indexer
        # Record mentions and queue notifications, due this long after a message (None: off).
        self._notify_grace_ms = notify_grace_ms

    async def add(self, batch: Sequence[StoredMessage]) -> int:
        """Store ``batch``; returns how many of its messages were not stored yet."""
        if not batch:
            return 0
        taking_part: set[tuple[str, str]] = set()
        for message in batch:
            if is_direct(message.conversation):
                for user in members_of_direct(message.conversation):
                    taking_part.add((user, message.conversation))
            elif message.kind == Kind.MESSAGE:
                taking_part.add((message.user, message.conversation))
        deleted = [(m.conversation, m.target) for m in batch if m.kind == Kind.DELETED]
        try:
            async with self._engine.begin() as connection:
                postgres = self._engine.dialect.name == "postgresql"
                new_keys: set[tuple[str, int]] = set()
                if postgres:
                    added = await _add_on_postgresql(
                        connection, batch, sorted(taking_part), self._search_index
                    )
                else:
                    result = await connection.execute(
                        self._insert_new(), [message._asdict() for message in batch]
                    )
                    if taking_part:
                        await connection.execute(
                            insert_ignoring_duplicates(self._engine, participants),
                            [{"user": u, "conversation": c} for u, c in sorted(taking_part)],
                        )
                    rows = cast(list[tuple[str, int]], result.all())
                    new_keys = {(str(c), int(i)) for c, i in rows}
                    added = len(new_keys)
                    if self._search_index:
                        queued = [
                            (m.conversation, m.id, m.kind)
                            for m in batch
                            if (m.conversation, m.id) in new_keys and m.kind in _INDEXED
                        ]
                        if queued:  # the driver's executemany, in C
                            await connection.exec_driver_sql(_QUEUE_SQLITE, queued)
                if self._notify_grace_ms is not None:
                    fresh = (
                        batch
                        if postgres  # (idempotent: nothing already notified is queued again)
                        else [m for m in batch if (m.conversation, m.id) in new_keys]
                    )
                    await queue_notifications(connection, fresh, self._notify_grace_ms)
                if deleted:
                    await _empty_deleted(connection, deleted)
                return added
        except (*DATABASE_ERRORS, *_UNSENDABLE) as exc:
            refusal = _refusal(exc)
            if refusal is not None:
                raise RowsRefused(len(batch), refusal) from exc
            raise StoreError(f"storing {len(batch)} messages failed: {exc!r}") from exc

    async def add_isolating(
        self, batch: Sequence[StoredMessage]
    ) -> tuple[int, list[tuple[StoredMessage, str]]]:
        """Store ``batch`` as :meth:`add` does, less the rows the database refuses: a refused
        batch is split in halves, each stored (or split again) on its own, down to the rows
        refused alone. Returns how many rows were new, and each refused row with why (never
        its text). Raises :class:`StoreError` when the database fails (then nothing is known
        of the rows not stored yet: the caller retries the whole batch, which is
        idempotent). A batch with k bad rows of n costs about 2·k·log2(n) transactions."""
        try:
            return await self.add(batch), []
        except RowsRefused as exc:
            if len(batch) == 1:
                return 0, [(batch[0], exc.reason)]
        half = len(batch) // 2
        added, refused = await self.add_isolating(batch[:half])
        more, also = await self.add_isolating(batch[half:])
        return added + more, refused + also

    def _insert_new(self) -> ReturningInsert[tuple[str, int]]:
        """INSERT … ON CONFLICT (conversation, id) DO NOTHING RETURNING conversation, id: the
        rows returned are those that were new (a row count is not reported for a batch by
        every driver)."""
        return insert_ignoring_duplicates(self._engine, messages).returning(
            messages.c.conversation, messages.c.id
        )

    async def after(self, conversation: str, since: int, limit: int) -> list[StoredMessage]:
        """The oldest ``limit`` messages of ``conversation`` with an id above ``since``."""
        query = (
            select(messages)
            .where(messages.c.conversation == conversation, messages.c.id > since)
            .order_by(messages.c.id)
            .limit(limit)
        )
        return await self._fetch(query)

    async def between(
        self, conversation: str, after: int, upto: int, limit: int
    ) -> list[StoredMessage]:
        """The oldest ``limit`` messages of ``conversation`` with ids in (``after``, ``upto``]."""
        query = (
            select(messages)
            .where(
                messages.c.conversation == conversation,
                messages.c.id > after,
                messages.c.id <= upto,
            )
            .order_by(messages.c.id)
            .limit(limit)
        )
        return await self._fetch(query)

    async def count_between(self, conversation: str, after: int, upto: int, cap: int) -> int:
        """How many messages of ``conversation`` have ids in (``after``, ``upto``], counting
        no further than ``cap + 1`` (reads at most that many index entries)."""
        some = (
            select(messages.c.id)
            .where(
                messages.c.conversation == conversation,
                messages.c.id > after,
                messages.c.id <= upto,
            )
            .limit(cap + 1)
            .subquery()
        )
        return await self._scalar(select(func.count()).select_from(some))

    async def delete_older_than(self, ts_ms: int, limit: int) -> int:
        """Delete up to ``limit`` messages sent before ``ts_ms`` (retention); returns how many."""
        oldest = (
            select(messages.c.conversation, messages.c.id)
            .where(messages.c.ts_ms < ts_ms)
            .limit(limit)
        )
        key = tuple_(messages.c.conversation, messages.c.id)
        try:
            async with self._engine.begin() as connection:
                result = await connection.execute(messages.delete().where(key.in_(oldest)))
                # Their search documents: those older than the cutoff whose message is gone.
                gone = ~exists().where(
                    messages.c.conversation == search_documents.c.conversation,
                    messages.c.id == search_documents.c.id,
                )
                await connection.execute(
                    search_documents.delete().where(search_documents.c.ts_ms < ts_ms, gone)
                )
                await connection.execute(mentions.delete().where(mentions.c.ts_ms < ts_ms))
                return int(result.rowcount)
        except DATABASE_ERRORS as exc:
            raise StoreError(f"deleting old messages failed: {exc!r}") from exc

    async def before(
        self, conversation: str, before: int | None, limit: int
    ) -> list[StoredMessage]:
        """The newest ``limit`` messages (not events) of ``conversation`` with an id below
        ``before`` (None: the newest of all), oldest first: a page of history scrolling back.
        :meth:`states` says what events did to them."""
        query = select(messages).where(
            messages.c.conversation == conversation, messages.c.kind == Kind.MESSAGE
        )
        if before is not None:
            query = query.where(messages.c.id < before)
        page = await self._fetch(query.order_by(messages.c.id.desc()).limit(limit))
        page.reverse()
        return page

    async def states(self, conversation: str, ids: list[int]) -> dict[int, dict[str, Any]]:
        """The state the stored events leave the messages ``ids`` in (those any event
        changed; :func:`app.conversations.lifecycle.fold`)."""
        if not ids:
            return {}
        query = (
            select(messages)
            .where(
                messages.c.conversation == conversation,
                messages.c.target.in_(ids),
                messages.c.kind != Kind.MESSAGE,
            )
            .order_by(messages.c.id)
        )
        events = await self._fetch(query)
        return fold((e.target or 0, Kind(e.kind), e.user, e.text, e.ts_ms) for e in events)

    async def find(self, conversation: str, message_id: int) -> Target | None:
        """Message ``message_id`` of ``conversation`` with its state, if it is stored."""
        query = select(messages).where(
            messages.c.conversation == conversation,
            messages.c.id == message_id,
            messages.c.kind == Kind.MESSAGE,
        )
        found = await self._fetch(query)
        if not found:
            return None
        state = (await self.states(conversation, [message_id])).get(message_id)
        return Target(found[0].user, state)

    async def count(self, conversation: str) -> int:
        """How many messages of ``conversation`` are stored."""
        return await self._scalar(
            select(func.count()).where(messages.c.conversation == conversation)
        )

    async def _scalar(self, query: Select[int]) -> int:
        try:
            async with self._engine.connect() as connection:
                return int((await connection.execute(query)).scalar_one())
        except DATABASE_ERRORS as exc:
            raise StoreError(f"counting messages failed: {exc!r}") from exc

    async def _fetch(
        self, query: Select[str, int, str, str, int, int, int | None]
    ) -> list[StoredMessage]:
        try:
            async with self._engine.connect() as connection:
                result = await connection.execute(query)
                return [StoredMessage._make(row) for row in result.all()]
        except DATABASE_ERRORS as exc:
            raise StoreError(f"reading messages failed: {exc!r}") from exc


def insert_ignoring_duplicates(
    engine: AsyncEngine, table: Table
) -> postgresql.Insert | sqlite.Insert:
    """INSERT … ON CONFLICT DO NOTHING into ``table``, in ``engine``'s dialect."""
    if engine.dialect.name == "postgresql":
        return postgresql.insert(table).on_conflict_do_nothing()
    return sqlite.insert(table).on_conflict_do_nothing()


# PostgreSQL: the batch as one array per column, in two statements whatever its size. The
# per-row work of an executemany (SQLAlchemy building and binding each row) cost the archiving
# worker ~13 us a message; arrays are encoded by asyncpg in C (loadtest/archive.py measures it).
_INSERT_MESSAGES: Final = """
WITH new AS (
  INSERT INTO messages (conversation, id, "user", text, ts_ms, kind, target, attachments,
                        mentions)
  SELECT * FROM unnest($1::varchar[], $2::bigint[], $3::varchar[], $4::text[], $5::bigint[],
                       $6::smallint[], $7::bigint[], $8::text[], $9::text[])
  ON CONFLICT DO NOTHING
  RETURNING 1
)
SELECT count(*) FROM new
"""
# The same, and the new messages, edits and deletions queued for the search indexer in the
# same statement (app.store.search): only rows new to ``messages`` are queued, so a deleted
# message archived again stays out of the index.
_INSERT_MESSAGES_QUEUED: Final = """
WITH new AS (
  INSERT INTO messages (conversation, id, "user", text, ts_ms, kind, target, attachments,
                        mentions)
  SELECT * FROM unnest($1::varchar[], $2::bigint[], $3::varchar[], $4::text[], $5::bigint[],
                       $6::smallint[], $7::bigint[], $8::text[], $9::text[])
  ON CONFLICT DO NOTHING
  RETURNING conversation, id, kind
), queued AS (
  INSERT INTO search_backlog (conversation, id, kind)
  SELECT conversation, id, kind FROM new WHERE kind IN (0, 1, 2) ORDER BY id
)
SELECT count(*) FROM new
"""
_INSERT_PARTICIPANTS: Final = """
INSERT INTO participants ("user", conversation)
SELECT * FROM unnest($1::varchar[], $2::varchar[])
ON CONFLICT DO NOTHING
"""


async def _add_on_postgresql(
    connection: AsyncConnection,
    batch: Sequence[StoredMessage],
    taking_part: Sequence[tuple[str, str]],
    queue: bool,
) -> int:
    """Store ``batch`` (and, if ``queue``, queue its new rows for the search indexer)."""
    columns = tuple(list(column) for column in zip(*batch, strict=True))
    statement = _INSERT_MESSAGES_QUEUED if queue else _INSERT_MESSAGES
    result = await connection.exec_driver_sql(statement, columns)
    if taking_part:
        users, conversations = zip(*taking_part, strict=True)
        await connection.exec_driver_sql(_INSERT_PARTICIPANTS, (list(users), list(conversations)))
    return int(result.scalar_one())


async def _empty_deleted(
    connection: AsyncConnection, deleted: Sequence[tuple[str, int | None]]
) -> None:
    """Empty the text of deleted messages and of their edits (what was said is gone; the rows
    stay, so the log keeps its order and the deletion its target)."""
    for conversation, target in deleted:
        await connection.execute(
            mentions.delete().where(
                mentions.c.conversation == conversation, mentions.c.id == target
            )
        )
        await connection.execute(
            update(messages)
            .where(
                messages.c.conversation == conversation,
                or_(
                    and_(messages.c.id == target, messages.c.kind == Kind.MESSAGE),
                    and_(messages.c.target == target, messages.c.kind == Kind.EDITED),
                ),
            )
            .values(text="", attachments=None, mentions=None)
        )
