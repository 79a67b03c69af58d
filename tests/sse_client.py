"""A protocol client over the HTTP fallback transport, for tests: a
:class:`tests.helpers.FrameClient` whose socket is a :class:`loadtest.sse.SseConnection` (the
stream read with a real HTTP client), with each frame POSTed here, its number the next one or
one the test chooses.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx2 as httpx
import orjson
from websockets.exceptions import ConnectionClosed

from loadtest.sse import SseConnection
from tests.helpers import FrameClient

Frame = dict[str, Any]


class StreamClosed(Exception):
    """The stream ended before ``hello``: ``code`` and ``reason`` from its ``close`` event."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"stream closed: {code} {reason}")
        self.code, self.reason = code, reason


class SseClient(FrameClient):
    """One stream. ``post_url`` may name another server than the stream's: any may take POSTs."""

    def __init__(self, conn: SseConnection, post_url: str) -> None:
        super().__init__(conn)
        self.conn = conn
        self.post_url = post_url
        self.seq = 0  # the next POST's number

    @property
    def stream_id(self) -> str:
        return self.conn.stream_id

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls, base_url: str, first: Frame | None = None, post_url: str | None = None, **query: str
    ) -> AsyncIterator[SseClient]:
        """Open a stream on ``base_url`` (its query: ``query``, e.g. ``name``), POST ``first``
        (an ``auth`` frame) when given, and wait for ``hello``; :class:`StreamClosed` if the
        stream ends first."""
        async with httpx.AsyncClient(timeout=httpx.Timeout(10, read=None)) as http:
            conn = await SseConnection.open(http, base_url, [base_url], query)
            client = cls(conn, (post_url or base_url) + "/sse")
            try:
                if first is not None:
                    await client.send(first)
                try:
                    client.hello = await client.next_frame()
                except ConnectionClosed:
                    raise StreamClosed(conn.close_code or 1006, conn.close_reason) from None
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
        """POST ``frame``, which must be taken (202)."""
        response = await self.post(orjson.dumps(frame).decode())
        assert response.status_code == 202, (response.status_code, response.text)
