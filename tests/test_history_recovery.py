"""Recovery from history, the same contract for both brokers (Redis against a real
redis-server): a client that missed at most ``history_size`` messages (and at most
``recovery_max_messages``) gets exactly those, in order; one that missed more, or whose
``since`` the room never reached, is told to resync, never handed a gap."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import orjson
import pytest

from app.broker import Broker, History
from app.broker.memory import MemoryBroker
from app.broker.redis import RedisBroker
from tests.helpers import make_settings
from tests.processes import RedisServer

BrokerFactory = Callable[..., AbstractAsyncContextManager[Broker]]


class _Ignore:
    """A BrokerHandler for a broker whose deliveries these tests do not look at."""

    def deliver_room(self, room: str, payload: bytes) -> None: ...
    def deliver_user(self, user: str, payload: bytes) -> None: ...
    def link_lost(self) -> None: ...
    def resubscribed(self) -> None: ...
    def kick(self, user: str, reason: str, issued_at: float | None = None) -> None: ...


@pytest.fixture(params=["memory", "redis"])
async def broker_of(request: pytest.FixtureRequest) -> AsyncIterator[BrokerFactory]:
    """Opens a started broker of the parameter's kind with the given settings."""
    server = RedisServer() if request.param == "redis" else None

    @asynccontextmanager
    async def open_broker(**settings: object) -> AsyncIterator[Broker]:
        broker: Broker
        if server is None:
            broker = MemoryBroker(make_settings(**settings))
        else:
            broker = RedisBroker(make_settings(redis_url=server.url, **settings))
        await broker.start(_Ignore())
        try:
            yield broker
        finally:
            await broker.stop()

    if server is None:
        yield open_broker
        return
    await server.start()
    try:
        yield open_broker
    finally:
        await server.stop()


def _texts(history: History) -> list[str]:
    return [orjson.loads(frame)["text"] for frame in history.frames]


async def test_up_to_history_size_missed_are_recovered(broker_of: BrokerFactory) -> None:
    async with broker_of(history_size=4, recovery_max_messages=10) as broker:
        ids = [(await broker.publish("r", "u", str(n), None)).id for n in range(8)]
        missed_four = await broker.history_since("r", ids[3], 100)
        assert missed_four == History(True, missed_four.frames)
        assert _texts(missed_four) == ["4", "5", "6", "7"]
        assert not (await broker.history_since("r", ids[2], 100)).recovered  # 5 missed > 4 kept
        assert not (await broker.history_since("r", ids[0], 100)).recovered
        assert await broker.history_since("r", ids[7], 100) == History(True, [])
        assert not (await broker.history_since("r", ids[7] + 1, 100)).recovered  # not reached yet


async def test_more_missed_than_recovery_max_is_not_recovered(broker_of: BrokerFactory) -> None:
    async with broker_of(history_size=10, recovery_max_messages=2) as broker:
        ids = [(await broker.publish("r", "u", str(n), None)).id for n in range(5)]
        assert _texts(await broker.history_since("r", ids[2], 100)) == ["3", "4"]
        assert not (await broker.history_since("r", ids[1], 100)).recovered


async def test_a_room_that_never_overflowed_recovers_from_its_start(
    broker_of: BrokerFactory,
) -> None:
    """A quiet room's `last` (what `joined` tells a client) is its log's origin: everything
    after it is recovered; a `since` from before the log began (0) cannot be vouched for."""
    async with broker_of(history_size=5, recovery_max_messages=10) as broker:
        origin = await broker.last_id("r")
        assert origin > 0
        for n in range(3):
            await broker.publish("r", "u", str(n), None)
        assert _texts(await broker.history_since("r", origin, 100)) == ["0", "1", "2"]
        assert not (await broker.history_since("r", 0, 100)).recovered


async def test_without_history_only_an_up_to_date_since_is_recovered(
    broker_of: BrokerFactory,
) -> None:
    async with broker_of(history_size=0) as broker:
        ids = [(await broker.publish("r", "u", str(n), None)).id for n in range(2)]
        assert not (await broker.history_since("r", ids[0], 100)).recovered
        assert await broker.history_since("r", ids[1], 100) == History(True, [])


async def test_a_gap_trimmed_under_a_smaller_history_size_is_not_recovered_later() -> None:
    """Raising CHAT_HISTORY_SIZE (a restart, or pods of a rolling deploy) must not turn a gap
    that was trimmed under the old size into a claimed recovery."""
    server = RedisServer()
    await server.start()
    try:
        small = RedisBroker(make_settings(redis_url=server.url, history_size=2))
        await small.start(_Ignore())
        ids = [(await small.publish("r", "u", str(n), None)).id for n in range(6)]
        await small.stop()
        large = RedisBroker(
            make_settings(redis_url=server.url, history_size=100, recovery_max_messages=100)
        )
        await large.start(_Ignore())
        try:
            assert not (await large.history_since("r", ids[0], 100)).recovered
            assert _texts(await large.history_since("r", ids[3], 100)) == ["4", "5"]
        finally:
            await large.stop()
    finally:
        await server.stop()
