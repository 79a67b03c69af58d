"""A protocol client over the HTTP fallback transport, for tests: the stream read by
:class:`loadtest.sse.SseConnection` (a real HTTP client), frames POSTed here with numbers the
test may choose.

Its frame methods are :class:`tests.helpers.ChatClient`'s, so a test can chat over either.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import httpx2 as httpx
import orjson
from websockets.exceptions import ConnectionClosed

from loadtest.sse import SseConnection

Frame = dict[str, Any]


class StreamClosed(Exception):
    """The stream ended: ``code`` and ``reason`` from its ``close`` event (1006 without one)."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"stream closed: {code} {reason}")
        self.code, self.reason = code, reason


class SseClient:
    """One stream. ``post_url`` may name another server than the stream's: any may take POSTs."""

    def __init__(self, conn: SseConnection, post_url: str) -> None:
        self.conn = conn
        self.post_url = post_url
        self.seq = 0
        self.hello: Frame = {}
        self._frames: deque[Frame] = deque()

    @property
    def stream_id(self) -> str:
        return self.conn.stream_id

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(
        cls, base_url: str, first: Frame | None = None, post_url: str | None = None, **query: str
    ) -> AsyncIterator[SseClient]:
        """Open a stream on ``base_url`` (its query: ``query``, e.g. ``name``), POST ``first``
        (an ``auth`` frame) when given, and wait for ``hello``; :class:`StreamClosed` if the
        stream ends first."""
        async with httpx.AsyncClient(timeout=httpx.Timeout(10, read=None)) as http:
            try:
                conn = await SseConnection.open(http, base_url, [base_url], query)
            except ConnectionClosed:
                raise StreamClosed(1006, "no stream") from None
            client = cls(conn, (post_url or base_url) + "/sse")
            try:
                if first is not None:
                    await client.send(first)
                client.hello = await client.next_frame()
                assert client.hello["type"] == "hello", client.hello
                yield client
            finally:
                await conn.close()

    async def post(self, body: str, seq: int | None = None) -> httpx.Response:
        """POST ``body`` as number ``seq`` (the next one by default)."""
        if seq is None:
            seq, self.seq = self.seq, self.seq + 1
        headers = {"Hubbub-Stream": self.stream_id, "Hubbub-Seq": str(seq)}
        return await self.conn.http.post(self.post_url, content=body.encode(), headers=headers)

    async def send(self, frame: Frame) -> None:
        response = await self.post(orjson.dumps(frame).decode())
        assert response.status_code == 202, (response.status_code, response.text)

    async def next_frame(
        self, timeout: float = 5.0, skip: tuple[str, ...] = ("ping", "presence")
    ) -> Frame:
        """The next frame whose type is not in ``skip``; :class:`StreamClosed` once the
        stream has ended and every frame before its end was read."""
        async with asyncio.timeout(timeout):
            while True:
                while not self._frames:
                    try:
                        text = await self.conn.recv()
                    except ConnectionClosed:
                        conn = self.conn
                        raise StreamClosed(conn.close_code or 1006, conn.close_reason) from None
                    self._frames.extend(orjson.loads(line) for line in text.split("\n"))
                frame = self._frames.popleft()
                if frame["type"] not in skip:
                    return frame

    async def expect(self, kind: str, timeout: float = 5.0) -> Frame:
        skip = tuple(t for t in ("ping", "presence") if t != kind)
        frame = await self.next_frame(timeout, skip)
        assert frame["type"] == kind, f"expected {kind!r}, got {frame}"
        return frame

    async def join(self, room: str, **extra: Any) -> Frame:
        await self.send({"type": "join", "room": room, **extra})
        return await self.expect("joined")

    async def say(self, room: str, text: str, **extra: Any) -> None:
        await self.send({"type": "send", "room": room, "text": text, **extra})

    async def closing(self, timeout: float = 5.0) -> StreamClosed:
        """Skip frames until the stream's end; how it ended."""
        async with asyncio.timeout(timeout):
            while True:
                try:
                    await self.next_frame(timeout, skip=())
                except StreamClosed as closed:
                    return closed
