"""Subscription against a real redis-server: pushes in order, subscribing after a loss, and
a handler's exception ending it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from app.redisio.subscription import Subscription
from tests.helpers import wait_until
from tests.processes import RedisServer


async def test_pushes_reach_the_handler_in_order(redis: Redis) -> None:
    pushes: list[list[Any]] = []
    subscription = await Subscription.open(redis, pushes.append)
    subscription.subscribe("a", "b")
    await wait_until(lambda: len(pushes) == 2)
    assert [p[:2] for p in pushes] == [[b"subscribe", b"a"], [b"subscribe", b"b"]]
    async with redis.pipeline(transaction=False) as pipe:
        for n in range(500):
            pipe.publish("a" if n % 2 else "b", str(n))
        await pipe.execute()
    await wait_until(lambda: len(pushes) == 502)
    assert [int(p[2]) for p in pushes[2:]] == list(range(500))
    subscription.unsubscribe("a")
    await redis.publish("a", "unheard")
    await redis.publish("b", "heard")
    await wait_until(lambda: pushes[-1][-1] == b"heard")
    assert [p[0] for p in pushes[502:]] == [b"unsubscribe", b"message"]
    subscription.close()
    assert isinstance(await subscription.lost, RedisConnectionError)


async def test_a_lost_connection_ends_it_and_refuses_more_subscriptions(
    redis_server: RedisServer, redis: Redis
) -> None:
    subscription = await Subscription.open(redis, lambda push: None)
    await redis_server.kill()
    lost = await asyncio.wait_for(subscription.lost, timeout=5)
    assert isinstance(lost, RedisConnectionError)
    with pytest.raises(RedisConnectionError):
        subscription.subscribe("too-late")
    subscription.close()


async def test_a_handler_that_raises_ends_the_subscription(redis: Redis) -> None:
    def handler(push: list[Any]) -> None:
        if push[0] == b"message":
            raise ValueError("bad push")

    subscription = await Subscription.open(redis, handler)
    subscription.subscribe("a")
    async with asyncio.timeout(5):
        while await redis.pubsub_numsub("a") != [(b"a", 1)]:
            await asyncio.sleep(0.01)
        await redis.publish("a", "boom")
        lost = await subscription.lost
    assert isinstance(lost, ValueError)
    async with asyncio.timeout(5):  # and the connection is gone from the server
        while await redis.pubsub_numsub("a") != [(b"a", 0)]:
            await asyncio.sleep(0.01)
    subscription.close()


async def test_a_replica_is_refused(redis_server: RedisServer, redis: Redis) -> None:
    """A subscription on a replica could miss the publishes its master ran before the
    replica's sync (a Sentinel behind on a failover names such a server): it is refused with
    the reason, and the same on the master is taken."""
    replica = RedisServer(extra=("--replicaof", "127.0.0.1", str(redis_server.port)))
    await replica.start()
    client = Redis.from_url(replica.url, socket_timeout=2, socket_connect_timeout=2)
    try:
        with pytest.raises(RedisConnectionError, match="only on a master"):
            await Subscription.open(client, lambda push: None)
        assert await client.pubsub_numsub("a") == [(b"a", 0)]
        subscription = await Subscription.open(redis, lambda push: None)
        subscription.close()
    finally:
        await client.aclose()
        await replica.stop()


async def test_one_iterations_commands_leave_as_few_in_order(redis: Redis) -> None:
    """What one loop iteration asks leaves together: consecutive subscriptions as one
    ``SUBSCRIBE`` (a connect storm's users), confirmed channel by channel, in order; an
    ``UNSUBSCRIBE`` between them keeps its place."""
    pushes: list[list[Any]] = []
    subscription = await Subscription.open(redis, pushes.append)
    await redis.config_resetstat()
    for n in range(200):
        subscription.subscribe(f"c{n}")
    subscription.unsubscribe("c0")
    subscription.subscribe("c0")
    await wait_until(lambda: len(pushes) == 202)
    assert [p[:2] for p in pushes] == [
        *([b"subscribe", f"c{n}".encode()] for n in range(200)),
        [b"unsubscribe", b"c0"],
        [b"subscribe", b"c0"],
    ]
    stats = await redis.info("commandstats")
    assert stats["cmdstat_subscribe"]["calls"] == 2
    assert stats["cmdstat_unsubscribe"]["calls"] == 1
    await redis.publish("c0", "heard")
    await wait_until(lambda: pushes[-1][-1] == b"heard")
    subscription.close()
