"""Durable conversations end to end: real servers archiving into a real PostgreSQL (or SQLite,
embedded), with Redis (or the embedded broker) in front. History and recovery reach past
Redis' tail, direct messages reach people who were away, and a database outage loses
nothing."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import jwt
import pytest

from app.state import ChatState
from app.store.database import StoreError, engine_for
from app.store.messages import MessageStore
from tests.helpers import ChatClient, LiveServer, make_settings, run_server, wait_until
from tests.processes import AppProcess, PostgresServer, RedisServer

pytestmark = pytest.mark.timeout(120)


@contextlib.asynccontextmanager
async def redis_and_postgres() -> AsyncIterator[tuple[RedisServer, PostgresServer, str]]:
    """A redis-server and a PostgreSQL for this test only (it may kill them), and the URL of
    a fresh database."""
    redis, postgres = RedisServer(), PostgresServer()
    await redis.start()
    await postgres.start()
    try:
        yield redis, postgres, await postgres.create_database("chat")
    finally:
        await postgres.stop()
        await redis.stop()


@contextlib.asynccontextmanager
async def chat_server(kind: str, tmp_path: Path, **settings: Any) -> AsyncIterator[LiveServer]:
    """A server with a store: ``embedded`` (memory broker, SQLite) or ``redis`` (Redis and
    PostgreSQL, both started here)."""
    if kind == "embedded":
        url = f"sqlite:///{tmp_path}/data/chat.db"
        async with run_server(make_settings(database_url=url, **settings)) as live:
            yield live
        return
    async with redis_and_postgres() as (redis, _, url):
        overrides = {"redis_url": redis.url, "database_url": url} | settings
        async with run_server(make_settings(**overrides)) as live:
            yield live


@contextlib.asynccontextmanager
async def connected(url: str) -> AsyncIterator[ChatClient]:
    """A client past its ``hello`` and the ``inbox`` that follows it with a store."""
    async with ChatClient.connect(url) as client:
        await client.expect("inbox")
        yield client


def store_of(live: LiveServer) -> MessageStore:
    state: ChatState = live.state
    assert state.store is not None
    return state.store.messages


async def send_acked(
    client: ChatClient, count: int, start: int = 0, own_copies: bool = False, **target: Any
) -> list[int]:
    """Send ``count`` messages (texts ``start``… with cids) and return their acked ids.

    With ``own_copies``, also wait for the sender's own copy of each (it may come before or
    after its ack), so that no copy is left to arrive where a test expects another frame."""
    for n in range(start, start + count):
        await client.send({"type": "send", "text": str(n), "cid": f"c{n}", **target})
    acked: dict[str, int] = {}
    copies: set[int] = set()
    while len(acked) < count or (own_copies and not copies >= set(acked.values())):
        frame = await client.next_frame(timeout=10, skip=("ping", "presence"))
        if frame["type"] == "message":
            copies.add(frame["id"])
            continue
        assert frame["type"] == "ack", frame
        acked[frame["cid"]] = frame["id"]
    return [acked[f"c{n}"] for n in range(start, start + count)]


async def wait_stored(store: MessageStore, conversation: str, count: int, timeout: float) -> None:
    """Until ``count`` messages of ``conversation`` are stored (the database may still be
    starting up)."""
    async with asyncio.timeout(timeout):
        while True:
            with contextlib.suppress(StoreError):
                if await store.count(conversation) >= count:
                    return
            await asyncio.sleep(0.05)


async def wait_indexed(live: LiveServer, conversation: str, count: int, timeout: float) -> None:
    """Until ``count`` messages of ``conversation`` are stored and everything stored is
    indexed for search (the indexer's next batch, run now rather than waited for)."""
    await wait_stored(store_of(live), conversation, count, timeout)
    store = live.state.store
    assert store is not None and store.indexer is not None
    while await store.indexer.index(10_000):
        pass


@pytest.mark.parametrize("kind", ["embedded", "redis"])
async def test_history_and_recovery_reach_past_the_brokers_tail(kind: str, tmp_path: Path) -> None:
    """Redis keeps 10 messages of the room; the store keeps all 40. Paging over HTTP reaches
    the first, and a join with a `since` from before all of them recovers every one, in
    order, then goes live."""
    async with chat_server(kind, tmp_path, history_size=10, recovery_page_messages=7) as live:
        async with connected(live.ws_url("alice")) as alice:
            origin = (await alice.join("lobby"))["last"]
            ids = await send_acked(alice, 40, room="lobby")
            await wait_stored(store_of(live), "lobby", 40, timeout=20)

            seen: list[int] = []
            before: int | None = None
            async with httpx.AsyncClient(base_url=live.http_url) as http:
                while True:
                    params = {"limit": 15} | ({"before": before} if before else {})
                    page = (await http.get("/rooms/lobby/messages", params=params)).json()
                    if not page["messages"]:
                        break
                    seen = [m["id"] for m in page["messages"]] + seen
                    before = page["messages"][0]["id"]
            assert seen == ids

            async with connected(live.ws_url("bob")) as bob:
                await bob.send({"type": "join", "room": "lobby", "since": origin})
                joined = await bob.expect("joined")
                assert joined["recovered"] is True
                replayed = await bob.messages(40, timeout=10)
                assert [m["id"] for m in replayed] == ids
                assert [m["text"] for m in replayed] == [str(n) for n in range(40)]
                await alice.say("lobby", "live")
                assert (await bob.expect("message"))["text"] == "live"

                # The same past over the socket: an `after` page is recovered from the store.
                await bob.send({"type": "history", "room": "lobby", "after": origin, "limit": 5})
                page = await bob.expect("history")
                assert page["recovered"] is True and page["more"] is True
                assert [m["id"] for m in page["messages"]] == ids[:5]


async def test_a_since_the_archive_cannot_vouch_for_is_not_recovered(tmp_path: Path) -> None:
    """A join with a `since` from before the room's history began (an older incarnation)
    is `recovered: false`, store or not: nothing is replayed as if complete."""
    async with chat_server("embedded", tmp_path, history_size=5) as live:
        async with connected(live.ws_url("alice")) as alice:
            origin = (await alice.join("lobby"))["last"]
            await send_acked(alice, 12, own_copies=True, room="lobby")
            await wait_stored(store_of(live), "lobby", 12, timeout=20)
            await alice.send({"type": "join", "room": "lobby", "since": origin - 1})
            assert (await alice.expect("joined"))["recovered"] is False


async def test_messages_and_direct_messages_survive_a_restart_of_the_embedded_server(
    tmp_path: Path,
) -> None:
    """`make run`'s setup (memory broker, SQLite file): after a restart the room's history is
    still there, and a DM sent to someone offline is in their inbox when they connect."""
    async with chat_server("embedded", tmp_path) as live:
        async with ChatClient.connect(live.ws_url("alice")) as alice:
            assert (await alice.expect("inbox"))["conversations"] == []
            await alice.join("lobby")
            ids = await send_acked(alice, 5, room="lobby")
            dm = await send_acked(alice, 2, start=5, to="bob")
    # Stopping stored what the archiver held.
    async with chat_server("embedded", tmp_path) as live:
        async with httpx.AsyncClient(base_url=live.http_url) as http:
            page = (await http.get("/rooms/lobby/messages")).json()
        assert [m["id"] for m in page["messages"]] == ids
        async with ChatClient.connect(live.ws_url("bob")) as bob:
            inbox = await bob.expect("inbox")
            assert inbox["conversations"] == [
                {"with": "alice", "unread": 2, "mentions": 0, "read": 0, "peer_read": 0,
                 "last": {"type": "message", "to": "bob", "id": dm[1], "user": "alice",
                          "text": "6", "ts": inbox["conversations"][0]["last"]["ts"]}},
            ]  # fmt: skip
            await bob.send({"type": "history", "with": "alice"})
            page = await bob.expect("history")
            assert [(m["id"], m["text"]) for m in page["messages"]] == [(dm[0], "5"), (dm[1], "6")]


async def test_direct_messages_are_stored_conversations_with_inbox_and_read_state(
    tmp_path: Path,
) -> None:
    async with chat_server("redis", tmp_path) as live:
        store = store_of(live)
        async with ChatClient.connect(live.ws_url("alice")) as alice:
            await alice.expect("inbox")
            sent = await send_acked(alice, 3, own_copies=True, to="bob")
            await wait_stored(store, "@alice:bob", 3, timeout=20)
            async with ChatClient.connect(live.ws_url("bob")) as bob:
                inbox = (await bob.expect("inbox"))["conversations"]
                assert [(c["with"], c["unread"], c["last"]["text"]) for c in inbox] == [
                    ("alice", 3, "2")
                ]
                # Recovery of a conversation the client does not join: `after` its last id.
                await bob.send({"type": "history", "with": "alice", "after": sent[0]})
                page = await bob.expect("history")
                assert page["recovered"] is True and page["more"] is False
                assert [m["id"] for m in page["messages"]] == sent[1:]

                await bob.send({"type": "read", "with": "alice", "id": sent[1]})
                # The receipt reaches alice, and bob's own connections (his other tabs).
                receipt = {"type": "receipt", "to": "alice", "user": "bob", "id": sent[1]}
                assert await bob.expect("receipt") == receipt
                assert await alice.expect("receipt") == receipt
                await bob.send({"type": "inbox"})
                inbox = (await bob.expect("inbox"))["conversations"]
                assert [(c["with"], c["unread"], c["read"]) for c in inbox] == [
                    ("alice", 1, sent[1])
                ]
                await alice.send({"type": "inbox"})
                inbox = (await alice.expect("inbox"))["conversations"]
                assert [(c["with"], c["peer_read"]) for c in inbox] == [("bob", sent[1])]
                # Live: both of bob's tabs (here one) and alice's other tabs get it.
                await alice.say_to("bob", "live")
                assert (await bob.expect("message"))["text"] == "live"

            # Someone else asking for "with alice" gets their own conversation with her.
            async with ChatClient.connect(live.ws_url("carol")) as carol:
                await carol.expect("inbox")
                await carol.send({"type": "history", "with": "alice"})
                assert (await carol.expect("history"))["messages"] == []
                # And no room can be named like a direct conversation.
                await carol.send({"type": "join", "room": "@alice:bob"})
                error = await carol.expect("error")
                assert error["code"] == "bad_frame"


async def test_without_a_store_the_inbox_is_refused_clearly() -> None:
    """(``read`` still relays receipts live: tests/test_lifecycle.py.)"""
    async with (
        run_server(make_settings()) as live,
        ChatClient.connect(live.ws_url("alice")) as alice,
    ):
        await alice.send({"type": "inbox"})
        assert (await alice.expect("error"))["code"] == "no_store"
        await alice.send({"type": "history", "room": "lobby", "before": 1, "after": 2})
        error = await alice.expect("error")
        assert error["code"] == "bad_frame"
        assert "at most one of before, after and around" in error["message"]
        assert await alice.is_responsive()


async def test_postgresql_down_under_traffic_chat_goes_on_and_nothing_is_lost(
    tmp_path: Path,
) -> None:
    """PostgreSQL SIGKILLed while messages keep coming: every send is still acked and
    delivered live, the lag grows (and shows in the metrics), and once PostgreSQL is back
    every acked message is stored exactly once."""
    async with redis_and_postgres() as (redis, postgres, url):
        settings = make_settings(
            redis_url=redis.url, database_url=url, database_timeout_s=1, history_size=20
        )
        async with (
            run_server(settings) as live,
            connected(live.ws_url("alice")) as alice,
            connected(live.ws_url("bob")) as bob,
        ):
            store = live.state.store
            assert store is not None
            await alice.join("lobby")
            await bob.join("lobby")
            acked = await send_acked(alice, 100, room="lobby")
            await wait_stored(store.messages, "lobby", 100, timeout=20)

            await postgres.kill()
            acked += await send_acked(alice, 200, start=100, room="lobby")
            got = await bob.messages(300, timeout=20)
            assert [m["id"] for m in got] == acked  # live delivery did not wait for the store
            await wait_until(lambda: store.archive_stats().failures > 0, timeout=20)
            await wait_until(lambda: store.archive_stats().lag_messages > 0, timeout=10)
            async with httpx.AsyncClient() as http, asyncio.timeout(10):
                while True:  # the metrics are synced every second
                    metrics = (await http.get(f"{live.http_url}/metrics")).text
                    lag = re.search(r"^hubbub_archive_lag_seconds\S* (\S+)$", metrics, re.M)
                    assert lag is not None, metrics
                    if float(lag.group(1)) > 0:
                        break
                    await asyncio.sleep(0.2)

            await postgres.resume()
            await wait_until(lambda: store.archive_stats().lag_messages == 0, timeout=60)
        engine = engine_for(url)
        try:
            stored = await MessageStore(engine).after("lobby", 0, 1_000)
        finally:
            await engine.dispose()
        assert [m.id for m in stored] == acked
        assert [m.text for m in stored] == [str(n) for n in range(300)]


async def test_archiving_moves_to_another_worker_when_its_leader_is_killed(
    redis_server: RedisServer, postgres_server: PostgresServer
) -> None:
    """Gunicorn, two workers: the one that archives is SIGKILLed; another takes over within
    the lease, claims what the dead one held, and every acked message is stored once."""
    url = await postgres_server.create_database("chat")
    app = AppProcess(
        {"CHAT_REDIS_URL": redis_server.url, "CHAT_DATABASE_URL": url,
         "CHAT_ARCHIVE_LEASE_S": "1.5", "CHAT_RATE_LIMIT_FRAMES_PER_S": "10000",
         "CHAT_RATE_LIMIT_BURST": "10000"},
        gunicorn_workers=2,
    )  # fmt: skip
    await app.start()
    try:
        leaders = await _leaders(app, 1)
        acked: list[int] = []
        async with connected(app.ws_url("alice")) as alice:
            await alice.join("lobby")
            acked += await send_acked(alice, 100, room="lobby")
        os.kill(leaders[0], signal.SIGKILL)
        await app.wait_status(200)
        async with connected(app.ws_url("alice")) as alice:
            await alice.join("lobby")
            acked += await send_acked(alice, 100, start=100, room="lobby")
        assert len(await _leaders(app, 2)) == 2
        engine = engine_for(url)
        try:
            store = MessageStore(engine)
            await wait_stored(store, "lobby", 200, timeout=30)
            assert [m.id for m in await store.after("lobby", 0, 1_000)] == acked
        finally:
            await engine.dispose()
    finally:
        await app.stop()


async def _leaders(app: AppProcess, count: int) -> list[int]:
    """The pids of the workers that have led archiving, once ``count`` have."""
    async with asyncio.timeout(20):
        while True:
            found = re.findall(r"archiving: this worker leads \([^:]+:(\d+):", app.output())
            pids = list(dict.fromkeys(int(pid) for pid in found))
            if len(pids) >= count:
                return pids
            await asyncio.sleep(0.1)


async def test_a_full_archive_backlog_is_counted_never_silent(tmp_path: Path) -> None:
    """While the store is down the backlog stops at CHAT_ARCHIVE_BACKLOG_MAX: chat goes on,
    the messages past it are not archived, and each is counted (the metric the
    HubbubArchiveDropping alert reads). Recovery never reads across that hole in the store:
    once Redis' history has moved past the unarchived messages, a `since` before them is
    `recovered: false`, and one after them is recovered from the store."""
    async with redis_and_postgres() as (redis, postgres, url):
        settings = make_settings(
            redis_url=redis.url, database_url=url, database_timeout_s=1,
            archive_backlog_max=1_000, history_size=50,
        )  # fmt: skip
        async with run_server(settings) as live:
            await postgres.kill()
            store = live.state.store
            assert store is not None
            async with ChatClient.connect(live.ws_url("alice")) as alice:
                error = await alice.expect("error")  # no inbox: the store is down
                assert error["code"] == "store_unavailable" and error["ref"] == "inbox"
                origin = (await alice.join("lobby"))["last"]
                await wait_until(lambda: store.archive_stats().leading, timeout=20)
                acked = await send_acked(alice, 1_100, room="lobby")
                assert len(set(acked)) == 1_100
                await wait_until(lambda: store.archive_stats().dropped == 100, timeout=20)
                assert store.archive_stats().lag_messages == 1_000

                await postgres.resume()
                await wait_stored(store.messages, "lobby", 1_000, timeout=60)
                acked += await send_acked(alice, 60, start=1_100, room="lobby")
                await wait_stored(store.messages, "lobby", 1_060, timeout=60)
                for since, recovered in ((origin, False), (acked[1_099], True)):
                    await alice.send({"type": "join", "room": "lobby", "since": since})
                    frame = await alice.next_frame(skip=("ping", "presence", "message"))
                    assert (frame["type"], frame["recovered"]) == ("joined", recovered)
                await alice.send({"type": "history", "room": "lobby", "after": acked[1_099]})
                page = await alice.next_frame(skip=("ping", "presence", "message"))
                # The store's part, up to where Redis' 50 (+1) begin: messages 1,100-1,109.
                assert page["recovered"] is True and page["more"] is True
                assert [m["id"] for m in page["messages"]] == acked[1_100:1_110]


async def test_inbox_and_direct_messages_over_http_are_per_user(tmp_path: Path) -> None:
    """GET /inbox and /dms/{peer}/messages answer for the bearer token's user only (jwt
    mode); without a valid token 401, in the modes without tokens 403."""
    secret = "a-test-secret-that-is-long-enough-for-hs256"

    def token(user: str) -> str:
        return jwt.encode({"sub": user, "exp": int(time.time()) + 60}, secret, "HS256")

    def bearer(user: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token(user)}"}

    async with (
        chat_server("embedded", tmp_path, auth_mode="jwt", jwt_secret=secret) as live,
        httpx.AsyncClient(base_url=live.http_url) as http,
    ):
        async with connected(f"{live.ws_url()}?token={token('ada')}") as ada:
            sent = await send_acked(ada, 3, to="bob")
        await wait_stored(store_of(live), "@ada:bob", 3, timeout=20)

        inbox = (await http.get("/inbox", headers=bearer("bob"))).json()
        assert [(c["with"], c["unread"], c["last"]["id"]) for c in inbox["conversations"]] == [
            ("ada", 3, sent[-1])
        ]
        page = (await http.get("/dms/ada/messages", headers=bearer("bob"))).json()
        assert page["with"] == "ada" and [m["id"] for m in page["messages"]] == sent
        page = (
            await http.get("/dms/ada/messages", params={"before": sent[-1]}, headers=bearer("bob"))
        ).json()
        assert [m["id"] for m in page["messages"]] == sent[:2]
        # Carol's conversation with ada is her own: empty.
        assert (await http.get("/dms/ada/messages", headers=bearer("carol"))).json()[
            "messages"
        ] == []
        assert (await http.get("/inbox")).status_code == 401
        assert (
            await http.get("/inbox", headers={"Authorization": "Bearer nope"})
        ).status_code == 401
        assert (await http.get("/dms/not a user/messages", headers=bearer("bob"))).status_code in (
            404,
            422,
        )
    async with (
        run_server(make_settings()) as live,
        httpx.AsyncClient(base_url=live.http_url) as http,
    ):
        assert (await http.get("/inbox")).status_code == 403


async def test_retention_deletes_what_is_older_than_it(tmp_path: Path) -> None:
    """CHAT_RETENTION_DAYS: stored messages older than it go (here 2 s), newer ones stay."""
    async with chat_server("embedded", tmp_path, retention_days=2 / 86_400) as live:
        store = store_of(live)
        async with connected(live.ws_url("ada")) as ada:
            await ada.join("lobby")
            await send_acked(ada, 5, room="lobby")
            await wait_stored(store, "lobby", 5, timeout=10)
            async with asyncio.timeout(15):
                while await store.count("lobby"):
                    await asyncio.sleep(0.1)
            await send_acked(ada, 1, start=5, room="lobby")
            await wait_stored(store, "lobby", 1, timeout=10)
            assert [m.text for m in await store.after("lobby", 0, 10)] == ["5"]
