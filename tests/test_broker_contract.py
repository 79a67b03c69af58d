"""The Broker contract, one suite run against both brokers (Redis against a real
redis-server): numbering, delivery with the id beside the frame, identical message frames,
dedup, the message quota taken inside publish, direct messages, broadcasts, kicks, and
recovery from history (a client that missed at most ``history_size`` messages, and at most
``recovery_max_messages``, gets exactly those, in order; one that missed more, or whose
``since`` the room never reached, is told to resync, never handed a gap)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Collection
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import orjson
import pytest

from app.broker import Broker, History
from app.broker.memory import MemoryBroker
from app.broker.redis import RedisBroker
from app.errors import QuotaExceeded
from app.protocol import message_frame, message_frame_parts
from tests.helpers import make_settings, wait_until
from tests.processes import RedisServer, redis_deployment


class Recorder:
    """A BrokerHandler that records what it is given."""

    def __init__(self) -> None:
        self.rooms: list[tuple[str, int | None, bytes]] = []
        self.users: list[tuple[str, int | None, bytes]] = []
        self.kicks: list[tuple[str, str]] = []
        self.room_notices: list[str] = []
        self.routed: list[bytes] = []

    def deliver_room(self, room: str, message_id: int | None, payload: bytes) -> None:
        self.rooms.append((room, message_id, payload))

    def deliver_user(self, user: str, message_id: int | None, payload: bytes) -> None:
        self.users.append((user, message_id, payload))

    def link_lost(self) -> None: ...

    def room_changed(self, room: str) -> None:
        self.room_notices.append(room)

    def resubscribed(self) -> None: ...
    def rooms_lost(self, rooms: Collection[str]) -> None: ...
    def rooms_back(self, rooms: Collection[str]) -> None: ...
    def notices_missed(self) -> None: ...

    def kick(self, user: str, reason: str, issued_at: float | None = None) -> None:
        self.kicks.append((user, reason))

    def deliver_routed(self, payload: bytes) -> None:
        self.routed.append(payload)


class Opened:
    """A started broker and what it delivered."""

    def __init__(self, broker: Broker, recorder: Recorder, kind: str) -> None:
        self.broker = broker
        self.recorder = recorder
        self.kind = kind  # memory, redis or cluster


BrokerFactory = Callable[..., AbstractAsyncContextManager[Broker]]
OpenedFactory = Callable[..., AbstractAsyncContextManager[Opened]]


@pytest.fixture(params=["memory", "redis", "cluster"])
async def opened_of(request: pytest.FixtureRequest) -> AsyncIterator[OpenedFactory]:
    """Opens a started, ready broker of the parameter's kind with the given settings."""
    server = redis_deployment(request.param)

    @asynccontextmanager
    async def open_broker(**settings: object) -> AsyncIterator[Opened]:
        broker: Broker
        if server is None:
            broker = MemoryBroker(make_settings(**settings))
        else:
            broker = RedisBroker(make_settings(**server.settings(), **settings))
        recorder = Recorder()
        await broker.start(recorder)
        try:
            await wait_until(lambda: broker.ready)
            yield Opened(broker, recorder, request.param)
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


@pytest.fixture
def broker_of(opened_of: OpenedFactory) -> BrokerFactory:
    """Opens a started broker (its deliveries are not looked at)."""

    @asynccontextmanager
    async def open_broker(**settings: object) -> AsyncIterator[Broker]:
        async with opened_of(**settings) as opened:
            yield opened.broker

    return open_broker


TEXTS = ["plain", 'quote " backslash \\ newline \n', "émoji 🎉 中文", "</script>", ""]


async def test_messages_are_numbered_and_delivered_with_their_id(opened_of: OpenedFactory) -> None:
    """Ids increase within a room; a subscribed room gets each message in id order, with its
    id beside the frame, and the frame is exactly what app.protocol.message_frame builds (so
    both brokers send the same bytes)."""
    async with opened_of() as opened:
        broker, recorder = opened.broker, opened.recorder
        await broker.subscribe_room("r")
        published = [await broker.publish("r", "alice", text, None) for text in TEXTS]
        ids = [p.id for p in published]
        assert ids == sorted(ids) and len(set(ids)) == len(ids)
        await wait_until(lambda: len(recorder.rooms) == len(TEXTS))
        for (room, message_id, payload), sent, text in zip(
            recorder.rooms, published, TEXTS, strict=True
        ):
            assert (room, message_id) == ("r", sent.id)
            parts = message_frame_parts("room", "r", "alice", text)
            assert payload == message_frame(parts, sent.id, sent.ts_ms)
            assert orjson.loads(payload) == {
                "type": "message", "room": "r", "id": sent.id, "user": "alice",
                "text": text, "ts": sent.ts_ms,
            }  # fmt: skip


async def test_a_retried_cid_is_not_published_twice(opened_of: OpenedFactory) -> None:
    async with opened_of(dedup_ttl_s=60) as opened:
        broker, recorder = opened.broker, opened.recorder
        await broker.subscribe_room("r")
        first = await broker.publish("r", "u", "a", "c1")
        again = await broker.publish("r", "u", "a", "c1")
        other_user = await broker.publish("r", "v", "a", "c1")
        other_room = await broker.publish("s", "u", "a", "c1")
        assert again.duplicate and again.id == first.id and again.ts_ms == 0
        assert not other_user.duplicate and not other_room.duplicate
        await wait_until(lambda: len(recorder.rooms) == 2)
        assert [message_id for _, message_id, _ in recorder.rooms] == [first.id, other_user.id]


async def test_only_subscribed_rooms_are_delivered(opened_of: OpenedFactory) -> None:
    async with opened_of() as opened:
        broker, recorder = opened.broker, opened.recorder
        await broker.subscribe_room("r")
        await broker.publish("elsewhere", "u", "x", None)
        await broker.unsubscribe_room("r")
        await broker.publish("r", "u", "y", None)
        await broker.subscribe_room("r")
        last = await broker.publish("r", "u", "z", None)
        await wait_until(lambda: len(recorder.rooms) == 1)
        assert recorder.rooms[0][1] == last.id


async def test_broadcasts_have_no_id_and_are_not_stored(opened_of: OpenedFactory) -> None:
    async with opened_of() as opened:
        broker, recorder = opened.broker, opened.recorder
        await broker.subscribe_room("r")
        before = await broker.last_id("r")
        typing = b'{"type":"typing","room":"r","user":"u"}'
        await broker.broadcast("r", typing)
        await wait_until(lambda: len(recorder.rooms) == 1)
        assert recorder.rooms == [("r", None, typing)]
        assert await broker.history_since("r", before, 10) == History(True, [])


async def test_direct_messages_reach_the_recipient_and_the_senders_other_tabs(
    opened_of: OpenedFactory,
) -> None:
    async with opened_of() as opened:
        broker, recorder = opened.broker, opened.recorder
        await broker.subscribe_user("bob")
        await broker.subscribe_user("alice")
        sent = await broker.publish_direct("alice", "bob", "hi bob", None)
        await wait_until(lambda: len(recorder.users) == 2)
        expected = message_frame(
            message_frame_parts("to", "bob", "alice", "hi bob"), sent.id, sent.ts_ms
        )
        assert sorted(recorder.users) == [("alice", sent.id, expected), ("bob", sent.id, expected)]


async def test_the_message_quota_is_taken_inside_publish(opened_of: OpenedFactory) -> None:
    """Past the burst, a publish (room or direct) raises QuotaExceeded and publishes nothing:
    no id, no delivery, no history; another user is not affected."""
    async with opened_of(user_messages_per_s=0.001, user_message_burst=2) as opened:
        broker, recorder = opened.broker, opened.recorder
        await broker.subscribe_room("r")
        first = await broker.publish("r", "u", "1", None)
        await broker.publish_direct("u", "v", "2", None)
        with pytest.raises(QuotaExceeded):
            await broker.publish("r", "u", "3", None)
        with pytest.raises(QuotaExceeded):
            await broker.publish_direct("u", "v", "4", None)
        other = await broker.publish("r", "someone-else", "5", None)
        await wait_until(lambda: len(recorder.rooms) == 2)
        assert [message_id for _, message_id, _ in recorder.rooms] == [first.id, other.id]
        assert _texts(await broker.history_since("r", first.id, 10)) == ["5"]


async def test_a_kick_reaches_the_handler(opened_of: OpenedFactory) -> None:
    async with opened_of() as opened:
        await opened.broker.kick("mallory", "spam")
        await wait_until(lambda: opened.recorder.kicks == [("mallory", "spam")])


async def test_a_payload_routed_to_a_worker_reaches_it_in_order(opened_of: OpenedFactory) -> None:
    """What the HTTP fallback routes its POSTs by: to this worker, in call order; to a worker
    nobody runs, False (except on Redis Cluster, where a publish cannot tell)."""
    async with opened_of() as opened:
        broker = opened.broker
        payloads = [orjson.dumps({"n": n}) for n in range(5)]
        for payload in payloads:
            assert await broker.route_to_worker(broker.worker_id, payload)
        await wait_until(lambda: opened.recorder.routed == payloads)
        gone = await broker.route_to_worker("0" * 12, b'{"n":9}')
        assert gone is (opened.kind == "cluster")
        assert opened.recorder.routed == payloads


async def test_the_census_holds_each_workers_latest_record(opened_of: OpenedFactory) -> None:
    """What rebalancing reads: every worker's latest record by worker id (on Redis, across
    workers: two brokers report into one census), until it is forgotten."""
    async with opened_of() as first, opened_of() as second:
        a, b = first.broker, second.broker
        assert await a.census(b"a1", 60_000) == {a.worker_id: b"a1"}
        seen = await b.census(b"b1", 60_000)
        if first.kind == "memory":  # one process: each broker is the only worker it knows
            assert seen == {b.worker_id: b"b1"}
            return
        assert seen == {a.worker_id: b"a1", b.worker_id: b"b1"}
        assert await a.census(b"a2", 60_000) == {a.worker_id: b"a2", b.worker_id: b"b1"}
        await a.forget_workers([b.worker_id])
        assert await a.census(b"a3", 60_000) == {a.worker_id: b"a3"}


async def test_history_before_pages_backwards_with_ids(broker_of: BrokerFactory) -> None:
    async with broker_of(history_size=5) as broker:
        ids = [(await broker.publish("r", "u", str(n), None)).id for n in range(8)]
        page = await broker.history_before("r", ids[7], 2)
        assert [m.id for m in page] == ids[5:7]
        assert [orjson.loads(m.payload)["text"] for m in page] == ["5", "6"]
        newest = await broker.history_before("r", None, 10)
        assert [m.id for m in newest] == ids[3:]  # history_size newest
        assert await broker.history_before("never", None, 10) == []


async def test_room_exists_once_joined_or_written(broker_of: BrokerFactory) -> None:
    async with broker_of() as broker:
        assert not await broker.room_exists("r")
        await broker.last_id("r")  # a join's
        assert await broker.room_exists("r")
        await broker.publish("s", "u", "x", None)
        assert await broker.room_exists("s")


def _texts(history: History) -> list[str]:
    return [orjson.loads(message.payload)["text"] for message in history.messages]


async def test_up_to_history_size_missed_are_recovered(broker_of: BrokerFactory) -> None:
    async with broker_of(history_size=4, recovery_max_messages=10) as broker:
        ids = [(await broker.publish("r", "u", str(n), None)).id for n in range(8)]
        missed_four = await broker.history_since("r", ids[3], 100)
        assert missed_four == History(True, missed_four.messages)
        assert [m.id for m in missed_four.messages] == ids[4:]
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
        await small.start(Recorder())
        ids = [(await small.publish("r", "u", str(n), None)).id for n in range(6)]
        await small.stop()
        large = RedisBroker(
            make_settings(redis_url=server.url, history_size=100, recovery_max_messages=100)
        )
        await large.start(Recorder())
        try:
            assert not (await large.history_since("r", ids[0], 100)).recovered
            assert _texts(await large.history_since("r", ids[3], 100)) == ["4", "5"]
        finally:
            await large.stop()
    finally:
        await server.stop()
