"""No silent loss: each path that used to lose an acked message without a word, one test each
(issue 17), against real servers and a real redis-server.

A message is delivered (live, or by recovery), or the client is told: ``recovered:false``, a
``resync`` error frame, or an error frame answering its own ``send``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx2 as httpx
import orjson
import pytest
from redis.asyncio import Redis

from app.broker.redis import RedisBroker
from app.errors import CloseCode
from app.presence.redis import RedisPresence
from app.redisio.autopipeline import AutoPipeline
from tests.helpers import ChatClient, Frame, LiveServer, make_settings, run_server, wait_until
from tests.processes import RedisServer
from tests.test_broker_contract import Recorder
from tests.test_direct_writes import RawReader
from tests.test_redis_fanout import redis_settings, two_servers

pytestmark = pytest.mark.timeout(90)

# Nearly 4,000 (CHAT_MAX_TEXT_CHARS) four-byte characters: a message frame of about 16 KB.
LONG_TEXT = "\N{GRINNING FACE}" * 3_990


@pytest.fixture(params=["memory", "redis"])
async def chat_server(request: pytest.FixtureRequest) -> AsyncIterator[LiveServer]:
    """One server with default limits (the embedded broker, or a real Redis)."""
    if request.param == "memory":
        async with run_server(make_settings()) as live:
            yield live
        return
    redis = RedisServer()
    await redis.start()
    try:
        async with run_server(redis_settings(redis)) as live:
            await wait_until(lambda: live.state.broker.ready)
            yield live
    finally:
        await redis.stop()


async def _send_until_acked(client: ChatClient, room: str, text: str, cid: str) -> int:
    """Send with ``cid`` until acked (retrying on error frames, as the protocol says)."""
    async with asyncio.timeout(20):
        while True:
            await client.say(room, text, cid=cid)
            while True:
                frame = await client.next_frame(10, skip=("ping", "presence", "message"))
                if frame["type"] == "ack" and frame["cid"] == cid:
                    return int(frame["id"])
                if frame["type"] == "error" and frame.get("cid") == cid:
                    await asyncio.sleep(0.05)
                    break


async def test_a_replay_larger_than_the_outbox_arrives_whole(chat_server: LiveServer) -> None:
    """Missed messages worth more than CHAT_OUTBOX_MAX_BYTES (20 x 16 KB > 256 KiB) are
    replayed as the socket takes them: all of them, in order, and no 4008 close."""
    async with ChatClient.connect(chat_server.ws_url("away")) as away:
        since = (await away.join("long"))["last"]
    async with ChatClient.connect(chat_server.ws_url("talker")) as talker:
        await talker.join("long")
        for n in range(20):  # its own copies read as they come: they must not fill its outbox
            await talker.say("long", f"{n}:{LONG_TEXT}")
            await talker.messages(1, timeout=20)
    async with ChatClient.connect(chat_server.ws_url("away")) as back:
        await back.send({"type": "join", "room": "long", "since": since})
        joined = await back.expect("joined")
        assert joined["recovered"] is True
        replayed = await back.messages(20, timeout=20)
        assert [m["text"].split(":")[0] for m in replayed] == [str(n) for n in range(20)]
        assert await back.is_responsive()


async def test_two_long_replays_share_one_socket(chat_server: LiveServer) -> None:
    """Two rooms replayed to one connection at once, each worth more than the outbox: both
    arrive whole and in order (each room's replay waits for the socket in turn)."""
    rooms = ("left", "right")
    async with ChatClient.connect(chat_server.ws_url("away")) as away:
        since = {room: (await away.join(room))["last"] for room in rooms}
    async with ChatClient.connect(chat_server.ws_url("talker")) as talker:
        for room in rooms:
            await talker.join(room)
            for n in range(20):  # its own copies read as they come (see above)
                await talker.say(room, f"{n}:{LONG_TEXT}")
                await talker.messages(1, timeout=20)
    async with ChatClient.connect(chat_server.ws_url("away")) as back:
        for room in rooms:
            await back.send({"type": "join", "room": room, "since": since[room]})
        got: dict[str, list[str]] = {room: [] for room in rooms}
        joined = 0
        async with asyncio.timeout(30):
            while joined < 2 or sum(map(len, got.values())) < 40:
                frame = await back.next_frame(skip=("ping", "presence"))
                if frame["type"] == "joined":
                    assert frame["recovered"] is True
                    joined += 1
                else:
                    assert frame["type"] == "message", frame
                    got[frame["room"]].append(frame["text"].split(":")[0])
        assert got == {room: [str(n) for n in range(20)] for room in rooms}


async def test_replays_to_a_paused_reader_wait_for_it(chat_server: LiveServer) -> None:
    """A reader that does not read while two rooms are replayed to it (a 4 KB receive buffer,
    so the server's transport pauses and its outbox fills): the replays wait for the socket
    instead of overflowing the outbox (4008), and once it reads it gets both rooms whole, in
    order."""
    rooms = ("one", "two")
    async with ChatClient.connect(chat_server.ws_url("reader")) as away:
        since = {room: (await away.join(room))["last"] for room in rooms}
    async with ChatClient.connect(chat_server.ws_url("talker")) as talker:
        for room in rooms:
            await talker.join(room)
            for n in range(300):  # 5 MB a room: more than the kernel's socket buffers
                await talker.say(room, f"{n}:{LONG_TEXT}")
                await talker.expect("message")
    reader = await RawReader.open(chat_server.port)
    try:
        for room in rooms:
            await reader.send({"type": "join", "room": room, "since": since[room]})
        # Not reading: the replays fill the transport, then wait at the outbox budget.
        await wait_until(lambda: _queued(chat_server) > 0, 10)
        bound = make_settings().outbox_max_bytes // 2 + 20_000
        for _ in range(50):  # sampled for half a second: the queue never passes the bound
            assert _queued(chat_server) <= bound
            await asyncio.sleep(0.01)
        got: dict[str, list[int]] = {room: [] for room in rooms}
        async with asyncio.timeout(60):
            while sum(map(len, got.values())) < 600:
                first, payload = await reader.frame()
                assert first == 0x81, f"not a text frame: {payload[:100]!r}"
                for line in payload.split(b"\n"):
                    frame = orjson.loads(line)
                    if frame["type"] == "message":
                        got[frame["room"]].append(int(frame["text"].split(":")[0]))
        assert got == {room: list(range(300)) for room in rooms}
    finally:
        reader.sock.close()


def _queued(live: LiveServer) -> int:
    return max((conn.queued_bytes for conn in live.state.hub.connections), default=0)


async def test_a_replay_continues_live_without_gap_or_duplicate(chat_server: LiveServer) -> None:
    """Messages sent while a long replay is still going out follow it, once each, in order."""
    async with ChatClient.connect(chat_server.ws_url("away")) as away:
        since = (await away.join("busy"))["last"]
    async with (
        ChatClient.connect(chat_server.ws_url("talker")) as talker,
        ChatClient.connect(chat_server.ws_url("away")) as back,
    ):
        await talker.join("busy")
        for n in range(20):  # its own copies read as they come (see above)
            await talker.say("busy", f"old{n}:{LONG_TEXT}")
            await talker.messages(1, timeout=20)
        await back.send({"type": "join", "room": "busy", "since": since})
        for n in range(20):  # while the replay goes out
            await talker.say("busy", f"new{n}")
        assert (await back.expect("joined"))["recovered"] is True
        texts = [m["text"].split(":")[0] for m in await back.messages(40, timeout=20)]
        assert texts == [f"old{n}" for n in range(20)] + [f"new{n}" for n in range(20)]


async def test_a_room_without_messages_is_caught_up_after_a_pubsub_kill(
    redis_server: RedisServer, redis: Redis
) -> None:
    """Members joined without `since` on two instances; every pub/sub connection is killed and
    a message is sent at once (retried until acked): the other instance's member gets it."""
    async with (
        two_servers(redis_server) as (a, b),
        ChatClient.connect(a.ws_url("x")) as x,
        ChatClient.connect(b.ws_url("y")) as y,
    ):
        await x.join("quiet")
        await y.join("quiet")
        for attempt in range(3):
            await redis.client_kill_filter(_type="pubsub")
            await _send_until_acked(x, "quiet", f"m{attempt}", f"c{attempt}")
            got = await _next_message(y)
            assert got["text"] == f"m{attempt}"
            await wait_until(lambda: a.state.broker.ready and b.state.broker.ready, 10)


async def _next_message(client: ChatClient) -> Frame:
    """The next message frame, past notices that direct messages may be missing (none were
    sent in these tests)."""
    while True:
        frame = await client.next_frame(10, skip=("ping", "presence", "ack"))
        if not (frame["type"] == "error" and "to" in frame):
            assert frame["type"] == "message", frame
            return frame


async def test_repeated_pubsub_blips_lose_and_repeat_nothing(
    redis_server: RedisServer, redis: Redis
) -> None:
    """Ten pub/sub kills 100 ms apart while a message goes out every 10 ms: every member on
    both instances gets every acked message once, in order (Redis kept its data, so nothing
    needs a resync)."""
    async with (
        two_servers(redis_server) as (a, b),
        ChatClient.connect(a.ws_url("sender")) as sender,
        ChatClient.connect(a.ws_url("ra")) as ra,
        ChatClient.connect(b.ws_url("rb")) as rb,
    ):
        for client in (sender, ra, rb):
            await client.join("blips")
        acked: list[int] = []
        stop = asyncio.Event()

        async def send() -> None:
            n = 0
            while not stop.is_set():
                acked.append(await _send_until_acked(sender, "blips", str(n), f"s{n}"))
                n += 1
                await asyncio.sleep(0.01)

        async def blip() -> None:
            for _ in range(10):
                await redis.client_kill_filter(_type="pubsub")
                await asyncio.sleep(0.1)
            await wait_until(lambda: a.state.broker.ready and b.state.broker.ready, 10)
            await asyncio.sleep(0.5)
            stop.set()

        await asyncio.gather(send(), blip())
        for receiver in (ra, rb):
            ids = await _ids_until(receiver, "blips", acked[-1])
            assert ids == sorted(set(ids)), "a duplicate or out of order"
            assert set(acked) <= set(ids), f"silently lost: {sorted(set(acked) - set(ids))}"


async def _ids_until(client: ChatClient, room: str, last: int) -> list[int]:
    """Message ids of ``room`` up to ``last``; fails on a resync (Redis lost nothing here)."""
    ids: list[int] = []
    async with asyncio.timeout(15):
        while not ids or ids[-1] < last:
            frame = await _next_message(client)
            if frame["room"] == room:
                ids.append(frame["id"])
    return ids


async def _history_of(client: ChatClient, room: str, count: int) -> list[Frame]:
    await client.join(room)
    for n in range(count):
        await client.say(room, f"m{n}")
    return await client.messages(count)


@pytest.mark.parametrize("persistence", ["empty", "append-only file"])
async def test_recovery_across_a_redis_restart_never_claims_no_gap(persistence: str) -> None:
    """A Redis restart starts a new log incarnation: a rejoin with a `since` from before it is
    `recovered:false` (nothing can vouch that the last writes survived), even once new
    messages exist; a `since` from after it recovers as usual."""
    redis = RedisServer(appendonly=persistence != "empty")
    await redis.start()
    try:
        async with run_server(redis_settings(redis)) as live:
            await wait_until(lambda: live.state.broker.ready)
            async with ChatClient.connect(live.ws_url("u")) as client:
                old = await _history_of(client, "r", 3)
            await redis.kill()
            await redis.start()
            await wait_until(lambda: live.state.broker.ready, 10)
            async with ChatClient.connect(live.ws_url("u")) as client:
                await client.join("r")
                after = await _send_until_acked(client, "r", "after", "a1")
                await _send_until_acked(client, "r", "later", "a2")
            async with ChatClient.connect(live.ws_url("u")) as back:
                await back.send({"type": "join", "room": "r", "since": old[1]["id"]})
                assert (await back.expect("joined"))["recovered"] is False
                await back.send({"type": "join", "room": "r", "since": after})
                assert (await back.expect("joined"))["recovered"] is True
                assert (await back.expect("message"))["text"] == "later"
            if persistence != "empty":  # the messages themselves are still there to read
                async with httpx.AsyncClient() as http:
                    page = (await http.get(f"{live.http_url}/rooms/r/messages")).json()
                assert [m["text"] for m in page["messages"]] == ["m0", "m1", "m2", "after", "later"]
    finally:
        await redis.stop()


async def test_an_expired_room_log_is_not_recovered_from(redis_server: RedisServer) -> None:
    """When a room's log expires (CHAT_HISTORY_TTL_S), a `since` from before is not
    recovered, even once the room has new messages."""
    broker = RedisBroker(redis_settings(redis_server, history_ttl_s=0.3))
    await broker.start(Recorder())
    redis = Redis.from_url(redis_server.url)
    try:
        first = await broker.publish("r", "u", "first", None)
        async with asyncio.timeout(5):
            while await redis.exists("hubbub:{r:r}:meta", "hubbub:{r:r}:log"):
                await asyncio.sleep(0.05)
        await broker.publish("r", "u", "second", None)
        assert not (await broker.history_since("r", first.id, 100)).recovered
    finally:
        await redis.aclose()
        await broker.stop()


async def test_the_first_join_after_a_redis_restart_succeeds(redis_server: RedisServer) -> None:
    """Once /readyz says 200 again after a Redis restart, a join works at once: a command on
    a stale pooled connection is retried on a fresh one."""
    async with run_server(redis_settings(redis_server)) as live:
        await wait_until(lambda: live.state.broker.ready)
        async with ChatClient.connect(live.ws_url("u")) as client:
            for room in ("r1", "r2", "r3"):  # several pooled connections
                await client.join(room)
            await redis_server.kill()
            await redis_server.start()
            await wait_until(lambda: live.state.broker.ready, 10)
            for room in ("n1", "n2", "n3"):
                await client.send({"type": "join", "room": room})
                frame = await client.next_frame(5, skip=("ping", "presence", "error"))
                assert frame["type"] == "joined", frame


async def test_a_refused_rejoin_leaves_the_client_in_the_room() -> None:
    """A rejoin with `since` refused by the join quota changes nothing: the client is still
    in the room (it gets the next message and may leave it)."""
    settings = make_settings(user_joins_per_s=0.01, user_join_burst=1)
    async with (
        run_server(settings) as live,
        ChatClient.connect(live.ws_url("u")) as client,
        ChatClient.connect(live.ws_url("v")) as other,
    ):
        last = (await client.join("r"))["last"]
        await client.send({"type": "join", "room": "r", "since": last})
        refused = await client.expect("error")
        assert refused["code"] == "rate_limited"
        await other.join("r")
        await other.say("r", "still here?")
        assert (await client.expect("message"))["text"] == "still here?"
        await client.send({"type": "leave", "room": "r"})
        assert (await client.expect("left"))["room"] == "r"


async def test_a_kick_reaches_a_worker_that_did_not_hear_it(redis_server: RedisServer) -> None:
    """A kick published while a worker's subscription is deaf is applied when the worker is
    subscribed again: the user's connection there is closed with 4003."""
    token = "t" * 32
    async with two_servers(redis_server, admin_token=token) as (a, b):
        broker = b.state.broker
        assert isinstance(broker, RedisBroker)
        async with ChatClient.connect(b.ws_url("troll")) as troll:
            await troll.join("r")
            reconnects = broker.stats.reconnects
            assert broker._subscription is not None
            broker._subscription.unsubscribe()  # deaf: b hears nothing from now on
            async with httpx.AsyncClient() as http:
                kicked = await http.post(
                    f"{a.http_url}/admin/users/troll/kick",
                    headers={"Authorization": f"Bearer {token}"},
                )
            assert kicked.status_code == 202
            await wait_until(lambda: broker.stats.reconnects > reconnects, 10)
            assert await troll.closed_with(10) == CloseCode.FORBIDDEN
        # A connection opened after the kick is not affected by it.
        async with ChatClient.connect(b.ws_url("troll")) as again:
            await again.join("r")
            assert await again.is_responsive()


async def test_a_broker_stopping_with_redis_down_still_cleans_up(
    redis_server: RedisServer,
) -> None:
    """Stopping while Redis is down (withdrawing presence fails) still runs the rest of the
    cleanup: the pipeline is closed, and neither stop() raises."""
    broker = RedisBroker(redis_settings(redis_server))
    presence = RedisPresence(redis_settings(redis_server), broker)
    await broker.start(Recorder())
    await presence.start()
    await wait_until(lambda: broker.ready)
    await presence.join("r", "u")
    await redis_server.kill()
    await presence.stop()
    await broker.stop()
    assert isinstance(broker._pipeline, AutoPipeline) and broker._pipeline._closed
