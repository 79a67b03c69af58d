"""Texts the store cannot hold (issue 33): one message with a U+0000 once halted archiving
for the whole deployment (acked, then refused by PostgreSQL batch after batch, forever).

Two defences, each tested on real servers and real databases:
- at the door, every client text that ends up in the store (message, edit, emoji, room title
  and topic, over the socket and the backend API) is refused when it holds a NUL: an
  ``error`` frame (``bad_frame``) or HTTP 422, nothing published;
- in the archivers, a batch the store refuses for its data has every other row stored and
  each refused row left out, counted (``hubbub_archive_rejected_total``) and never retried,
  on PostgreSQL and on SQLite; a store that is down is still retried (the outage tests of
  tests/test_store.py and tests/test_durable.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from pathlib import Path
from typing import Any

import httpx2 as httpx
import orjson
import pytest
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from app.broker.keys import KeyLayout
from app.conversations.names import direct
from app.errors import ErrorCode, FrameError
from app.protocol import parse_client_frame
from app.store.archiver import Archiver
from app.store.database import StoreError, engine_for, migrate
from app.store.messages import MessageStore, RowsRefused, StoredMessage
from tests.helpers import make_settings, run_server, wait_until
from tests.processes import PostgresServer
from tests.test_durable import connected, redis_and_postgres, send_acked, wait_stored

pytestmark = pytest.mark.timeout(120)

SERVICE = "s" * 40
NUL = "a\x00b"


# -- at the door ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("frame", "field"),
    [
        ({"type": "send", "room": "r", "text": NUL}, "text"),
        ({"type": "send", "to": "bob", "text": "\x00"}, "text"),
        ({"type": "edit", "room": "r", "id": 1, "text": NUL}, "text"),
        ({"type": "react", "with": "bob", "id": 1, "emoji": "\x00"}, "emoji"),
        ({"type": "create", "room": "r", "title": NUL}, "title"),
        ({"type": "create", "room": "r", "topic": NUL}, "topic"),
        ({"type": "describe", "room": "r", "title": NUL}, "title"),
        ({"type": "describe", "room": "r", "topic": NUL}, "topic"),
    ],
)
def test_every_stored_text_with_a_nul_is_a_bad_frame(frame: dict[str, object], field: str) -> None:
    """The one place frames are validated refuses a NUL in each text that reaches the store,
    and says which field and why."""
    with pytest.raises(FrameError) as info:
        parse_client_frame(orjson.dumps(frame).decode())
    assert info.value.code is ErrorCode.BAD_FRAME
    assert info.value.message == f"{field}: must not contain U+0000 (NUL)"


def test_an_unpaired_surrogate_never_parses() -> None:
    """JSON may spell a lone surrogate (``\\ud800``), which no database, Redis script or JSON
    encoder can take: orjson refuses it (bad_json). Paired, it is an ordinary character."""
    with pytest.raises(FrameError) as info:
        parse_client_frame('{"type":"send","room":"r","text":"x\\ud800"}')
    assert info.value.code is ErrorCode.BAD_JSON
    frame = parse_client_frame('{"type":"send","room":"r","text":"\\ud83d\\ude00 \\u00e9"}')
    assert getattr(frame, "text", None) == "\U0001f600 \u00e9"


async def test_sends_edits_and_rooms_with_a_nul_are_refused_and_nothing_is_published(
    tmp_path: Path,
) -> None:
    """On a real server: a send, an edit, a reaction and a room with a NUL each get an error
    frame; the other member gets nothing of them, and nothing is stored."""
    url = f"sqlite:///{tmp_path}/chat.db"
    async with (
        run_server(make_settings(database_url=url)) as live,
        connected(live.ws_url("alice")) as alice,
        connected(live.ws_url("bob")) as bob,
    ):
        await alice.join("lobby")
        await bob.join("lobby")
        [first] = await send_acked(alice, 1, room="lobby")
        assert (await bob.expect("message"))["id"] == first

        refused: list[dict[str, Any]] = [
            {"type": "send", "room": "lobby", "text": NUL, "cid": "s"},
            {"type": "send", "to": "bob", "text": NUL, "cid": "d"},
            {"type": "edit", "room": "lobby", "id": first, "text": NUL, "cid": "e"},
            {"type": "react", "room": "lobby", "id": first, "emoji": "\x00", "cid": "r"},
            {"type": "create", "room": "nul-room", "title": NUL},
            {"type": "describe", "room": "lobby", "topic": NUL},
        ]
        for frame in refused:
            await alice.send(frame)
            error = await alice.next_frame(skip=("ping", "presence", "message"))
            assert error["type"] == "error", error
            assert error["code"] == "bad_frame", error
            assert "must not contain U+0000 (NUL)" in error["message"]

        # Nothing was published: bob's next frame is the next good message, and the refused
        # room does not exist (creating it now works).
        await alice.say("lobby", "after")
        assert (await bob.next_frame(skip=("ping", "presence")))["text"] == "after"
        await alice.messages_until("after")
        await alice.send({"type": "create", "room": "nul-room", "title": "fine"})
        assert (await alice.expect("room"))["title"] == "fine"
        store = live.state.store
        assert store is not None
        await wait_stored(store.messages, "lobby", 2, timeout=10)
        assert [m.text for m in await store.messages.after("lobby", 0, 10)] == ["0", "after"]


async def test_the_backend_api_refuses_a_nul_with_422(tmp_path: Path) -> None:
    """Publishing, creating and describing rooms over the backend API: 422, nothing done; an
    unpaired surrogate in a JSON body (which Python's JSON parser lets through) too."""
    url = f"sqlite:///{tmp_path}/chat.db"
    settings = make_settings(database_url=url, service_token=SERVICE)
    headers = {"Authorization": f"Bearer {SERVICE}", "Content-Type": "application/json"}
    async with (
        run_server(settings) as live,
        httpx.AsyncClient(base_url=f"{live.http_url}/api/v1", headers=headers) as api,
        connected(live.ws_url("alice")) as alice,
    ):
        await alice.join("lobby")
        bodies = [
            ("/rooms/lobby/messages", '{"text":"a\\u0000b"}', "text"),
            ("/rooms/lobby/messages", '{"text":"a\\ud800b"}', "text"),
            ("/users/alice/messages", '{"text":"\\u0000"}', "text"),
            ("/rooms", '{"room":"team","title":"\\u0000"}', "title"),
            ("/rooms", '{"room":"team","topic":"x\\u0000"}', "topic"),
        ]
        for path, body, field in bodies:
            answer = await api.post(path, content=body)
            assert answer.status_code == 422, (path, body, answer.text)
            assert answer.json()["detail"][0]["loc"][-1] == field
        assert (await api.post("/rooms", json={"room": "team"})).status_code == 201
        patched = await api.patch("/rooms/team", content='{"topic":"\\u0000"}')
        assert patched.status_code == 422
        assert (await api.get("/rooms/team")).json()["topic"] == ""

        ok = await api.post("/rooms/lobby/messages", json={"text": "fine"})
        assert ok.status_code == 201
        # The first message alice gets is the good one: none of the refused was published.
        assert (await alice.next_frame(skip=("ping", "presence")))["text"] == "fine"


# -- in the archivers ------------------------------------------------------------------------


def _row(conversation: str, n: int, text: str | None = None) -> StoredMessage:
    return StoredMessage(
        conversation, 1_000 + n, f"user{n % 3}", f"text {n}" if text is None else text,
        1_795_000_000_000 + n,
    )  # fmt: skip


async def test_what_each_database_refuses(engine: AsyncEngine) -> None:
    """PostgreSQL refuses a NUL in TEXT; SQLite stores it, and reads it back as it was. Both
    refuse a value the driver cannot send (an unpaired surrogate, an id beyond 64 bits): as
    RowsRefused, a StoreError that says the data is at fault, without quoting it."""
    store = MessageStore(engine)
    if engine.dialect.name == "postgresql":
        with pytest.raises(RowsRefused, match=r"SQLSTATE 22021") as info:
            await store.add([_row("lobby", 1, NUL)])
        assert NUL not in str(info.value)
    else:
        assert await store.add([_row("lobby", 1, NUL)]) == 1
        assert (await store.after("lobby", 0, 10))[0].text == NUL
    for bad in (_row("lobby", 2, "secret \ud800"), _row("lobby", 2)._replace(id=2**64)):
        with pytest.raises(RowsRefused) as refused:
            await store.add([_row("lobby", 3), bad])
        assert "secret" not in str(refused.value)
    assert await store.count("lobby") == (0 if engine.dialect.name == "postgresql" else 1)


async def test_a_refused_row_is_left_out_and_never_holds_back_the_rest(
    engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    """A batch holding rows the store refuses (two conversations, the bad rows anywhere):
    every other row of it is stored, each refused one is counted and logged once by
    conversation and id (never its text), and archiving goes on with what follows."""
    postgresql = engine.dialect.name == "postgresql"
    store = MessageStore(engine)
    archiver = Archiver(store, batch_max=50, interval_s=0.02, retry_max_s=0.1)
    batch = [_row("lobby" if n % 2 else "@alice:bob", n) for n in range(40)]
    batch[0] = _row("@alice:bob", 0, "secret \x00 nul")  # first
    batch[17] = _row("lobby", 17, "secret \ud800 surrogate")
    batch[39] = _row("lobby", 39, "secret \x00 nul")  # last
    refused = {1_000, 1_017, 1_039} if postgresql else {1_017}
    task = asyncio.create_task(archiver.run())
    try:
        with caplog.at_level(logging.ERROR, logger="app.store.archiver"):
            for message in batch:
                archiver.offer(message)
            await wait_until(lambda: archiver.lag == 0, timeout=30)
            for n in range(40, 60):  # and then archiving goes on
                archiver.offer(_row("lobby", n))
            await wait_until(lambda: archiver.lag == 0, timeout=30)
    finally:
        task.cancel()
    assert archiver.rejected == len(refused) and archiver.stats.rejected == len(refused)
    assert archiver.stored == 60 - len(refused) and archiver.failures == 0
    stored = await store.after("lobby", 0, 100) + await store.after("@alice:bob", 0, 100)
    assert sorted(m.id for m in stored) == [
        1_000 + n for n in range(60) if 1_000 + n not in refused
    ]
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(lines) == len(refused)
    assert all("secret" not in line for line in lines)
    assert any(re.search(r"message 1017 of lobby", line) for line in lines)
    # The conversations that lost a message are vouched for no more (recovery does not read
    # the store across the hole); the others are.
    assert archiver.archived("lobby") == -1
    assert archiver.archived("@alice:bob") == (-1 if postgresql else 1_038)


async def test_a_store_that_is_down_is_not_a_refusal(postgres_server: PostgresServer) -> None:
    """PostgreSQL killed: storing fails with a plain StoreError (retried by the archivers,
    every row kept), not RowsRefused (rows left out)."""
    engine = engine_for(await postgres_server.create_database("chat"), timeout_s=1)
    try:
        await migrate(engine)
        store = MessageStore(engine)
        await postgres_server.kill()
        with pytest.raises(StoreError) as info:
            await store.add_isolating([_row("lobby", 1), _row("lobby", 2, NUL)])
        assert not isinstance(info.value, RowsRefused)
    finally:
        await engine.dispose()


async def test_a_nul_published_past_the_door_does_not_stall_archiving_on_postgresql() -> None:
    """Redis and PostgreSQL, the deployment of the issue: a message with a NUL published
    directly through the broker (as a client of an older version could) is acked and
    delivered; the archiver stores everything around it and after it, in every
    conversation, counts the one refused (the metric HubbubArchiveRejected reads), and marks
    it a hole recovery does not read the store across."""
    async with redis_and_postgres() as (redis, _, url):
        settings = make_settings(redis_url=redis.url, database_url=url)
        async with (
            run_server(settings) as live,
            connected(live.ws_url("alice")) as alice,
            connected(live.ws_url("bob")) as bob,
        ):
            store = live.state.store
            assert store is not None
            await alice.join("lobby")
            await bob.join("lobby")
            before = await send_acked(alice, 5, room="lobby")
            bad = await live.state.broker.publish("lobby", "mallory", NUL, None)
            after = await send_acked(alice, 5, start=5, room="lobby")
            to_bob = await send_acked(alice, 3, start=10, to="bob")
            got = await bob.messages(14, timeout=10)
            assert bad.id in [m["id"] for m in got]

            await wait_until(lambda: store.archive_stats().rejected == 1, timeout=30)
            await wait_stored(store.messages, "lobby", 10, timeout=30)
            await wait_stored(store.messages, direct("alice", "bob"), 3, timeout=30)
            await wait_until(lambda: store.archive_stats().lag_messages == 0, timeout=30)
            lobby = await store.messages.after("lobby", 0, 100)
            assert [m.id for m in lobby] == before + after
            dms = await store.messages.after(direct("alice", "bob"), 0, 100)
            assert [m.id for m in dms] == to_bob
            assert store.archive_stats().failures == 0

            meta = KeyLayout.of(settings).room("lobby", "meta")
            async with contextlib.aclosing(Redis.from_url(redis.url)) as client:
                assert int(await client.hget(meta, "unarchived") or 0) == bad.id

            async with httpx.AsyncClient() as http, asyncio.timeout(10):
                while True:  # the metrics are synced every second
                    metrics = (await http.get(f"{live.http_url}/metrics")).text
                    found = re.search(r"^hubbub_archive_rejected_total\S* (\S+)$", metrics, re.M)
                    if found and float(found.group(1)) == 1:
                        break
                    await asyncio.sleep(0.2)

            # Archiving goes on.
            later = await send_acked(alice, 3, start=13, room="lobby")
            await wait_stored(store.messages, "lobby", 13, timeout=30)
            lobby = await store.messages.after("lobby", 0, 100)
            assert [m.id for m in lobby] == before + after + later


async def test_a_nul_published_past_the_door_is_stored_by_sqlite(tmp_path: Path) -> None:
    """The embedded server (memory broker, SQLite): SQLite holds a NUL, so a message with one
    that got past the door is stored as it was, nothing refused."""
    url = f"sqlite:///{tmp_path}/chat.db"
    async with (
        run_server(make_settings(database_url=url)) as live,
        connected(live.ws_url("alice")) as alice,
    ):
        store = live.state.store
        assert store is not None
        await alice.join("lobby")
        published = await live.state.broker.publish("lobby", "mallory", NUL, None)
        await send_acked(alice, 2, room="lobby")
        await wait_stored(store.messages, "lobby", 3, timeout=20)
        stored = await store.messages.after("lobby", 0, 10)
        assert [m.text for m in stored] == [NUL, "0", "1"]
        assert stored[0].id == published.id
        assert store.archive_stats().rejected == 0
