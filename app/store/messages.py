"""Messages in the store: written in batches, idempotently; read a page at a time.

Contract:
- :meth:`MessageStore.add` stores a batch in one transaction. A message already stored (same
  conversation and id) is left as it is, so archiving a batch again after a failure (the
  archiver is at-least-once) stores nothing twice. It returns how many rows were new.
- Reads return messages in id order (increasing), at most ``limit`` of them.
- Every call raises :class:`~app.store.database.StoreError` when the database fails; the
  caller decides whether to retry (the archiver) or answer ``store_unavailable`` (history).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from sqlalchemy import Select, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.sql.dml import ReturningInsert

from app.store.database import StoreError
from app.store.schema import messages


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
        rows = [message._asdict() for message in batch]
        try:
            async with self._engine.begin() as connection:
                result = await connection.execute(self._insert_new(), rows)
                return len(result.all())
        except (SQLAlchemyError, OSError, TimeoutError) as exc:
            raise StoreError(f"storing {len(batch)} messages failed: {exc!r}") from exc

    def _insert_new(self) -> ReturningInsert[int]:
        """INSERT … ON CONFLICT (conversation, id) DO NOTHING RETURNING id, in this database's
        dialect: the ids returned are the rows that were new (a row count is not reported
        for a batch by every driver)."""
        key = [messages.c.conversation, messages.c.id]
        if self._engine.dialect.name == "postgresql":
            on_postgresql = postgresql.insert(messages).on_conflict_do_nothing(index_elements=key)
            return on_postgresql.returning(messages.c.id)
        on_sqlite = sqlite.insert(messages).on_conflict_do_nothing(index_elements=key)
        return on_sqlite.returning(messages.c.id)

    async def after(self, conversation: str, since: int, limit: int) -> list[StoredMessage]:
        """The oldest ``limit`` messages of ``conversation`` with an id above ``since``."""
        query = (
            select(messages)
            .where(messages.c.conversation == conversation, messages.c.id > since)
            .order_by(messages.c.id)
            .limit(limit)
        )
        return await self._fetch(query)

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
        query = select(func.count()).where(messages.c.conversation == conversation)
        try:
            async with self._engine.connect() as connection:
                return int((await connection.execute(query)).scalar_one())
        except (SQLAlchemyError, OSError, TimeoutError) as exc:
            raise StoreError(f"counting messages failed: {exc!r}") from exc

    async def _fetch(self, query: Select[str, int, str, str, int]) -> list[StoredMessage]:
        try:
            async with self._engine.connect() as connection:
                result = await connection.execute(query)
                return [StoredMessage._make(row) for row in result.all()]
        except (SQLAlchemyError, OSError, TimeoutError) as exc:
            raise StoreError(f"reading messages failed: {exc!r}") from exc
