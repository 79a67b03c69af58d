"""A lean protocol client for load tests, on picows (WebSocket framing in Cython), so the load
generator spends its core on measuring rather than on parsing frames.

Every text frame is split on ``\\n`` into JSON objects (the server coalesces queued frames);
the server's heartbeat ``ping`` frames are answered with ``pong`` at once, whoever reads. Other
frames go to the ``on_frame`` callback when one is set (callback mode, for the hot receivers of
the fan-out scenario), else into an inbox that :func:`until` reads.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import orjson
from picows import WSFrame, WSListener, WSMsgType, WSTransport, ws_connect

Frame = dict[str, Any]
OnFrame = Callable[[Frame, float], None]
_PONG = b'{"type":"pong"}'
_PING = b'{"type":"ping"}'
# A message frame's start: Hubbub's (app.protocol.message_frame) and the tutorial baseline's
# (json.dumps, with a space); quotes in texts are escaped, so a text cannot fake one.
_MESSAGE_STARTS = (b'{"type":"message"', b'{"type": "message"')
IP_BIND_ADDRESS_NO_PORT = getattr(socket, "IP_BIND_ADDRESS_NO_PORT", 24)  # Linux >= 4.2


class Closed(ConnectionError):
    """The server closed the socket (with ``code``, None when it sent none)."""

    def __init__(self, code: int | None) -> None:
        super().__init__(f"closed with {code}")
        self.code = code


class Client(WSListener):
    """One connection to the chat server. Not thread-safe; one event loop.

    Contract: frames reach ``on_frame`` (or the inbox) in arrival order, each with its arrival
    time (``time.time()``, taken once per WebSocket frame, so comparable with timestamps that
    other processes put in messages). ``closed`` resolves, with the close code
    the server sent (None if none), once the TCP connection has ended.
    """

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.transport: WSTransport | None = None
        self.on_frame: OnFrame | None = None
        self.close_code: int | None = None
        self.closed: asyncio.Future[int | None] = self._loop.create_future()
        self._inbox: deque[Frame] = deque()
        self._arrived: asyncio.Future[None] | None = None
        self._partial = bytearray()
        # Counting mode (:meth:`count_messages`): message frames are counted, not parsed.
        self.counting = False
        self.messages_counted = 0
        self.last_counted_at = 0.0

    # -- picows callbacks --------------------------------------------------------------------

    def on_ws_connected(self, transport: WSTransport) -> None:
        self.transport = transport

    def on_ws_frame(self, transport: WSTransport, frame: WSFrame) -> None:
        kind = frame.msg_type
        if kind is WSMsgType.CLOSE:
            self.close_code = int(frame.get_close_code().value)
            transport.send_close(frame.get_close_code())
            transport.disconnect()
            return
        if kind is not WSMsgType.TEXT and kind is not WSMsgType.CONTINUATION:
            return  # control frames: picows answers WebSocket pings itself
        payload = frame.get_payload_as_bytes()
        if not frame.fin or self._partial:
            self._partial += payload
            if not frame.fin:
                return
            payload, self._partial = bytes(self._partial), bytearray()
        now = time.time()
        if self.counting:
            count = sum(payload.count(start) for start in _MESSAGE_STARTS)
            if count:
                self.messages_counted += count
                self.last_counted_at = now
            if _PING in payload:
                transport.send(WSMsgType.TEXT, _PONG)
            return
        on_frame = self.on_frame
        for line in payload.split(b"\n"):
            message: Frame = orjson.loads(line)
            if message["type"] == "ping":
                transport.send(WSMsgType.TEXT, _PONG)
            elif on_frame is not None:
                on_frame(message, now)
            else:
                self._inbox.append(message)
        if self._arrived is not None:
            self._wake()

    def on_ws_disconnected(self, transport: WSTransport) -> None:
        if not self.closed.done():
            self.closed.set_result(self.close_code)
        self._wake()

    # -- the scenarios' side -----------------------------------------------------------------

    def _wake(self) -> None:
        if self._arrived is not None and not self._arrived.done():
            self._arrived.set_result(None)

    def send(self, frame: Frame) -> None:
        """Send one JSON frame (never blocks: picows buffers it in the transport)."""
        if self.transport is not None and not self.closed.done():
            self.transport.send(WSMsgType.TEXT, orjson.dumps(frame))

    async def next_frame(self) -> Frame:
        """The oldest unread inbox frame; raises ``ConnectionError`` once closed."""
        while not self._inbox:
            if self.closed.done():
                raise Closed(self.close_code)
            self._arrived = self._loop.create_future()
            await self._arrived
        return self._inbox.popleft()

    async def stream(self, on_frame: OnFrame) -> int | None:
        """Hand every frame still unread, and every later one, to ``on_frame`` until the
        socket closes; returns the close code."""
        while self._inbox:
            on_frame(self._inbox.popleft(), time.time())
        self.on_frame = on_frame
        return await asyncio.shield(self.closed)

    def count_messages(self) -> None:
        """From now on, count message frames (``messages_counted``) instead of parsing any
        frame: a load generator's core checks every delivery of a sample of the subscribers and
        counts the rest's at C speed. Pings are still answered; other frames are dropped."""
        self._inbox.clear()
        self.counting = True

    def abort(self) -> None:
        """Drop the connection at once (a client that gave up on it)."""
        if self.transport is not None:
            self.transport.disconnect(graceful=False)

    async def close(self) -> None:
        """Close (1000) and wait, briefly, for the TCP connection to end."""
        if self.transport is not None and not self.closed.done():
            self.transport.send_close()
            self.transport.disconnect()
            await asyncio.wait([self.closed], timeout=5)


def bound_socket(source: str) -> socket.socket:
    """An unconnected TCP socket bound to address ``source`` whose port is chosen when it
    connects (``IP_BIND_ADDRESS_NO_PORT``): binding to port 0 would pick a port unused by any
    socket of ``source`` (a kernel search that slows to milliseconds with ~10k in use), instead
    of one unused towards the server only."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)
    sock.bind((source, 0))
    sock.setblocking(False)
    return sock


async def open_client(
    url: str, name: str, timeout_s: float = 30.0, source: str | None = None
) -> tuple[Client, Frame]:
    """Connect as ``name`` (from local address ``source`` when given) and read the ``hello``
    frame."""
    separator = "&" if "?" in url else "?"
    async with asyncio.timeout(timeout_s):
        _, client = await ws_connect(
            Client, f"{url}{separator}name={name}", websocket_handshake_timeout=timeout_s,
            socket_factory=None if source is None else (lambda _: bound_socket(source)),
        )  # fmt: skip
    assert isinstance(client, Client)
    try:
        hello = await until(client, "hello", timeout_s)
    except BaseException:
        client.abort()
        raise
    return client, hello


class Refused(Exception):
    """The server answered the frame awaited with an error frame (``code``)."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


async def until(client: Client, kind: str, timeout_s: float = 30.0) -> Frame:
    """Read inbox frames until one of type ``kind`` (earlier ones are dropped); an error frame
    meanwhile raises :class:`Refused`."""
    async with asyncio.timeout(timeout_s):
        while True:
            frame = await client.next_frame()
            if frame["type"] == kind:
                return frame
            if frame["type"] == "error":
                raise Refused(str(frame.get("code")))
