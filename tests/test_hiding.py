"""Block and mute (docs/protocol.md, "Block and mute"; app.access.hiding), against real
servers and a real store: a muted user's messages are hidden from the muter on every path —
live delivery in rooms and direct messages, typing, replays, history (frame and HTTP),
search, the inbox's counts and newest message, mentions, notifications — and shown again
when unmuted; a blocked user cannot write to the blocker directly nor invite them; the
lists over frames and HTTP, with their limits; and a change made through one server holds
on another at once."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from tests.helpers import ChatClient, make_settings, run_server
from tests.test_access import as_user, bearer, jwt_settings
from tests.test_durable import redis_and_postgres, send_acked, wait_indexed
from tests.test_notify import decided, outcomes, sent, take_part
from tests.test_rooms import answer

pytestmark = pytest.mark.timeout(120)

SERVICE = "a-service-token-of-at-least-32-characters"


def settings_of(tmp_path: Path, **overrides: Any) -> Any:
    """jwt, a SQLite store, quick archiving and notifications (to the metrics only)."""
    return jwt_settings(
        tmp_path, notify_grace_s=0.3, notify_interval_s=0.0, notify_poll_s=0.05,
        archive_interval_s=0.02, **overrides,
    )  # fmt: skip


async def hide(client: ChatClient, change: str, user: str) -> dict[str, Any]:
    return await answer(client, {"type": change, "user": user}, "hidden")


async def history(client: ChatClient, **where: Any) -> list[str]:
    page = await answer(client, {"type": "history", **where}, "history")
    return [m["text"] for m in page["messages"]]


async def next_live(client: ChatClient) -> dict[str, Any]:
    """The next frame but pings, presence and read receipts (typing included: it is
    checked)."""
    return await client.next_frame(skip=("ping", "presence", "receipt", "receipts"))


async def test_a_muted_user_is_hidden_on_every_path_and_shown_again_when_unmuted(
    tmp_path: Path,
) -> None:
    async with (
        run_server(settings_of(tmp_path)) as live,
        httpx.AsyncClient(base_url=live.http_url) as http,
        as_user(live, "ada") as ada,
        as_user(live, "ada") as ada_tab,
        as_user(live, "bob") as bob,
        as_user(live, "carol") as carol,
    ):
        for client in (ada, ada_tab, bob, carol):
            await take_part(client, "lobby")
        # Muting answers the lists, on every connection of the muter.
        lists = await hide(ada, "mute", "bob")
        assert lists == {"type": "hidden", "muted": ["bob"], "blocked": []}
        assert await next_live(ada_tab) == lists
        assert await answer(ada_tab, {"type": "hidden"}, "hidden") == lists
        async with as_user(live, "ada") as ada_late:  # a connection made since: hides him too
            for client in (ada_late, bob, carol):
                await answer(client, {"type": "join", "room": "side"}, "joined")
            await bob.send({"type": "typing", "room": "side"})
            await sent(bob, {"room": "side", "text": "early bob"})
            await sent(carol, {"room": "side", "text": "early carol"})
            assert (await next_live(ada_late))["text"] == "early carol"
        for client in (bob, carol):  # what is left of the above: acks, typing
            await answer(client, {"type": "ping"}, "pong")

        # Live: bob's message, typing and DM do not reach ada; carol's do; bob's reach carol.
        await bob.send({"type": "typing", "room": "lobby"})
        first = await sent(bob, {"room": "lobby", "text": "hello from bob @ada"})
        await sent(bob, {"to": "ada", "text": "hello ada, from bob"})
        assert (await next_live(carol))["type"] == "typing"
        assert (await next_live(carol))["text"] == "hello from bob @ada"
        await sent(carol, {"room": "lobby", "text": "hello from carol"})
        for client in (ada, ada_tab):
            got = await next_live(client)
            assert (got["type"], got.get("text")) == ("message", "hello from carol"), got
        await wait_indexed(live, "lobby", 2, timeout=20)

        # History (frame and HTTP), search, the inbox and mentions: without bob's.
        assert await history(ada, room="lobby") == ["hello from carol"]
        assert await history(ada, peer="bob") == []
        assert await history(carol, room="lobby") == ["hello from bob @ada", "hello from carol"]
        page = await http.get("/rooms/lobby/messages", headers=bearer("ada"))
        assert [m["text"] for m in page.json()["messages"]] == ["hello from carol"]
        page = await http.get("/dms/bob/messages", headers=bearer("ada"))
        assert page.json()["messages"] == []
        found = await answer(ada, {"type": "search", "q": "hello"}, "search")
        assert [r["text"] for r in found["results"]] == ["hello from carol"]
        found = (await http.get("/search", params={"q": "hello"}, headers=bearer("ada"))).json()
        assert [r["text"] for r in found["results"]] == ["hello from carol"]
        found = await answer(carol, {"type": "search", "q": "hello"}, "search")
        assert len(found["results"]) == 2
        inbox = (await answer(ada, {"type": "inbox"}, "inbox"))["conversations"]
        lobby = next(c for c in inbox if c.get("room") == "lobby")
        assert (lobby["unread"], lobby["mentions"], lobby["last"]["text"]) == (
            1, 0, "hello from carol",
        )  # fmt: skip
        assert all(c.get("with") != "bob" or c["unread"] == 0 for c in inbox), inbox
        inbox = (await http.get("/inbox", headers=bearer("ada"))).json()["conversations"]
        assert next(c for c in inbox if c.get("room") == "lobby")["unread"] == 1
        mentions = await answer(ada, {"type": "mentions"}, "mentions")
        assert (mentions["mentions"], mentions["unread"]) == ([], 0)

        # A replay (a join with since) leaves bob's out too.
        joined = await answer(
            ada, {"type": "join", "room": "lobby", "since": first["id"] - 1}, "joined"
        )
        assert joined["recovered"] is True
        assert (await next_live(ada))["text"] == "hello from carol"

        # Unmuted: nothing was lost, everything shows again.
        lists = await hide(ada, "unmute", "bob")
        assert lists == {"type": "hidden", "muted": [], "blocked": []}
        assert await history(ada, room="lobby") == ["hello from bob @ada", "hello from carol"]
        assert await history(ada, peer="bob") == ["hello ada, from bob"]
        mentions = await answer(ada, {"type": "mentions"}, "mentions")
        assert [m["text"] for m in mentions["mentions"]] == ["hello from bob @ada"]
        await sent(bob, {"room": "lobby", "text": "shown again"})
        assert (await next_live(ada))["text"] == "shown again"


async def test_a_muted_user_never_notifies(tmp_path: Path) -> None:
    """A DM from a muted user is decided ``hidden``, never sent; once unmuted, the next is."""
    async with run_server(settings_of(tmp_path)) as live:
        async with as_user(live, "ada") as ada:
            await hide(ada, "mute", "bob")
        async with as_user(live, "bob") as bob:
            before = outcomes(live)
            await sent(bob, {"to": "ada", "text": "psst"})
            await decided(live, "hidden", before)
            async with as_user(live, "ada") as ada:
                await hide(ada, "unmute", "bob")
            before = outcomes(live)
            await sent(bob, {"to": "ada", "text": "psst again"})
            await decided(live, "sent", before)


async def test_a_blocked_user_cannot_write_to_the_blocker_nor_invite_them(tmp_path: Path) -> None:
    """Blocked: bob's DMs to ada and his invites of her are refused with words that do not
    say why; carol's are not; ada's DMs to bob still go. A mute of a blocked user leaves the
    block; an unmute does not lift it; unblock does."""
    async with (
        run_server(settings_of(tmp_path)) as live,
        as_user(live, "ada") as ada,
        as_user(live, "bob") as bob,
        as_user(live, "carol") as carol,
    ):
        assert (await hide(ada, "block", "bob"))["blocked"] == ["bob"]
        refused = await sent(bob, {"to": "ada", "text": "let me in"})
        assert (refused["code"], refused["message"], refused["ref"]) == (
            "forbidden", "you cannot send direct messages to this user", "send",
        )  # fmt: skip
        assert (await sent(carol, {"to": "ada", "text": "hi ada"}))["type"] == "message"
        assert (await ada.expect("message"))["text"] == "hi ada"
        away = await sent(ada, {"to": "bob", "text": "go away"})
        assert (await bob.expect("message"))["text"] == "go away"
        react = {"type": "react", "with": "ada", "id": away["id"], "emoji": "👎"}
        assert (await answer(bob, react, "reaction"))["code"] == "forbidden"  # nor any write
        await answer(bob, {"type": "create", "room": "bobs", "private": True}, "room")
        invite = {"type": "invite", "room": "bobs", "user": "ada"}
        refused = await answer(bob, invite, "room")
        assert (refused["code"], refused["message"]) == ("forbidden", "you cannot invite this user")
        assert (await answer(bob, {**invite, "user": "carol"}, "room"))["type"] == "room"

        assert await hide(ada, "mute", "bob") == {
            "type": "hidden", "muted": [], "blocked": ["bob"],
        }  # fmt: skip
        assert (await hide(ada, "unmute", "bob"))["blocked"] == ["bob"]
        assert await hide(ada, "unblock", "bob") == {
            "type": "hidden", "muted": [], "blocked": [],
        }  # fmt: skip
        assert (await sent(bob, {"to": "ada", "text": "sorry"}))["type"] == "message"
        assert (await answer(bob, invite, "room"))["type"] == "room"


async def test_the_lists_over_http_and_their_limits(tmp_path: Path) -> None:
    """``GET /me/hidden``, ``PUT``/``DELETE /me/muted/{user}`` and ``/me/blocked/{user}``:
    the lists as the frames show them (a change reaches the user's sockets); yourself is a
    422 (``bad_frame``), past ``CHAT_HIDDEN_USERS_MAX`` a 409 (``too_many_hidden``), no token
    a 401; without a store the frames answer ``no_store``."""
    async with (
        run_server(settings_of(tmp_path, hidden_users_max=2, service_token=SERVICE)) as live,
        httpx.AsyncClient(base_url=live.http_url) as http,
        as_user(live, "ada") as ada,
    ):
        me = bearer("ada")
        assert (await http.get("/me/hidden", headers=me)).json() == {"muted": [], "blocked": []}
        put = await http.put("/me/muted/bob", headers=me)
        assert (put.status_code, put.json()) == (200, {"muted": ["bob"], "blocked": []})
        assert (await ada.expect("hidden"))["muted"] == ["bob"]
        assert (await http.put("/me/blocked/carol", headers=me)).json()["blocked"] == ["carol"]
        assert (await ada.expect("hidden"))["blocked"] == ["carol"]
        service = {"Authorization": f"Bearer {SERVICE}"}  # the backend API reads them
        assert (await http.get("/api/v1/users/ada/hidden", headers=service)).json() == {
            "user": "ada", "muted": ["bob"], "blocked": ["carol"],
        }  # fmt: skip
        assert (await http.get("/api/v1/users/ada/hidden", headers=me)).status_code == 401
        assert (await http.put("/me/muted/bob", headers=me)).status_code == 200  # again: same
        assert await ada.expect("hidden") == {"type": "hidden", "muted": ["bob"],
                                               "blocked": ["carol"]}  # fmt: skip
        over = await http.put("/me/muted/dan", headers=me)
        assert over.status_code == 409 and "2" in over.json()["detail"]
        assert (await hide(ada, "mute", "dan"))["code"] == "too_many_hidden"
        assert (await http.put("/me/blocked/ada", headers=me)).status_code == 422
        assert (await hide(ada, "block", "ada"))["code"] == "bad_frame"
        assert (await http.delete("/me/blocked/carol", headers=me)).json()["blocked"] == []
        assert (await http.delete("/me/muted/bob", headers=me)).json() == {
            "muted": [], "blocked": [],
        }  # fmt: skip
        assert (await ada.expect("hidden"))["blocked"] == []
        assert await ada.expect("hidden") == {"type": "hidden", "muted": [], "blocked": []}
        assert (await http.get("/me/hidden")).status_code == 401
        assert (await http.put("/me/muted/not a name", headers=me)).status_code in (404, 422)
        assert await ada.is_responsive()
    async with run_server(make_settings()) as bare, ChatClient.connect(bare.ws_url("ada")) as ada:
        assert (await hide(ada, "mute", "bob"))["code"] == "no_store"
        assert await answer(ada, {"type": "hidden"}, "hidden") == {
            "type": "hidden", "muted": [], "blocked": [],
        }  # fmt: skip


async def test_a_change_through_one_server_holds_on_another_at_once(tmp_path: Path) -> None:
    """Two servers on one Redis and one PostgreSQL: ada mutes bob through the first (HTTP);
    her socket on the second is told and filters bob's next message; bob's DM through the
    first after ada blocks him on the second is refused."""
    async with redis_and_postgres() as (redis, _, url):
        settings = make_settings(
            redis_url=redis.url, database_url=url, auth_mode="jwt",
            jwt_secret=jwt_settings(tmp_path).jwt_secret,
        )  # fmt: skip
        async with (
            run_server(settings) as one,
            run_server(settings) as two,
            httpx.AsyncClient(base_url=one.http_url) as http,
            as_user(two, "ada") as ada,
            as_user(one, "bob") as bob,
            as_user(one, "carol") as carol,
        ):
            for client in (ada, bob, carol):
                await answer(client, {"type": "join", "room": "lobby"}, "joined")
            assert (await http.put("/me/muted/bob", headers=bearer("ada"))).status_code == 200
            assert (await ada.expect("hidden"))["muted"] == ["bob"]
            await send_acked(bob, 1, room="lobby")
            await send_acked(carol, 1, start=1, room="lobby")
            assert (await ada.expect("message"))["text"] == "1"  # carol's, not bob's "0"
            await hide(ada, "block", "bob")
            async with asyncio.timeout(5):  # the notice crosses Redis meanwhile
                while (await sent(bob, {"to": "ada", "text": "hi"})).get("code") != "forbidden":
                    await asyncio.sleep(0.05)
