"""Search over the stored messages, on SQLite (FTS5) and PostgreSQL (tsvector, GIN): the index
follows archiving (edits re-indexed, deletions and expiry gone), raw input is never query
syntax, matches are highlighted by offsets, and only what the user may read now is found —
through the store, the ``search`` frame and ``GET /search``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.conversations.lifecycle import Kind
from app.conversations.names import direct
from app.store.database import MIGRATIONS, engine_for, migrate
from app.store.messages import MessageStore, StoredMessage
from app.store.rooms import Role, Room, RoomStore
from app.store.search import SearchIndexer, SearchStore, fts5_query
from tests.helpers import ChatClient, make_settings, run_server
from tests.test_access import as_user, bearer, jwt_settings
from tests.test_durable import store_of, wait_indexed, wait_stored
from tests.test_rooms import answer

pytestmark = pytest.mark.timeout(90)

TS = 1_795_000_000_000


class IndexedStore(MessageStore):
    """The store as the archiver and the indexer together keep it: each batch stored, then
    indexed (in a transaction of the indexer's own, as the running indexer does)."""

    def __init__(self, engine: AsyncEngine) -> None:
        super().__init__(engine)
        self.indexer = SearchIndexer(engine)

    async def add(self, batch: Sequence[StoredMessage]) -> int:
        added = await super().add(batch)
        while await self.indexer.index(1_000):
            pass
        return added


async def undo_0009(connection: AsyncConnection) -> None:
    """Take a database back to before migration 0009 (notifications), and 0010
    and 0011 (hidden users, reports)."""
    await connection.execute(text("DROP TABLE reports"))
    await connection.execute(text("DROP TABLE hidden_users"))
    for table in ("mentions", "notification_levels", "notify_state", "push_subscriptions"):
        await connection.execute(text(f"DROP TABLE {table}"))
    await connection.execute(text("ALTER TABLE messages DROP COLUMN mentions"))


def row(conversation: str, n: int, user: str, said: str, kind: Kind = Kind.MESSAGE,
        target: int | None = None) -> StoredMessage:  # fmt: skip
    return StoredMessage(conversation, n, user, said, TS + n, int(kind), target)


async def test_the_index_follows_archiving_edits_deletions_and_expiry(
    engine: AsyncEngine,
) -> None:
    """A stored message is found by its words (any case; newest first, or best match
    first); an edit replaces what it is found by (an older edit archived again does not undo
    it); a deleted or expired message is not found; archiving a batch twice indexes once."""
    store, search = IndexedStore(engine), SearchStore(engine)
    batch = [
        row("lobby", 1, "ada", "The budget meeting is on Friday"),
        row("lobby", 2, "bob", "budget budget budget, again the budget"),
        row("lobby", 3, "cy", "lunch?"),
        row("lobby", 4, "ada", "a typo: bugdet", Kind.MESSAGE),
    ]
    await store.add(batch)
    await store.add(batch)  # at-least-once
    found = await search.search("eve", "BUDGET", None, "newest", 10, 0)
    assert [hit.id for hit in found] == [2, 1]
    assert found[1].text == "The budget meeting is on Friday"
    assert found[1].highlights == ((4, 10),)
    best = await search.search("eve", "budget", None, "best", 10, 0)
    assert best[0].id == 2  # four times the word
    assert [hit.id for hit in await search.search("eve", "budget", None, "newest", 1, 1)] == [1]

    fix = row("lobby", 5, "ada", "a typo: budget fixed", Kind.EDITED, 4)
    older = row("lobby", 6, "ada", "a typo: budget", Kind.EDITED, 4)
    newest = row("lobby", 7, "ada", "a typo: budget, fixed for good", Kind.EDITED, 4)
    await store.add([fix, newest])
    await store.add([older])  # archived late: older than the newest edit
    edited = await search.search("eve", "good", None, "newest", 10, 0)
    assert [(hit.id, hit.text) for hit in edited] == [(4, "a typo: budget, fixed for good")]
    assert await search.search("eve", "bugdet", None, "newest", 10, 0) == []

    await store.add([row("lobby", 8, "bob", "", Kind.DELETED, 2)])
    assert [hit.id for hit in await search.search("eve", "budget", None, "newest", 10, 0)] == [4, 1]
    await store.add([batch[1]])  # the deleted message archived again: still not found
    assert [hit.id for hit in await search.search("eve", "again", None, "newest", 10, 0)] == []

    assert await store.delete_older_than(TS + 2, 100) == 1  # message 1 expires
    assert [hit.id for hit in await search.search("eve", "budget", None, "newest", 10, 0)] == [4]


@pytest.mark.parametrize(
    "query",
    ['"', "'", "*", "-", "NEAR(", "a OR", "AND", ")(", "col:x", "^", "\\", '"""', "--x", "😀"],
)
async def test_raw_input_is_never_query_syntax(engine: AsyncEngine, query: str) -> None:
    """Any input is searched for, never parsed as the database's query language: no error."""
    await IndexedStore(engine).add([row("lobby", 1, "ada", "near the col: x AND y")])
    found = await SearchStore(engine).search("eve", query, None, "newest", 10, 0)
    assert all(hit.conversation == "lobby" for hit in found)


def test_fts5_queries_are_quoted_terms() -> None:
    assert fts5_query('budget "next friday" -lunch') == '"budget" "next friday" NOT "lunch"'
    assert fts5_query('a"b OR c*') == '"a b" "OR" "c"'  # one word's pieces: a phrase
    assert fts5_query("-only") == ""
    assert fts5_query('"" * :') == ""


async def test_only_what_the_user_may_read_is_found(engine: AsyncEngine) -> None:
    """A private room's messages are found by its members only; a direct conversation's by
    its two users only; a public room's by anyone."""
    rooms = RoomStore(engine)
    await rooms.create(Room("plans", True, created_by="ada", created_ms=TS))
    await rooms.set_role("plans", "bob", Role.MEMBER, TS)
    await IndexedStore(engine).add([
        row("lobby", 1, "ada", "secret word in public"),
        row("plans", 1, "ada", "secret word in private"),
        row(direct("ada", "bob"), 1, "ada", "secret word between us"),
    ])  # fmt: skip
    search = SearchStore(engine)

    async def found(user: str) -> list[str]:
        return sorted(h.text for h in await search.search(user, "secret", None, "newest", 10, 0))

    assert await found("ada") == ["secret word between us", "secret word in private",
                                  "secret word in public"]  # fmt: skip
    assert await found("bob") == await found("ada")
    assert await found("eve") == ["secret word in public"]
    await rooms.remove("plans", "bob")
    assert await found("bob") == ["secret word between us", "secret word in public"]


async def _stored_with_edits_and_a_deletion(engine: AsyncEngine) -> None:
    await IndexedStore(engine).add([
        row("lobby", 1, "ada", "old words"), row("lobby", 2, "ada", "gone words"),
        row("lobby", 3, "ada", "new words", Kind.EDITED, 1),
        row("lobby", 4, "ada", "", Kind.DELETED, 2), row("lobby", 5, "bob", "more words"),
    ])  # fmt: skip


async def _found(engine: AsyncEngine, query: str = "words") -> list[tuple[int, str]]:
    hits = await SearchStore(engine).search("eve", query, None, "newest", 10, 0)
    return [(hit.id, hit.text) for hit in hits]


async def test_on_sqlite_the_index_is_a_file_of_its_own_made_again_when_lost(
    tmp_path: Path,
) -> None:
    """The index lives in chat-search.db beside chat.db (the store's file holds no search
    table); deleted, it is made again from the stored messages as they are now when the store
    is next opened (newest edit; deleted messages left out), and indexing goes on."""
    store_file = tmp_path / "chat.db"
    engine = engine_for(f"sqlite:///{store_file}")
    try:
        await migrate(engine)
        await _stored_with_edits_and_a_deletion(engine)
        assert await _found(engine) == [(5, "more words"), (1, "new words")]
        async with engine.connect() as connection:
            in_store = await connection.scalar(
                text("SELECT count(*) FROM main.sqlite_master WHERE name LIKE 'search_%'")
            )
            tables = await connection.scalar(
                text("SELECT count(*) FROM search.sqlite_master WHERE name = 'search_documents'")
            )
        assert (in_store, tables) == (1, 1)  # only the queue (search_backlog) in the store's
    finally:
        await engine.dispose()
    _delete_search_file(tmp_path)
    engine = engine_for(f"sqlite:///{store_file}")
    try:
        await migrate(engine)
        assert await _found(engine) == [(5, "more words"), (1, "new words")]
        await IndexedStore(engine).add([row("lobby", 6, "bob", "later words")])
        assert [n for n, _ in await _found(engine)] == [6, 5, 1]
    finally:
        await engine.dispose()


async def test_a_new_sqlite_store_beside_an_old_stores_index_finds_nothing_of_it(
    tmp_path: Path,
) -> None:
    """The store's file deleted (a reset) and its search file left behind: the new store does
    not take that index as its own (it would find the old store's messages), it makes its
    own."""
    store_file = tmp_path / "chat.db"
    engine = engine_for(f"sqlite:///{store_file}")
    try:
        await migrate(engine)
        await _stored_with_edits_and_a_deletion(engine)
        assert len(await _found(engine)) == 2
    finally:
        await engine.dispose()
    for path in _files(tmp_path, "chat.db*"):
        path.unlink()
    engine = engine_for(f"sqlite:///{store_file}")
    try:
        await migrate(engine)
        assert await _found(engine) == []
        await IndexedStore(engine).add([row("lobby", 1, "bob", "fresh words")])
        assert await _found(engine) == [(1, "fresh words")]
        await migrate(engine)  # opened again: its own index, kept
        assert await _found(engine) == [(1, "fresh words")]
    finally:
        await engine.dispose()


async def test_a_sqlite_store_from_before_the_search_file_moves_its_index_there(
    tmp_path: Path,
) -> None:
    """A store migrated before 0012 (its index in the store's own file: downgraded here, as
    0012's downgrade leaves it) is upgraded: the index leaves the store's file and is made in
    the search file, what was stored found as before."""
    store_file = tmp_path / "chat.db"
    engine = engine_for(f"sqlite:///{store_file}")
    try:
        await migrate(engine)
        await _stored_with_edits_and_a_deletion(engine)
        async with engine.begin() as connection:
            await connection.run_sync(_downgrade_to, "0011")
            await connection.execute(text("DROP TABLE search.search_fts"))
            await connection.execute(text("DROP TABLE search.search_documents"))
            in_store = await connection.scalar(text("SELECT count(*) FROM main.search_documents"))
        assert in_store == 2
        assert await _found(engine) == [(5, "more words"), (1, "new words")]  # the store's
        await migrate(engine)
        async with engine.connect() as connection:
            left = await connection.scalar(
                text("SELECT count(*) FROM main.sqlite_master WHERE name LIKE 'search_d%'")
            )
        assert left == 0
        assert await _found(engine) == [(5, "more words"), (1, "new words")]
    finally:
        await engine.dispose()


def _files(folder: Path, pattern: str) -> list[Path]:
    found = list(folder.glob(pattern))
    assert found
    return found


def _delete_search_file(folder: Path) -> None:
    for path in _files(folder, "chat-search.db*"):  # with its WAL
        path.unlink()


def _downgrade_to(connection: Connection, revision: str) -> None:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    command.downgrade(config, revision)


async def test_messages_stored_before_the_migration_are_found(tmp_path: Path) -> None:
    """Migration 0005 indexes what was stored before it, as it is now (newest edit; deleted
    messages left out)."""
    engine = engine_for(f"sqlite:///{tmp_path}/chat.db")
    try:
        await migrate(engine)
        store = IndexedStore(engine)
        await store.add([
            row("lobby", 1, "ada", "old words"), row("lobby", 2, "ada", "gone words"),
            row("lobby", 3, "ada", "new words", Kind.EDITED, 1),
            row("lobby", 4, "ada", "", Kind.DELETED, 2),
        ])  # fmt: skip
        async with engine.begin() as connection:  # as a database from before 0005 holds it
            await connection.execute(text("DELETE FROM search_documents"))
            await connection.execute(text("DROP TRIGGER search_documents_ai"))
            await connection.execute(text("DROP TRIGGER search_documents_ad"))
            await connection.execute(text("DROP TRIGGER search_documents_au"))
            await connection.execute(text("DROP TABLE search_fts"))
            await connection.execute(text("DROP TABLE search_documents"))
            await undo_0009(connection)
            await connection.execute(text("DROP TABLE search_backlog"))  # 0007, 0008
            await connection.execute(text("DROP TABLE files"))  # 0006
            await connection.execute(text("ALTER TABLE messages DROP COLUMN attachments"))
            await connection.execute(text("UPDATE alembic_version SET version_num = '0004'"))
        await migrate(engine)
        hits = await SearchStore(engine).search("eve", "words", None, "newest", 10, 0)
        assert [(hit.id, hit.text) for hit in hits] == [(1, "new words")]
    finally:
        await engine.dispose()


async def test_rows_queued_before_the_kind_column_keep_their_kind(engine: AsyncEngine) -> None:
    """Migration 0008 gives the rows already queued their kind from ``messages``: an edit
    queued before it still replaces its message's text in the index."""
    await MessageStore(engine).add([
        row("lobby", 1, "ada", "old words"),
        row("lobby", 2, "ada", "new words", Kind.EDITED, 1),
    ])  # fmt: skip
    async with engine.begin() as connection:  # the queue as a database at 0007 holds it
        await undo_0009(connection)
        await connection.execute(text("ALTER TABLE search_backlog DROP COLUMN kind"))
        await connection.execute(text("UPDATE alembic_version SET version_num = '0007'"))
    await migrate(engine)
    while await SearchIndexer(engine).index(10):
        pass
    search = SearchStore(engine)
    assert [h.text for h in await search.search("eve", "words", None, "newest", 10, 0)] == [
        "new words"
    ]
    assert await search.search("eve", "old", None, "newest", 10, 0) == []


async def test_search_through_the_frame_and_http_honours_the_access_decision(
    tmp_path: Path,
) -> None:
    """The ``search`` frame and ``GET /search``: members find a private room's messages,
    a stranger, a removed member and a token whose rooms claim leaves the room out do not;
    naming the private room is refused as any frame about it (``not_found``, 404); a
    conversation named finds its messages only; results carry highlights; bad input is a
    clear refusal."""
    async with (
        run_server(jwt_settings(tmp_path)) as live,
        httpx.AsyncClient(base_url=live.http_url) as http,
    ):
        async with as_user(live, "ada") as ada:
            await answer(ada, {"type": "create", "room": "plans", "private": True}, "room")
            await answer(ada, {"type": "invite", "room": "plans", "user": "bob"}, "room")
            await answer(ada, {"type": "join", "room": "plans"}, "joined")
            await answer(ada, {"type": "join", "room": "lobby"}, "joined")
            await ada.say("plans", "the launch date is secret")
            await ada.say("lobby", "launch party on friday")
        await wait_stored(store_of(live), "plans", 1, timeout=20)
        await wait_indexed(live, "lobby", 1, timeout=20)

        async def ask(user: str, **params: Any) -> dict[str, Any]:
            claims = params.pop("claims", {})
            async with as_user(live, user, **claims) as client:
                return await answer(client, {"type": "search", **params}, "search")

        bob = await ask("bob", q="launch")
        assert [(r.get("room"), r["text"]) for r in bob["results"]] == [
            ("lobby", "launch party on friday"), ("plans", "the launch date is secret"),
        ]  # fmt: skip
        assert bob["results"][1]["highlights"] == [[4, 10]]
        assert bob["next_offset"] is None
        eve = await ask("eve", q="launch")
        assert [r["room"] for r in eve["results"]] == ["lobby"]
        narrowed = await ask("bob", q="launch", claims={"rooms": ["lobby"]})
        assert [r["room"] for r in narrowed["results"]] == ["lobby"]
        only = await ask("bob", q="launch", room="plans")
        assert [r["room"] for r in only["results"]] == ["plans"]
        async with as_user(live, "eve") as eve_client:
            refused = await answer(
                eve_client, {"type": "search", "q": "launch", "room": "plans"}, "search"
            )
            assert (refused["code"], refused["ref"]) == ("not_found", "search")
            unused = await answer(
                eve_client, {"type": "search", "q": "launch", "room": "nobody-here"}, "search"
            )
            assert unused["code"] == "not_found"  # the same answer: no existence oracle
            empty = await answer(eve_client, {"type": "search", "q": ""}, "search")
            assert empty["code"] == "bad_frame"

        page = await http.get("/search", params={"q": "LAUNCH"}, headers=bearer("bob"))
        assert page.status_code == 200
        assert [r["room"] for r in page.json()["results"]] == ["lobby", "plans"]
        stranger = await http.get("/search", params={"q": "launch"}, headers=bearer("eve"))
        assert [r["room"] for r in stranger.json()["results"]] == ["lobby"]
        named = await http.get(
            "/search", params={"q": "launch", "room": "plans"}, headers=bearer("eve")
        )
        assert named.status_code == 404
        assert (await http.get("/search", params={"q": "launch"})).status_code == 401
        too_deep = await http.get(
            "/search", params={"q": "x", "offset": 10**6}, headers=bearer("bob")
        )
        assert too_deep.status_code == 422

        async with as_user(live, "ada") as ada:  # bob removed: he finds it no more
            await answer(ada, {"type": "remove", "room": "plans", "user": "bob"}, "room")
        removed = await http.get("/search", params={"q": "launch"}, headers=bearer("bob"))
        assert [r["room"] for r in removed.json()["results"]] == ["lobby"]


async def test_without_a_store_search_is_refused() -> None:
    async with run_server(make_settings()) as live, ChatClient.connect(live.ws_url("ada")) as ada:
        await ada.send({"type": "search", "q": "anything"})
        assert (await ada.expect("error"))["code"] == "no_store"


async def test_a_result_opens_in_its_context_history_around_an_id(tmp_path: Path) -> None:
    """``history`` with ``around``: the messages up to the one found (as they are now) and
    those after it, ``limit`` in all, oldest first; past the broker's tail too (the store);
    refused as any history frame to someone who may not read the room."""
    settings = jwt_settings(tmp_path, history_size=5, archive_interval_s=0.05)
    async with run_server(settings) as live, as_user(live, "ada") as ada:
        await answer(ada, {"type": "create", "room": "team", "private": True}, "room")
        await answer(ada, {"type": "join", "room": "team"}, "joined")
        ids = []
        for n in range(20):
            await ada.send({"type": "send", "room": "team", "text": f"note {n}", "cid": n})
            ids.append((await answer(ada, {"type": "ping"}, "ack"))["id"])
        await wait_stored(store_of(live), "team", 20, timeout=10)
        page = await answer(
            ada, {"type": "history", "room": "team", "around": ids[8], "limit": 6}, "history"
        )
        assert page["around"] == ids[8]
        assert [m["text"] for m in page["messages"]] == [f"note {n}" for n in range(5, 11)]
        async with as_user(live, "eve") as eve:
            refused = await answer(
                eve, {"type": "history", "room": "team", "around": ids[8]}, "history"
            )
            assert refused["code"] == "not_found"


async def test_indexing_is_off_the_archivers_transaction(engine: AsyncEngine) -> None:
    """Archiving only queues: nothing is found until the indexer applies the queue, in
    order and in batches of its limit; a message deleted before the indexer's turn is never
    indexed; what it applied is gone from the queue."""
    store, search, indexer = MessageStore(engine), SearchStore(engine), SearchIndexer(engine)
    await store.add([row("lobby", 1, "ada", "queued words"), row("lobby", 2, "bob", "more words"),
                     row("lobby", 3, "bob", "doomed words"),
                     row("lobby", 4, "bob", "", Kind.DELETED, 3)])  # fmt: skip
    assert await search.search("eve", "words", None, "newest", 10, 0) == []
    assert await indexer.index(2) == 2
    assert [h.id for h in await search.search("eve", "words", None, "newest", 10, 0)] == [2, 1]
    assert indexer.backlog == 2
    assert await indexer.index(10) == 2
    assert indexer.backlog == 0
    assert [h.id for h in await search.search("eve", "words", None, "newest", 10, 0)] == [2, 1]
    assert await indexer.index(10) == 0
