"""Private rooms with members and roles, on real servers: the embedded setup (SQLite) and two
servers (two pods) on one Redis and one PostgreSQL, where a removal on one takes the member's
socket out of the room on the other at once."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from tests.helpers import ChatClient, LiveServer, make_settings, run_server
from tests.test_durable import connected, redis_and_postgres

pytestmark = pytest.mark.timeout(120)


@contextlib.asynccontextmanager
async def two_servers(kind: str, tmp_path: Path) -> AsyncIterator[tuple[LiveServer, LiveServer]]:
    """``embedded``: one server (memory broker, SQLite) twice; ``redis``: two servers on one
    Redis and one PostgreSQL."""
    if kind == "embedded":
        settings = make_settings(database_url=f"sqlite:///{tmp_path}/data/chat.db")
        async with run_server(settings) as live:
            yield live, live
        return
    async with redis_and_postgres() as (redis, _, url):
        settings = make_settings(redis_url=redis.url, database_url=url)
        async with run_server(settings) as one, run_server(settings) as two:
            yield one, two


async def answer(c: ChatClient, frame: dict[str, Any], kind: str) -> dict[str, Any]:
    """Send ``frame``; the next frame of type ``kind`` or ``error`` (live notices skipped)."""
    await c.send(frame)
    while True:
        got = await c.next_frame(skip=("ping", "presence", "member", "invited", "receipts"))
        if got["type"] in (kind, "error"):
            return got


@pytest.mark.parametrize("kind", ["embedded", "redis"])
async def test_private_rooms_admit_members_only_and_removal_is_immediate_everywhere(
    kind: str, tmp_path: Path
) -> None:
    async with (
        two_servers(kind, tmp_path) as (one, two),
        connected(one.ws_url("ada")) as ada,
        connected(two.ws_url("bob")) as bob,
        connected(two.ws_url("cy")) as cy,
    ):
        create = {"type": "create", "room": "secret", "private": True, "title": "Plans"}
        room = await answer(ada, create, "room")
        assert room == {
            "type": "room", "room": "secret", "private": True, "title": "Plans", "topic": "",
            "role": "owner", "members": {"ada": "owner"},
        }  # fmt: skip
        assert (await answer(bob, create, "room"))["code"] == "exists"
        await cy.join("lobby")  # a room in use cannot be taken over
        error = await answer(ada, {"type": "create", "room": "lobby", "private": True}, "room")
        assert error["code"] == "exists"

        # Not a member: no join, no history (socket or HTTP), no events, no members; every
        # answer the one a room nobody uses gets ("not allowed" and "does not exist" are one).
        outsider_frames: tuple[dict[str, Any], ...] = (
            {"type": "join", "room": "secret"},
            {"type": "history", "room": "secret"},
            {"type": "read", "room": "secret", "id": 1},
            {"type": "describe", "room": "secret", "topic": "x"},
            {"type": "invite", "room": "secret", "user": "cy"},
            {"type": "remove", "room": "secret", "user": "ada"},
            {"type": "remove", "room": "secret", "user": "nobody"},
        )
        for n, frame in enumerate(outsider_frames):
            error = await answer(bob, frame, "joined")
            assert error["code"] == "not_found", frame
            assert error["message"] == "room 'secret' not found", frame
            if frame["type"] != "join":  # an unused name's join makes a public room
                unused = await answer(bob, {**frame, "room": f"unused{n}"}, "joined")
                assert unused["message"] == f"room 'unused{n}' not found", frame
        async with httpx.AsyncClient(base_url=two.http_url) as http:
            secret_page = await http.get("/rooms/secret/messages")
            unused_page = await http.get("/rooms/unused2/messages")
            assert secret_page.status_code == unused_page.status_code == 404
            assert secret_page.json()["detail"].replace("secret", "X") == unused_page.json()[
                "detail"
            ].replace("unused2", "X")

        # Invited: bob hears of it on his own server, joins, reads and writes.
        await answer(ada, {"type": "invite", "room": "secret", "user": "bob"}, "room")
        invited = await bob.expect("invited")
        assert (invited["room"], invited["role"], invited["by"]) == ("secret", "member", "ada")
        await ada.join("secret")
        assert (await ada.expect("room"))["role"] == "owner"  # after `joined`: its record
        await bob.send({"type": "join", "room": "secret"})
        assert (await bob.expect("joined"))["room"] == "secret"
        assert (await bob.expect("room"))["role"] == "member"
        await bob.say("secret", "hi")
        assert (await ada.messages_until("hi"))[-1]["user"] == "bob"

        # Roles: a member cannot invite; an admin adds members but cannot remove the owner.
        error = await answer(bob, {"type": "invite", "room": "secret", "user": "cy"}, "room")
        assert error["code"] == "forbidden"
        await answer(ada, {"type": "invite", "room": "secret", "user": "bob", "role": "admin"},
                     "room")  # fmt: skip
        room = await answer(bob, {"type": "invite", "room": "secret", "user": "cy"}, "room")
        assert room["members"] == {"ada": "owner", "bob": "admin", "cy": "member"}
        error = await answer(bob, {"type": "remove", "room": "secret", "user": "ada"}, "room")
        assert error["code"] == "forbidden" and "owner" in error["message"]
        error = await answer(cy, {"type": "describe", "room": "secret", "topic": "x"}, "room")
        assert error["code"] == "forbidden"
        room = await answer(bob, {"type": "describe", "room": "secret", "topic": "Q3"}, "room")
        assert (room["title"], room["topic"]) == ("Plans", "Q3")
        rooms = await answer(cy, {"type": "rooms"}, "rooms")
        assert [(r["room"], r["role"]) for r in rooms["rooms"]] == [("secret", "member")]

        # Removed: bob's socket, on the other server, leaves the room at once.
        room = await answer(ada, {"type": "remove", "room": "secret", "user": "bob"}, "room")
        assert room["members"] == {"ada": "owner", "cy": "member"}
        while (frame := await bob.next_frame(skip=("ping", "presence", "member", "message"))
               )["type"] != "left":  # fmt: skip
            pass
        assert frame == {"type": "left", "room": "secret", "reason": "removed"}
        await bob.say("secret", "still here?")
        assert (await answer(bob, {"type": "ping"}, "error"))["code"] == "not_joined"
        assert (await answer(bob, {"type": "join", "room": "secret"}, "joined"))["code"] == (
            "not_found"
        )
        # Anyone may leave for good; the owner may not.
        room = await answer(cy, {"type": "remove", "room": "secret", "user": "cy"}, "room")
        assert "members" not in room and "role" not in room
        error = await answer(ada, {"type": "remove", "room": "secret", "user": "ada"}, "room")
        assert error["code"] == "forbidden"


async def test_a_removed_socket_gets_its_notice_once_and_nothing_posted_after(
    tmp_path: Path,
) -> None:
    """On the other server, the removed member's socket gets ``left`` and its removal notice,
    each once, and not the message the owner posts the moment the removal is answered: the
    notice on the room's channel takes it out before anything after it on that channel."""
    async with (
        two_servers("redis", tmp_path) as (one, two),
        connected(one.ws_url("ada")) as ada,
        connected(two.ws_url("bob")) as bob,
        connected(two.ws_url("cy")) as cy,
    ):
        for round_ in range(5):  # the race it closes is a matter of milliseconds: several goes
            room = f"fenced{round_}"
            await answer(ada, {"type": "create", "room": room, "private": True}, "room")
            for user in ("bob", "cy"):
                await answer(ada, {"type": "invite", "room": room, "user": user}, "room")
            for c in (ada, bob, cy):
                await c.send({"type": "join", "room": room})
                while (await c.next_frame(skip=("ping", "presence", "member", "invited")))[
                    "type"
                ] != "room":  # after `joined`, the room's record
                    pass
            await answer(ada, {"type": "remove", "room": room, "user": "bob"}, "room")
            await ada.say(room, "after the removal")
            while (await cy.next_frame()).get("text") != "after the removal":
                pass  # server two has delivered it
            got: list[dict[str, Any]] = []
            while not ({"member", "left"} <= {f["type"] for f in got}):
                got.append(await bob.next_frame(skip=("ping", "presence", "room")))
            await bob.send({"type": "ping"})  # what was queued for bob before its answer
            while (frame := await bob.next_frame(skip=("ping", "presence", "room")))["type"] != (
                "pong"
            ):
                got.append(frame)
            assert [f for f in got if f["type"] == "message"] == [], got
            notices = [f for f in got if f["type"] == "member" and f["user"] == "bob"]
            assert len(notices) == 1, got
            assert [f for f in got if f["type"] == "left"] == [
                {"type": "left", "room": room, "reason": "removed"}
            ], got


@pytest.mark.parametrize("kind", ["embedded", "redis"])
async def test_the_directory_lists_public_rooms_never_private_ones(
    kind: str, tmp_path: Path
) -> None:
    """``{"type":"rooms","public":true}``: the public rooms with a record, for anyone (not
    only members), found by name, title or topic (``q``, case-insensitive, ``%`` and ``_``
    taken literally); a private room is never listed, not even to its owner; a token whose
    ``rooms`` claim leaves a room out does not see it there either."""
    async with two_servers(kind, tmp_path) as (one, two):
        async with (
            ChatClient.connect(one.ws_url("ada")) as ada,
            ChatClient.connect(two.ws_url("eve")) as eve,
        ):
            for frame in (
                {"type": "create", "room": "gardening", "title": "Tomatoes and more"},
                {"type": "create", "room": "jobs", "topic": "Hiring 100% remote"},
                {"type": "create", "room": "plans", "private": True, "title": "Tomato secrets"},
            ):
                assert (await answer(ada, frame, "room"))["type"] == "room"
            found = await answer(eve, {"type": "rooms", "public": True}, "rooms")
            assert found["public"] is True
            assert [(r["room"], r["private"], "role" in r) for r in found["rooms"]] == [
                ("gardening", False, False),
                ("jobs", False, False),
            ]
            tomato = await answer(eve, {"type": "rooms", "public": True, "q": "TOMATO"}, "rooms")
            assert [r["room"] for r in tomato["rooms"]] == ["gardening"]
            percent = await answer(eve, {"type": "rooms", "public": True, "q": "0% r"}, "rooms")
            assert [r["room"] for r in percent["rooms"]] == ["jobs"]
            literal = await answer(eve, {"type": "rooms", "public": True, "q": "%"}, "rooms")
            assert [r["room"] for r in literal["rooms"]] == ["jobs"]  # not every room
            mine = await answer(ada, {"type": "rooms", "public": True, "q": "plans"}, "rooms")
            assert mine["rooms"] == []  # private: not in the directory, even for its owner
            long = await answer(eve, {"type": "rooms", "public": True, "q": "x" * 65}, "rooms")
            assert long["code"] == "bad_frame"


async def test_without_a_store_rooms_are_public_and_records_refused() -> None:
    async with run_server(make_settings()) as live, ChatClient.connect(live.ws_url("ada")) as ada:
        await ada.send({"type": "create", "room": "secret", "private": True})
        assert (await ada.expect("error"))["code"] == "no_store"
        await ada.send({"type": "create", "room": "bad name!"})
        assert (await ada.expect("error"))["code"] == "bad_frame"
        assert (await ada.join("secret"))["room"] == "secret"


async def test_while_the_store_is_down_public_rooms_work_and_private_ones_stay_closed() -> None:
    """PostgreSQL is killed under two running servers. A public room is joined as ever (chat
    goes on); a private room a server never read is refused (`store_unavailable`, not taken
    for public: Redis says it is private); one it had read is used as last read."""
    async with redis_and_postgres() as (redis, postgres, url):
        settings = make_settings(redis_url=redis.url, database_url=url, room_cache_s=0.2)
        async with (
            run_server(settings) as one,
            run_server(settings) as two,
            connected(one.ws_url("ada")) as ada,
            connected(two.ws_url("bob")) as bob,
        ):
            await answer(ada, {"type": "create", "room": "secret", "private": True}, "room")
            await ada.join("secret")
            await ada.expect("room")
            await postgres.kill()
            await asyncio.sleep(0.3)  # ada's server's record of it is stale now
            assert (await bob.join("lobby"))["room"] == "lobby"
            error = await answer(bob, {"type": "join", "room": "secret"}, "joined")
            assert error["code"] == "store_unavailable"
            await ada.send({"type": "leave", "room": "secret"})
            await ada.expect("left")
            joined = await answer(ada, {"type": "join", "room": "secret"}, "joined")
            assert joined["type"] == "joined"
