"""The Presence contract, against both implementations (Redis against a real redis-server):
who is in a room across workers, announcements of first arrivals and last departures, big
rooms announced as throttled counts, and the departure of a dead worker's users."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import orjson
import pytest

from app.broker import Broker
from app.broker.memory import MemoryBroker
from app.broker.redis import RedisBroker
from app.presence import Presence, RoomPresence
from app.presence.memory import MemoryPresence
from app.presence.redis import UPKEEP_CHUNK, RedisPresence
from app.settings import Settings
from tests.helpers import make_settings, wait_until
from tests.processes import RedisServer, redis_deployment
from tests.test_broker_contract import Recorder


class Opened:
    def __init__(self, presence: Presence, broker: Broker, recorder: Recorder) -> None:
        self.presence = presence
        self.broker = broker
        self.recorder = recorder

    def announced(self) -> list[dict[str, object]]:
        """Every presence frame broadcast (one broadcast may carry several, see
        app.presence.announcer)."""
        return [
            orjson.loads(line)
            for _, _, payload in self.recorder.rooms
            for line in payload.split(b"\n")
        ]


OpenedFactory = Callable[..., AbstractAsyncContextManager[Opened]]


@pytest.fixture(params=["memory", "redis", "cluster"])
async def opened_of(request: pytest.FixtureRequest) -> AsyncIterator[OpenedFactory]:
    """Opens presence (and the broker it announces through, subscribed to room ``r``)."""
    server = redis_deployment(request.param)

    @asynccontextmanager
    async def open_presence(**overrides: object) -> AsyncIterator[Opened]:
        broker: Broker
        presence: Presence
        if server is None:
            settings = make_settings(**overrides)
            broker = MemoryBroker(settings)
            presence = MemoryPresence(settings, broker)
        else:
            settings = make_settings(**server.settings(), **overrides)
            broker = RedisBroker(settings)
            presence = RedisPresence(settings, broker)
        recorder = Recorder()
        await broker.start(recorder)
        await presence.start()
        try:
            await wait_until(lambda: broker.ready)
            await broker.subscribe_room("r")
            yield Opened(presence, broker, recorder)
        finally:
            await presence.stop()
            await broker.stop()

    if server is None:
        yield open_presence
        return
    await server.start()
    try:
        yield open_presence
    finally:
        await server.stop()


async def test_arrivals_and_departures_are_announced(opened_of: OpenedFactory) -> None:
    async with opened_of() as opened:
        presence = opened.presence
        await presence.join("r", "ada")
        await presence.join("r", "bob")
        assert await presence.of("r") == RoomPresence(2, ["ada", "bob"])
        await presence.leave("r", "ada")
        assert await presence.of("r") == RoomPresence(1, ["bob"])
        await wait_until(lambda: len(opened.announced()) == 3)
        assert [(f["event"], f["user"], f["count"]) for f in opened.announced()] == [
            ("join", "ada", 1),
            ("join", "bob", 2),
            ("leave", "ada", 1),
        ]
        assert all(message_id is None for _, message_id, _ in opened.recorder.rooms)


async def test_big_rooms_are_announced_as_throttled_counts(opened_of: OpenedFactory) -> None:
    """Above presence_max_members, joins are announced as counts, at most once per interval,
    with one trailing update carrying the final count: no N² storm when a room fills up."""
    async with opened_of(presence_max_members=3, presence_count_interval_s=0.2) as opened:
        for n in range(50):
            await opened.presence.join("r", f"u{n}")
        await wait_until(lambda: len(opened.announced()) >= 4)
        frames = opened.announced()
        assert [f.get("user") for f in frames[:3]] == ["u0", "u1", "u2"]  # small: by name
        assert frames[3] == {"type": "presence", "room": "r", "count": 4}
        await wait_until(lambda: opened.announced()[-1].get("count") == 50)
        assert len(opened.announced()) == 5  # the trailing update, and nothing else
        assert await opened.presence.of("r") == RoomPresence(50, None)


@asynccontextmanager
async def recorded_broker(
    rooms: list[str], **overrides: object
) -> AsyncIterator[tuple[Settings, RedisBroker, Recorder]]:
    """A fresh redis-server and a RedisBroker on it (``overrides`` to the settings),
    subscribed to ``rooms``, whose broadcasts ``Recorder`` records."""
    server = RedisServer()
    await server.start()
    try:
        settings = make_settings(redis_url=server.url, **overrides)
        broker = RedisBroker(settings)
        recorder = Recorder()
        await broker.start(recorder)
        try:
            await wait_until(lambda: broker.ready)
            await asyncio.gather(*(broker.subscribe_room(room) for room in rooms))
            yield settings, broker, recorder
        finally:
            await broker.stop()
    finally:
        await server.stop()


async def test_a_dead_workers_users_leave_when_their_entries_expire() -> None:
    """A worker that stops refreshing (it died) leaves nothing behind: once its entries
    expire, a live worker's sweep announces its users' departure."""
    async with recorded_broker(["r"], presence_ttl_s=0.6) as (settings, broker, recorder):
        alive, dead = RedisPresence(settings, broker), RedisPresence(settings, broker)
        await alive.start()  # refreshes and sweeps every ttl/3; `dead` never does
        try:
            await alive.join("r", "ada")
            await dead.join("r", "zed")
            assert (await alive.of("r")).users == ["ada", "zed"]
            await wait_until(lambda: (b'"leave"', b'"zed"') in _events(recorder), 5)
            assert (await alive.of("r")).users == ["ada"]
        finally:
            await dead.stop()  # only now: its connections are closed
            await alive.stop()


async def test_the_upkeep_of_many_rooms_refreshes_and_sweeps_each() -> None:
    """Many more rooms than the upkeep takes at a time: every room's entries are refreshed
    (the live user stays past the ttl) and every room's sweep announces its own departures
    (the dead worker's user leaves each room, once)."""
    rooms = [f"r{n}" for n in range(300)]
    async with recorded_broker(rooms, presence_ttl_s=0.9) as (settings, broker, recorder):
        alive, dead = RedisPresence(settings, broker), RedisPresence(settings, broker)
        await alive.start()
        try:
            await asyncio.gather(*(alive.join(room, "ada") for room in rooms))
            await asyncio.gather(*(dead.join(room, f"zed-{room}") for room in rooms))

            def departed() -> list[bytes]:
                return [user for event, user in _events(recorder) if event == b'"leave"']

            await wait_until(lambda: len(departed()) == len(rooms), 10)
            assert sorted(departed()) == sorted(orjson.dumps(f"zed-{r}") for r in rooms)
            for room in (rooms[0], rooms[UPKEEP_CHUNK - 1], rooms[UPKEEP_CHUNK], rooms[-1]):
                assert (await alive.of(room)).users == ["ada"]
        finally:
            await dead.stop()
            await alive.stop()


async def test_a_clean_stop_sends_the_announcements_still_waiting() -> None:
    """Stopping withdraws the worker's users and sends what waits in its coalescing window
    (their departures among it) before the broker stops, rather than dropping it: the other
    workers' members see them leave."""
    async with recorded_broker(["r"], presence_coalesce_s=5.0) as (settings, broker, recorder):
        presence = RedisPresence(settings, broker)
        await presence.start()
        try:
            await presence.join("r", "ada")
            await presence.join("r", "bob")
        finally:
            await presence.stop()  # well within the window
        expected = [(b'"join"', b'"ada"'), (b'"join"', b'"bob"')]
        expected += [(b'"leave"', b'"ada"'), (b'"leave"', b'"bob"')]
        await wait_until(lambda: sorted(_events(recorder)) == sorted(expected))
        assert _events(recorder)[:2] == expected[:2]  # in order, in one broadcast
        assert len(recorder.rooms) == 1
        assert (await RedisPresence(settings, broker).of("r")).users == []


def _events(recorder: Recorder) -> list[tuple[bytes, bytes]]:
    found = []
    frames = [orjson.loads(line) for _, _, p in recorder.rooms for line in p.split(b"\n")]
    for frame in frames:
        if "event" in frame:
            found.append((orjson.dumps(frame["event"]), orjson.dumps(frame["user"])))
    return found


async def test_arrivals_within_the_window_go_out_in_one_broadcast(
    opened_of: OpenedFactory,
) -> None:
    """Ten members coming back at once (a reconnect storm) are announced in one broadcast
    of ten frames, in order, not ten broadcasts."""
    async with opened_of(presence_coalesce_s=0.3) as opened:
        for n in range(10):
            await opened.presence.join("r", f"u{n}")
        await wait_until(lambda: len(opened.announced()) == 10)
        assert len(opened.recorder.rooms) == 1
        assert [(f["user"], f["count"]) for f in opened.announced()] == [
            (f"u{n}", n + 1) for n in range(10)
        ]
