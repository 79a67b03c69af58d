"""The one access decision (app/access/conversations.py) where features meet, on real
servers: the inbox, a restart of the embedded setup, a ban over HTTP, a removal made on
another server (issue 33: each of these leaked on the code before it)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import jwt
import orjson
import pytest

from tests.helpers import ChatClient, LiveServer, make_settings, run_server
from tests.test_durable import connected, send_acked, store_of, wait_stored
from tests.test_rooms import answer

pytestmark = pytest.mark.timeout(120)
SECRET = "a-test-secret-that-is-long-enough-for-hs256"
ADMIN = "an-admin-token-that-is-long-enough-0123456789"
MARKER = "MARKER-7f3a9c"


def token(user: str, **claims: Any) -> str:
    return jwt.encode({"sub": user, "exp": int(time.time()) + 120, **claims}, SECRET, "HS256")


def bearer(user: str, **claims: Any) -> dict[str, str]:
    return {"Authorization": f"Bearer {token(user, **claims)}"}


def jwt_settings(tmp_path: Path, **overrides: Any) -> Any:
    return make_settings(
        auth_mode="jwt", jwt_secret=SECRET, admin_token=ADMIN,
        database_url=f"sqlite:///{tmp_path}/data/chat.db", **overrides,
    )  # fmt: skip


@contextlib.asynccontextmanager
async def as_user(live: LiveServer, user: str, **claims: Any) -> AsyncIterator[ChatClient]:
    async with connected(f"{live.ws_url()}?token={token(user, **claims)}") as client:
        yield client


async def inbox_frame(client: ChatClient) -> dict[str, Any]:
    return await answer(client, {"type": "inbox"}, "inbox")


async def test_the_inbox_lists_only_what_the_user_may_read_now(tmp_path: Path) -> None:
    """Three side doors into a private room through the inbox, closed: an outsider who marked
    the name read before it was created, a removed member, and a member whose token's rooms
    claim no longer allows the room see neither its entry nor its newest message (frame and
    GET /inbox); its members do. The directory of public rooms lists none that is private."""
    async with (
        run_server(jwt_settings(tmp_path)) as live,
        httpx.AsyncClient(base_url=live.http_url) as http,
    ):
        async with as_user(live, "mallory") as mallory:  # before the room exists
            await mallory.send({"type": "read", "room": "plans", "id": 1})
            await answer(mallory, {"type": "ping"}, "pong")
        async with as_user(live, "ada") as ada:
            await answer(ada, {"type": "create", "room": "plans", "private": True}, "room")
            for user in ("bob", "carol"):
                await answer(ada, {"type": "invite", "room": "plans", "user": user}, "room")
            await ada.join("plans")
            await ada.expect("room")
            ids = await send_acked(ada, 1, room="plans")
            for user in ("bob", "carol"):
                async with as_user(live, user) as member:
                    await member.send({"type": "read", "room": "plans", "id": ids[0]})
                    await answer(member, {"type": "ping"}, "pong")
            await answer(ada, {"type": "remove", "room": "plans", "user": "bob"}, "room")
            await ada.send({"type": "send", "room": "plans", "text": MARKER, "cid": "m"})
            await answer(ada, {"type": "ping"}, "ack")
        await wait_stored(store_of(live), "plans", 2, timeout=20)

        async def inbox_of(user: str, **claims: Any) -> list[bytes]:
            async with as_user(live, user, **claims) as client:
                frame = await inbox_frame(client)
            page = await http.get("/inbox", headers=bearer(user, **claims))
            assert page.status_code == 200
            return [orjson.dumps(frame), page.content]

        for seen in await inbox_of("ada"):
            assert MARKER.encode() in seen
        for user, claims in (("mallory", {}), ("bob", {}), ("carol", {"rooms": ["lobby"]})):
            for seen in await inbox_of(user, **claims):
                assert b"plans" not in seen and MARKER.encode() not in seen, (user, seen)
        for seen in await inbox_of("carol"):  # the same member with a token that allows it
            assert MARKER.encode() in seen
        async with as_user(live, "carol", rooms=["lobby"]) as carol:  # nor in her rooms list
            assert (await answer(carol, {"type": "rooms"}, "rooms"))["rooms"] == []
        async with as_user(live, "carol") as carol:
            listed = (await answer(carol, {"type": "rooms"}, "rooms"))["rooms"]
            assert [r["room"] for r in listed] == ["plans"]
        # The directory of public rooms: never a private one; a public one only to tokens
        # whose rooms claim allows it.
        async with as_user(live, "ada") as ada:
            await answer(ada, {"type": "create", "room": "town", "title": "plans too"}, "room")
        for user, claims, expected in (
            ("mallory", {}, ["town"]),
            ("carol", {}, ["town"]),
            ("carol", {"rooms": ["lobby"]}, []),
        ):
            async with as_user(live, user, **claims) as client:
                found = await answer(
                    client, {"type": "rooms", "public": True, "q": "plans"}, "rooms"
                )
                assert [r["room"] for r in found["rooms"]] == expected, (user, claims)


async def test_a_room_with_stored_history_cannot_be_taken_over_after_a_restart(
    tmp_path: Path,
) -> None:
    """The embedded setup forgets its rooms on a restart (memory broker); the store does not:
    a name with stored history is in use, and nobody may create it private."""
    settings = make_settings(database_url=f"sqlite:///{tmp_path}/data/chat.db")
    async with run_server(settings) as live:
        async with connected(live.ws_url("regular")) as regular:
            await regular.join("lobby")
            await send_acked(regular, 3, room="lobby")
        await wait_stored(store_of(live), "lobby", 3, timeout=20)
    async with run_server(settings) as live, connected(live.ws_url("mallory")) as mallory:
        create = {"type": "create", "room": "lobby", "private": True}
        error = await answer(mallory, create, "room")
        assert error["code"] == "exists"
        async with connected(live.ws_url("regular")) as regular:
            page = await answer(regular, {"type": "history", "room": "lobby"}, "history")
            assert [m["text"] for m in page["messages"]] == ["0", "1", "2"]


async def test_a_banned_user_reads_nothing_over_http(tmp_path: Path) -> None:
    async with (
        run_server(jwt_settings(tmp_path)) as live,
        httpx.AsyncClient(base_url=live.http_url) as http,
    ):
        async with as_user(live, "bob") as bob:
            await bob.join("lobby")
            await send_acked(bob, 1, room="lobby")
            await send_acked(bob, 1, to="ada")
        routes = ("/rooms/lobby/messages", "/inbox", "/dms/ada/messages")
        for route in routes:
            assert (await http.get(route, headers=bearer("bob"))).status_code == 200, route
        banned = await http.put(
            "/admin/users/bob/ban", json={"duration_s": 60},
            headers={"Authorization": f"Bearer {ADMIN}"},
        )  # fmt: skip
        assert banned.status_code == 200
        for route in routes:
            page = await http.get(route, headers=bearer("bob"))
            assert page.status_code == 403 and b"banned" in page.content, route


async def test_a_removal_holds_on_another_server_before_it_hears_of_it(tmp_path: Path) -> None:
    """Two servers on one store whose workers never hear of each other's changes (each its
    own embedded broker: the worst case of a notice that has not arrived yet). bob, removed
    through the first, is refused the private history by the second at once, though the
    second had just read the room's record with bob in it."""
    settings = jwt_settings(tmp_path, room_cache_s=600)
    async with (
        run_server(settings) as one,
        run_server(settings) as two,
        httpx.AsyncClient(base_url=two.http_url) as http,
        as_user(one, "ada") as ada,
    ):
        await answer(ada, {"type": "create", "room": "plans", "private": True}, "room")
        await answer(ada, {"type": "invite", "room": "plans", "user": "bob"}, "room")
        page = await http.get("/rooms/plans/messages", headers=bearer("bob"))
        assert page.status_code == 200  # the second server has read the record: bob is in
        await answer(ada, {"type": "remove", "room": "plans", "user": "bob"}, "room")
        page = await http.get("/rooms/plans/messages", headers=bearer("bob"))
        assert page.status_code == 404
        assert page.json()["detail"] == "room 'plans' not found"


async def test_invites_have_a_quota_and_rooms_a_member_cap(tmp_path: Path) -> None:
    """A stranger cannot put one user into many rooms at once, nor fill a room with made-up
    members: invites past the burst are rate_limited, members past the cap too_many_members."""
    settings = make_settings(
        database_url=f"sqlite:///{tmp_path}/data/chat.db", user_invite_burst=3,
        user_invites_per_s=0.01, room_members_max=3, user_new_room_burst=10,
    )  # fmt: skip
    async with run_server(settings) as live, connected(live.ws_url("ada")) as ada:
        for n in range(4):
            await answer(ada, {"type": "create", "room": f"r{n}", "private": True}, "room")
        for n in range(3):
            room = await answer(ada, {"type": "invite", "room": f"r{n}", "user": "bob"}, "room")
            assert "bob" in room["members"]
        error = await answer(ada, {"type": "invite", "room": "r3", "user": "bob"}, "room")
        assert error["code"] == "rate_limited"
    async with run_server(settings) as live, connected(live.ws_url("cy")) as cy:
        await answer(cy, {"type": "create", "room": "full", "private": True}, "room")
        for user in ("u1", "u2"):
            await answer(cy, {"type": "invite", "room": "full", "user": user}, "room")
        error = await answer(cy, {"type": "invite", "room": "full", "user": "u3"}, "room")
        assert error["code"] == "too_many_members"
