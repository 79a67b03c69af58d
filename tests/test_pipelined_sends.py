"""A connection's ``send`` frames are pipelined (``CHAT_SENDS_IN_FLIGHT_MAX``): published together,
in the order they came, answered in that order; any other frame waits for them."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from app.broker import Published
from app.broker.memory import MemoryBroker
from app.broker.redis import RedisBroker
from app.broker.redis_scripts import MESSAGE_KEYS
from app.errors import BrokerUnavailable, CloseCode, QuotaExceeded
from app.redisio.autopipeline import AutoPipeline
from tests.helpers import ChatClient, LiveServer, make_settings, run_server, wait_until
from tests.processes import RedisServer
from tests.test_redis_fanout import redis_settings

pytestmark = pytest.mark.timeout(60)
SENDS = 200


@pytest.fixture(params=["memory", "redis"])
async def server_for(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    redis = RedisServer() if request.param == "redis" else None
    if redis is not None:
        await redis.start()

    @contextlib.asynccontextmanager
    async def serve(**overrides: Any) -> AsyncIterator[LiveServer]:
        if redis is None:
            settings = make_settings(**overrides)
        else:
            settings = redis_settings(redis, **overrides)
        async with run_server(settings) as live:
            await wait_until(lambda: live.state.broker.ready)
            yield live

    try:
        yield serve
    finally:
        if redis is not None:
            await redis.stop()


async def test_sends_keep_their_order_and_their_answers_order(server_for: Any) -> None:
    """200 sends written at once, every tenth refused (too long): the acks and errors come
    back in the order of the frames, the ids grow in that order, and a member receives the
    messages in it."""
    async with (
        server_for(max_text_chars=50) as live,
        ChatClient.connect(live.ws_url("reader")) as reader,
        ChatClient.connect(live.ws_url("writer")) as writer,
    ):
        await reader.join("r")
        await writer.join("r")
        for n in range(SENDS):
            text = "x" * 51 if n % 10 == 9 else f"m{n}"
            await writer.say("r", text, cid=n)
        answers = [
            await writer.next_frame(skip=("ping", "presence", "message")) for _ in range(SENDS)
        ]
        assert [a.get("cid") for a in answers] == list(range(SENDS))
        assert [a["type"] for a in answers] == [
            "error" if n % 10 == 9 else "ack" for n in range(SENDS)
        ]
        ids = [a["id"] for a in answers if a["type"] == "ack"]
        assert ids == sorted(ids) and len(set(ids)) == len(ids)
        got = await reader.messages(len(ids))
        assert [m["id"] for m in got] == ids
        assert [m["text"] for m in got] == [f"m{n}" for n in range(SENDS) if n % 10 != 9]


async def test_other_frames_wait_for_the_sends_before_them(server_for: Any) -> None:
    """Sends then a leave: every send is acked before `left`, so each was published while
    the sender was in the room; a send after the leave is refused `not_joined`."""
    async with server_for() as live, ChatClient.connect(live.ws_url("w")) as writer:
        await writer.join("r")
        for n in range(20):
            await writer.say("r", f"m{n}", cid=n)
        await writer.send({"type": "leave", "room": "r"})
        await writer.say("r", "late", cid="late")
        kinds = [
            (await writer.next_frame(skip=("ping", "presence", "message")))["type"]
            for _ in range(22)
        ]
        assert kinds == ["ack"] * 20 + ["left", "error"]


async def test_sends_past_the_quota_are_refused_in_their_turn(server_for: Any) -> None:
    """A burst past the message quota: the broker refuses the sends past the burst (the
    Redis script, or the embedded broker's bucket), each answered ``rate_limited`` in its
    place among the acks, with its cid; a member gets only the published ones; the
    connection goes on."""
    burst = 5
    async with (
        server_for(user_messages_per_s=0.01, user_message_burst=burst) as live,
        ChatClient.connect(live.ws_url("reader")) as reader,
        ChatClient.connect(live.ws_url("writer")) as writer,
    ):
        await reader.join("r")
        await writer.join("r")
        for n in range(burst + 3):
            await writer.say("r", f"m{n}", cid=n)
        answers = [
            await writer.next_frame(skip=("ping", "presence", "message")) for _ in range(burst + 3)
        ]
        assert [a.get("cid") for a in answers] == list(range(burst + 3))
        assert [a.get("code", a["type"]) for a in answers] == (
            ["ack"] * burst + ["rate_limited"] * 3
        )
        got = await reader.messages(burst)
        assert [m["text"] for m in got] == [f"m{n}" for n in range(burst)]
        await writer.send({"type": "ping"})
        assert (await writer.next_frame(skip=("presence", "message")))["type"] == "pong"


async def test_sends_redis_does_not_answer_are_refused_in_order(
    redis_server: RedisServer,
) -> None:
    """Redis stops answering (SIGSTOP) with sends in flight: once its timeout passes, each is
    answered ``broker_unavailable``, in order, and counted as a failed publish; the
    connection stays open, and sends are acked again once Redis is back."""
    settings = redis_settings(redis_server, redis_timeout_s=1, canary_timeout_s=30)
    async with run_server(settings) as live, ChatClient.connect(live.ws_url("w")) as writer:
        await wait_until(lambda: live.state.broker.ready)
        await writer.join("r")
        await writer.say("r", "first", cid="first")
        first = await writer.next_frame(skip=("ping", "presence", "message"))
        assert (first["type"], first["cid"]) == ("ack", "first")
        failures = live.state.metrics.publish_failures
        failed_before = failures._value.get()
        assert redis_server.proc is not None
        redis_server.proc.send_signal(signal.SIGSTOP)
        try:
            for n in range(6):
                await writer.say("r", f"m{n}", cid=n)
            answers = [
                await writer.next_frame(skip=("ping", "presence", "message")) for _ in range(6)
            ]
        finally:
            redis_server.proc.send_signal(signal.SIGCONT)
        assert [(a.get("code"), a.get("cid")) for a in answers] == [
            ("broker_unavailable", n) for n in range(6)
        ]
        assert failures._value.get() - failed_before == 6
        await wait_until(lambda: live.state.broker.ready, timeout=20)

        async def acked_again() -> bool:
            await writer.say("r", "back", cid="back")
            answer = await writer.next_frame(skip=("ping", "presence", "message"))
            return bool(answer["type"] == "ack")

        async with asyncio.timeout(20):
            while not await acked_again():
                await asyncio.sleep(0.1)


@pytest.mark.parametrize("limit", [1, 4])
async def test_at_most_the_limit_of_sends_is_in_flight(
    redis_server: RedisServer, limit: int
) -> None:
    """With Redis paused, a connection that sent 10 frames has exactly
    CHAT_SENDS_IN_FLIGHT_MAX of them waiting on Redis (1: each waits for the one before);
    once Redis resumes all 10 are acked, in order."""
    settings = redis_settings(
        redis_server, sends_in_flight_max=limit, redis_timeout_s=5, canary_timeout_s=8
    )
    async with run_server(settings) as live, ChatClient.connect(live.ws_url("w")) as writer:
        await wait_until(lambda: live.state.broker.ready)
        await writer.join("r")
        await writer.say("r", "first", cid="first")  # the pipeline's connection is open
        first = await writer.next_frame(skip=("ping", "presence", "message"))
        assert (first["type"], first["cid"]) == ("ack", "first")
        broker = live.state.broker
        assert isinstance(broker, RedisBroker)
        assert redis_server.proc is not None
        redis_server.proc.send_signal(signal.SIGSTOP)
        try:
            for n in range(10):
                await writer.say("r", f"m{n}", cid=n)

            pipeline = broker._pipeline
            assert isinstance(pipeline, AutoPipeline)

            def in_flight() -> int:
                """Messages waiting on Redis (the sends of one loop iteration share one
                script call: its own keys for each message, then the shared keys if the
                deployment uses them, see redis_scripts.PUBLISH)."""
                replies = pipeline._replies
                waiting = [] if replies is None else replies._waiting
                return sum(
                    (call[0][2] - broker._shared_keys) // MESSAGE_KEYS
                    for call, _ in waiting
                    if call[0][0] == "FCALL"  # the publishing library's (redis_scripts)
                )

            await wait_until(lambda: in_flight() == limit)
            await asyncio.sleep(0.2)  # and no more come: the rest wait in the session
            assert in_flight() == limit
        finally:
            redis_server.proc.send_signal(signal.SIGCONT)
        for n in range(10):
            ack = await writer.next_frame(skip=("ping", "presence", "message"))
            assert (ack["type"], ack["cid"]) == ("ack", n)


async def test_a_burst_of_sends_leaves_coalesced() -> None:
    """60 sends read together (one TCP write) with the embedded broker are published at once
    and reach a member in a few coalesced WebSocket frames, not one frame each: a fan-out's
    throughput depends on it (issue 42: a send waiting a loop iteration for the one before
    it cut one-room fan-out 10x)."""
    burst = 60
    async with (
        run_server(make_settings()) as live,
        ChatClient.connect(live.ws_url("reader")) as reader,
        ChatClient.connect(live.ws_url("writer")) as writer,
    ):
        await reader.join("r")
        await writer.join("r")
        frames = [
            orjson.dumps({"type": "send", "room": "r", "text": f"m{n}"}).decode()
            for n in range(burst)
        ]
        # One write of 60 frames: the server reads them in one go.
        await writer.ws.send(frames[0])  # warm: the writer's first frame alone
        got = await reader.expect("message")
        assert got["text"] == "m0"
        protocol = writer.ws.protocol
        for text in frames[1:]:
            protocol.send_text(text.encode())
        writer.ws.transport.write(b"".join(protocol.data_to_send()))
        texts: list[str] = []
        ws_frames = 0
        async with asyncio.timeout(5):
            while len(texts) < burst - 1:
                data = await reader.ws.recv()
                assert isinstance(data, str)
                ws_frames += 1
                texts += [
                    m["text"] for m in map(orjson.loads, data.split("\n")) if m["type"] == "message"
                ]
        assert texts == [f"m{n}" for n in range(1, burst)]
        assert ws_frames <= 3, f"{burst - 1} messages came in {ws_frames} frames"


async def test_a_bug_in_a_publish_closes_that_connection_only() -> None:
    """A publish that fails unexpectedly (a bug, made here by hand) closes its connection with
    1011 and answers nothing; every other connection goes on."""
    async with (
        run_server(make_settings()) as live,
        ChatClient.connect(live.ws_url("other")) as other,
        ChatClient.connect(live.ws_url("w")) as writer,
    ):
        await other.join("r")
        await writer.join("r")
        broker = live.state.broker
        assert isinstance(broker, MemoryBroker)
        publish = broker._publish_message

        def fails_for_w(conversation: str, user: str, *args: Any, **kwargs: Any) -> Any:
            if user == "w":
                raise RuntimeError("a bug in the broker")
            return publish(conversation, user, *args, **kwargs)

        broker._publish_message = fails_for_w  # type: ignore[method-assign]
        await writer.say("r", "lost", cid=1)
        assert await writer.closed_with() == CloseCode.INTERNAL_ERROR
        await other.say("r", "still here", cid=2)
        ack = await other.next_frame(skip=("ping", "presence", "message"))
        assert (ack["type"], ack["cid"]) == ("ack", 2)


async def test_every_reply_to_a_pipelined_send_answers_it_once() -> None:
    """The callback that maps a publishing script's reply to a pipelined send answers it once
    whatever the reply: a message published, a duplicate, a refusal, a reply that is not the
    script's, an error, a cancelled call (the send is never left unanswered)."""
    broker = RedisBroker(make_settings(redis_url="redis://127.0.0.1:1"))
    loop = asyncio.get_running_loop()
    outcomes: list[Any] = []
    for result in ([b"7", 0, 9], [b"7", 1, 0], [0, 2, 0], [b"oops"], None):
        reply: asyncio.Future[Any] = loop.create_future()
        reply.set_result(result)
        broker._answer(outcomes.append, "r", "u", reply)
    failed: asyncio.Future[Any] = loop.create_future()
    failed.set_exception(ConnectionError("lost"))
    broker._answer(outcomes.append, "r", "u", failed)
    cancelled: asyncio.Future[Any] = loop.create_future()
    cancelled.cancel()
    broker._answer(outcomes.append, "r", "u", cancelled)
    assert len(outcomes) == 7, outcomes
    assert outcomes[0] == Published(7, 9, duplicate=False), outcomes
    assert outcomes[1] == Published(7, 0, duplicate=True), outcomes
    assert isinstance(outcomes[2], QuotaExceeded), outcomes
    assert all(isinstance(outcome, Exception) for outcome in outcomes[3:]), outcomes
    assert isinstance(outcomes[6], BrokerUnavailable), outcomes
