"""A worker's periodic upkeep in Redis (its presence entries, its connection counts) is dealt
out over part of its interval in chunks (app.redisio.spread), not sent in one burst that
Redis runs while every worker's messages wait (docs/benchmarks.md, "the presence upkeep").
What each chunk did is read back from Redis: the expiry each entry was given."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import pytest
from redis.asyncio import Redis

from app.access.quotas import COUNTS_CHUNK, RedisQuotas, refresh_counts
from app.broker.keys import KeyLayout
from app.broker.redis import RedisBroker
from app.presence.redis import UPKEEP_CHUNK, UPKEEP_USERS, RedisPresence
from app.redisio.spread import spread
from tests.helpers import make_settings, wait_until
from tests.processes import RedisServer

pytestmark = pytest.mark.timeout(60)

# Clocks: the loop's and Redis' are read apart; a chunk is never early by more than this.
SLACK_S = 0.02


async def test_spread_deals_chunks_out_evenly_and_in_order() -> None:
    loop = asyncio.get_running_loop()
    began = loop.time()
    seen = [(k, loop.time() - began) async for k in spread(4, 0.4)]
    assert [k for k, _ in seen] == [0, 1, 2, 3]
    for k, at in seen:
        assert at >= 0.1 * k - SLACK_S, seen
    assert seen[-1][1] < 0.4 + 0.5, seen  # the last starts within the spread (and some slack)
    assert [k async for k in spread(3, 0.0)] == [0, 1, 2]
    assert [k async for k in spread(0, 1.0)] == []


@dataclass
class _Conn:
    user: str
    id: str


async def test_the_connection_counts_are_refreshed_a_chunk_at_a_time_spread_out() -> None:
    """Each connection's entry is pushed back a ttl from when its chunk ran: the last chunk's
    later than the first's by about the spread; a connection left out keeps its expiry."""
    server = RedisServer()
    await server.start()
    settings = make_settings(redis_url=server.url, presence_ttl_s=60.0)
    quotas = RedisQuotas(settings)
    admin = Redis.from_url(server.url)
    try:
        conns = [_Conn(f"u{n}", f"c{n}") for n in range(2 * COUNTS_CHUNK + 1)]
        for conn in [*conns, _Conn("left-out", "c-out")]:
            assert await quotas.admit(conn.user, conn.id, None) is None
        await quotas.prepare()

        async def expiry(conn: _Conn) -> float:
            score = await admin.zscore(quotas._user_key("conns", conn.user), conn.id)
            assert score is not None, conn
            return float(score) / 1000

        left_out = await expiry(_Conn("left-out", "c-out"))
        await refresh_counts(quotas, conns, spread_s=0.6)
        first, last = await expiry(conns[0]), await expiry(conns[-1])
        assert first >= left_out  # pushed back (ttl from a later time)
        assert last - first >= 0.6 * 2 / 3 - SLACK_S, (first, last)
        assert await expiry(_Conn("left-out", "c-out")) == left_out
    finally:
        await admin.aclose()
        await quotas.close()
        await server.stop()


async def test_the_presence_upkeep_is_spread_a_chunk_of_rooms_at_a_time() -> None:
    server = RedisServer()
    await server.start()
    settings = make_settings(redis_url=server.url, presence_ttl_s=60.0)
    broker = RedisBroker(settings)
    presence = RedisPresence(settings, broker)
    admin = Redis.from_url(server.url)
    try:
        rooms = [f"r{n}" for n in range(2 * UPKEEP_CHUNK + 1)]
        await asyncio.gather(*(presence.join(room, "ada") for room in rooms))
        present = KeyLayout.of(settings).room

        async def expiry(room: str) -> float:
            score = await admin.zscore(present(room, "present"), "ada")
            assert score is not None, room
            return float(score) / 1000

        joined = await expiry(rooms[0])
        await presence.upkeep(spread_s=0.6)
        first, last = await expiry(rooms[0]), await expiry(rooms[-1])
        assert first >= joined
        assert last - first >= 0.6 * 2 / 3 - SLACK_S, (first, last)
        assert (await presence.of(rooms[-1])).users == ["ada"]
    finally:
        await admin.aclose()
        await presence.stop()
        await server.stop()


async def test_a_room_of_many_users_takes_several_calls_and_one_sweep() -> None:
    """A room with more users than a call refreshes (the internal rooms hold every user of a
    worker) is refreshed in several calls, all before its sweep, in the last: none of them
    is swept out, and a dead worker's user is."""
    server = RedisServer()
    await server.start()
    settings = make_settings(redis_url=server.url, presence_ttl_s=0.3)
    broker = RedisBroker(settings)
    alive, dead = RedisPresence(settings, broker), RedisPresence(settings, broker)
    admin = Redis.from_url(server.url)
    present = KeyLayout.of(settings).room("big", "present")
    try:
        users = [f"u{n}" for n in range(2 * UPKEEP_USERS + 1)]
        await asyncio.gather(*(alive.join("big", user) for user in users))
        await dead.join("big", "zed")
        zed = await admin.zscore(present, "zed")
        assert zed is not None
        await wait_until(lambda: time.time() * 1000 > zed + 50)  # every entry has expired
        stats = await admin.info("commandstats")
        before = stats["cmdstat_evalsha"]["calls"]
        await alive.upkeep()
        stats = await admin.info("commandstats")
        assert stats["cmdstat_evalsha"]["calls"] - before == 3
        assert set(await admin.zrange(present, 0, -1)) == {user.encode() for user in users}
        assert (await alive.of("big")).count == len(users)
    finally:
        await admin.aclose()
        await alive.stop()
        await server.stop()
