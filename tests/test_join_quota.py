"""A join's quotas (app.access.quotas.Quotas.allow_join): the user's join token, and a
new-room token when the join brings a room into being. On one Redis the join token, the
room's existence and the new-room token are one script call (one round trip a join); on
Redis Cluster (tests/test_cluster.py) they are asked apart, with the same answers."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from app.access.quotas import JoinVerdict, MemoryQuotas, RedisQuotas
from app.broker.keys import KeyLayout
from app.redisio.autopipeline import AutoPipeline
from app.settings import Settings
from tests.helpers import make_settings
from tests.processes import RedisServer

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
