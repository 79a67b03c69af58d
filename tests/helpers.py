"""Test helpers: a real uvicorn server on a free port, and a chat client speaking the protocol."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
import uvicorn
from fastapi import FastAPI
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from app.main import create_app
from app.server import uvicorn_options
from app.settings import Settings
from app.state import ChatState

Frame = dict[str, Any]


def make_settings(**overrides: object) -> Settings:
    """Settings for tests: production defaults with a generous rate limit, plus overrides."""
    base: dict[str, object] = {
        # Tests connect as named users (?name=); the identity modes are tested on their own.
        "auth_mode": "names",
        # A departure is announced when the socket ends: tests of the grace set it themselves.
        "presence_leave_grace_s": 0.0,
        "rate_limit_frames_per_s": 10_000.0,
        "rate_limit_burst": 10_000,
        # Tests open many connections and send fast from one address and a few names.
        "ip_connections_per_s": 100_000.0,
        "ip_connection_burst": 100_000,
        "max_connections_per_user": 1_000,
        "user_messages_per_s": 100_000.0,
        "user_message_burst": 100_000,
        "user_joins_per_s": 100_000.0,
        "user_join_burst": 100_000,
        "user_new_rooms_per_s": 100_000.0,
        "user_new_room_burst": 100_000,
        "history_reads_per_s": 100_000.0,
        "history_read_burst": 100_000,
        "user_typing_per_s": 100_000.0,
        "user_typing_burst": 100_000,
        "user_reads_per_s": 100_000.0,
        "user_read_burst": 100_000,
    }
    return Settings(**(base | overrides))  # type: ignore[arg-type]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class LiveServer:
    app: FastAPI
    port: int

    @property
    def state(self) -> ChatState:
        state: ChatState = self.app.state.chat
        return state

    def ws_url(self, name: str | None = None) -> str:
        query = f"?name={name}" if name is not None else ""
        return f"ws://127.0.0.1:{self.port}/ws{query}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextlib.asynccontextmanager
async def run_server(settings: Settings, **overrides: Any) -> AsyncIterator[LiveServer]:
    """A real uvicorn server, configured like production (but for ``overrides`` of its
    uvicorn options), serving in this event loop."""
    app = create_app(settings)
    port = free_port()
    options = uvicorn_options(settings) | {"loop": "none", "log_level": "warning"} | overrides
    async with serving(app, port, stop_timeout_s=15, **options):
        yield LiveServer(app, port)


@contextlib.asynccontextmanager
async def serving(
    app: Any, port: int, stop_timeout_s: float = 10, **options: Any
) -> AsyncIterator[None]:
    """``app`` (any ASGI app) served by uvicorn on 127.0.0.1:``port`` in this event loop, from
    when it listens until the block ends (then stopped, within ``stop_timeout_s``)."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, **options))
    task = asyncio.create_task(server.serve())
    async with asyncio.timeout(10):
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
    try:
        yield
    finally:
        server.should_exit = True
        async with asyncio.timeout(stop_timeout_s):
            await task


async def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll ``condition`` until it holds; fail the test after ``timeout`` seconds."""
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


class FrameSocket(Protocol):
    """What :class:`FrameClient` reads and writes: a WebSocket client connection, or a stream
    of the HTTP fallback (``tests.sse_client``)."""

    @property
    def close_code(self) -> int | None: ...

    async def send(self, message: str) -> None: ...

    async def recv(self) -> str | bytes: ...


class FrameClient:
    """A protocol client for tests over any :class:`FrameSocket`: splits coalesced frames and
    can skip server pings. :class:`ChatClient` is the WebSocket one."""

    def __init__(self, socket: FrameSocket) -> None:
        self.socket = socket
        self._pending: deque[Frame] = deque()
        self.hello: Frame = {}

    async def send(self, frame: Frame) -> None:
        await self.socket.send(orjson.dumps(frame).decode())

    async def next_frame(
        self, timeout: float = 5.0, skip: tuple[str, ...] = ("ping", "presence")
    ) -> Frame:
        """The next server frame whose type is not in ``skip`` (by default pings and presence
        announcements, which arrive at times a test does not control)."""
        async with asyncio.timeout(timeout):
            while True:
                while not self._pending:
                    data = await self.socket.recv()
                    assert isinstance(data, str), "server frames are text"
                    self._pending.extend(orjson.loads(line) for line in data.split("\n"))
                frame = self._pending.popleft()
                if frame["type"] not in skip:
                    return frame

    async def expect(self, kind: str, timeout: float = 5.0) -> Frame:
        skip = tuple(t for t in ("ping", "presence") if t != kind)
        frame = await self.next_frame(timeout, skip)
        assert frame["type"] == kind, f"expected {kind!r}, got {frame}"
        return frame

    async def join(self, room: str) -> Frame:
        await self.send({"type": "join", "room": room})
        return await self.expect("joined")

    async def join_when_possible(self, room: str, timeout: float = 15.0) -> Frame:
        """Join ``room``, sending the join again after each ``broker_unavailable`` refusal, as
        the protocol tells clients to (such a join did not happen): right after a failover a
        worker may refuse joins until it is subscribed on the new master."""
        async with asyncio.timeout(timeout):
            while True:
                await self.send({"type": "join", "room": room})
                frame = await self.next_frame_past_direct_resync(timeout)
                if frame["type"] == "joined":
                    return frame
                assert frame.get("code") == "broker_unavailable", frame
                await asyncio.sleep(0.2)

    async def next_frame_past_direct_resync(self, timeout: float) -> Frame:
        """The next frame other than a ping, presence or ``resync`` with ``to``: the notice a
        worker sends every connection it routes direct messages to once it is subscribed again
        after losing the broker, which a connection made during the outage gets too."""
        while True:
            frame = await self.next_frame(timeout, skip=("ping", "presence"))
            if not (frame["type"] == "error" and frame.get("code") == "resync" and "to" in frame):
                return frame

    async def say(self, room: str, text: str, **extra: Any) -> None:
        await self.send({"type": "send", "room": room, "text": text, **extra})

    async def say_to(self, user: str, text: str, **extra: Any) -> None:
        await self.send({"type": "send", "to": user, "text": text, **extra})

    async def messages_until(self, text: str, timeout: float = 10.0) -> list[Frame]:
        """Message frames up to and including the first whose text is ``text``."""
        got: list[Frame] = []
        async with asyncio.timeout(timeout):
            while not got or got[-1]["text"] != text:
                got.append(await self.expect("message"))
        return got

    async def presence_of(self, user: str, timeout: float = 5.0) -> Frame:
        """The next ``presence`` frame about ``user`` (others are skipped)."""
        async with asyncio.timeout(timeout):
            while True:
                frame = await self.expect("presence", timeout)
                if frame.get("user") == user:
                    return frame

    async def messages(self, count: int, timeout: float = 5.0) -> list[Frame]:
        """The next ``count`` frames, all of which must be ``message`` frames."""
        return [await self.expect("message", timeout) for _ in range(count)]

    async def closed_with(self, timeout: float = 5.0) -> int:
        """Read until the server closes the socket; return the close code it sent."""
        async with asyncio.timeout(timeout):
            with contextlib.suppress(ConnectionClosed):
                while True:
                    await self.socket.recv()
        assert self.socket.close_code is not None
        return self.socket.close_code

    async def is_responsive(self) -> bool:
        """The socket is open and the server answers a ping."""
        await self.send({"type": "ping"})
        frame = await self.expect("pong")
        return bool(frame == {"type": "pong"})


class ChatClient(FrameClient):
    """A protocol client for tests on a WebSocket (``ws``: the websockets connection)."""

    def __init__(self, ws: ClientConnection) -> None:
        super().__init__(ws)
        self.ws = ws

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(cls, url: str, **kwargs: Any) -> AsyncIterator[ChatClient]:
        async with connect(url, open_timeout=5, close_timeout=2, **kwargs) as ws:
            client = cls(ws)
            client.hello = await client.next_frame()
            assert client.hello["type"] == "hello", client.hello
            yield client


async def send_until_acked(client: ChatClient, room: str, text: str, acks: dict[str, int]) -> None:
    """Send ``text`` in ``room`` (with ``text`` as its cid) again after each error until it is
    acked, as a client does through a failover; records its id in ``acks``."""
    while text not in acks:
        await client.say(room, text, cid=text)
        async with asyncio.timeout(15):
            while True:
                frame = await client.next_frame(15, skip=("ping", "presence", "message"))
                if frame["type"] == "ack" and frame["cid"] == text:
                    acks[text] = frame["id"]
                    return
                if frame["type"] == "error" and frame.get("cid") == text:
                    await asyncio.sleep(0.1)
                    break


async def assert_live_delivery(ws_url: Callable[[str], str], room: str, text: str) -> None:
    """Four readers and a sender connect to ``ws_url(name)`` (gunicorn spreads them over its
    workers) and join ``room`` (again after a ``broker_unavailable``, as clients do); the
    sender's ``text`` reaches every reader live."""
    async with contextlib.AsyncExitStack() as stack:
        readers = [
            await stack.enter_async_context(ChatClient.connect(ws_url(f"reader{i}")))
            for i in range(4)
        ]
        for reader in readers:
            await reader.join_when_possible(room)
        async with ChatClient.connect(ws_url("sender")) as sender:
            await sender.join_when_possible(room)
            await send_until_acked(sender, room, text, {})
        for reader in readers:
            frame = await reader.next_frame_past_direct_resync(10)
            assert frame["type"] == "message" and frame["text"] == text, frame


async def raw_upgrade(
    port: int, rcvbuf: int, name: str, extra_headers: bytes = b""
) -> tuple[socket.socket, bytes]:
    """A WebSocket client socket upgraded by hand, with a small receive buffer, that the test
    reads only when it wants to; and whatever arrived after the 101 response."""
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", port))
    await loop.sock_sendall(
        sock,
        f"GET /ws?name={name} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n".encode()
        + b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        + b"Sec-WebSocket-Version: 13\r\n"
        + extra_headers
        + b"\r\n",
    )
    response = b""
    while b"\r\n\r\n" not in response:
        response += await loop.sock_recv(sock, 4096)
    head, rest = response.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock, rest


def client_frame(text: str) -> bytes:
    """``text`` as a masked client text frame (a zero mask), up to 125 bytes."""
    payload = text.encode()
    assert len(payload) < 126
    return bytes([0x81, 0x80 | len(payload)]) + b"\x00\x00\x00\x00" + payload
