"""Messages in the store: written in batches, idempotently; read a page at a time.

Contract:
- :meth:`MessageStore.add` stores a batch in one transaction. A message already stored (same
  conversation and id) is left as it is, so archiving a batch again after a failure (the
  archiver is at-least-once) stores nothing twice. It returns how many rows were new.
- :meth:`MessageStore.add` also records who takes part in each conversation (both users of a
  direct one, a room message's author): the users' inboxes (:mod:`app.store.inbox`).
- Reads return messages in id order (increasing), at most ``limit`` of them.
- Every call raises :class:`~app.store.database.StoreError` when the database fails; the
  caller decides whether to retry (the archiver) or answer ``store_unavailable`` (history).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, NamedTuple

from sqlalchemy import Select, Table, func, select, tuple_
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql.dml import ReturningInsert

from app.conversation import is_direct, members_of_direct
from app.store.database import StoreError
from app.store.schema import messages, participants

# What a failing database raises through SQLAlchemy and its drivers.
DATABASE_ERRORS = (SQLAlchemyError, OSError, TimeoutError)


class StoredMessage(NamedTuple):
    conversation: str
    id: int
    user: str
    text: str
    ts_ms: int


class MessageStore:
    """Messages of every conversation, on ``engine`` (migrated: see
    :func:`app.store.database.migrate`)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def add(self, batch: Sequence[StoredMessage]) -> int:
        """Store ``batch``; returns how many of its messages were not stored yet."""
        if not batch:
            return 0
        taking_part: set[tuple[str, str]] = set()
        for message in batch:
            if is_direct(message.conversation):
                for user in members_of_direct(message.conversation):
                    taking_part.add((user, message.conversation))
            else:
                taking_part.add((message.user, message.conversation))
        try:
            async with self._engine.begin() as connection:
                if self._engine.dialect.name == "postgresql":
                    return await _add_on_postgresql(connection, batch, sorted(taking_part))
                result = await connection.execute(
                    self._insert_new(), [message._asdict() for message in batch]
                )
                await connection.execute(
                    insert_ignoring_duplicates(self._engine, participants),
                    [{"user": u, "conversation": c} for u, c in sorted(taking_part)],
                )
                return len(result.all())
        except DATABASE_ERRORS as exc:
            raise StoreError(f"storing {len(batch)} messages failed: {exc!r}") from exc

    def _insert_new(self) -> ReturningInsert[tuple[int]]:
        """INSERT … ON CONFLICT (conversation, id) DO NOTHING RETURNING id: the ids returned
        are the rows that were new (a row count is not reported for a batch by every
        driver)."""
        return insert_ignoring_duplicates(self._engine, messages).returning(messages.c.id)

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
                return int(result.rowcount)
        except DATABASE_ERRORS as exc:
            raise StoreError(f"deleting old messages failed: {exc!r}") from exc

    async def before(
        self, conversation: str, before: int | None, limit: int
    ) -> list[StoredMessage]:
        """The newest ``limit`` messages of ``conversation`` with an id below ``before``
        (None: the newest of all), oldest first: a page of history scrolling back."""
        query = select(messages).where(messages.c.conversation == conversation)
        if before is not None:
            query = query.where(messages.c.id < before)
        page = await self._fetch(query.order_by(messages.c.id.desc()).limit(limit))
        page.reverse()
        return page

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

    async def _fetch(self, query: Select[str, int, str, str, int]) -> list[StoredMessage]:
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
  INSERT INTO messages (conversation, id, "user", text, ts_ms)
  SELECT * FROM unnest($1::varchar[], $2::bigint[], $3::varchar[], $4::text[], $5::bigint[])
  ON CONFLICT DO NOTHING
  RETURNING 1
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
) -> int:
    columns = tuple(list(column) for column in zip(*batch, strict=True))
    result = await connection.exec_driver_sql(_INSERT_MESSAGES, columns)
    users, conversations = zip(*taking_part, strict=True)
    await connection.exec_driver_sql(_INSERT_PARTICIPANTS, (list(users), list(conversations)))
    return int(result.scalar_one())
