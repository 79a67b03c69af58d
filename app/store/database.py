"""Opening the store: ``CHAT_DATABASE_URL`` to an engine, its schema migrated, and failures
that read as what to fix, not as stack traces.

URLs: ``postgresql://user:password@host:port/db`` (run by asyncpg) or ``sqlite:///path``
(a file, run by aiosqlite; its directory is created; the search index is a second file
beside it: :mod:`app.store.search_file`). Migrations (Alembic, in
``app/store/migrations``) run once per process that calls :func:`migrate`: ``python -m app``
before it serves, gunicorn's master before it forks workers. On PostgreSQL an advisory lock
lets several pods start at once; the second waits, then finds the schema current.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Final

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import event, text
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.exc import ArgumentError, DBAPIError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import ConnectionPoolEntry

from app.store.search_file import attach, ensure_search_tables

logger = logging.getLogger(__name__)

MIGRATIONS: Final = Path(__file__).parent / "migrations"
# pg_advisory_lock key held while migrating ("hubbub" in ASCII).
MIGRATION_LOCK: Final = 0x687562627562
_DRIVERS: Final = {"postgresql": "postgresql+asyncpg", "sqlite": "sqlite+aiosqlite"}


class StoreError(Exception):
    """The store cannot be used: the message says why and what to check."""


def engine_for(url: str, timeout_s: float = 10.0) -> AsyncEngine:
    """An engine for ``url`` (``postgresql://…`` or ``sqlite:///…``); connects lazily.
    Raises :class:`StoreError` for a URL that is neither."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise StoreError(f"CHAT_DATABASE_URL is not a database URL: {_redacted(url)!r}") from None
    driver = _DRIVERS.get(parsed.get_backend_name())
    if driver is None:
        raise StoreError(
            f"CHAT_DATABASE_URL must start with postgresql:// or sqlite:///, "
            f"not {parsed.drivername}://"
        )
    parsed = parsed.set(drivername=driver)
    if driver == "sqlite+aiosqlite":
        if not parsed.database or parsed.database == ":memory:":
            raise StoreError("CHAT_DATABASE_URL: SQLite needs a file (sqlite:///path/to/chat.db)")
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_async_engine(parsed, connect_args={"timeout": timeout_s})
        store_file = Path(parsed.database)

        def on_connect(dbapi_connection: DBAPIConnection, _: ConnectionPoolEntry) -> None:
            _sqlite_pragmas(dbapi_connection)
            attach(dbapi_connection, store_file)

        event.listen(engine.sync_engine, "connect", on_connect)
        return engine
    return create_async_engine(
        parsed,
        pool_pre_ping=True,
        connect_args={"timeout": timeout_s, "command_timeout": timeout_s},
    )


def _sqlite_pragmas(dbapi_connection: DBAPIConnection) -> None:
    # WAL: readers do not wait for the archiver's writes. NORMAL sync is durable across a crash
    # of the process (not of the host) in WAL mode, which is what an embedded store needs.
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


async def migrate(engine: AsyncEngine) -> str:
    """Bring the schema to the newest migration; returns its revision. Raises
    :class:`StoreError` when the database is unreachable, refuses us, or is not ours."""
    try:
        async with engine.connect() as connection:
            if engine.dialect.name == "postgresql":
                await connection.execute(text("SELECT pg_advisory_lock(:k)"), {"k": MIGRATION_LOCK})
            try:
                revision = await connection.run_sync(_upgrade)
                if engine.dialect.name == "sqlite":
                    await connection.run_sync(ensure_search_tables)
            finally:
                if engine.dialect.name == "postgresql":
                    await connection.execute(
                        text("SELECT pg_advisory_unlock(:k)"), {"k": MIGRATION_LOCK}
                    )
            await connection.commit()
    except StoreError:
        raise
    except (SQLAlchemyError, OSError, TimeoutError) as exc:
        raise StoreError(_explain(engine, exc)) from exc
    return revision


def _upgrade(connection: Connection) -> str:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    scripts = ScriptDirectory.from_config(config)
    head = scripts.get_current_head()
    current = MigrationContext.configure(connection).get_current_revision()
    known = {script.revision for script in scripts.walk_revisions()}
    if current is not None and current not in known:
        raise StoreError(
            f"the database is at schema revision {current!r}, which this version of Hubbub "
            "does not know: it was migrated by a newer version (roll forward, or restore)"
        )
    if current != head:
        logger.info("migrating the store", extra={"from": current, "to": head})
        command.upgrade(config, "head")
    assert head is not None
    return head


def _explain(engine: AsyncEngine, exc: BaseException) -> str:
    where = _redacted(engine.url.render_as_string(hide_password=True))
    cause = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    return f"cannot open the store at {where}: {type(cause).__name__}: {cause}"


def _redacted(url: str) -> str:
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "<unparseable>"


def prepare(url: str) -> str:
    """Open the store at ``url`` once and migrate it, from synchronous code (``python -m app``
    before it serves, gunicorn's master before it forks); returns the schema revision.
    Raises :class:`StoreError` with what to fix."""

    async def run() -> str:
        engine = engine_for(url)
        try:
            return await migrate(engine)
        finally:
            await engine.dispose()

    return asyncio.run(run())
