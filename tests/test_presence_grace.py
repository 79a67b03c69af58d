"""A user whose connection ends without leaving lingers (``CHAT_PRESENCE_LEAVE_GRACE_S``):
back within the grace, on any worker, nobody is told anything; not back, the departure is
announced when the grace ends; an explicit ``leave`` is announced at once; a worker that stops
in the grace leaves its lingering users to the other workers' sweeps. On the embedded broker
and through a real Redis, with presence announced at once (no coalescing window), so that a
room's frames reach its members in the order they were made."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx2 as httpx
import pytest
from redis.asyncio import Redis

from app.broker.keys import KeyLayout
from app.errors import CloseCode
from tests.helpers import ChatClient, Frame, LiveServer, make_settings, run_server, wait_until
from tests.processes import RedisServer

pytestmark = pytest.mark.timeout(60)

GRACE_S = 2.5  # long enough that the steps a test takes within one grace fit
BROKERS = ("memory", "redis")


def grace_settings(redis: RedisServer | None, **overrides: Any) -> Any:
    redis_url = {} if redis is None else {"redis_url": redis.url}
    return make_settings(
        presence_leave_grace_s=GRACE_S, presence_coalesce_s=0, **redis_url, **overrides
    )


@contextlib.asynccontextmanager
async def one_server(broker: str) -> AsyncIterator[LiveServer]:
    redis = RedisServer() if broker == "redis" else None
    if redis is not None:
        await redis.start()
    try:
        async with run_server(grace_settings(redis)) as server:
            await wait_until(lambda: server.state.broker.ready)
            yield server
    finally:
        if redis is not None:
            await redis.stop()


async def frames_until_message(client: ChatClient, text: str) -> list[Frame]:
    """Every frame but pings, up to the message ``text``."""
    got: list[Frame] = []
    async with asyncio.timeout(10):
        while not (got and got[-1]["type"] == "message" and got[-1]["text"] == text):
            got.append(await client.next_frame(skip=("ping",)))
    return got


async def comes_and_goes(url: str, ada: ChatClient) -> None:
    """A client joins room p at ``url``, ``ada`` (in p) hears of it, and its socket ends."""
    async with ChatClient.connect(url) as client:
        await client.join("p")
        assert (await ada.presence_of(client.hello["user"]))["event"] == "join"


def about(frames: list[Frame], user: str) -> list[Frame]:
    return [f for f in frames if f["type"] == "presence" and f.get("user") == user]


@pytest.mark.parametrize("broker", BROKERS)
async def test_back_within_the_grace_nothing_is_announced(broker: str) -> None:
    async with (
        one_server(broker) as server,
        ChatClient.connect(server.ws_url("ada")) as ada,
    ):
        await ada.join("p")
        await comes_and_goes(server.ws_url("bob"), ada)
        await wait_until(lambda: server.state.presence.lingering == 1)
        async with ChatClient.connect(server.ws_url("bob")) as bob:
            joined = await bob.join("p")
            assert joined["users"] == ["ada", "bob"] and joined["count"] == 2
            await wait_until(lambda: server.state.presence.lingering == 0, GRACE_S + 5)
            await bob.say("p", "back")
            assert about(await frames_until_message(ada, "back"), "bob") == []


@pytest.mark.parametrize("broker", BROKERS)
async def test_not_back_the_departure_is_announced_when_the_grace_ends(broker: str) -> None:
    """bob's socket ends: he is still present in the grace (a newcomer sees him), and his
    departure is announced once it ends; cy, who leaves with a ``leave``, is announced at
    once, ahead of bob."""
    async with (
        one_server(broker) as server,
        ChatClient.connect(server.ws_url("ada")) as ada,
    ):
        await ada.join("p")
        await comes_and_goes(server.ws_url("bob"), ada)
        gone_at = time.monotonic()
        async with ChatClient.connect(server.ws_url("cy")) as cy:
            assert (await cy.join("p"))["users"] == ["ada", "bob", "cy"]
            await cy.send({"type": "leave", "room": "p"})
            await cy.expect("left")
        presence = [await ada.expect("presence", GRACE_S + 5) for _ in range(3)]
        assert [(f["event"], f["user"], f["count"]) for f in presence] == [
            ("join", "cy", 3), ("leave", "cy", 2), ("leave", "bob", 1),
        ]  # fmt: skip
        assert time.monotonic() - gone_at >= GRACE_S - 0.1
        await wait_until(lambda: server.state.presence.lingering == 0)


async def entry_lapsed(redis: RedisServer, server: LiveServer, user: str, room: str) -> bool:
    """Whether ``server``'s presence entry for ``user`` in ``room`` is gone or past its time."""
    settings = server.state.settings
    key = KeyLayout.of(settings).room(room, f"tabs:{user}")
    client = Redis.from_url(redis.url)
    try:
        score = await client.zscore(key, server.state.presence.worker_id)  # type: ignore[attr-defined]
    finally:
        await client.aclose()
    return score is None or score < time.time() * 1000


async def test_back_on_another_worker_nothing_is_announced(redis_server: RedisServer) -> None:
    """bob's socket on A ends, and he comes back on B within the grace: ada hears nothing of
    it, not when A's grace ends either; when he is gone from B for good, one departure."""
    settings = grace_settings(redis_server)
    async with run_server(settings) as a, run_server(settings) as b:
        await wait_until(lambda: a.state.broker.ready and b.state.broker.ready)
        async with ChatClient.connect(b.ws_url("ada")) as ada:
            await ada.join("p")
            await comes_and_goes(a.ws_url("bob"), ada)
            await wait_until(lambda: a.state.presence.lingering == 1)
            async with ChatClient.connect(b.ws_url("bob")) as bob:
                assert (await bob.join("p"))["count"] == 2
                await wait_until(lambda: a.state.presence.lingering == 0, GRACE_S + 5)
                await bob.say("p", "back")
                assert about(await frames_until_message(ada, "back"), "bob") == []
            gone_at = time.monotonic()
            leave = await ada.presence_of("bob", timeout=GRACE_S + 5)
            assert leave["event"] == "leave" and leave["count"] == 1, leave
            assert time.monotonic() - gone_at >= GRACE_S - 0.1
            await ada.say("p", "after")
            assert about(await frames_until_message(ada, "after"), "bob") == []


@pytest.mark.parametrize("back", [True, False])
async def test_a_worker_that_stops_in_the_grace_leaves_its_users_to_the_sweeps(
    redis_server: RedisServer, back: bool
) -> None:
    """A drain: bob's socket on A ends, then A stops while he lingers. Back on B within the
    grace, nothing is announced, B's sweeps included; not back, B's sweep announces his
    departure once the grace has passed (A's entry no longer counts)."""
    settings = grace_settings(redis_server)
    async with run_server(settings) as b, ChatClient.connect(b.ws_url("ada")) as ada:
        await ada.join("p")
        async with run_server(settings) as a:
            await wait_until(lambda: a.state.broker.ready)
            await comes_and_goes(a.ws_url("bob"), ada)
            await wait_until(lambda: a.state.presence.lingering == 1)
            stopped = a
        if back:
            async with ChatClient.connect(b.ws_url("bob")) as bob:
                assert (await bob.join("p"))["count"] == 2
                await wait_until_async(lambda: entry_lapsed(redis_server, stopped, "bob", "p"))
                await b.state.presence.upkeep()  # type: ignore[attr-defined]
                await bob.say("p", "back")
                assert about(await frames_until_message(ada, "back"), "bob") == []
            return
        await wait_until_async(lambda: entry_lapsed(redis_server, stopped, "bob", "p"))
        await b.state.presence.upkeep()  # type: ignore[attr-defined]
        leave = await ada.presence_of("bob")
        assert leave["event"] == "leave" and leave["count"] == 1, leave


async def wait_until_async(condition: Callable[[], Awaitable[bool]], timeout: float = 10) -> None:
    async with asyncio.timeout(timeout):
        while not await condition():
            await asyncio.sleep(0.05)


@pytest.mark.parametrize("broker", BROKERS)
async def test_a_join_that_overtakes_the_lingering_counts(broker: str) -> None:
    """The worker's presence is told bob left (his socket ended) and, before that call is
    done, that he joined again (a reconnect to the same worker): he stays present, and
    neither the join nor the grace's end announces anything."""
    async with (
        one_server(broker) as server,
        ChatClient.connect(server.ws_url("ada")) as ada,
    ):
        await ada.join("p")
        presence = server.state.presence
        await presence.join("p", "bob")
        assert (await ada.presence_of("bob"))["event"] == "join"
        await asyncio.gather(presence.leave("p", "bob", linger=True), presence.join("p", "bob"))
        if broker == "redis":  # the leave's call to Redis was made first: its grace runs
            await wait_until(lambda: presence.lingering == 1)
        await wait_until(lambda: presence.lingering == 0, GRACE_S + 5)
        assert await presence.is_present("p", "bob")
        await ada.say("p", "still here")
        assert about(await frames_until_message(ada, "still here"), "bob") == []
        await presence.leave("p", "bob")
        assert (await ada.presence_of("bob"))["event"] == "leave"


@pytest.mark.parametrize("broker", BROKERS)
async def test_a_kicked_user_does_not_linger(broker: str) -> None:
    """A connection the server closes for good (here a moderator's kick, 4003) is not
    expected back: its user's departure is announced at once."""
    token = "a-moderators-token-that-is-long-enough"
    redis = RedisServer() if broker == "redis" else None
    if redis is not None:
        await redis.start()
    try:
        async with (
            run_server(grace_settings(redis, admin_token=token)) as server,
            ChatClient.connect(server.ws_url("ada")) as ada,
            ChatClient.connect(server.ws_url("troll")) as troll,
            httpx.AsyncClient(timeout=5) as http,
        ):
            await ada.join("p")
            await troll.join("p")
            assert (await ada.presence_of("troll"))["event"] == "join"
            kicked_at = time.monotonic()
            kick = await http.post(
                f"{server.http_url}/admin/users/troll/kick",
                headers={"Authorization": f"Bearer {token}"},
            )
            assert kick.status_code == 202
            assert await troll.closed_with() == CloseCode.FORBIDDEN
            leave = await ada.presence_of("troll")
            assert leave["event"] == "leave" and leave["count"] == 1, leave
            assert time.monotonic() - kicked_at < GRACE_S
            assert server.state.presence.lingering == 0
    finally:
        if redis is not None:
            await redis.stop()
