"""The HTTP fallback transport on real servers: a stream (server-sent events down, numbered
POSTs up) chats with WebSocket users through the same session, POSTs are taken in number
order once each whichever server they reach, and every bad POST gets a clear answer."""

from __future__ import annotations

import time
from pathlib import Path

import httpx2 as httpx
import jwt
import orjson
import pytest

from tests.helpers import ChatClient, LiveServer, make_settings, run_server, wait_until
from tests.processes import RedisServer
from tests.sse_client import SseClient, StreamClosed

pytestmark = pytest.mark.timeout(60)
SECRET = "a-stream-secret-that-is-long-enough-for-hs256"


async def test_a_stream_chats_with_a_websocket_user(server: LiveServer) -> None:
    async with (
        SseClient.open(server.http_url, name="ada") as ada,
        ChatClient.connect(server.ws_url("bob")) as bob,
    ):
        assert ada.hello["user"] == "ada" and ada.hello["limits"]["max_frame_bytes"] == 65_536
        assert server.state.hub.snapshot().sse_connections == 1
        await ada.join("lobby")
        await bob.join("lobby")
        await bob.say("lobby", "hi ada")
        assert (await ada.expect("message"))["text"] == "hi ada"
        await ada.say("lobby", "hi bob", cid="c1")
        mine = await ada.expect("message")
        ack = await ada.expect("ack")
        assert (ack["cid"], ack["id"]) == ("c1", mine["id"])
        assert [m["text"] for m in await bob.messages(2)] == ["hi ada", "hi bob"]
        # A refused frame is an error frame, as on a WebSocket; the stream goes on.
        await ada.send({"type": "send", "room": "lobby"})
        assert (await ada.expect("error"))["code"] == "bad_frame"
        await ada.send({"type": "history", "room": "lobby"})
        history = await ada.expect("history")
        assert [m["text"] for m in history["messages"]] == ["hi ada", "hi bob"]
        # Several frames in one POST, answered in order.
        await ada.post('{"type":"ping"}\n{"type":"send","room":"lobby","text":"two","cid":2}')
        assert (await ada.next_frame(skip=("presence",)))["type"] == "pong"
        assert (await ada.expect("message"))["text"] == "two"
        assert (await ada.expect("ack"))["cid"] == 2


async def test_posts_are_taken_in_number_order_once_each(server: LiveServer) -> None:
    async with SseClient.open(server.http_url, name="ada") as ada:
        await ada.join("room")

        def send(text: str) -> str:
            return orjson.dumps({"type": "send", "room": "room", "text": text}).decode()

        # Numbers 1 then 2 come before 0: held, then taken after it.
        first = ada.seq
        assert (await ada.post(send("second"), first + 1)).status_code == 202
        assert (await ada.post(send("third"), first + 2)).status_code == 202
        assert (await ada.post(send("first"), first)).status_code == 202
        # A retried POST (a number already taken) is dropped: no duplicate.
        assert (await ada.post(send("first"), first)).status_code == 202
        ada.seq = first + 3
        await ada.say("room", "fourth")
        texts = [(await ada.expect("message"))["text"] for _ in range(4)]
        assert texts == ["first", "second", "third", "fourth"]
        await ada.send({"type": "history", "room": "room"})
        history = await ada.expect("history")
        assert [m["text"] for m in history["messages"]] == texts


async def test_a_frame_too_large_closes_the_stream_with_1009() -> None:
    async with (
        run_server(make_settings(max_frame_bytes=1_024)) as live,
        SseClient.open(live.http_url, name="ada") as ada,
    ):
        await ada.say("room", "x" * 2_000)
        assert await ada.closed_with() == 1009
        assert ada.conn.close_reason == "frame too large"
        await wait_until(lambda: not live.state.hub.connections)


async def test_posts_ahead_of_a_missing_one_are_bounded() -> None:
    async with (
        run_server(make_settings(sse_posts_ahead_max=2)) as live,
        SseClient.open(live.http_url, name="ada") as ada,
    ):
        for ahead in (1, 2, 3):  # number 0 never comes
            await ada.post('{"type":"ping"}', ada.seq + ahead)
        assert await ada.closed_with() == 1008
        assert "ahead" in ada.conn.close_reason
        # Its POSTs are now answered: gone.
        assert (await ada.post('{"type":"ping"}', 0)).status_code == 410


async def test_bad_posts_get_clear_answers(server: LiveServer) -> None:
    async with (
        SseClient.open(server.http_url, name="ada") as ada,
        httpx.AsyncClient(base_url=server.http_url) as http,
    ):
        worker = ada.stream_id.partition(".")[0]
        cases: list[tuple[dict[str, str], bytes, int]] = [
            ({}, b'{"type":"ping"}', 400),
            ({"Hubbub-Stream": "nonsense", "Hubbub-Seq": "0"}, b"", 400),
            ({"Hubbub-Stream": ada.stream_id, "Hubbub-Seq": "-1"}, b"", 400),
            ({"Hubbub-Stream": ada.stream_id, "Hubbub-Seq": "one"}, b"", 400),
            ({"Hubbub-Stream": ada.stream_id, "Hubbub-Seq": str(2**53)}, b"", 400),
            ({"Hubbub-Stream": f"{worker}.{'A' * 22}", "Hubbub-Seq": "0"}, b"", 410),
            ({"Hubbub-Stream": f"{'0' * 12}.{'A' * 22}", "Hubbub-Seq": "0"}, b"", 410),
            ({"Hubbub-Stream": ada.stream_id, "Hubbub-Seq": "9"}, b"\xff\xfe", 400),
            ({"Hubbub-Stream": ada.stream_id, "Hubbub-Seq": "9"}, b"x" * 262_145, 413),
            ({"Hubbub-Stream": ada.stream_id, "Hubbub-Seq": "9",
              "Origin": "https://evil.example"}, b"", 403),
        ]  # fmt: skip
        for headers, body, status in cases:
            response = await http.post("/sse", content=body, headers=headers)
            assert response.status_code == status, (headers, response.text)
            assert response.json()["detail"], headers
        foreign = await http.get("/sse", headers={"Origin": "https://evil.example"})
        assert foreign.status_code == 403
        # None of it reached the stream, which goes on.
        await ada.send({"type": "ping"})
        assert (await ada.next_frame())["type"] == "pong"


async def test_a_stream_the_client_leaves_is_gone_from_the_server(server: LiveServer) -> None:
    async with ChatClient.connect(server.ws_url("bob")) as bob:
        await bob.join("room")
        async with SseClient.open(server.http_url, name="ada") as ada:
            await ada.join("room")
            assert (await bob.presence_of("ada"))["event"] == "join"
            stream_id = ada.stream_id
        assert (await bob.presence_of("ada"))["event"] == "leave"
        await wait_until(lambda: len(server.state.hub.connections) == 1)
        assert len(server.state.streams) == 0
        async with httpx.AsyncClient(base_url=server.http_url) as http:
            gone = await http.post("/sse", headers={"Hubbub-Stream": stream_id, "Hubbub-Seq": "9"})
            assert gone.status_code == 410


async def test_the_token_goes_in_the_first_post_and_a_ban_closes_the_stream(
    tmp_path: Path,
) -> None:
    admin = "an-admin-token-that-is-long-enough-0123456789"
    settings = make_settings(
        auth_mode="jwt", jwt_secret=SECRET, admin_token=admin, auth_timeout_s=1.0,
        database_url=f"sqlite:///{tmp_path}/chat.db",
    )  # fmt: skip
    token = jwt.encode({"sub": "ada", "exp": int(time.time()) + 120}, SECRET, "HS256")
    async with run_server(settings) as live:
        async with SseClient.open(
            live.http_url, first={"type": "auth", "token": token}, auth="frame"
        ) as ada:
            assert ada.hello["user"] == "ada"
            async with httpx.AsyncClient(base_url=live.http_url) as http:
                banned = await http.put(
                    "/admin/users/ada/ban", json={"duration_s": 60},
                    headers={"Authorization": f"Bearer {admin}"},
                )  # fmt: skip
                assert banned.status_code == 200, banned.text
            assert await ada.closed_with() == 4003
        # No auth frame in time: 4001, as on a WebSocket.
        with pytest.raises(StreamClosed) as refused:
            async with SseClient.open(live.http_url, auth="frame"):
                pass
        assert refused.value.code == 4001


async def test_posts_reach_the_stream_through_the_other_server() -> None:
    """No sticky sessions: the stream is held by one server, its POSTs go to the other, and
    are routed to it through Redis, in number order; once its server is gone, 410."""
    redis = RedisServer()
    await redis.start()
    settings = make_settings(redis_url=redis.url)
    try:
        async with run_server(settings) as two:
            async with (
                run_server(settings) as one,
                SseClient.open(one.http_url, name="ada", post_url=two.http_url) as ada,
                ChatClient.connect(two.ws_url("bob")) as bob,
            ):
                assert ada.stream_id.partition(".")[0] == one.state.broker.worker_id
                await ada.join("room")
                await bob.join("room")
                # Numbers out of order, each to the other server than the one before.
                start = ada.seq
                for n in (1, 0, 3, 2, 5, 4):
                    frame = {"type": "send", "room": "room", "text": f"m{n}", "cid": n}
                    ada.post_url = (two if n % 2 else one).http_url + "/sse"
                    response = await ada.post(orjson.dumps(frame).decode(), start + n)
                    assert response.status_code == 202, response.text
                texts = [(await bob.expect("message"))["text"] for _ in range(6)]
                assert texts == [f"m{n}" for n in range(6)]
                skip = ("ping", "presence", "message")
                acks = [(await ada.next_frame(skip=skip))["cid"] for _ in range(6)]
                assert acks == list(range(6))
                stream_id = ada.stream_id
                # The stream ends, its server lives on: the other asks it, and answers 410.
                await ada.conn.close()
                await wait_until(lambda: len(one.state.streams) == 0)
                async with httpx.AsyncClient(base_url=two.http_url) as http:
                    headers = {"Hubbub-Stream": stream_id, "Hubbub-Seq": "6"}
                    assert (await http.post("/sse", headers=headers)).status_code == 410
            # The stream's server is gone: the other answers 410 (no worker of that name).
            async with httpx.AsyncClient(base_url=two.http_url) as http:
                headers = {"Hubbub-Stream": stream_id, "Hubbub-Seq": "7"}
                assert (await http.post("/sse", headers=headers)).status_code == 410
    finally:
        await redis.stop()


async def test_the_transport_is_counted_in_the_metrics(server: LiveServer) -> None:
    async with (
        SseClient.open(server.http_url, name="ada"),
        ChatClient.connect(server.ws_url("bob")),
    ):
        state = server.state
        state.metrics.sync(state.hub.snapshot(), state.broker, None)
        registry = state.metrics.registry
        for transport, count in (("sse", 1.0), ("websocket", 1.0)):
            sample = registry.get_sample_value(
                "hubbub_connections_by_transport", {"transport": transport}
            )
            assert sample == count, transport
