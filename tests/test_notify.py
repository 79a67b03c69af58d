"""Mentions and notifications (docs/protocol.md, "Mentions and notifications"), against a
real server, a real store and a real push service (tests/push_service.py: it checks the VAPID
JWT and decrypts the RFC 8291 payload as a browser would): who a message mentions, the
mentions list and its unread counts, levels and mutes, and each rule of when a notification
is pushed — the grace period, reading first, a visible connection, once per interval, levels,
mutes, the one access decision, expired subscriptions — and the ``notification.needed``
webhook."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import orjson
import pytest

from app.conversations.names import direct as direct_of
from app.notify.mentions import from_stored, named, stored_form
from app.notify.webpush import generate_keys
from tests.helpers import ChatClient, LiveServer, make_settings, run_server, wait_until
from tests.push_service import PushService, running_push_service
from tests.test_access import as_user, bearer, jwt_settings
from tests.test_durable import connected, redis_and_postgres, store_of, wait_stored
from tests.test_rooms import answer
from tests.webhook_receiver import running_receiver

pytestmark = pytest.mark.timeout(90)

PRIVATE_KEY, PUBLIC_KEY = generate_keys()


def notify_settings(tmp_path: Path, push: PushService | None = None, **overrides: Any) -> Any:
    """An embedded server with a store, quick notifications and (with ``push``) Web Push to
    the test push service only."""
    base: dict[str, Any] = {
        "database_url": f"sqlite:///{tmp_path}/chat.db",
        "notify_grace_s": 0.4,
        "notify_interval_s": 0.0,
        "notify_poll_s": 0.05,
        "archive_interval_s": 0.02,
    }
    if push is not None:
        base |= {"vapid_private_key": PRIVATE_KEY, "push_services": [push.base_url + "/"]}
    return make_settings(**(base | overrides))


@contextlib.asynccontextmanager
async def user(live: LiveServer, name: str) -> AsyncIterator[ChatClient]:
    async with connected(live.ws_url(name)) as client:
        yield client


async def take_part(client: ChatClient, room: str) -> int:
    """Join ``room`` and mark it read (which makes the user take part in it); its last id."""
    joined = await answer(client, {"type": "join", "room": room}, "joined")
    read = {"type": "read", "room": room, "id": max(joined["last"], 1)}
    assert (await answer(client, read, "receipt"))["type"] == "receipt"
    return int(joined["last"])


async def sent(client: ChatClient, frame: dict[str, Any]) -> dict[str, Any]:
    """Send ``frame`` (a ``send``) and return the message frame it made (or the error)."""
    await client.send({"type": "send", "cid": secrets.token_hex(4), **frame})
    while True:
        got = await client.next_frame(skip=("ping", "presence", "receipt", "inbox", "typing"))
        if got["type"] == "error":
            return got
        if got["type"] == "message" and got["text"] == frame["text"]:
            return got


async def subscribed(client: ChatClient, push: PushService) -> str:
    """Subscribe ``client``'s user to Web Push at the test service; the endpoint."""
    subscription = push.subscribe(PUBLIC_KEY)
    got = await answer(client, {"type": "push_subscribe", "subscription": subscription},
                       "push_subscribed")  # fmt: skip
    assert got == {"type": "push_subscribed", "endpoint": subscription["endpoint"]}, got
    return str(subscription["endpoint"])


def outcomes(live: LiveServer) -> dict[str, float]:
    counter = live.state.metrics.notifications
    return {
        outcome: counter.labels(outcome)._value.get()
        for outcome in (
            "sent",
            "read",
            "visible",
            "unwanted",
            "forbidden",
            "deleted",
            "hidden",
            "deferred",
        )
    }


async def decided(live: LiveServer, outcome: str, before: dict[str, float]) -> None:
    """Wait until one more notification was decided with ``outcome``."""
    await wait_until(lambda: outcomes(live)[outcome] > before[outcome], timeout=10)


def test_mentions_are_found_in_text_as_names_and_here() -> None:
    """``@name`` and ``@here``; not an e-mail address; trailing punctuation is not the
    name; each name once; the stored form keeps both."""
    names, here = named("hi @bob, @carol. ask a@b.c and @bob again @here!")
    assert names == ["bob", "carol"] and here
    assert named("nobody here") == ([], False)
    assert from_stored(stored_form(["bob"], True)) == (["bob"], True)
    assert stored_form([], False) is None


async def test_a_message_mentions_those_who_may_read_and_take_part(tmp_path: Path) -> None:
    """Only users who may read the conversation and take part in it are mentioned; never
    the sender; in a private room, not an outsider; at most the setting's number; the
    message frame, its history and a direct message carry them."""
    settings = notify_settings(tmp_path, mentions_per_message_max=2)
    async with run_server(settings) as live:
        async with user(live, "ada") as ada, user(live, "bob") as bob, user(live, "cy") as cy:
            await take_part(bob, "lobby")
            await take_part(cy, "lobby")
            await take_part(ada, "lobby")
            got = await sent(ada, {"room": "lobby", "text": "@bob @stranger @ada @cy"})
            assert got["mentions"] == ["bob", "cy"], got
            got = await sent(ada, {"room": "lobby", "text": "@cy @bob and @bob"})
            assert got["mentions"] == ["cy", "bob"], got
            plain = await sent(ada, {"room": "lobby", "text": "no one, write to x@bob.org"})
            assert "mentions" not in plain and "here" not in plain
            await answer(ada, {"type": "create", "room": "plans", "private": True}, "room")
            await answer(ada, {"type": "invite", "room": "plans", "user": "bob"}, "room")
            await answer(ada, {"type": "join", "room": "plans"}, "joined")
            got = await sent(ada, {"room": "plans", "text": "@bob @cy secret"})
            assert got["mentions"] == ["bob"], got  # cy may not read it
            direct = await sent(ada, {"to": "bob", "text": "@bob @cy hi"})
            assert direct["mentions"] == ["bob"], direct
            page = await answer(ada, {"type": "history", "room": "lobby", "limit": 5}, "history")
            assert [m.get("mentions") for m in page["messages"][-3:]] == [
                ["bob", "cy"], ["cy", "bob"], None,
            ]  # fmt: skip


async def test_here_is_for_owners_and_admins_of_a_busy_room(tmp_path: Path) -> None:
    """``@here`` marks the message; with more people present than the setting, a member's
    ``@here`` is refused (``forbidden``) and not sent, the owner's goes."""
    async with run_server(notify_settings(tmp_path, mention_here_open_max=1)) as live:
        async with user(live, "ada") as ada, user(live, "bob") as bob:
            await answer(ada, {"type": "create", "room": "big"}, "room")
            await answer(ada, {"type": "invite", "room": "big", "user": "bob"}, "room")
            await answer(ada, {"type": "join", "room": "big"}, "joined")
            await answer(bob, {"type": "join", "room": "big"}, "joined")
            refused = await sent(bob, {"room": "big", "text": "@here look"})
            assert refused["type"] == "error" and refused["code"] == "forbidden", refused
            got = await sent(ada, {"room": "big", "text": "@here look"})
            assert got["here"] is True and "mentions" not in got, got
            page = await answer(bob, {"type": "history", "room": "big", "limit": 5}, "history")
            assert [m["text"] for m in page["messages"]] == ["@here look"]
            assert page["messages"][0]["here"] is True


async def test_the_mentions_list_counts_unread_and_follows_reads_deletes_and_access(
    tmp_path: Path,
) -> None:
    """The ``mentions`` frame and ``GET /mentions`` list a user's mentions newest first
    with unread marks and an unread total, the inbox counts them apart; reading clears the
    unread mark, an edit shows its new text, a deleted message is gone, and a private room
    the user was removed from is no longer listed."""
    async with run_server(jwt_settings(tmp_path, notify_grace_s=60)) as live:
        async with as_user(live, "ada") as ada, as_user(live, "bob") as bob:
            await answer(ada, {"type": "create", "room": "plans", "private": True}, "room")
            await answer(ada, {"type": "invite", "room": "plans", "user": "bob"}, "room")
            for client in (ada, bob):
                await answer(client, {"type": "join", "room": "plans"}, "joined")
                await answer(client, {"type": "join", "room": "lobby"}, "joined")
            await answer(bob, {"type": "read", "room": "lobby", "id": 1}, "receipt")
            first = await sent(ada, {"room": "lobby", "text": "@bob first"})
            doomed = await sent(ada, {"room": "lobby", "text": "@bob doomed"})
            await sent(ada, {"room": "plans", "text": "@bob secret"})
            await ada.send({"type": "edit", "room": "lobby", "id": first["id"],
                            "text": "@bob first, edited"})  # fmt: skip
            await ada.send({"type": "delete", "room": "lobby", "id": doomed["id"]})
            await wait_stored(store_of(live), "lobby", 4, timeout=20)  # and the two events
            await wait_stored(store_of(live), "plans", 1, timeout=20)
            listed = await answer(bob, {"type": "mentions"}, "mentions")
            assert [(m.get("room"), m["text"], m["unread"]) for m in listed["mentions"]] == [
                ("plans", "@bob secret", True), ("lobby", "@bob first, edited", True),
            ], listed  # fmt: skip
            assert listed["unread"] == 2 and listed["more"] is False
            inbox = await answer(bob, {"type": "inbox"}, "inbox")
            counts = {c.get("room"): c["mentions"] for c in inbox["conversations"]}
            assert counts == {"lobby": 1, "plans": 1}, inbox
            await bob.send({"type": "read", "room": "lobby", "id": first["id"] + 5})
            page = await answer(bob, {"type": "mentions", "limit": 1}, "mentions")
            assert [m["unread"] for m in page["mentions"]] == [True] and page["more"] is True
            older = await answer(
                bob, {"type": "mentions", "before": page["mentions"][0]["ts"]}, "mentions"
            )
            assert [(m["text"], m["unread"]) for m in older["mentions"]] == [
                ("@bob first, edited", False)
            ]
            async with httpx.AsyncClient(base_url=live.http_url) as http:
                response = await http.get("/mentions", headers=bearer("bob"))
                assert response.status_code == 200, response.text
                assert response.json()["unread"] == 1
                assert (await http.get("/mentions")).status_code == 401
            await answer(ada, {"type": "remove", "room": "plans", "user": "bob"}, "room")
            after = await answer(bob, {"type": "mentions"}, "mentions")
            assert [m.get("room") for m in after["mentions"]] == ["lobby"], after
            assert after["unread"] == 0


async def test_levels_and_mutes_are_kept_per_conversation(tmp_path: Path) -> None:
    """Defaults (rooms: mentions, direct: all); a level and a mute set, read back and
    listed; 0 unmutes; setting without a conversation is a bad frame."""
    async with run_server(notify_settings(tmp_path)) as live, user(live, "ada") as ada:
        await answer(ada, {"type": "join", "room": "lobby"}, "joined")
        got = await answer(ada, {"type": "notifications", "room": "lobby"}, "notifications")
        assert got == {"type": "notifications", "room": "lobby", "level": "mentions",
                       "mute_until": None}  # fmt: skip
        got = await answer(ada, {"type": "notifications", "with": "bob"}, "notifications")
        assert got["level"] == "all"
        later = 4_000_000_000_000
        got = await answer(ada, {"type": "notifications", "room": "lobby", "level": "all",
                                 "mute_until": later}, "notifications")  # fmt: skip
        assert (got["level"], got["mute_until"]) == ("all", later)
        got = await answer(ada, {"type": "notifications", "room": "lobby", "mute_until": 0},
                           "notifications")  # fmt: skip
        assert (got["level"], got["mute_until"]) == ("all", None)
        listed = await answer(ada, {"type": "notifications"}, "notifications")
        assert listed["conversations"] == [{"room": "lobby", "level": "all", "mute_until": None}]
        bad = await answer(ada, {"type": "notifications", "level": "none"}, "notifications")
        assert bad["type"] == "error" and bad["code"] == "bad_frame", bad


async def test_a_direct_message_to_someone_away_is_pushed_encrypted_and_signed(
    tmp_path: Path,
) -> None:
    """Bob subscribed and went away: ada's DM reaches his push service after the grace
    period, VAPID-signed (the service checks the JWT) and encrypted (it decrypts it), with
    who, where and what; ``hello`` carries the application server key; an endpoint that is
    not an allowed push service is refused."""
    async with running_push_service() as push:
        async with run_server(notify_settings(tmp_path, push)) as live:
            async with user(live, "bob") as bob:
                assert bob.hello["push_key"] == PUBLIC_KEY
                endpoint = await subscribed(bob, push)
                elsewhere = {"endpoint": "https://evil.example/push/1",
                             "keys": push.subscribe()["keys"]}  # fmt: skip
                refused = await answer(
                    bob, {"type": "push_subscribe", "subscription": elsewhere}, "push_subscribed"
                )
                assert refused["type"] == "error" and refused["code"] == "forbidden", refused
            async with user(live, "ada") as ada:
                message = await sent(ada, {"to": "bob", "text": "are you there?"})
            [delivered] = await push.received(endpoint, timeout=10)
            assert orjson.loads(delivered.payload) == {
                "type": "notification", "with": "ada", "id": message["id"], "user": "ada",
                "ts": message["ts"], "reason": "direct", "count": 1, "text": "are you there?",
            }  # fmt: skip
            assert delivered.claims["sub"].startswith("mailto:")
            assert int(delivered.headers["ttl"]) > 0
            assert not push.refused


async def test_nothing_is_pushed_to_someone_who_reads_first_or_is_looking(tmp_path: Path) -> None:
    """A message read within the grace period is not pushed; nor one to a user with a
    visible connection (on another socket); once that connection is hidden, the next one is;
    the sender never gets one."""
    async with running_push_service() as push:
        settings = notify_settings(tmp_path, push, notify_grace_s=0.8)
        async with run_server(settings) as live:
            async with user(live, "bob") as bob, user(live, "ada") as ada:
                endpoint = await subscribed(bob, push)
                ada_endpoint = await subscribed(ada, push)
                before = outcomes(live)
                message = await sent(ada, {"to": "bob", "text": "quick one"})
                await bob.send({"type": "read", "with": "ada", "id": message["id"]})
                await decided(live, "read", before)
                async with user(live, "bob") as watching:
                    await watching.send({"type": "visibility", "visible": True})
                    before = outcomes(live)
                    await sent(ada, {"to": "bob", "text": "seen live"})
                    await decided(live, "visible", before)
                    await watching.send({"type": "visibility", "visible": False})
                    before = outcomes(live)
                    await sent(ada, {"to": "bob", "text": "now away"})
                    await decided(live, "sent", before)
                pushed = [orjson.loads(p.payload)["text"] for p in push.to(endpoint)]
                assert pushed == ["now away"], pushed
                assert push.to(ada_endpoint) == []


async def test_one_push_per_conversation_per_interval(tmp_path: Path) -> None:
    """Three DMs in a row: the first is pushed; the others wait for the interval's end and
    go as one (``count`` 2), the newest."""
    async with running_push_service() as push:
        settings = notify_settings(tmp_path, push, notify_grace_s=0.1, notify_interval_s=1.5)
        async with run_server(settings) as live:
            async with user(live, "bob") as bob:
                endpoint = await subscribed(bob, push)
            async with user(live, "ada") as ada:
                await sent(ada, {"to": "bob", "text": "one"})
                await push.received(endpoint, 1)
                await sent(ada, {"to": "bob", "text": "two"})
                last = await sent(ada, {"to": "bob", "text": "three"})
            pushes = await push.received(endpoint, 2, timeout=10)
            second = orjson.loads(pushes[1].payload)
            assert (second["text"], second["id"], second["count"]) == ("three", last["id"], 2)
            assert len(push.to(endpoint)) == 2


async def test_levels_mutes_and_rooms_decide_what_is_pushed(tmp_path: Path) -> None:
    """In a room: a plain message is not pushed (default level: mentions), a mention is;
    with level ``all`` a plain one is; muted, nothing is; with level ``none`` not even a
    mention."""
    async with running_push_service() as push:
        async with run_server(notify_settings(tmp_path, push)) as live:
            async with user(live, "bob") as bob:
                endpoint = await subscribed(bob, push)
                await take_part(bob, "lobby")
            async with user(live, "ada") as ada, user(live, "bob") as bob:
                await take_part(ada, "lobby")

                async def level(**fields: Any) -> None:
                    await answer(bob, {"type": "notifications", "room": "lobby", **fields},
                                 "notifications")  # fmt: skip

                before = outcomes(live)
                await sent(ada, {"room": "lobby", "text": "plain"})
                await sent(ada, {"room": "lobby", "text": "@bob mentioned"})
                await decided(live, "sent", before)
                await level(level="all")
                before = outcomes(live)
                await sent(ada, {"room": "lobby", "text": "plain, all"})
                await decided(live, "sent", before)
                await level(mute_until=4_000_000_000_000)
                before = outcomes(live)
                await sent(ada, {"room": "lobby", "text": "@bob muted"})
                await decided(live, "unwanted", before)
                await level(mute_until=0, level="none")
                before = outcomes(live)
                await sent(ada, {"room": "lobby", "text": "@bob none"})
                await decided(live, "unwanted", before)
            texts = [orjson.loads(p.payload)["text"] for p in push.to(endpoint)]
            assert texts == ["@bob mentioned", "plain, all"], texts


async def test_no_text_reaches_someone_removed_before_the_push(tmp_path: Path) -> None:
    """Bob is mentioned in a private room and removed from it within the grace period: no
    push (the one access decision, asked when it is due); a deleted message is not pushed."""
    async with running_push_service() as push:
        settings = notify_settings(tmp_path, push, notify_grace_s=1.0)
        async with run_server(settings) as live:
            async with user(live, "bob") as bob:
                endpoint = await subscribed(bob, push)
            async with user(live, "ada") as ada:
                await answer(ada, {"type": "create", "room": "plans", "private": True}, "room")
                await answer(ada, {"type": "invite", "room": "plans", "user": "bob"}, "room")
                await answer(ada, {"type": "join", "room": "plans"}, "joined")
                before = outcomes(live)
                await sent(ada, {"room": "plans", "text": "@bob the secret"})
                await answer(ada, {"type": "remove", "room": "plans", "user": "bob"}, "room")
                await decided(live, "forbidden", before)
                before = outcomes(live)
                doomed = await sent(ada, {"to": "bob", "text": "oops"})
                await ada.send({"type": "delete", "with": "bob", "id": doomed["id"]})
                await decided(live, "deleted", before)
            assert push.to(endpoint) == []


async def test_an_expired_subscription_is_removed(tmp_path: Path) -> None:
    """The push service answers 410: the subscription is removed; a second one of the same
    user still gets pushes."""
    async with running_push_service() as push:
        async with run_server(notify_settings(tmp_path, push)) as live:
            async with user(live, "bob") as bob:
                gone = await subscribed(bob, push)
                kept = await subscribed(bob, push)
            push.expire(gone)
            async with user(live, "ada") as ada:
                await sent(ada, {"to": "bob", "text": "hello"})
            await push.received(kept)
            notifications = live.state.notifications
            assert notifications is not None
            async with asyncio.timeout(10):
                while len(await notifications.store.subscriptions_of("bob")) > 1:
                    await asyncio.sleep(0.05)
            remaining = await notifications.store.subscriptions_of("bob")
            assert [s.endpoint for s in remaining] == [kept]


async def test_notification_needed_goes_to_the_webhook(tmp_path: Path) -> None:
    """With webhooks (Redis, PostgreSQL): a mention of someone away is queued as
    ``notification.needed``, signed, with the recipient and the message."""
    secret = "s" * 32
    async with running_receiver(secret) as receiver, redis_and_postgres() as (redis, _, url):
        settings = make_settings(
            redis_url=redis.url, database_url=url, webhook_url=receiver.url,
            webhook_secret=secret, webhook_events=["notification.needed"], notify_grace_s=0.2,
            notify_interval_s=0.0, notify_poll_s=0.05,
        )  # fmt: skip
        async with run_server(settings) as live:
            async with user(live, "bob") as bob:
                await take_part(bob, "lobby")
            async with user(live, "ada") as ada:
                await take_part(ada, "lobby")
                message = await sent(ada, {"room": "lobby", "text": "@bob look"})
            await wait_until(lambda: bool(receiver.of_type("notification.needed")), timeout=20)
            [event] = receiver.of_type("notification.needed")
            assert event["data"] == {
                "recipient": "bob", "type": "notification", "room": "lobby",
                "id": message["id"], "user": "ada", "ts": message["ts"], "reason": "mention",
                "count": 1, "text": "@bob look",
            }, event  # fmt: skip


async def test_a_pending_notification_survives_a_restart(tmp_path: Path) -> None:
    """The server stops while a notification waits out its grace period: started again on
    the same store, it sends it."""
    async with running_push_service() as push:
        settings = notify_settings(tmp_path, push, notify_grace_s=1.5)
        async with run_server(settings) as live:
            async with user(live, "bob") as bob:
                endpoint = await subscribed(bob, push)
            async with user(live, "ada") as ada:
                await sent(ada, {"to": "bob", "text": "before the restart"})
            await wait_stored(store_of(live), direct_of("ada", "bob"), 1, timeout=10)
        assert push.to(endpoint) == []  # stopped before it was due
        async with run_server(settings):
            [delivered] = await push.received(endpoint, timeout=10)
        assert orjson.loads(delivered.payload)["text"] == "before the restart"
