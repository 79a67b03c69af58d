"""Full-text search over the stored messages (table ``search_documents``).

Contract:
- Indexing is off the archiver's transaction: the archiver queues each new message, edit and
  deletion in ``search_backlog`` (one small row, in the same statement or transaction), and
  :class:`SearchIndexer` applies the queue, oldest first, in batches of its own transactions:
  a new message is indexed with its text as stored (a message deleted before its turn is
  not: its text is empty), an edit replaces its message's text unless a newer edit already
  did (``version``), a deletion removes it. Idempotent; on PostgreSQL one indexer works at a
  time (an advisory lock), whichever worker runs it, and its commits do not wait for the disk
  (a crash may undo its last batches, which are then applied again). A message is found once
  the indexer has reached it, a fraction of a second after it is stored
  (``hubbub_search_backlog``).
- :meth:`SearchStore.search` finds the messages whose text matches ``query`` among the
  conversations a user may read, as the SQL below narrows them: public rooms, private rooms the
  user is a member of, and the user's direct conversations. The caller still asks the one
  access decision about every conversation it returns (``app.conversations.search``): this
  narrowing only keeps the pages full.
- ``query`` is raw user input. PostgreSQL parses it with ``websearch_to_tsquery`` ("quoted
  phrases", ``-word``, ``or``), which never fails on any input; SQLite gets it rewritten into
  an FTS5 query of quoted terms (:func:`fts5_query`), so no input is FTS5 syntax.
- Each hit carries its text and where the matched words are in it (``highlights``:
  ``(start, end)`` offsets in characters), never markup.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any, Final, Literal, NamedTuple

from sqlalchemy import (
    Select,
    and_,
    bindparam,
    cast,
    column,
    delete,
    exists,
    func,
    literal,
    literal_column,
    or_,
    select,
    table,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import REGCONFIG
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql.elements import ColumnClause, ColumnElement, UnaryExpression

from app.conversations.lifecycle import Kind
from app.store.database import StoreError
from app.store.schema import (
    members,
    messages,
    participants,
    rooms,
    search_backlog,
    search_documents,
)

logger = logging.getLogger(__name__)

# What marks a matched word in the text the databases return (then turned into offsets):
# control characters (a text that holds them itself gets no highlights).
_START, _STOP = "\x02", "\x03"
Order = Literal["newest", "best"]
_DATABASE_ERRORS = (SQLAlchemyError, OSError, TimeoutError)


class Hit(NamedTuple):
    conversation: str
    id: int
    user: str
    ts_ms: int
    text: str
    highlights: tuple[tuple[int, int], ...]


def fts5_query(query: str) -> str:
    """``query`` as an FTS5 query that is never syntax: its "quoted phrases" and words, each
    a quoted string (a ``"`` inside doubled), all required; a word starting with ``-`` left
    out of the results. Empty when nothing is left to search for."""
    required: list[str] = []
    excluded: list[str] = []
    for phrase, word in re.findall(r'"([^"]*)"|(\S+)', query):
        term = (phrase or word).strip()
        negative = not phrase and term.startswith("-") and len(term) > 1
        term = term[1:] if negative else term
        words = re.findall(r"\w+", term)
        if not words:
            continue
        quoted = '"' + " ".join(words).replace('"', '""') + '"'
        (excluded if negative else required).append(quoted)
    if not required:
        return ""
    return " ".join(required) + "".join(f" NOT {term}" for term in excluded)


def _offsets(marked: str) -> tuple[str, tuple[tuple[int, int], ...]]:
    """The text without its match marks, and where the marked spans are in it."""
    plain: list[str] = []
    spans: list[tuple[int, int]] = []
    length = 0
    start = None
    for piece in re.split(f"([{_START}{_STOP}])", marked):
        if piece == _START:
            start = length
        elif piece == _STOP:
            if start is not None and length > start:
                spans.append((start, length))
            start = None
        else:
            plain.append(piece)
            length += len(piece)
    return "".join(plain), tuple(spans)


class SearchIndexer:
    """Applies ``search_backlog`` to ``search_documents``, oldest first, a batch a
    transaction (see the module's contract), in ``language`` (PostgreSQL)."""

    def __init__(self, engine: AsyncEngine, language: str = "simple") -> None:
        self._engine = engine
        self._language = language
        self.backlog = 0  # rows waiting, as the last batch found them

    async def index(self, limit: int) -> int:
        """Apply up to ``limit`` queued rows; returns how many were applied (0: none left).
        Raises :class:`~app.store.database.StoreError`.

        On PostgreSQL in one transaction. On SQLite the index is a file of its own
        (:mod:`app.store.search_file`): the batch is applied in one transaction, which writes
        only that file, and forgotten from the queue in a second, which writes only the
        store's (a crash between the two applies it again, which changes nothing)."""
        postgres = self._engine.dialect.name == "postgresql"
        try:
            async with self._engine.connect() as connection:
                async with connection.begin():
                    if postgres:
                        # One snapshot for the whole batch: the range deleted at the end is
                        # the one read, never a row an archiver committed meanwhile. (On
                        # SQLite no row joins the range later: a new row's seq is above every
                        # row queued, and the range's rows stay queued until deleted.)
                        await connection.exec_driver_sql(
                            "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"
                        )
                        # The commit need not wait for the disk: a crash loses the batch's
                        # index rows and its removal from the queue together (one
                        # transaction), so it is applied again; the indexer no longer waits
                        # on a flush of the log per batch. (Its effect on archiving beside
                        # it was within this machine's noise: docs/benchmarks.md.)
                        await connection.exec_driver_sql("SET LOCAL synchronous_commit = off")
                        # One indexer at a time, whichever worker runs it.
                        locked = await connection.scalar(
                            text("SELECT pg_try_advisory_xact_lock(:key)"),
                            {"key": _INDEXER_LOCK},
                        )
                        if not locked:
                            return 0
                    batch = await self._apply_batch(connection, limit, postgres)
                    if batch is None:
                        self.backlog = 0
                        return 0
                    count, queued = batch
                    if postgres:
                        await self._forget(connection, queued, count == limit)
                if not postgres:
                    async with connection.begin():
                        await self._forget(connection, queued, count == limit)
                return count
        except _DATABASE_ERRORS as exc:
            raise StoreError(f"indexing for search failed: {exc!r}") from exc

    async def _apply_batch(
        self, connection: AsyncConnection, limit: int, postgres: bool
    ) -> tuple[int, ColumnElement[bool]] | None:
        """Apply the oldest ``limit`` queued rows to the index; returns how many, and the
        condition that selects them in the queue (None: the queue is empty)."""
        # The batch: the oldest ``limit`` queued rows, as a range (one row back).
        oldest = select(search_backlog.c.seq).order_by(search_backlog.c.seq).limit(limit).subquery()
        count, low, high = (
            await connection.execute(
                select(func.count(), func.min(oldest.c.seq), func.max(oldest.c.seq))
            )
        ).one()
        if not count:
            return None
        queued = search_backlog.c.seq.between(low, high)
        # New messages, in one statement, the text never leaving the database.
        language = {"language": self._language} if postgres else {}
        await connection.execute(
            text(_INDEX_NEW_POSTGRES if postgres else _INDEX_NEW_SQLITE),
            {"low": low, "high": high, **language},
        )
        # Edits and deletions (few, found by their queued kind), one by one in the order they
        # were stored.
        changes = (
            await connection.execute(
                select(
                    messages.c.conversation,
                    messages.c.id,
                    messages.c.kind,
                    messages.c.target,
                    messages.c.text,
                )
                .join_from(
                    search_backlog,
                    messages,
                    and_(
                        messages.c.conversation == search_backlog.c.conversation,
                        messages.c.id == search_backlog.c.id,
                    ),
                )
                .where(queued, search_backlog.c.kind.in_([Kind.EDITED, Kind.DELETED]))
                .order_by(search_backlog.c.seq)
            )
        ).all()
        await self._apply(connection, changes, postgres)
        return int(count), queued

    async def _forget(
        self, connection: AsyncConnection, queued: ColumnElement[bool], full: bool
    ) -> None:
        """Delete the applied rows from the queue, and count what waits after a full batch."""
        await connection.execute(delete(search_backlog).where(queued))
        if full:
            self.backlog = int(
                await connection.scalar(select(func.count()).select_from(search_backlog)) or 0
            )
        else:
            self.backlog = 0

    async def _apply(
        self, connection: AsyncConnection, rows: Sequence[Any], postgres: bool
    ) -> None:
        """Edits and deletions: an edit replaces its message's text unless a newer edit already
        did (``version``); a deletion removes it."""
        for row in rows:
            key = and_(
                search_documents.c.conversation == row.conversation,
                search_documents.c.id == row.target,
            )
            if row.kind == Kind.EDITED:
                changed: dict[str, object] = {"text": row.text, "version": row.id}
                if postgres:
                    changed["document"] = func.to_tsvector(
                        cast(literal(self._language), REGCONFIG), row.text
                    )
                await connection.execute(
                    update(search_documents)
                    .where(key, search_documents.c.version < row.id)
                    .values(changed)
                )
            else:
                await connection.execute(delete(search_documents).where(key))


# Any constant: the advisory lock of PostgreSQL's single indexer.
_INDEXER_LOCK: Final = 0x48554242  # "HUBB"


# A new message is indexed with its text as stored now: one deleted before its turn has an
# empty text, and is not.
_INDEX_NEW_POSTGRES: Final = """
INSERT INTO search_documents (conversation, id, "user", ts_ms, text, version, document)
SELECT m.conversation, m.id, m."user", m.ts_ms, m.text, m.id,
       to_tsvector(CAST(:language AS regconfig), m.text)
FROM search_backlog b JOIN messages m ON m.conversation = b.conversation AND m.id = b.id
WHERE b.seq BETWEEN :low AND :high AND b.kind = 0 AND m.kind = 0 AND m.text <> ''
ON CONFLICT DO NOTHING
"""
# (WHERE true: SQLite's upsert after a SELECT needs it to parse.)
_INDEX_NEW_SQLITE: Final = """
INSERT INTO search_documents (conversation, id, "user", ts_ms, text, version)
SELECT m.conversation, m.id, m."user", m.ts_ms, m.text, m.id
FROM search_backlog b JOIN messages m ON m.conversation = b.conversation AND m.id = b.id
WHERE b.seq BETWEEN :low AND :high AND b.kind = 0 AND m.kind = 0 AND m.text <> '' AND true
ORDER BY b.seq
ON CONFLICT DO NOTHING
"""


class SearchStore:
    """Searches ``search_documents`` on ``engine`` (see the module's contract)."""

    def __init__(self, engine: AsyncEngine, language: str = "simple") -> None:
        self._engine = engine
        self._language = language

    async def search(
        self,
        user: str,
        query: str,
        conversation: str | None,
        order: Order,
        limit: int,
        offset: int,
        hidden: frozenset[str] = frozenset(),
    ) -> list[Hit]:
        """Up to ``limit`` messages matching ``query`` that ``user`` may read (as narrowed in
        SQL), newest first or best match first, skipping ``offset``; in ``conversation``
        only when given; none by the users in ``hidden`` (app.access.hiding)."""
        postgres = self._engine.dialect.name == "postgresql"
        docs = search_documents
        private_elsewhere = exists().where(
            rooms.c.name == docs.c.conversation,
            rooms.c.private.is_(True),
            ~exists().where(members.c.room == rooms.c.name, members.c.user == user),
        )
        my_direct = exists().where(
            participants.c.user == user, participants.c.conversation == docs.c.conversation
        )
        readable = or_(
            and_(~docs.c.conversation.startswith("@"), ~private_elsewhere),
            and_(docs.c.conversation.startswith("@"), my_direct),
        )
        columns = (docs.c.conversation, docs.c.id, docs.c.user, docs.c.ts_ms, docs.c.text)
        statement: Select[*tuple[Any, ...]]
        if postgres:
            language = cast(literal(self._language), REGCONFIG)
            tsquery = func.websearch_to_tsquery(language, bindparam("q"))
            marked = func.ts_headline(
                language, docs.c.text, tsquery,
                f"StartSel={_START}, StopSel={_STOP}, HighlightAll=true",
            )  # fmt: skip
            statement = select(*columns, marked).where(docs.c.document.op("@@")(tsquery), readable)
            best = func.ts_rank_cd(docs.c.document, tsquery).desc()
            newest_first: tuple[UnaryExpression[Any], ...] = ()
            parameters = {"q": query}
        else:
            match = fts5_query(query)
            if not match:
                return []
            fts = table("search_fts", column("rowid"), column("rank"))
            fts_name: ColumnClause[Any] = literal_column("search_fts")
            marked = func.highlight(fts_name, 0, literal(_START), literal(_STOP))
            joined = docs.join(fts, fts.c.rowid == literal_column("search_documents.rowid"))
            statement = (
                select(*columns, marked)
                .select_from(joined)
                .where(fts_name.op("MATCH")(bindparam("q")), readable)
            )
            best = fts.c.rank.asc()  # bm25: lower is better
            # Newest first in the order archived (FTS5 streams its rowids backwards, so a
            # common word stops at the page instead of sorting every match).
            newest_first = (fts.c.rowid.desc(),)
            parameters = {"q": match}
        if conversation is not None:
            statement = statement.where(docs.c.conversation == conversation)
        if hidden:
            statement = statement.where(docs.c.user.not_in(sorted(hidden)))
        newest = newest_first if not postgres else (docs.c.ts_ms.desc(), docs.c.id.desc())
        statement = statement.order_by(*((best, *newest) if order == "best" else newest))
        statement = statement.limit(limit).offset(offset)
        try:
            async with self._engine.connect() as connection:
                rows = (await connection.execute(statement, parameters)).all()
        except _DATABASE_ERRORS as exc:
            raise StoreError(f"searching failed: {exc!r}") from exc
        hits = []
        for row in rows:
            values: tuple[Any, ...] = tuple(row)
            conversation_of, row_id, author, ts_ms, stored, marked = values
            plain, spans = _offsets(str(marked))
            if plain != stored:  # the text holds the marks itself: no highlights, same text
                spans = ()
            hits.append(
                Hit(str(conversation_of), int(row_id), str(author), int(ts_ms), stored, spans)
            )
        return hits
