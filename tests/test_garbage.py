"""Serving creates no cyclic garbage: after warming up, a connection's whole life (connect,
join, chat, typing, leave, close) leaves nothing for Python's cyclic garbage collector, so its
collections find nothing to free and the memory of every closed connection is returned at
once, by reference counting.

The server runs in this process, on uvloop as in production (conftest.py; asyncio's own
selector transport would hold a reference cycle of its own), with the memory broker and with
Redis; the clients run in another process (tests/chat_cycles.py) so that their objects are not
counted. Periodic freezing is off here: a frozen cycle would be invisible to the collection
this test makes.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import sys
from collections.abc import AsyncIterator

import pytest

from app.ops.gc_tuning import keep_freezing
from tests.helpers import LiveServer, make_settings, run_server, wait_until
from tests.processes import RedisServer


@pytest.fixture(params=["memory", "redis"])
async def live(request: pytest.FixtureRequest) -> AsyncIterator[LiveServer]:
    if request.param == "memory":
        async with run_server(make_settings(gc_freeze_interval_s=0)) as server:
            yield server
        return
    redis = RedisServer()
    await redis.start()
    try:
        async with run_server(make_settings(redis_url=redis.url, gc_freeze_interval_s=0)) as server:
            await wait_until(lambda: server.state.broker.ready)
            yield server
    finally:
        await redis.stop()


async def _cycles(live: LiveServer, count: int, tag: str) -> None:
    client = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.chat_cycles", str(live.port), str(count), tag
    )
    async with asyncio.timeout(60):
        assert await client.wait() == 0, "the client process failed"


@pytest.mark.timeout(120)
async def test_a_connections_whole_life_leaves_no_cyclic_garbage(live: LiveServer) -> None:
    await _cycles(live, 10, "warm-up")  # first-use caches, lazily built objects
    await wait_until(lambda: not live.state.hub.connections)
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection finds is kept in gc.garbage
    try:
        await _cycles(live, 30, "measured")
        await wait_until(lambda: not live.state.hub.connections)
        gc.collect()
        garbage = list(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    kinds = collections.Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in garbage)
    assert not garbage, f"{len(garbage)} objects in cycles: {kinds.most_common(15)}"


async def test_survivors_are_frozen_out_of_the_collectors_sight() -> None:
    """keep_freezing moves what survives out of the collector's sight, every interval."""
    before = gc.get_freeze_count()
    task = asyncio.create_task(keep_freezing(0.01))
    try:
        survivors = [[n] for n in range(10_000)]  # tracked containers
        await wait_until(lambda: gc.get_freeze_count() >= before + len(survivors))
    finally:
        task.cancel()
        gc.unfreeze()
