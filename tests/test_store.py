"""The durable store on both databases it runs on: a real PostgreSQL (started by the test)
and SQLite (a file in a temporary directory)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, MetaData, inspect, text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.conversations.names import direct
from app.store.archiver import Archiver
from app.store.database import StoreError, engine_for, migrate
from app.store.inbox import Inbox
from app.store.messages import MessageStore, StoredMessage
from app.store.schema import metadata, search_documents
from app.store.search_file import SCHEMA
from tests.helpers import wait_until
from tests.processes import AppProcess, PostgresServer


def _message(conversation: str, n: int) -> StoredMessage:
    return StoredMessage(
        conversation, 1_000 + n, f"user{n % 3}", f"text {n} ✓", 1_795_000_000_000 + n
    )


async def test_migrating_builds_the_schema_the_code_describes(engine: AsyncEngine) -> None:
    """After the migrations the database matches app/store/schema.py, and migrating again
    changes nothing."""

    def differences(connection: Connection) -> list[object]:
        # SQLite's FTS5 index (search_fts and its shadow tables) is made with raw SQL
        # (app.store.search_file): not described in schema.py, as SQLAlchemy has no virtual
        # tables. On SQLite search_documents is in the search file (schema "search").
        sqlite = connection.dialect.name == "sqlite"
        expected = metadata
        if sqlite:
            expected = MetaData()
            for table in metadata.tables.values():
                if table is search_documents:
                    table.to_metadata(expected, schema=SCHEMA)
                else:
                    table.to_metadata(expected)
        options = {
            "include_name": lambda name, kind, _: not str(name).startswith("search_fts"),
            "include_schemas": sqlite,
        }
        context = MigrationContext.configure(connection, opts=options)
        return list(compare_metadata(context, expected))

    async with engine.connect() as connection:
        assert await connection.run_sync(differences) == []
    head = await migrate(engine)
    async with engine.connect() as connection:
        version = (await connection.execute(text("SELECT version_num FROM alembic_version"))).all()
    assert version == [(head,)]


async def test_a_batch_stored_twice_is_stored_once(engine: AsyncEngine) -> None:
    """The archiver is at-least-once: a batch (or part of one) stored again adds nothing."""
    store = MessageStore(engine)
    batch = [_message("lobby", n) for n in range(10)]
    assert await store.add(batch) == 10
    assert await store.add([*batch[5:], _message("lobby", 10)]) == 1
    assert await store.count("lobby") == 11
    assert await store.after("lobby", 0, 100) == [*batch, _message("lobby", 10)]


async def test_pages_scroll_back_and_forth_in_id_order(engine: AsyncEngine) -> None:
    """``before`` pages back from the newest, ``after`` forward from an id; each page is in
    id order, conversations do not mix."""
    store = MessageStore(engine)
    await store.add([_message("a", n) for n in range(25)] + [_message("b", n) for n in range(5)])
    newest = await store.before("a", None, 10)
    assert [m.id for m in newest] == list(range(1_015, 1_025))
    older = await store.before("a", newest[0].id, 10)
    assert [m.id for m in older] == list(range(1_005, 1_015))
    oldest = await store.before("a", older[0].id, 10)
    assert [m.id for m in oldest] == list(range(1_000, 1_005))
    assert await store.before("a", oldest[0].id, 10) == []
    assert [m.id for m in await store.after("a", 1_020, 10)] == list(range(1_021, 1_025))
    assert {m.conversation for m in await store.after("b", 0, 100)} == {"b"}


async def test_an_unreachable_database_is_a_clear_error(postgres_server: PostgresServer) -> None:
    """Nothing listening, a database that does not exist: StoreError says where and why."""
    url = postgres_server.url("missing")
    with pytest.raises(StoreError, match=r"cannot open the store at postgresql\+asyncpg://"):
        await migrate(engine_for(url, timeout_s=2))
    await postgres_server.stop()
    with pytest.raises(StoreError, match="cannot open the store"):
        await migrate(engine_for(postgres_server.url(), timeout_s=2))


async def test_a_corrupt_sqlite_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "chat.db"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match="file is not a database"):
        await migrate(engine_for(f"sqlite:///{path}"))


async def test_a_schema_from_a_newer_version_is_refused(tmp_path: Path) -> None:
    """A database migrated by a newer Hubbub (an unknown revision) is not touched."""
    engine = engine_for(f"sqlite:///{tmp_path}/chat.db")
    await migrate(engine)
    async with engine.begin() as connection:
        await connection.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    with pytest.raises(StoreError, match=r"revision '9999'.*newer version"):
        await migrate(engine)
    await engine.dispose()


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("mysql://db/chat", "must start with postgresql:// or sqlite:///"),
        ("sqlite://", "SQLite needs a file"),
        ("not a url", "not a database URL"),
    ],
)
def test_a_bad_database_url_is_a_clear_error(url: str, why: str) -> None:
    with pytest.raises(StoreError, match=why):
        engine_for(url)


async def _exit_of(app: AppProcess) -> tuple[int, str]:
    await app.start(wait_ready=False)
    try:
        code = await app.wait(timeout=30)
        return code, app.output()
    finally:
        await app.stop()


@pytest.mark.parametrize("gunicorn", [False, True], ids=["python -m app", "gunicorn"])
async def test_a_server_with_an_unusable_database_stops_with_a_clear_message(
    gunicorn: bool, tmp_path: Path
) -> None:
    """A corrupt SQLite file at startup: the server exits at once and says which database and
    why, in one line, without a traceback, and serves nothing."""
    path = tmp_path / "chat.db"
    path.write_bytes(b"not a database" * 100)
    app = AppProcess(
        {"CHAT_DATABASE_URL": f"sqlite:///{path}"}, gunicorn_workers=1 if gunicorn else None
    )
    code, output = await _exit_of(app)
    assert code != 0
    assert f"hubbub: cannot open the store at sqlite+aiosqlite:///{path}" in output
    assert "file is not a database" in output and "Traceback" not in output


async def test_a_server_migrates_its_store_before_it_serves(
    postgres_server: PostgresServer,
) -> None:
    """gunicorn on a fresh PostgreSQL database: the master migrates it before the worker
    serves."""
    url = await postgres_server.create_database("chat")
    app = AppProcess({"CHAT_DATABASE_URL": url}, gunicorn_workers=1)
    await app.start()
    try:
        engine = engine_for(url)
        try:
            async with engine.connect() as connection:
                versions = (await connection.execute(text("SELECT * FROM alembic_version"))).all()
                tables = await connection.run_sync(lambda sync: inspect(sync).get_table_names())
        finally:
            await engine.dispose()
        assert len(versions) == 1
        assert {"messages", "read_state"} <= set(tables)
    finally:
        await app.stop()


async def test_the_archiver_stores_everything_offered_in_order(engine: AsyncEngine) -> None:
    """Offers never wait; every message lands, in batches of at most batch_max."""
    store = MessageStore(engine)
    archiver = Archiver(store, batch_max=400, interval_s=0.05)
    task = asyncio.create_task(archiver.run())
    try:
        for n in range(1_000):
            archiver.offer(_message("lobby", n))
        await wait_until(lambda: archiver.lag == 0, timeout=20)
    finally:
        task.cancel()
    assert archiver.stored == 1_000 and archiver.dropped == 0
    assert [m.id for m in await store.after("lobby", 0, 2_000)] == list(range(1_000, 2_000))


async def test_archiving_survives_a_database_outage(postgres_server: PostgresServer) -> None:
    """PostgreSQL killed while messages keep coming: they wait (the lag grows), and once it is
    back every one is stored, none twice."""
    url = await postgres_server.create_database("chat")
    engine = engine_for(url, timeout_s=1)
    await migrate(engine)
    store = MessageStore(engine)
    archiver = Archiver(store, batch_max=100, interval_s=0.05, retry_max_s=0.5)
    task = asyncio.create_task(archiver.run())
    try:
        for n in range(300):
            archiver.offer(_message("lobby", n))
        await wait_until(lambda: archiver.lag == 0, timeout=20)
        await postgres_server.kill()
        for n in range(300, 600):
            archiver.offer(_message("lobby", n))
        await wait_until(lambda: archiver.failures > 0, timeout=20)
        assert archiver.lag > 0
        await postgres_server.resume()
        await wait_until(lambda: archiver.lag == 0, timeout=30)
    finally:
        task.cancel()
        await engine.dispose()
    engine = engine_for(url)
    try:
        stored = await MessageStore(engine).after("lobby", 0, 1_000)
    finally:
        await engine.dispose()
    assert [m.id for m in stored] == list(range(1_000, 1_600))


async def test_ranges_counts_and_retention(engine: AsyncEngine) -> None:
    store = MessageStore(engine)
    await store.add([_message("lobby", n) for n in range(20)])
    between = await store.between("lobby", 1_004, 1_010, 100)
    assert [m.id for m in between] == list(range(1_005, 1_011))
    assert [m.id for m in await store.between("lobby", 1_004, 1_010, 2)] == [1_005, 1_006]
    assert await store.count_between("lobby", 1_004, 1_010, cap=100) == 6
    assert await store.count_between("lobby", 1_004, 1_010, cap=3) == 4  # counts to cap + 1
    # Retention: the messages sent before a time go, a page at a time.
    assert await store.delete_older_than(1_795_000_000_000 + 5, limit=3) == 3
    assert await store.delete_older_than(1_795_000_000_000 + 5, limit=3) == 2
    assert await store.delete_older_than(1_795_000_000_000 + 5, limit=3) == 0
    assert [m.id for m in await store.after("lobby", 0, 100)] == list(range(1_005, 1_020))


async def test_inboxes_list_conversations_with_their_last_message_and_unread_count(
    engine: AsyncEngine,
) -> None:
    """Both users of a direct conversation have it; a room is in the inbox of who wrote in it
    or marked it read; read positions only move forward; unread counts stop at the cap."""
    store, inbox = MessageStore(engine), Inbox(engine)
    dm = direct("bob", "alice")
    assert dm == "@alice:bob" == direct("alice", "bob")
    await store.add(
        [StoredMessage(dm, 10 + n, "alice", f"hi {n}", 1_000 + n) for n in range(5)]
        + [StoredMessage("lobby", 100 + n, "carol", "yo", 2_000 + n) for n in range(3)]
    )
    bob = await inbox.entries("bob", limit=10, unread_cap=99)
    assert [(e.conversation, e.unread, e.last_read) for e in bob] == [(dm, 5, 0)]
    assert bob[0].last is not None and bob[0].last.text == "hi 4"
    assert await inbox.mark_read("bob", dm, 12) == 12
    assert await inbox.mark_read("bob", dm, 11) == 12  # never backwards
    assert await inbox.mark_read("bob", "lobby", 100) == 100
    bob = await inbox.entries("bob", limit=10, unread_cap=99)
    # The lobby's newest message is newer than the DM's: it comes first.
    assert [(e.conversation, e.unread, e.last_read) for e in bob] == [
        ("lobby", 2, 100),
        (dm, 2, 12),
    ]
    assert [e.conversation for e in await inbox.entries("bob", limit=1, unread_cap=99)] == ["lobby"]
    assert [e.unread for e in await inbox.entries("alice", limit=10, unread_cap=3)] == [4]
    carol = await inbox.entries("carol", limit=10, unread_cap=99)
    assert [(e.conversation, e.unread) for e in carol] == [("lobby", 3)]
    assert await inbox.entries("nobody", limit=10, unread_cap=99) == []
