"""Fan-out through a real Redis: across processes, recovery, presence, direct messages,
self-healing, drain, and Gunicorn."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import signal
from collections.abc import AsyncIterator
from typing import Any

import httpx2 as httpx
from redis.asyncio import Redis
from websockets.asyncio.client import connect

from app.broker.redis import RedisBroker
from app.settings import Settings
from tests.helpers import ChatClient, LiveServer, make_settings, run_server, wait_until
from tests.processes import AppProcess, RedisServer


def redis_settings(redis: RedisServer, **overrides: Any) -> Settings:
    fast = {
        "redis_url": redis.url,
        "canary_interval_s": 0.2,
        "canary_timeout_s": 1.0,
        "redis_reconnect_max_s": 0.5,
        "redis_timeout_s": 1.0,
    }
    return make_settings(**(fast | overrides))


@contextlib.asynccontextmanager
async def two_servers(
    redis: RedisServer, **overrides: Any
) -> AsyncIterator[tuple[LiveServer, LiveServer]]:
    """Two independent app instances (as two workers or pods) sharing one Redis."""
    settings = redis_settings(redis, **overrides)
    async with run_server(settings) as a, run_server(settings) as b:
        await wait_until(lambda: a.state.broker.ready and b.state.broker.ready)
        yield a, b


async def test_message_crosses_processes_in_one_order(redis_server: RedisServer) -> None:
    """Messages published through either instance reach members on both, and every member
    sees the same order."""
    async with two_servers(redis_server) as (a, b), contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(ChatClient.connect(server.ws_url(f"u{n}")))
            for n, server in enumerate([a, b, a, b])
        ]
        for client in clients:
            await client.join("hall")

        async def publish(client: ChatClient, tag: str) -> None:
            for k in range(30):
                await client.say("hall", f"{tag}{k}")

        await asyncio.gather(publish(clients[0], "a"), publish(clients[1], "b"))
        seen = [[m["text"] for m in await c.messages(60)] for c in clients]
        assert all(order == seen[0] for order in seen)
        assert [t for t in seen[0] if t[0] == "a"] == [f"a{k}" for k in range(30)]


async def test_recovery_on_the_other_process(redis_server: RedisServer) -> None:
    """A client that missed messages rejoins on the other instance with `since` and gets
    exactly the missed ones, in order, then live ones; too old a `since` is not recovered."""
    async with two_servers(redis_server, history_size=20) as (a, b):
        async with ChatClient.connect(b.ws_url("talker")) as talker:
            await talker.join("r")
            async with ChatClient.connect(a.ws_url("reader")) as reader:
                await reader.join("r")
                await talker.say("r", "seen")
                last = (await reader.expect("message"))["id"]
            for k in range(5):
                await talker.say("r", f"missed{k}")
            await talker.messages_until("missed4")
            async with ChatClient.connect(b.ws_url("reader")) as back:
                await back.send({"type": "join", "room": "r", "since": last})
                joined = await back.expect("joined")
                assert joined["recovered"] is True
                replay = await back.messages(5)
                assert [m["text"] for m in replay] == [f"missed{k}" for k in range(5)]
                await talker.say("r", "live")
                assert (await back.expect("message"))["text"] == "live"
            for k in range(30):  # push "seen" out of the 20-message history
                await talker.say("r", f"more{k}")
            await talker.messages_until("more29")  # all of them published
            async with ChatClient.connect(a.ws_url("late")) as late:
                await late.send({"type": "join", "room": "r", "since": last})
                assert (await late.expect("joined"))["recovered"] is False
                assert await late.is_responsive()  # nothing replayed


async def test_a_quiet_room_is_recovered_from_the_last_id_of_its_join(
    redis_server: RedisServer,
) -> None:
    """A join without `since` answers `last`: a client that got no message before it went
    away rejoins with it and gets what was said meanwhile, on the other instance."""
    async with two_servers(redis_server) as (a, b):
        async with ChatClient.connect(a.ws_url("quiet")) as quiet:
            await quiet.send({"type": "join", "room": "q"})
            last = (await quiet.expect("joined"))["last"]
            assert last > 0  # nothing said in q yet: where its log begins
        async with ChatClient.connect(b.ws_url("talker")) as talker:
            await talker.join("q")
            await talker.say("q", "first")
            first = (await talker.expect("message"))["id"]
            async with ChatClient.connect(a.ws_url("quiet")) as quiet:
                await quiet.send({"type": "join", "room": "q"})
                assert (await quiet.expect("joined"))["last"] == first
            await talker.say("q", "while away")
            await talker.messages_until("while away")
        async with ChatClient.connect(b.ws_url("quiet")) as back:
            await back.send({"type": "join", "room": "q", "since": last})
            assert (await back.expect("joined"))["recovered"] is True
            assert [m["text"] for m in await back.messages(2)] == ["first", "while away"]


async def test_recovery_has_no_gap_or_duplicate_under_traffic(redis_server: RedisServer) -> None:
    """Rejoining with `since` on the other instance while messages keep flowing yields every
    message exactly once, in order: no gap, no duplicate."""
    async with two_servers(redis_server) as (a, b):
        async with ChatClient.connect(a.ws_url("pub")) as pub:
            await pub.join("flow")
            stop = asyncio.Event()

            async def publish() -> int:
                n = 0
                while not stop.is_set():
                    await pub.say("flow", str(n))
                    n += 1
                    await asyncio.sleep(0.002)
                return n

            async def drain_own_echoes() -> None:
                while True:
                    await pub.next_frame(timeout=30)

            publisher = asyncio.create_task(publish())
            echoes = asyncio.create_task(drain_own_echoes())
            async with ChatClient.connect(b.ws_url("sub")) as sub:
                joined = await sub.join("flow")
                assert "recovered" not in joined
                first = await sub.messages(20)
            got = [int(m["text"]) for m in first]
            async with ChatClient.connect(a.ws_url("sub")) as sub2:
                await sub2.send({"type": "join", "room": "flow", "since": first[-1]["id"]})
                assert (await sub2.expect("joined"))["recovered"] is True
                await asyncio.sleep(0.2)  # let traffic flow across the rejoin
                stop.set()
                total = await publisher
                got += [int(m["text"]) for m in await sub2.messages(total - got[0] - len(got))]
            echoes.cancel()
            assert got == list(range(got[0], total))


async def test_presence_across_processes(redis_server: RedisServer) -> None:
    """`joined` lists users on every instance; joins and leaves are announced everywhere; a
    user with two tabs counts once and leaves only when the last tab goes."""
    async with two_servers(redis_server) as (a, b):
        async with ChatClient.connect(a.ws_url("ann")) as ann:
            await ann.join("p")
            async with ChatClient.connect(b.ws_url("bob")) as bob:
                joined = await bob.join("p")
                assert joined["users"] == ["ann", "bob"] and joined["count"] == 2
                event = await ann.presence_of("bob")  # (her own arrival is announced too)
                assert event == {
                    "type": "presence", "room": "p", "event": "join", "user": "bob", "count": 2
                }  # fmt: skip
                async with ChatClient.connect(a.ws_url("bob")) as bob_tab2:
                    assert (await bob_tab2.join("p"))["count"] == 2
                # bob's second tab left, his first is still there: no announcement.
                assert await ann.is_responsive()
            leave = await ann.presence_of("bob")
            assert leave["event"] == "leave" and leave["user"] == "bob" and leave["count"] == 1


async def test_presence_counts_only_above_threshold(redis_server: RedisServer) -> None:
    """Above presence_max_members, joined and presence frames carry counts, not names."""
    async with two_servers(redis_server, presence_max_members=1) as (a, b):
        async with ChatClient.connect(a.ws_url("x")) as x, ChatClient.connect(b.ws_url("y")) as y:
            assert (await x.join("big"))["users"] == ["x"]
            joined = await y.join("big")
            assert joined["count"] == 2 and "users" not in joined
            own = await x.expect("presence")  # x's own arrival, when the room was small
            assert own["user"] == "x" and own["count"] == 1
            assert await x.expect("presence") == {"type": "presence", "room": "big", "count": 2}


async def test_presence_of_killed_process_expires(redis_server: RedisServer) -> None:
    """When a process dies without cleaning up (SIGKILL), its users disappear from presence
    within the presence TTL and the others are told."""
    env = {"CHAT_REDIS_URL": redis_server.url, "CHAT_PRESENCE_TTL_S": "1.5"}
    doomed = AppProcess(env)
    await doomed.start()
    try:
        async with run_server(redis_settings(redis_server, presence_ttl_s=1.5)) as live:
            await wait_until(lambda: live.state.broker.ready)
            async with ChatClient.connect(live.ws_url("stays")) as stays:
                await stays.join("room")
                ghost = await connect(doomed.ws_url("ghost"))
                await ghost.send('{"type":"join","room":"room"}')
                assert (await stays.presence_of("ghost"))["event"] == "join"
                doomed.signal(signal.SIGKILL)
                await doomed.wait()
                leave = await stays.presence_of("ghost", timeout=6)
                assert leave["event"] == "leave" and leave["user"] == "ghost"
                assert (await stays.join("room"))["users"] == ["stays"]
    finally:
        await doomed.stop()


async def test_direct_messages_across_processes(redis_server: RedisServer) -> None:
    """`send` with `to` reaches every connection of that user on any instance, plus the
    sender's own connections; the sender gets an ack."""
    async with two_servers(redis_server) as (a, b):
        async with (
            ChatClient.connect(a.ws_url("amy")) as amy,
            ChatClient.connect(a.ws_url("ben")) as ben_a,
            ChatClient.connect(b.ws_url("ben")) as ben_b,
            ChatClient.connect(b.ws_url("cat")) as cat,
        ):
            await amy.say_to("ben", "psst", cid="d1")
            for client in (ben_a, ben_b):
                dm = await client.expect("message")
                assert dm["to"] == "ben" and dm["user"] == "amy" and dm["text"] == "psst"
            # With Redis the ack may come before the sender's own copy.
            own = {f["type"]: f for f in [await amy.next_frame(), await amy.next_frame()]}
            assert own["ack"]["cid"] == "d1" and own["ack"]["id"] == own["message"]["id"]
            assert await cat.is_responsive()  # cat got nothing


async def test_redis_outage_loses_nothing_silently(redis_server: RedisServer) -> None:
    """Redis is killed under steady traffic and restarted. Every send is answered by an ack or
    an error frame; acked messages are delivered live or recoverable; /readyz fails during the
    outage and recovers; rooms are resubscribed so live delivery resumes."""
    async with two_servers(redis_server) as (a, b):
        async with (
            ChatClient.connect(a.ws_url("sender")) as sender,
            ChatClient.connect(b.ws_url("receiver")) as receiver,
        ):
            await sender.join("steady")
            await receiver.join("steady")
            acked: dict[int, int] = {}  # seq -> message id
            refused: list[int] = []
            resyncs: list[str] = []
            seq = 0

            async def send_one() -> None:
                nonlocal seq
                await sender.say("steady", str(seq), cid=seq)
                while True:
                    frame = await sender.next_frame(
                        timeout=10, skip=("ping", "presence", "message")
                    )
                    if frame["type"] == "ack":
                        acked[frame["cid"]] = frame["id"]
                        break
                    if frame["type"] == "error" and frame["code"] == "resync":
                        # Redis lost its data: history is gone (and direct messages have none)
                        resyncs.append(frame.get("room") or f"to:{frame['to']}")
                        continue
                    if frame["type"] == "error":
                        assert frame["code"] == "broker_unavailable" and frame["cid"] == seq
                        refused.append(seq)
                        break
                seq += 1

            for _ in range(20):
                await send_one()
            await redis_server.kill()
            async with httpx.AsyncClient() as http:
                async with asyncio.timeout(5):
                    while (await http.get(f"{a.http_url}/readyz")).status_code != 503:
                        await send_one()
                for _ in range(5):
                    await send_one()  # sends during the outage: refused, never silently lost
                await redis_server.start()
                async with asyncio.timeout(10):
                    while (await http.get(f"{a.http_url}/readyz")).status_code != 200:
                        await asyncio.sleep(0.05)
                await wait_until(lambda: b.state.broker.ready, 10)
            for _ in range(20):
                await send_one()
            assert refused, "the outage refused no send"
            assert set(acked) | set(refused) == set(range(seq))
            # Everything acked after the restart reaches the receiver live: rooms resubscribed.
            after = [s for s in acked if s > max(refused)]
            got: list[int] = []
            async with asyncio.timeout(10):
                while max(after) not in got:
                    frame = await receiver.next_frame(skip=("ping", "presence", "error"))
                    if frame["type"] == "message":
                        got.append(int(frame["text"]))
            assert set(after) <= set(got)
            assert not set(refused) & set(got)
            # Redis came back empty, so the worker cannot prove nothing was missed: it says so,
            # for the room and for the sender's direct messages.
            assert sorted(resyncs) == ["steady", "to:sender"]


async def test_deaf_subscription_is_detected_and_healed(
    redis_server: RedisServer, redis: Redis
) -> None:
    """If a worker's subscription silently stops delivering, the canary notices, the worker
    resubscribes, delivers what its clients missed meanwhile from history, in order and once,
    and live delivery resumes."""
    async with two_servers(redis_server) as (a, b):
        broker = b.state.broker
        assert isinstance(broker, RedisBroker)
        async with (
            ChatClient.connect(a.ws_url("pub")) as pub,
            ChatClient.connect(b.ws_url("sub")) as sub,
        ):
            await pub.join("c")
            await sub.join("c")
            reconnects = broker.stats.reconnects
            # Make b's subscription deaf behind its back: the connection stays up, but Redis no
            # longer sends it anything (what a lost subscription looks like to a client).
            assert broker._subscription is not None
            await pub.say("c", "before")
            assert (await sub.expect("message"))["text"] == "before"
            broker._subscription.unsubscribe()  # from every channel
            # Once Redis has taken it (b writes it in its next loop pass, on a connection of
            # its own): only a's subscription to the room is left.
            channel = broker._room_channel("c")
            async with asyncio.timeout(5):
                while (await redis.pubsub_numsub(channel))[0][1] != 1:
                    await asyncio.sleep(0.01)
            for k in range(3):  # published fine through a, never heard live by b
                await pub.say("c", f"during{k}")
            await pub.messages_until("during2")
            await wait_until(lambda: broker.stats.reconnects > reconnects, 10)
            assert broker.stats.deaf_reconnects == broker.stats.reconnects - reconnects
            await wait_until(lambda: broker.ready, 10)
            await pub.say("c", "after")
            # Direct messages have no history: b says some may be missing.
            notice = await sub.expect("error")
            assert notice["code"] == "resync" and notice["to"] == "sub"
            # b caught up from history: the missed messages, in order, once, then live ones.
            got = [m["text"] for m in await sub.messages_until("after")]
            assert got == ["during0", "during1", "during2", "after"]


async def test_typing_reaches_the_room_on_every_server(redis_server: RedisServer) -> None:
    """``typing`` is relayed to the room's members on both instances (not to other rooms),
    is not stored, and needs membership."""
    async with (
        two_servers(redis_server) as (a, b),
        ChatClient.connect(a.ws_url("writer")) as writer,
        ChatClient.connect(b.ws_url("reader")) as reader,
        ChatClient.connect(b.ws_url("elsewhere")) as elsewhere,
    ):
        await writer.join("t")
        await reader.join("t")
        await elsewhere.join("other")
        await writer.send({"type": "typing", "room": "t"})
        assert await reader.expect("typing") == {"type": "typing", "room": "t", "user": "writer"}
        await writer.send({"type": "typing", "room": "other"})
        error = await writer.next_frame(skip=("ping", "presence", "typing"))
        assert (error["type"], error["code"], error["ref"]) == ("error", "not_joined", "typing")
        await writer.say("t", "after")  # typing frames are not part of the history
        assert (await reader.expect("message"))["text"] == "after"
        async with httpx.AsyncClient() as http:
            stored = (await http.get(f"{a.http_url}/rooms/t/messages")).json()["messages"]
        assert [m["type"] for m in stored] == ["message"]
        assert await elsewhere.is_responsive()  # nothing else was queued for it


async def test_a_burst_of_joins_waits_for_redis_connections_instead_of_failing(
    redis_server: RedisServer, redis: Redis
) -> None:
    """Sixty clients join at once while each Redis client of the worker (broker, presence,
    quotas) may open only two connections: every join is answered ``joined`` (the calls queue
    for a connection), none ``broker_unavailable``, and Redis sees a few connections, not one
    per join."""
    settings = redis_settings(redis_server, redis_pool_size=2, redis_timeout_s=5.0)
    async with run_server(settings) as live, contextlib.AsyncExitStack() as stack:
        await wait_until(lambda: live.state.broker.ready)
        clients = await asyncio.gather(
            *(
                stack.enter_async_context(ChatClient.connect(live.ws_url(f"u{n}")))
                for n in range(60)
            )
        )

        async def join(client: ChatClient, n: int) -> dict[str, Any]:
            await client.send({"type": "join", "room": f"r{n % 6}"})
            while True:
                frame = await client.next_frame(timeout=10)
                if frame["type"] in ("joined", "error"):
                    return frame

        answers = await asyncio.gather(*(join(c, n) for n, c in enumerate(clients)))
        assert [a["type"] for a in answers] == ["joined"] * 60, [
            a for a in answers if a["type"] != "joined"
        ]
        # A few pools of two, the broker's subscription, and this test's own client: not a
        # connection per join.
        clients_info = await redis.info("clients")
        assert clients_info["connected_clients"] <= 12, clients_info


async def test_periodic_scripts_are_in_redis_from_the_start(
    redis_server: RedisServer, redis: Redis
) -> None:
    """The scripts that only periodic upkeep runs (presence refresh and sweep, connection
    counts) are loaded when a worker starts: their first run, many seconds later, does not
    fail with NOSCRIPT (an exception a worker should not have to make)."""
    from app.access import quotas
    from app.presence import redis as presence

    scripts = (presence.UPKEEP, quotas.REFRESH)
    shas = [hashlib.sha1(script.encode()).hexdigest() for script in scripts]
    async with run_server(make_settings(redis_url=redis_server.url)):
        async with asyncio.timeout(10):
            while not all(await redis.script_exists(*shas)):
                await asyncio.sleep(0.05)
