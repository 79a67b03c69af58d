"""Bad input and limits over a real socket: each gets its documented answer, nothing else breaks."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from app.errors import CloseCode
from tests.helpers import (
    ChatClient,
    LiveServer,
    client_frame,
    make_settings,
    raw_upgrade,
    run_server,
    wait_until,
)
from tests.processes import AppProcess
from tests.test_direct_writes import RawReader

BAD_FRAMES: list[tuple[str, str, str]] = [
    # (id, raw text frame, expected error code)
    ("not-json", "hello", "bad_json"),
    ("truncated-json", '{"type":"join"', "bad_json"),
    ("array", '["join","r"]', "bad_frame"),
    ("number", "42", "bad_frame"),
    ("no-type", '{"room":"r"}', "bad_frame"),
    ("type-not-string", '{"type":1}', "bad_frame"),
    ("unknown-type", '{"type":"shout","room":"r"}', "unknown_type"),
    ("join-no-room", '{"type":"join"}', "bad_frame"),
    ("join-room-number", '{"type":"join","room":5}', "bad_frame"),
    ("join-room-html", '{"type":"join","room":"<b>x</b>"}', "bad_frame"),
    ("join-room-too-long", '{"type":"join","room":"' + "r" * 65 + '"}', "bad_frame"),
    ("join-room-empty", '{"type":"join","room":""}', "bad_frame"),
    ("send-no-text", '{"type":"send","room":"r"}', "bad_frame"),
    ("send-text-list", '{"type":"send","room":"r","text":["x"]}', "bad_frame"),
    ("send-bad-cid", '{"type":"send","room":"r","text":"x","cid":{"a":1}}', "bad_frame"),
    ("send-not-joined", '{"type":"send","room":"elsewhere","text":"x"}', "not_joined"),
    ("leave-not-joined", '{"type":"leave","room":"elsewhere"}', "not_joined"),
    (
        "send-text-too-long",
        '{"type":"send","room":"r","text":"' + "x" * 101 + '"}',
        "text_too_long",
    ),
    ("deep-json", "[" * 5000 + "]" * 5000, "bad_json"),
    ("huge-number", '{"type":"join","room":1' + "0" * 400 + "}", "bad_json"),
    ("nul-in-room", '{"type":"join","room":"a\\u0000b"}', "bad_frame"),
]


@pytest.fixture
async def limited() -> Any:
    async with run_server(make_settings(max_text_chars=100)) as live:
        yield live


@pytest.mark.parametrize(
    ("raw", "code"), [(r, c) for _, r, c in BAD_FRAMES], ids=[i for i, _, _ in BAD_FRAMES]
)
async def test_bad_frame_gets_error_and_connection_stays(
    limited: LiveServer, raw: str, code: str
) -> None:
    """Each malformed or refused frame gets an error frame with its code; the socket stays
    usable and another member of the same room is unaffected."""
    async with (
        ChatClient.connect(limited.ws_url("bad")) as bad,
        ChatClient.connect(limited.ws_url("good")) as good,
    ):
        await bad.join("r")
        await good.join("r")
        await bad.ws.send(raw)
        error = await bad.expect("error")
        assert error["code"] == code
        assert isinstance(error["message"], str) and error["message"]
        await bad.say("r", "still here")
        assert (await good.expect("message"))["text"] == "still here"
        assert (await bad.expect("message"))["text"] == "still here"


async def test_error_echoes_cid(server: LiveServer) -> None:
    """A refused send names the frame type and its cid, so the client can match it."""
    async with ChatClient.connect(server.ws_url("a")) as a:
        await a.say("nowhere", "x", cid="m-9")
        error = await a.expect("error")
        assert error["code"] == "not_joined"
        assert error["ref"] == "send" and error["cid"] == "m-9"


async def test_binary_frame_is_refused(server: LiveServer) -> None:
    """Binary frames get an error; the socket stays open."""
    async with ChatClient.connect(server.ws_url("a")) as a:
        await a.ws.send(b"\x00\x01binary")
        assert (await a.expect("error"))["code"] == "binary_unsupported"
        assert await a.is_responsive()


async def test_invalid_utf8_closes_1007(server: LiveServer) -> None:
    """A text frame that is not UTF-8 is a protocol error: the server closes with 1007."""
    async with ChatClient.connect(server.ws_url("a")) as a:
        # websockets refuses to send invalid UTF-8 as text, so write the raw frame ourselves.
        payload = b"\xff\xfe"
        mask = b"\x00\x00\x00\x00"
        a.ws.transport.write(bytes([0x81, 0x80 | len(payload)]) + mask + payload)
        assert await a.closed_with() == 1007
    async with ChatClient.connect(server.ws_url("b")) as b:
        assert await b.is_responsive()


async def test_oversize_frame_closes_1009() -> None:
    """A frame above max_frame_bytes closes the connection with 1009; others carry on."""
    async with run_server(make_settings(max_frame_bytes=1024)) as live:
        async with (
            ChatClient.connect(live.ws_url("big")) as big,
            ChatClient.connect(live.ws_url("ok")) as ok,
        ):
            await big.ws.send('{"type":"ping","pad":"' + "x" * 2000 + '"}')
            assert await big.closed_with() == CloseCode.MESSAGE_TOO_BIG
            assert await ok.is_responsive()


async def test_too_many_rooms() -> None:
    """Joining more than max_rooms_per_connection rooms is refused with an error."""
    async with run_server(make_settings(max_rooms_per_connection=3)) as live:
        async with ChatClient.connect(live.ws_url("a")) as a:
            for n in range(3):
                await a.join(f"r{n}")
            await a.send({"type": "join", "room": "r3"})
            error = await a.expect("error")
            assert error["code"] == "too_many_rooms" and error["ref"] == "join"
            await a.send({"type": "leave", "room": "r0"})
            await a.expect("left")
            assert (await a.join("r3"))["room"] == "r3"


async def test_rate_limit_then_policy_close() -> None:
    """Past the burst, frames get `rate_limited` errors; persisting gets a 1008 close."""
    settings = make_settings(
        rate_limit_frames_per_s=1.0, rate_limit_burst=5, rate_limit_max_violations=10
    )
    async with run_server(settings) as live:
        async with (
            ChatClient.connect(live.ws_url("spammer")) as spammer,
            ChatClient.connect(live.ws_url("calm")) as calm,
        ):
            await spammer.join("r")
            await calm.join("r")
            for n in range(4):
                await spammer.say("r", f"m{n}", cid=n)
            got = [(await spammer.next_frame())["type"] for _ in range(8)]
            assert sorted(got) == ["ack"] * 4 + ["message"] * 4  # interleaved as they come
            await spammer.say("r", "one too many", cid="x")
            error = await spammer.expect("error")
            assert error["code"] == "rate_limited" and error["cid"] == "x"
            for n in range(20):
                await spammer.say("r", f"flood{n}")
            assert await spammer.closed_with() == CloseCode.POLICY_VIOLATION
            # calm saw exactly the four accepted messages and is still served.
            assert [m["text"] for m in await calm.messages(4)] == [f"m{n}" for n in range(4)]
            assert await calm.is_responsive()


async def test_max_connections_refused_with_1013() -> None:
    """Past max_connections an upgrade is accepted and closed with 1013; a slot freed is
    usable again."""
    async with run_server(make_settings(max_connections=2)) as live:
        async with contextlib.AsyncExitStack() as stack:
            first = await stack.enter_async_context(ChatClient.connect(live.ws_url("a")))
            await stack.enter_async_context(ChatClient.connect(live.ws_url("b")))
            async with connect(live.ws_url("c")) as third:
                assert await ChatClient(third).closed_with() == CloseCode.TRY_AGAIN_LATER
            assert await first.is_responsive()
            await first.ws.close()
            await wait_until(lambda: len(live.state.hub.connections) == 1)
            async with ChatClient.connect(live.ws_url("d")) as fourth:
                assert await fourth.is_responsive()


async def test_a_worker_at_its_descriptor_limit_refuses_with_1013_and_drops_nobody() -> None:
    """Under a descriptor limit of 200 the worker caps itself at 136 sockets (64 kept for
    upgrades in flight, Redis, logs), below CHAT_MAX_CONNECTIONS (20,000), and says so: the
    sockets beyond the cap are closed with 1013, none is reset (as at the limit itself, where
    the event loop accepts and drops connections), and the worker keeps serving."""
    app = AppProcess({"CHAT_LOG_LEVEL": "warning"}, descriptor_limit=200)
    await app.start()
    try:

        async def first_answer(n: int) -> str:
            try:
                ws = await connect(app.ws_url(f"u{n}"), open_timeout=15)
            except (OSError, InvalidHandshake) as exc:
                return f"failed: {exc!r}"
            held.append(ws)
            try:
                # A text frame may carry several frames, split on "\n" (docs/protocol.md):
                # with 160 upgrades at once, hello can share one with the frame after it.
                text = await asyncio.wait_for(ws.recv(), 15)
                frame = json.loads(str(text).split("\n", 1)[0])
                return str(frame["type"])
            except ConnectionClosed as closed:
                return f"closed {closed.rcvd.code if closed.rcvd else None}"

        held: list[ClientConnection] = []
        try:
            answers = await asyncio.gather(*(first_answer(n) for n in range(160)))
            counts = collections.Counter(answers)
            assert counts == {"hello": 136, f"closed {CloseCode.TRY_AGAIN_LATER}": 24}, counts
            async with connect(app.ws_url("late")) as late:
                assert await ChatClient(late).closed_with() == CloseCode.TRY_AGAIN_LATER
        finally:
            await asyncio.gather(*(ws.close() for ws in held), return_exceptions=True)
        async with ChatClient.connect(app.ws_url("after")) as after:
            assert await after.is_responsive()
        assert "does not fit the descriptor limit (200" in app.output()
    finally:
        await app.stop()


async def test_invalid_name_closes_1008(server: LiveServer) -> None:
    """An invalid ?name= is refused with 1008 after the upgrade."""
    async with connect(server.ws_url("bad%20name<script>")) as ws:
        assert await ChatClient(ws).closed_with() == CloseCode.POLICY_VIOLATION
        assert ws.close_reason == "invalid name"


async def test_slow_consumer_closed_others_keep_up() -> None:
    """A member that never reads is dropped with 4008 once its outbox overflows, while the
    publisher and the other members receive every message, promptly."""
    settings = make_settings(
        outbox_max_bytes=16_384, close_timeout_s=0.5, max_text_chars=8000, max_frame_bytes=16_384
    )
    async with run_server(settings) as live:
        slow, _ = await raw_upgrade(live.port, rcvbuf=4096, name="slow")
        try:
            await asyncio.get_running_loop().sock_sendall(
                slow, client_frame('{"type":"join","room":"r"}')
            )
            await wait_until(lambda: len(live.state.hub.members("r")) == 1)
            (slow_conn,) = live.state.hub.members("r")
            async with (
                ChatClient.connect(live.ws_url("pub")) as pub,
                ChatClient.connect(live.ws_url("fast")) as fast,
            ):
                await pub.join("r")
                await fast.join("r")
                # Enough to fill the kernel's send buffer (it grows to a few MB) and then the
                # transport's and the outbox's: 4,000 x 4 KB = 16 MB.
                total, text = 4000, "x" * 4000
                fast_reader = asyncio.create_task(fast.messages(total, timeout=20))
                for n in range(total):  # closed loop: the publisher waits for its own echo
                    await pub.say("r", f"{n}:{text}")
                    assert (await pub.expect("message"))["text"].startswith(f"{n}:")
                got = await fast_reader
                assert [int(m["text"].split(":")[0]) for m in got] == list(range(total))
                assert slow_conn.close_code == CloseCode.SLOW_CONSUMER
                await wait_until(lambda: slow_conn not in live.state.hub.connections)
                assert all(conn.user != "slow" for conn in live.state.hub.members("r"))
        finally:
            slow.close()


async def test_slow_readers_cannot_take_a_workers_memory() -> None:
    """Readers that stop reading fill their outboxes, but all of a worker's outboxes together
    stay within CHAT_WORKER_OUTBOX_MAX_BYTES: past it the slowest are closed (4008), and a
    reader that keeps up gets every message and stays connected."""
    settings = make_settings(
        outbox_max_bytes=4 * 2**20, worker_outbox_max_bytes=6 * 2**20, max_text_chars=16_000
    )
    async with run_server(settings) as live:
        budget = live.state.hub.outbox_budget
        slow = [await RawReader.open(live.port) for _ in range(4)]
        try:
            for reader in slow:
                await reader.send({"type": "join", "room": "r"})
            async with (
                ChatClient.connect(live.ws_url("fast")) as fast,
                ChatClient.connect(live.ws_url("pub")) as pub,
            ):
                await fast.join("r")
                await pub.join("r")
                await wait_until(lambda: len(live.state.hub.members("r")) == 6)
                peak, text = 0, "x" * 15_990
                for n in range(600):  # 9.6 MB to each reader: more than the kernel buffers
                    await pub.say("r", f"{n}:{text}")
                    assert (await pub.expect("message"))["text"].startswith(f"{n}:")
                    assert (await fast.expect("message"))["text"].startswith(f"{n}:")
                    peak = max(peak, budget.used)
                assert peak <= budget.limit + 2**20  # over it for one fan-out at most
                still_open = [c for c in live.state.hub.connections if c.close_code is None]
                assert len(still_open) < 6  # slow readers were cut...
                assert await fast.is_responsive()  # ...not the one that keeps up
            for reader in slow:
                reader.sock.close()
            await wait_until(lambda: not live.state.hub.connections, 10)
            assert budget.used == 0  # every outbox gave its bytes back
        finally:
            for reader in slow:
                reader.sock.close()


def _memory_bytes(pid: int, field: str) -> int:
    """``VmRSS`` (resident now) or ``VmHWM`` (the peak) of a process, in bytes."""
    status = Path(f"/proc/{pid}/status").read_text()
    line = next(line for line in status.splitlines() if line.startswith(f"{field}:"))
    return int(line.split()[1]) * 1024


async def test_a_slow_reader_attack_leaves_a_workers_memory_bounded() -> None:
    """Ten readers that never read, each in a room of its own (so each is sent frames of its
    own, not shared ones), each allowed 16 MiB of outbox, while 9.6 MB goes to each (about
    5 MB of it beyond what the kernel buffers): the server's peak memory grows by about its
    worker budget (16 MiB here; measured 18.5 MiB), not by what the outboxes alone allow
    (measured 67 MiB with the budget out of the way)."""
    app = AppProcess(
        {
            "CHAT_OUTBOX_MAX_BYTES": str(16 * 2**20),
            "CHAT_WORKER_OUTBOX_MAX_BYTES": str(16 * 2**20),
            "CHAT_MAX_TEXT_CHARS": "16000",
            "CHAT_LOG_LEVEL": "warning",
            "CHAT_RATE_LIMIT_FRAMES_PER_S": "100000",
            "CHAT_RATE_LIMIT_BURST": "100000",
            "CHAT_HISTORY_SIZE": "10",  # the embedded broker keeps history in the process
        }
    )
    await app.start()
    readers: list[RawReader] = []
    try:
        assert app.proc is not None
        rooms = [f"r{n}" for n in range(10)]
        async with ChatClient.connect(app.ws_url("pub")) as pub:
            for room in rooms:
                await pub.join(room)
            readers = [await RawReader.open(app.port) for _ in rooms]
            for reader, room in zip(readers, rooms, strict=True):
                await reader.send({"type": "join", "room": room})
            for reader in readers:  # the joins are in
                while b'"type":"joined"' not in (await asyncio.wait_for(reader.frame(), 10))[1]:
                    pass
            before = _memory_bytes(app.proc.pid, "VmRSS")
            for n in range(600):
                for room in rooms:
                    await pub.say(room, f"{n}:{room}:" + "x" * 15_980)
                await pub.messages(len(rooms), timeout=10)
            grown = _memory_bytes(app.proc.pid, "VmHWM") - before
            assert grown < 40 * 2**20, f"grew by {grown / 2**20:.0f} MiB"
            assert await pub.is_responsive()
    finally:
        for reader in readers:
            reader.sock.close()
        await app.stop()
