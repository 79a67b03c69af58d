"""Whole client text frames read without websockets' parser (app.transport.client_frames, and
HubbubWebSocketProtocol.data_received): the texts websockets and uvicorn read from the same
bytes, and every other chunk left to websockets' parser, which answers it as before."""

from __future__ import annotations

import asyncio
import random
import socket
from typing import Any

import orjson
import pytest
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.frames import Frame, Opcode
from websockets.protocol import Protocol, State
from websockets.server import ServerProtocol

from app.transport import uvicorn_seam
from app.transport.client_frames import whole_texts
from tests.helpers import make_settings, run_server, wait_until
from tests.test_direct_writes import RawReader

pytestmark = pytest.mark.timeout(60)


def frame(payload: str | bytes, opcode: Opcode = Opcode.TEXT, **options: Any) -> bytes:
    """A client frame (masked with a random key, as websockets' client sends it) unless
    ``mask=False`` is among ``options``."""
    data = payload.encode() if isinstance(payload, str) else payload
    mask = options.pop("mask", True)
    return Frame(opcode, data, **options).serialize(mask=mask)


def websockets_reads(data: bytes, max_size: int | None = 2**20) -> list[str] | None:
    """The texts websockets' server parser (as the seam starts it for frames) and uvicorn's
    decoding make of ``data``, whole messages only; None if it reads anything else or
    refuses the data."""
    conn = ServerProtocol(max_size=max_size)
    conn.state = State.OPEN
    conn.parser = Protocol.parse(conn)
    next(conn.parser)
    conn.receive_data(data)
    events = [event for event in conn.events_received() if isinstance(event, Frame)]
    if conn.parser_exc is not None or conn.reader.buffer:
        return None
    if any(event.opcode is not Opcode.TEXT or not event.fin for event in events):
        return None
    try:
        return [bytes(event.data).decode() for event in events]
    except UnicodeDecodeError:
        return None


def test_whole_text_frames_are_read_as_websockets_reads_them() -> None:
    rng = random.Random(7)
    sizes = [0, 1, 2, 125, 126, 127, 1000, 65535]
    for _ in range(200):
        texts = [
            "".join(rng.choice('aé€😀{}"') for _ in range(rng.choice(sizes) // 4))
            for _ in range(rng.randint(1, 4))
        ]
        data = b"".join(frame(text) for text in texts)
        assert whole_texts(data, 2**20) == websockets_reads(data) == texts
    exact = frame("x" * 65535)  # the largest 16-bit length, a byte at a time
    assert whole_texts(exact, 65535) == ["x" * 65535]


@pytest.mark.parametrize(
    "data",
    [
        frame(b"\x00\x01", Opcode.BINARY),
        frame(b"", Opcode.PING),
        frame(b"", Opcode.PONG),
        frame(b"\x03\xe8", Opcode.CLOSE),
        frame("first half", fin=False),
        frame("rest", Opcode.CONT),
        bytes([0x81 | 0x40]) + frame("deflated?")[1:],  # RSV1: an extension's bit
        frame("unmasked", mask=False),
        frame("x" * 65536),  # a 64-bit length
        frame(b"\xff\xfe not UTF-8"),
        frame("\ud800".encode("utf-8", "surrogatepass")),
        frame("a text") + frame(b"", Opcode.PING),
        frame("over the limit"),
    ],
    ids=lambda data: data[:2].hex(),
)
def test_any_other_chunk_is_left_to_websockets(data: bytes) -> None:
    assert whole_texts(data, 10) is None


def test_a_chunk_that_ends_inside_a_frame_is_left_to_websockets() -> None:
    first = frame("one")
    data = first + frame("two" * 50)
    for cut in range(1, len(data)):
        if cut != len(first):
            assert whole_texts(data[:cut], 2**20) is None, cut
    assert whole_texts(first, 2**20) == ["one"]
    assert whole_texts(data, 2**20) == ["one", "two" * 50]


class Counted:
    """How many chunks each path read on a live server: whole text frames read by the seam,
    and chunks given to websockets' parser (uvicorn's data_received)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.plain = self.websockets = 0
        read_by_websockets = WebSocketsSansIOProtocol.data_received

        def counted_plainly(data: bytes, max_size: int | None) -> list[str] | None:
            texts = whole_texts(data, max_size)
            self.plain += texts is not None
            return texts

        def counted_by_websockets(protocol: WebSocketsSansIOProtocol, data: bytes) -> None:
            self.websockets += 1
            read_by_websockets(protocol, data)

        monkeypatch.setattr(uvicorn_seam, "whole_texts", counted_plainly)
        monkeypatch.setattr(WebSocketsSansIOProtocol, "data_received", counted_by_websockets)


class Peer(RawReader):
    """A hand-made client socket (test_direct_writes' reader): sends raw bytes, reads the
    server's messages and its close."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__(sock)
        self.lines: list[bytes] = []  # of a text frame read, not yet taken

    async def send_raw(self, data: bytes) -> None:
        await asyncio.get_running_loop().sock_sendall(self.sock, data)

    async def typed(self, kind: str) -> dict[str, Any]:
        """The next message of ``kind`` (a text frame may hold several, one a line; others
        are skipped)."""
        while True:
            while self.lines:
                message = orjson.loads(self.lines.pop(0))
                if message["type"] == kind:
                    return dict(message)
            first, payload = await self.frame()
            if first & 0x0F == Opcode.TEXT.value:
                self.lines = payload.split(b"\n")

    async def closed_with(self) -> int:
        """The code of the close frame the server sends next."""
        while True:
            first, payload = await self.frame()
            if first & 0x0F == Opcode.CLOSE.value:
                return int.from_bytes(payload[:2], "big")


def ping() -> bytes:
    return frame(orjson.dumps({"type": "ping"}).decode())


async def test_a_live_socket_reads_whole_frames_itself_and_the_rest_through_websockets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    counted = Counted(monkeypatch)
    async with run_server(make_settings()) as live:
        peer = await Peer.open(live.port, name="alice", rcvbuf=65536)
        try:
            await peer.typed("hello")
            await peer.send_raw(ping() + ping())  # two whole frames, one chunk: read here
            await peer.typed("pong")
            await peer.typed("pong")
            assert (counted.plain, counted.websockets) == (1, 0)
            # A frame cut in two: websockets reads both halves, then whole frames come back here.
            whole = ping()
            await peer.send_raw(whole[:3])
            await wait_until(lambda: counted.websockets == 1)
            await peer.send_raw(whole[3:])
            await peer.typed("pong")
            assert counted.websockets == 2
            await peer.send_raw(ping())
            await peer.typed("pong")
            assert (counted.plain, counted.websockets) == (2, 2)
            # A control frame goes to websockets, which answers it; then back to whole frames.
            await peer.send_raw(frame(b"are you there", Opcode.PING))
            assert await peer.frame() == (0x80 | Opcode.PONG.value, b"are you there")
            await peer.send_raw(ping())
            await peer.typed("pong")
            assert (counted.plain, counted.websockets) == (3, 3)
            # Invalid UTF-8 is refused as uvicorn refuses it.
            await peer.send_raw(frame(b"\xff not UTF-8"))
            assert await peer.closed_with() == 1007
        finally:
            peer.sock.close()


async def test_a_frame_over_the_limit_is_refused_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    counted = Counted(monkeypatch)
    async with run_server(make_settings(max_frame_bytes=1024)) as live:
        peer = await Peer.open(live.port, name="bob", rcvbuf=65536)
        try:
            await peer.typed("hello")
            await peer.send_raw(frame(orjson.dumps({"type": "ping", "pad": "x" * 1100}).decode()))
            assert await peer.closed_with() == 1009
            assert counted.plain == 0
        finally:
            peer.sock.close()


async def test_frames_read_directly_pause_reading_once_too_many_wait() -> None:
    """Back-pressure, as uvicorn's after each message, but from a high-water mark: a few small
    messages waiting for the app leave the socket read; 16 waiting, or one chunk over 4 KiB,
    stop its reading until the app has taken them all (a client that sends faster than the
    app reads is held back by TCP, not buffered without bound)."""
    async with run_server(make_settings()) as live:
        peer = await Peer.open(live.port, name="alice", rcvbuf=65536)
        try:
            await peer.typed("hello")
            [conn] = live.state.hub.connections
            protocol = conn._ws.scope[uvicorn_seam.PROTOCOL_KEY]()
            assert isinstance(protocol, uvicorn_seam.HubbubWebSocketProtocol)
            # Chunks as uvloop hands them over, before the app runs (no await in between).
            for waiting in range(1, 17):
                protocol.data_received(ping())
                assert protocol.queue.qsize() == waiting
                assert protocol.read_paused is (waiting == 16), waiting
            for _ in range(16):
                await peer.typed("pong")
            await wait_until(lambda: not protocol.read_paused)
            padded = orjson.dumps({"type": "ping", "pad": "x" * 5000}).decode()
            protocol.data_received(frame(padded))
            assert protocol.read_paused and protocol.queue.qsize() == 1
            await peer.typed("pong")
            await wait_until(lambda: not protocol.read_paused)
        finally:
            peer.sock.close()
