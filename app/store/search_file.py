"""SQLite only: the search index in a database file of its own, beside the store's file.

Why: SQLite lets one connection at a time write a database file. With the index in the
store's file, every batch the search indexer applied (FTS5 tokenizing thousands of texts)
held the archiver off the file, and archiving ran at 0.75 times its speed without it. In a
file of its own the indexer writes the index while the archiver writes the store, side by
side (docs/benchmarks.md, "Search").

Contract:
- :func:`search_file_of`: ``<stem>-search<suffix>`` in the store file's directory
  (``data/hubbub.db`` → ``data/hubbub-search.db``).
- :func:`attach`: every connection of a SQLite engine has that file attached as the schema
  :data:`SCHEMA` (created empty where there is none). Its tables (``search_documents``, the
  FTS5 index ``search_fts`` and the triggers that keep them in step) are named without a
  schema everywhere: SQLite looks for a table in the store's file, then in the attached one.
- :func:`ensure_search_tables`: after the migrations (which keep no search table in the
  store's file: migration 0012), makes the tables where the file lacks them — a new store, a
  store from before 0012, or a search file lost or deleted (it holds nothing but what can be
  made again) — and indexes every stored message as it is now (its newest edit; deleted ones
  left out). Messages queued for the indexer meanwhile are applied again, which is harmless.
  The two files carry one random number (SQLite's ``user_version``, set here): an index
  whose number is not its store's (a store file deleted and made anew, its old index left
  beside it) is dropped and made anew, so no message of another store is ever found.
- No transaction writes both files: the indexer writes the index, then forgets what it
  applied from the store's queue (``search_backlog``) in a transaction of its own
  (:class:`~app.store.search.SearchIndexer`), so two writers never wait on each other in
  opposite orders. (Retention writes the store's file, then the index, in one transaction;
  SQLite commits each file atomically, and what a crash between the two leaves in the index
  is deleted by the next pass.)
"""

from __future__ import annotations

import logging
import secrets
import time
from pathlib import Path
from typing import Final

from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection
from sqlalchemy.engine.interfaces import DBAPIConnection

from app.store.schema import search_documents

logger = logging.getLogger(__name__)

SCHEMA: Final = "search"

# The FTS5 index over search_documents (external content: the text is not kept twice), in step
# with it through triggers; unicode61 folds case and diacritics. In SCHEMA (a trigger's
# statements name tables of its own file).
FTS_STATEMENTS: Final = (
    "CREATE VIRTUAL TABLE {schema}.search_fts USING fts5(text, content='search_documents', "
    "content_rowid='rowid', tokenize='unicode61 remove_diacritics 2')",
    "CREATE TRIGGER {schema}.search_documents_ai AFTER INSERT ON search_documents BEGIN "
    "INSERT INTO search_fts(rowid, text) VALUES (new.rowid, new.text); END",
    "CREATE TRIGGER {schema}.search_documents_ad AFTER DELETE ON search_documents BEGIN "
    "INSERT INTO search_fts(search_fts, rowid, text) VALUES ('delete', old.rowid, old.text); END",
    "CREATE TRIGGER {schema}.search_documents_au AFTER UPDATE OF text ON search_documents BEGIN "
    "INSERT INTO search_fts(search_fts, rowid, text) VALUES ('delete', old.rowid, old.text); "
    "INSERT INTO search_fts(rowid, text) VALUES (new.rowid, new.text); END",
)

# The messages stored, as they are now: the text of their newest edit, if any; deleted ones
# (and their empty texts) left out. ``version`` is the id of the row the text came from.
INDEX_STORED: Final = """
INSERT INTO {schema}.search_documents (conversation, id, "user", ts_ms, text, version)
SELECT m.conversation, m.id, m."user", m.ts_ms, coalesce(e.text, m.text), coalesce(e.id, m.id)
FROM main.messages m
LEFT JOIN (
  SELECT conversation, target, max(id) AS id FROM main.messages WHERE kind = 1
  GROUP BY conversation, target
) newest ON newest.conversation = m.conversation AND newest.target = m.id
LEFT JOIN main.messages e ON e.conversation = newest.conversation AND e.id = newest.id
WHERE m.kind = 0 AND m.text <> ''
  AND NOT EXISTS (SELECT 1 FROM main.messages d
                  WHERE d.conversation = m.conversation AND d.target = m.id AND d.kind = 2)
"""


def search_file_of(store_file: Path) -> Path:
    """The search index's file for the store's ``store_file``."""
    return store_file.with_name(f"{store_file.stem}-search{store_file.suffix}")


def attach(dbapi_connection: DBAPIConnection, store_file: Path) -> None:
    """Attach the search file of ``store_file`` to a new connection, as :data:`SCHEMA`, in
    WAL mode with NORMAL sync like the store's file."""
    cursor = dbapi_connection.cursor()
    cursor.execute(f"ATTACH DATABASE ? AS {SCHEMA}", (str(search_file_of(store_file)),))
    cursor.execute(f"PRAGMA {SCHEMA}.journal_mode=WAL")
    cursor.execute(f"PRAGMA {SCHEMA}.synchronous=NORMAL")
    cursor.close()


def ensure_search_tables(connection: Connection) -> None:
    """Make the search tables in the attached file and index what is stored, where the file
    lacks them or is another store's (see the module's contract); else nothing. Runs in
    ``connection``'s transaction; the caller commits."""
    store = connection.exec_driver_sql("PRAGMA main.user_version").scalar_one()
    index = connection.exec_driver_sql(f"PRAGMA {SCHEMA}.user_version").scalar_one()
    made = inspect(connection).has_table(search_documents.name, schema=SCHEMA)
    if made and store != 0 and index == store:
        return
    if made:  # another store's index (its store file deleted, this one's left): not ours
        logger.warning("the search index belongs to another store: made anew")
        connection.exec_driver_sql(f"DROP TABLE {SCHEMA}.search_fts")
        connection.exec_driver_sql(f"DROP TABLE {SCHEMA}.{search_documents.name}")
    if store == 0:
        store = secrets.randbelow(2**31 - 1) + 1
        connection.exec_driver_sql(f"PRAGMA main.user_version = {store}")
    connection.exec_driver_sql(f"PRAGMA {SCHEMA}.user_version = {store}")
    started = time.monotonic()
    in_search_file = connection.execution_options(schema_translate_map={None: SCHEMA})
    search_documents.create(in_search_file)
    for statement in FTS_STATEMENTS:
        connection.exec_driver_sql(statement.format(schema=SCHEMA))
    indexed = connection.execute(text(INDEX_STORED.format(schema=SCHEMA))).rowcount
    logger.info(
        "search index made",
        extra={"messages": indexed, "seconds": round(time.monotonic() - started, 1)},
    )
