"""A message's life after it is sent — edits, deletion, reactions, replies — and read receipts,
end to end on real servers: each broker (embedded, Redis), with and without a store (SQLite,
PostgreSQL). Events are numbered in the room's log: delivered live, replayed by a join with
`since`, and folded into history pages (the message as it is now)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import jwt
import pytest

from app.conversations.lifecycle import Kind
from app.store.messages import StoredMessage
from tests.helpers import ChatClient, LiveServer, make_settings, run_server
from tests.processes import RedisServer
from tests.test_durable import (
    chat_server,
    connected,
    redis_and_postgres,
    store_of,
    wait_stored,
)

pytestmark = pytest.mark.timeout(120)

KINDS = ["memory", "redis", "embedded", "redis-postgres"]


@contextlib.asynccontextmanager
async def server(kind: str, tmp_path: Path, **settings: Any) -> AsyncIterator[LiveServer]:
    """``memory``/``redis``: a broker alone; ``embedded``/``redis-postgres``: with a store."""
    if kind == "memory":
        async with run_server(make_settings(**settings)) as live:
            yield live
    elif kind == "redis":
        redis = RedisServer()
        await redis.start()
        try:
            async with run_server(make_settings(redis_url=redis.url, **settings)) as live:
                yield live
        finally:
            await redis.stop()
    else:
        async with chat_server(kind.removeprefix("redis-").replace("postgres", "redis"),
                               tmp_path, **settings) as live:  # fmt: skip
            yield live


@contextlib.asynccontextmanager
async def client(live: LiveServer, name: str) -> AsyncIterator[ChatClient]:
    if live.state.store is not None:
        async with connected(live.ws_url(name)) as c:
            yield c
    else:
        async with ChatClient.connect(live.ws_url(name)) as c:
            yield c


async def acked(c: ChatClient, frame: dict[str, Any], skip: tuple[str, ...] = ()) -> int:
    """Send ``frame`` (with a cid) and return the id of its ack; the frames that came before
    the ack are left to read (but those of types in ``skip``)."""
    await c.send(frame)
    before: list[dict[str, Any]] = []
    while True:
        got = await c.next_frame(skip=("ping", "presence", "receipts", *skip))
        if got["type"] == "ack" and got["cid"] == frame["cid"]:
            c._pending.extendleft(reversed(before))
            return int(got["id"])
        assert got["type"] != "error", got
        before.append(got)


async def next_of(c: ChatClient, kind: str) -> dict[str, Any]:
    """The next frame of type ``kind``; acks, receipts and frames of other types skipped."""
    while True:
        frame = await c.next_frame(skip=("ping", "presence", "receipts", "ack"))
        assert frame["type"] != "error", frame
        if frame["type"] == kind:
            return frame


async def error_for(c: ChatClient, frame: dict[str, Any]) -> dict[str, Any]:
    """The error ``frame`` is answered with (frames of the log before it are skipped); no
    ack, so nothing was published."""
    await c.send(frame)
    log = ("message", "edited", "deleted", "reaction", "receipt")
    got = await c.next_frame(skip=("ping", "presence", "receipts", *log))
    assert got["type"] == "error", got
    return got


@pytest.mark.parametrize("kind", KINDS)
async def test_edit_delete_react_reply_live_replayed_and_in_history(
    kind: str, tmp_path: Path
) -> None:
    async with (
        server(kind, tmp_path) as live,
        client(live, "ada") as ada,
        client(live, "bob") as bob,
    ):
        origin = (await ada.join("lobby"))["last"]
        await bob.join("lobby")
        first = await acked(ada, {"type": "send", "room": "lobby", "text": "helo", "cid": 1})
        reply = await acked(
            bob, {"type": "send", "room": "lobby", "text": "hi", "cid": 2, "reply_to": first}
        )
        got = [await next_of(bob, "message"), await next_of(bob, "message")]
        assert [m["id"] for m in got] == [first, reply]
        assert got[1]["reply_to"] == first and "reply_to" not in got[0]

        # Only the author edits; bob's reply is bob's to delete.
        error = await error_for(bob, {"type": "edit", "room": "lobby", "id": first, "text": "x"})
        assert error["code"] == "forbidden" and error["ref"] == "edit" and error["id"] == first
        edit = {"type": "edit", "room": "lobby", "id": first, "text": "hello", "cid": "e1"}
        edit_id = await acked(ada, edit, skip=("message", "edited"))
        assert edit_id > reply
        edited = await next_of(bob, "edited")
        assert edited == {
            "type": "edited", "room": "lobby", "id": edit_id, "target": first, "user": "ada",
            "text": "hello", "ts": edited["ts"],
        }  # fmt: skip
        # A retried edit (same cid) is acked again, and not published twice.
        await ada.send(edit)
        assert (await ada.next_frame(skip=("ping", "presence", "message", "edited"))) == {
            "type": "ack", "cid": "e1", "id": edit_id, "duplicate": True,
        }  # fmt: skip

        # Reactions toggle: on, off, and another one on.
        for emoji, on in (("👍", True), ("👍", False), ("🎉", True)):
            await bob.send({"type": "react", "room": "lobby", "id": first, "emoji": emoji})
            reaction = await next_of(ada, "reaction")
            assert (reaction["emoji"], reaction["on"], reaction["user"]) == (emoji, on, "bob")
            assert reaction["target"] == first

        await acked(bob, {"type": "delete", "room": "lobby", "id": reply, "cid": "d"})
        deleted = await next_of(ada, "deleted")
        assert (deleted["target"], deleted["user"]) == (reply, "bob")

        # Bad input: each a clear error, nothing published.
        cases = [
            ({"type": "edit", "room": "lobby", "id": reply, "text": "x"}, "not_found", "deleted"),
            ({"type": "react", "room": "lobby", "id": reply, "emoji": "x"}, "not_found", "deleted"),
            ({"type": "delete", "room": "lobby", "id": 12345}, "not_found", "no message 12345"),
            ({"type": "delete", "room": "lobby", "id": edit_id}, "not_found", "no message"),
            ({"type": "react", "room": "lobby", "id": first, "emoji": "x" * 17}, "bad_frame", "16"),
            ({"type": "edit", "room": "lobby", "id": first, "text": "x" * 4001},
             "text_too_long", "4001"),
            ({"type": "send", "room": "lobby", "text": "x", "reply_to": 7}, "not_found", "7"),
            ({"type": "edit", "room": "other", "id": first, "text": "x"}, "not_found", "other"),
        ]  # fmt: skip
        for frame, code, words in cases:
            error = await error_for(bob if frame["type"] != "edit" else ada, frame)
            assert error["code"] == code and words in error["message"], (frame, error)

        # History shows the messages as they are now; events are not part of it.
        async with httpx.AsyncClient(base_url=live.http_url) as http:
            page = (await http.get("/rooms/lobby/messages")).json()["messages"]
        assert [m["id"] for m in page] == [first, reply]
        assert page[0]["text"] == "hello" and page[0]["edited"] == edited["ts"]
        assert page[0]["reactions"] == {"🎉": ["bob"]}
        assert page[1]["deleted"] is True and page[1]["text"] == ""

        # A join with `since` replays the messages (as they are now), then the events, in id
        # order after the messages they touch.
        async with client(live, "cy") as cy:
            await cy.send({"type": "join", "room": "lobby", "since": origin})
            assert (await cy.expect("joined"))["recovered"] is True
            replayed = [await cy.next_frame(skip=("ping", "presence", "receipts"))
                        for _ in range(7)]  # fmt: skip
        types = [f["type"] for f in replayed]
        assert types == ["message", "message", "edited", "reaction", "reaction", "reaction",
                         "deleted"]  # fmt: skip
        ids = [f["id"] for f in replayed]
        assert ids == sorted(ids) and ids[0] == first and ids[2] == edit_id
        assert replayed[1]["deleted"] is True and replayed[1]["text"] == ""  # "hi" is gone

        if live.state.store is not None:
            store = store_of(live)
            await wait_stored(store, "lobby", 7, timeout=20)
            rows = await store.after("lobby", 0, 100)
            assert [r.kind for r in rows] == [Kind.MESSAGE, Kind.MESSAGE, Kind.EDITED,
                                             Kind.REACTION_ON, Kind.REACTION_OFF,
                                             Kind.REACTION_ON, Kind.DELETED]  # fmt: skip
            assert rows[1] == StoredMessage("lobby", reply, "bob", "", rows[1].ts_ms, 0, first)
            assert (await store.states("lobby", [first, reply])) == {
                first: {"text": "hello", "edited": edited["ts"], "reactions": {"🎉": ["bob"]}},
                reply: {"deleted": True},
            }
            # The inbox's newest message is shown as it is now too.
            await bob.send({"type": "inbox"})
            inbox = await next_of(bob, "inbox")
            last = inbox["conversations"][0]["last"]
            assert (last["id"], last["deleted"], last["text"]) == (reply, True, "")


@pytest.mark.parametrize("kind", ["embedded", "redis-postgres"])
async def test_events_on_messages_only_the_store_still_holds(kind: str, tmp_path: Path) -> None:
    """The broker keeps 5 entries of the room's log; the first message is long gone from it
    but not from the store: it can still be edited, reacted to, replied to and deleted, and
    history (from the store) shows it as it is now."""
    async with server(kind, tmp_path, history_size=5) as live, client(live, "ada") as ada:
        await ada.join("lobby")
        first = await acked(ada, {"type": "send", "room": "lobby", "text": "old", "cid": 0})
        for n in range(1, 11):
            await acked(ada, {"type": "send", "room": "lobby", "text": str(n), "cid": n})
        await wait_stored(store_of(live), "lobby", 11, timeout=20)
        assert await live.state.broker.find("lobby", first) is None  # only in the store now

        skip = ("message", "edited", "reaction", "deleted")
        edit = {"type": "edit", "room": "lobby", "id": first, "text": "older", "cid": "e"}
        await acked(ada, edit, skip)
        for cid in ("r1", "r2", "r3"):  # on, off, on: the toggle follows the stored state
            react = {"type": "react", "room": "lobby", "id": first, "emoji": "👀", "cid": cid}
            await acked(ada, react, skip)
        reply = {"type": "send", "room": "lobby", "text": "re", "cid": "re", "reply_to": first}
        await acked(ada, reply, skip)
        async with httpx.AsyncClient(base_url=live.http_url) as http:
            page = (await http.get("/rooms/lobby/messages", params={"limit": 100})).json()
        oldest = page["messages"][0]
        assert (oldest["id"], oldest["text"], oldest["reactions"]) == (
            first,
            "older",
            {"👀": ["ada"]},
        )
        await acked(ada, {"type": "delete", "room": "lobby", "id": first, "cid": "d"}, skip)
        error = await error_for(ada, {"type": "react", "room": "lobby", "id": first, "emoji": "x"})
        assert error["code"] == "not_found"
        store = store_of(live)
        await wait_stored(store, "lobby", 17, timeout=20)
        # What was said is gone from the store too: the message's text and its edit's.
        rows = await store.after("lobby", 0, 100)
        assert [
            r.text for r in rows if r.id == first or (r.target == first and r.kind == Kind.EDITED)
        ] == ["", ""]
        async with httpx.AsyncClient(base_url=live.http_url) as http:
            page = (await http.get("/rooms/lobby/messages", params={"limit": 100})).json()
        assert page["messages"][0]["deleted"] is True


@pytest.mark.parametrize("kind", ["memory", "redis-postgres"])
async def test_direct_messages_get_the_same(kind: str, tmp_path: Path) -> None:
    """Edit, react, reply, delete and read in a direct conversation: both users see each event
    (``to`` is the other user from the one acting), and the read position as a receipt."""
    async with (
        server(kind, tmp_path) as live,
        client(live, "ada") as ada,
        client(live, "bob") as bob,
    ):
        first = await acked(ada, {"type": "send", "to": "bob", "text": "psst", "cid": 1})
        assert (await next_of(bob, "message"))["id"] == first
        await bob.send({"type": "react", "with": "ada", "id": first, "emoji": "❤"})
        for c in (ada, bob):
            reaction = await next_of(c, "reaction")
            assert (reaction["to"], reaction["user"], reaction["on"]) == ("ada", "bob", True)
        await acked(bob, {"type": "send", "to": "ada", "text": "?", "cid": 2, "reply_to": first})
        assert (await next_of(ada, "message"))["reply_to"] == first
        await ada.send({"type": "edit", "with": "bob", "id": first, "text": "psst!"})
        assert (await next_of(bob, "edited"))["text"] == "psst!"
        error = await error_for(bob, {"type": "edit", "with": "ada", "id": first, "text": "no"})
        assert error["code"] == "forbidden" and error["with"] == "ada"
        await bob.send({"type": "read", "with": "ada", "id": first})
        receipt = await next_of(ada, "receipt")
        assert receipt == {"type": "receipt", "to": "ada", "user": "bob", "id": first}
        await ada.send({"type": "delete", "with": "bob", "id": first})
        assert (await next_of(bob, "deleted"))["target"] == first
        # Another user's conversation is not reachable by naming its message ids.
        async with client(live, "cy") as cy:
            error = await error_for(cy, {"type": "delete", "with": "ada", "id": first})
            assert error["code"] == "not_found"


@pytest.mark.parametrize("kind", ["memory", "embedded"])
async def test_read_receipts_reach_the_room_and_can_be_kept_private(
    kind: str, tmp_path: Path
) -> None:
    async with (
        server(kind, tmp_path) as live,
        client(live, "ada") as ada,
        client(live, "bob") as bob,
    ):
        await ada.join("lobby")
        await bob.join("lobby")
        first = await acked(ada, {"type": "send", "room": "lobby", "text": "x", "cid": 1})
        await next_of(bob, "message")
        await bob.send({"type": "read", "room": "lobby", "id": first, "receipt": False})
        await bob.send({"type": "read", "room": "lobby", "id": first})
        assert await next_of(ada, "receipt") == {
            "type": "receipt", "room": "lobby", "user": "bob", "id": first,
        }  # fmt: skip
        if live.state.store is not None:
            # Joining shows where the room's readers are; a read never moves back.
            await bob.send({"type": "read", "room": "lobby", "id": first - 1})
            assert (await next_of(ada, "receipt"))["id"] == first
            async with client(live, "cy") as cy:
                await cy.join("lobby")
                assert await cy.expect("receipts") == {
                    "type": "receipts", "room": "lobby", "read": {"bob": first},
                }  # fmt: skip
    async with server(kind, tmp_path, read_receipts=False) as live, client(live, "ada") as ada:
        async with client(live, "bob") as bob:
            await ada.join("lobby")
            await bob.join("lobby")
            await bob.send({"type": "read", "room": "lobby", "id": 5})
            await ada.say("lobby", "after")
            assert (await next_of(bob, "message"))["text"] == "after"
            assert (await ada.next_frame(skip=("ping", "presence")))["type"] == "message"


async def test_a_moderator_deletes_anyones_message(tmp_path: Path) -> None:
    secret = "s" * 32

    def token(user: str, **claims: Any) -> str:
        return jwt.encode({"sub": user, "exp": int(time.time()) + 60, **claims}, secret, "HS256")

    settings = make_settings(auth_mode="jwt", jwt_secret=secret)
    async with run_server(settings) as live:
        url = f"ws://127.0.0.1:{live.port}/ws?token="
        async with (
            ChatClient.connect(url + token("ada")) as ada,
            ChatClient.connect(url + token("bob")) as bob,
            ChatClient.connect(url + token("mo", roles=["moderator"])) as mo,
        ):
            for c in (ada, bob, mo):
                await c.join("lobby")
            first = await acked(ada, {"type": "send", "room": "lobby", "text": "spam", "cid": 1})
            error = await error_for(bob, {"type": "delete", "room": "lobby", "id": first})
            assert error["code"] == "forbidden"
            error = await error_for(mo, {"type": "edit", "room": "lobby", "id": first, "text": "x"})
            assert error["code"] == "forbidden"  # moderators delete; they do not edit
            await mo.send({"type": "delete", "room": "lobby", "id": first})
            deleted = await next_of(ada, "deleted")
            assert (deleted["target"], deleted["user"]) == (first, "mo")


async def test_events_cross_servers_and_are_recovered_after_a_reconnect(tmp_path: Path) -> None:
    """Two servers (two pods) on one Redis and one PostgreSQL: an edit and a reaction made on
    one reach the other live; what bob missed while away (an edit, a deletion) is replayed
    to him on the other server by a join with `since`, in order."""
    async with redis_and_postgres() as (redis, _, url):
        settings = make_settings(redis_url=redis.url, database_url=url)
        async with run_server(settings) as one, run_server(settings) as two:
            async with client(one, "ada") as ada:
                await ada.join("lobby")
                async with client(two, "bob") as bob:
                    await bob.join("lobby")
                    first = await acked(
                        ada, {"type": "send", "room": "lobby", "text": "a", "cid": 1}
                    )
                    assert (await next_of(bob, "message"))["id"] == first
                    await ada.send({"type": "edit", "room": "lobby", "id": first, "text": "b"})
                    assert (await next_of(bob, "edited"))["text"] == "b"
                    await bob.send({"type": "react", "room": "lobby", "id": first, "emoji": "✓"})
                    position = (await next_of(ada, "reaction"))["id"]
                    assert (await next_of(bob, "reaction"))["id"] == position
                skip = ("message", "edited", "reaction", "deleted")
                edit = {"type": "edit", "room": "lobby", "id": first, "text": "c", "cid": "e"}
                edited = await acked(ada, edit, skip)
                deleted = await acked(ada, {"type": "delete", "room": "lobby", "id": first,
                                            "cid": "d"}, skip)  # fmt: skip
            async with client(two, "bob") as bob:
                await bob.send({"type": "join", "room": "lobby", "since": position})
                assert (await bob.expect("joined"))["recovered"] is True
                replayed = [await next_of(bob, kind) for kind in ("edited", "deleted")]
                assert [f["id"] for f in replayed] == [edited, deleted]
                assert replayed[0]["text"] == "c"
