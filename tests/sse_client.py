"""A protocol client over the HTTP fallback transport, for tests: the stream read with a real
HTTP client (its events parsed as the SSE spec says), frames POSTed with their numbers.

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

Frame = dict[str, Any]


class StreamClosed(Exception):
    """The stream ended: ``code`` and ``reason`` from its ``close`` event (1006 without one)."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"stream closed: {code} {reason}")
        self.code, self.reason = code, reason


class SseClient:
    """One stream. ``post_url`` may name another server than the stream's: any may take POSTs."""

    def __init__(self, http: httpx.AsyncClient, post_url: str) -> None:
        self.http = http
        self.post_url = post_url
        self.stream_id = ""
        self.seq = 0
        self.hello: Frame = {}
        self.closed: StreamClosed | None = None
        self.statuses: list[int] = []  # each POST's answer
        self._frames: deque[Frame] = deque()
        self._arrived = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(
        cls, base_url: str, first: Frame | None = None, post_url: str | None = None, **query: str
    ) -> AsyncIterator[SseClient]:
        """Open a stream on ``base_url`` (its query: ``query``, e.g. ``name``), POST ``first``
        (an ``auth`` frame) when given, and wait for ``hello``."""
        async with httpx.AsyncClient(timeout=httpx.Timeout(10, read=None)) as http:
            client = cls(http, (post_url or base_url) + "/sse")
            opened = asyncio.get_running_loop().create_future()
            client._reader = asyncio.create_task(client._read(base_url + "/sse", query, opened))
            try:
                await asyncio.wait_for(asyncio.shield(opened), 5)
                if first is not None:
                    await client.send(first)
                client.hello = await client.next_frame()
                assert client.hello["type"] == "hello", client.hello
                yield client
            finally:
                client._reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await client._reader

    async def _read(self, url: str, query: dict[str, str], opened: asyncio.Future[None]) -> None:
        code, reason = 1006, "the stream ended without a close event"
        try:
            async with self.http.stream("GET", url, params=query) as response:
                assert response.status_code == 200, response.status_code
                assert response.headers["content-type"].startswith("text/event-stream")
                event, data = "message", []
                async for line in response.aiter_lines():
                    if line:
                        field, _, value = line.partition(":")
                        value = value.removeprefix(" ")
                        if field == "event":
                            event = value
                        elif field == "data":
                            data.append(value)
                        continue
                    if event == "stream":
                        self.stream_id = orjson.loads(data[0])["stream"]
                        opened.set_result(None)
                    elif event == "close":
                        closing = orjson.loads(data[0])
                        code, reason = closing["code"], closing["reason"]
                    else:
                        self._frames.extend(orjson.loads(d) for d in data)
                        self._arrived.set()
                    event, data = "message", []
        except httpx.HTTPError:
            pass
        finally:
            if not opened.done():
                opened.set_exception(StreamClosed(code, reason))
            self.closed = StreamClosed(code, reason)
            self._arrived.set()

    async def post(self, body: str, seq: int | None = None) -> httpx.Response:
        """POST ``body`` as number ``seq`` (the next one by default)."""
        if seq is None:
            seq, self.seq = self.seq, self.seq + 1
        headers = {"Hubbub-Stream": self.stream_id, "Hubbub-Seq": str(seq)}
        response = await self.http.post(self.post_url, content=body.encode(), headers=headers)
        self.statuses.append(response.status_code)
        return response

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
                    if self.closed is not None:
                        raise self.closed
                    self._arrived.clear()
                    await self._arrived.wait()
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
