"""Direct writes (app.transport.uvicorn_seam): frames written straight to the transport, the
ASGI path taking over while a transport is paused, and compressed sockets left to ASGI."""

from __future__ import annotations

import asyncio
import socket
import zlib
from typing import Self

import orjson
import pytest
from websockets.frames import Frame, Opcode

from app.transport.frames import FrameCache
from app.transport.uvicorn_seam import (
    FALLBACK_DEFLATE,
    FALLBACK_NO_PROTOCOL,
    FALLBACK_UNSUPPORTED,
)
from tests.helpers import (
    ChatClient,
    LiveServer,
    client_frame,
    make_settings,
    raw_upgrade,
    run_server,
    wait_until,
)


def test_frame_cache_encodes_each_sequence_once() -> None:
    cache = FrameCache()
    one, two, big = '{"a":1}', '{"b":2}', "é" * 40_000
    assert cache.encode([one]) is cache.encode([one])
    assert cache.encode([one, two]) is cache.encode([one, two])
    assert cache.encode([one, two]) == Frame(Opcode.TEXT, b'{"a":1}\n{"b":2}').serialize(mask=False)
    assert cache.encode([big]) == Frame(Opcode.TEXT, big.encode()).serialize(mask=False)
    cache.clear()
    assert cache.encode([one]) == b"\x81\x07" + one.encode()


class RawReader:
    """A client socket with a small receive buffer that the test reads only when it wants."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    @classmethod
    async def open(
        cls, port: int, extra_headers: bytes = b"", *, name: str = "reader", rcvbuf: int = 4096
    ) -> Self:
        sock, rest = await raw_upgrade(port, rcvbuf=rcvbuf, name=name, extra_headers=extra_headers)
        reader = cls(sock)
        reader.buffer = rest
        return reader

    async def send(self, frame: dict[str, object]) -> None:
        await asyncio.get_running_loop().sock_sendall(
            self.sock, client_frame(orjson.dumps(frame).decode())
        )

    async def _need(self, n: int) -> None:
        while len(self.buffer) < n:
            data = await asyncio.get_running_loop().sock_recv(self.sock, 65536)
            assert data, "connection closed"
            self.buffer += data

    async def frame(self) -> tuple[int, bytes]:
        """The next frame: its first byte (FIN, RSV, opcode) and its payload."""
        await self._need(2)
        length, start = self.buffer[1] & 0x7F, 2
        if length == 126:
            await self._need(4)
            length, start = int.from_bytes(self.buffer[2:4], "big"), 4
        elif length == 127:
            await self._need(10)
            length, start = int.from_bytes(self.buffer[2:10], "big"), 10
        await self._need(start + length)
        first, payload = self.buffer[0], self.buffer[start : start + length]
        self.buffer = self.buffer[start + length :]
        return first, payload


async def test_paused_reader_gets_every_message_in_order() -> None:
    """A reader that stops reading pauses the server's transport: its frames then wait in the
    outbox and leave through ASGI; once it reads again it gets every message, in order, and
    the other members get theirs directly meanwhile."""
    settings = make_settings(outbox_max_bytes=64 * 2**20, max_text_chars=8000)
    async with run_server(settings) as live:
        reader = await RawReader.open(live.port)
        try:
            await reader.send({"type": "join", "room": "r"})
            await wait_until(lambda: len(live.state.hub.members("r")) == 1)
            total, text = 2000, "x" * 4000  # 8 MB: more than the kernel buffers take
            async with ChatClient.connect(live.ws_url("pub")) as pub:
                await pub.join("r")
                for n in range(total):
                    await pub.say("r", f"{n}:{text}")
                    assert (await pub.expect("message"))["text"].startswith(f"{n}:")
            seen: list[int] = []
            while len(seen) < total:
                first, payload = await asyncio.wait_for(reader.frame(), 10)
                assert first == 0x81  # FIN, no RSV bit, text
                for line in payload.split(b"\n"):
                    message = orjson.loads(line)
                    if message["type"] == "message":
                        seen.append(int(message["text"].split(":")[0]))
            assert seen == list(range(total))
        finally:
            reader.sock.close()


async def test_compressed_sockets_are_written_through_asgi() -> None:
    """With permessage-deflate negotiated, every frame is compressed for its socket (RSV1
    set): such sockets never get the shared pre-encoded frames."""
    settings = make_settings(ws_per_message_deflate=True)
    async with run_server(settings) as live:
        reader = await RawReader.open(
            live.port, b"Sec-WebSocket-Extensions: permessage-deflate\r\n"
        )
        inflate = zlib.decompressobj(wbits=-15)  # the server keeps its context across frames

        pending: list[dict[str, object]] = []

        async def next_message() -> dict[str, object]:
            while not pending:
                first, payload = await asyncio.wait_for(reader.frame(), 5)
                assert first == 0xC1, "FIN, RSV1 (compressed), text"
                text = inflate.decompress(payload + b"\x00\x00\xff\xff")
                pending.extend(orjson.loads(line) for line in text.split(b"\n"))
            return pending.pop(0)

        try:
            assert (await next_message())["type"] == "hello"
            await reader.send({"type": "join", "room": "r"})
            assert (await next_message())["type"] == "joined"
            async with ChatClient.connect(live.ws_url("pub")) as pub:
                await pub.join("r")
                await pub.say("r", "hello " * 50)
                while (message := await next_message())["type"] != "message":
                    pass  # presence
                assert message["text"] == "hello " * 50
        finally:
            reader.sock.close()


def _fallbacks(live: LiveServer, reason: str) -> float:
    registry = live.state.metrics.registry
    return registry.get_sample_value("hubbub_transport_fallbacks_total", {"reason": reason}) or 0


def _fast_path(live: LiveServer, path: str) -> float | None:
    registry = live.state.metrics.registry
    return registry.get_sample_value("hubbub_fast_path_live", {"path": path})


async def _chat_once(live: LiveServer) -> None:
    async with (
        ChatClient.connect(live.ws_url("alice")) as alice,
        ChatClient.connect(live.ws_url("bob")) as bob,
    ):
        await alice.join("r")
        await bob.join("r")
        await alice.say("r", "hi")
        assert (await bob.expect("message"))["text"] == "hi"


@pytest.mark.parametrize("log_level", ["trace", "warning"])
async def test_connections_keep_the_fast_paths_whatever_wraps_send(log_level: str) -> None:
    """At uvicorn's TRACE level a middleware wraps the ASGI ``send`` (which used to turn
    direct writes and aborts off with only a warning): every connection still writes
    directly, and the worker reports its fast paths live."""
    async with run_server(make_settings(), log_level=log_level) as live:
        await _chat_once(live)
        assert _fast_path(live, "direct_writes") == 1
        assert _fast_path(live, "abort") == 1
        for reason in (FALLBACK_NO_PROTOCOL, FALLBACK_DEFLATE, FALLBACK_UNSUPPORTED):
            assert _fallbacks(live, reason) == 0, reason


async def test_a_server_without_our_protocol_is_counted_and_flagged() -> None:
    """Served by uvicorn's own sans-I/O protocol (not app.server.uvicorn_options), sockets
    still work through ASGI, and the fallback is counted and flagged, never silent."""
    async with run_server(make_settings(), ws="websockets-sansio") as live:
        await _chat_once(live)
        assert _fallbacks(live, FALLBACK_NO_PROTOCOL) == 2
        assert _fast_path(live, "direct_writes") == 0
        assert _fast_path(live, "abort") == 0


async def test_compressed_sockets_are_counted_as_expected_fallbacks() -> None:
    """permessage-deflate is a fallback by design: counted under its own reason, and the
    fast path stays reported live."""
    settings = make_settings(ws_per_message_deflate=True)
    async with run_server(settings) as live:
        reader = await RawReader.open(
            live.port, b"Sec-WebSocket-Extensions: permessage-deflate\r\n"
        )
        try:
            await wait_until(lambda: _fallbacks(live, FALLBACK_DEFLATE) == 1)
            assert _fast_path(live, "direct_writes") == 1
        finally:
            reader.sock.close()
