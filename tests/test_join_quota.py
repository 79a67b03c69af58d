"""A join's quotas (app.access.quotas.Quotas.allow_join): the user's join token, and a
new-room token when the join brings a room into being. On one Redis the join token, the
room's existence and the new-room token are one script call (one round trip a join); on
Redis Cluster (tests/test_cluster.py) they are asked apart, with the same answers."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from app.access.quotas import JoinVerdict, MemoryQuotas, RedisQuotas
from app.broker.keys import KeyLayout
from app.redisio.autopipeline import AutoPipeline
from app.settings import Settings
from tests.helpers import ChatClient, make_settings
from tests.processes import RedisServer, server_on

pytestmark = pytest.mark.timeout(60)

QUOTAS = {
    "user_joins_per_s": 0.01,
    "user_join_burst": 4,
    "user_new_rooms_per_s": 0.01,
    "user_new_room_burst": 2,
}


async def assert_join_verdicts(
    quotas: RedisQuotas, settings: Settings, redis: Redis | RedisCluster
) -> None:
    """Four joins' tokens and two new rooms' for ``ada``: an existing room costs a join, a new
    one a join and a new room; past the new rooms' burst a new room is refused (its join
    token spent), past the joins' every join is; ``bob``'s buckets are his own. ``redis``
    writes where the existing room's key lives."""
    existence = KeyLayout.of(settings).room  # what RedisBroker.existence_key names
    await redis.hset(existence("old", "meta"), "origin", "1")
    verdicts = [
        await quotas.allow_join("ada", existence(room, "meta"))
        for room in ("old", "new-1", "new-2", "new-3", "old")
    ]
    assert verdicts == [
        JoinVerdict.ADMITTED,
        JoinVerdict.NEW_ROOM,
        JoinVerdict.NEW_ROOM,
        JoinVerdict.NEW_ROOM_RATE,
        JoinVerdict.JOIN_RATE,
    ]
    assert await quotas.allow_join("bob", existence("new-4", "meta")) is JoinVerdict.NEW_ROOM
    assert await quotas.allow_join("bob", None) is JoinVerdict.ADMITTED  # not asked


async def test_a_joins_quotas_on_one_redis_are_one_round_trip() -> None:
    redis = RedisServer()
    await redis.start()
    settings = make_settings(redis_url=redis.url, **QUOTAS)
    quotas = RedisQuotas(settings)
    client = Redis.from_url(redis.url)
    try:
        pipeline = quotas._pipeline
        assert isinstance(pipeline, AutoPipeline)
        before = pipeline.batches
        await assert_join_verdicts(quotas, settings, client)
        # Seven joins, seven writes to Redis: a second call in any would be one more.
        assert pipeline.batches - before == 7
    finally:
        await client.aclose()
        await quotas.close()
        await redis.stop()


async def test_a_joins_quotas_fail_open_when_redis_is_gone() -> None:
    """Unreachable Redis: the join is admitted and its room counts as existing (the broker,
    down too, refuses the join with broker_unavailable)."""
    redis = RedisServer()
    await redis.start()
    settings = make_settings(redis_url=redis.url, redis_timeout_s=0.5, **QUOTAS)
    quotas = RedisQuotas(settings)
    try:
        assert await quotas.allow_join("ada", "k") is JoinVerdict.NEW_ROOM
        await redis.kill()
        assert await quotas.allow_join("ada", "k") is JoinVerdict.ADMITTED
    finally:
        await quotas.close()
        await redis.stop()


async def test_one_process_quotas_count_joins() -> None:
    quotas = MemoryQuotas(make_settings(**QUOTAS))
    verdicts = [await quotas.allow_join("ada", None) for _ in range(5)]
    assert verdicts == [JoinVerdict.ADMITTED] * 4 + [JoinVerdict.JOIN_RATE]


@pytest.mark.parametrize("broker", ["memory", "redis"])
async def test_joins_of_rooms_the_worker_is_in_cost_a_token_each(broker: str) -> None:
    """A join of a room the worker is in (nothing to ask about it) costs a token: a first
    tab's, a second tab's of a user present already, one with ``since``. A refused join
    changes nothing: the user is not present, and nothing of the room reaches the refused
    connection."""
    async with server_on(broker, user_joins_per_s=0.01, user_join_burst=3) as live:
        async with (
            ChatClient.connect(live.ws_url("host")) as host,
            ChatClient.connect(live.ws_url("ada")) as tab_1,
            ChatClient.connect(live.ws_url("ada")) as tab_2,
            ChatClient.connect(live.ws_url("zed")) as zed,
        ):
            for room in ("a", "b", "c"):
                await host.join(room)  # the worker is in each
            answers = []
            joins: list[tuple[ChatClient, dict[str, Any]]] = [
                (tab_1, {"room": "a"}),
                (tab_1, {"room": "b"}),
                (tab_2, {"room": "a"}),  # ada is present in a already
                (tab_2, {"room": "c"}),  # none left
                (tab_1, {"room": "c", "since": 0}),
            ]
            for client, join in joins:
                await client.send({"type": "join", **join})
                frame = await client.next_frame()
                answers.append(frame["type"] if frame["type"] == "joined" else frame["code"])
            assert answers == ["joined"] * 3 + ["rate_limited"] * 2
            assert not await live.state.presence.is_present("c", "ada")
            assert (await zed.join("c"))["count"] == 2  # host and zed
            await host.say("c", "for c's members")
            assert (await zed.expect("message"))["text"] == "for c's members"
            for tab in (tab_1, tab_2):  # a barrier: nothing of c came before its pong
                await tab.send({"type": "ping"})
                while (frame := await tab.next_frame(skip=("ping",)))["type"] != "pong":
                    assert frame.get("room") != "c", frame
