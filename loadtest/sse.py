"""The HTTP fallback transport as the load tools' clients see a WebSocket: a look-alike of the
``websockets`` client connection (``recv``, ``send``, ``async for``, ``close``,
``close_code``, :class:`~websockets.exceptions.ConnectionClosed` at the end) over one stream
(server-sent events read with httpx) and numbered POSTs, so a tool's client runs on either
transport unchanged (``make chaos`` runs a share of its clients on it).

POSTs go one at a time (so in number order), each carrying what was sent meanwhile; each goes
to one of ``post_urls`` at random (any server takes any stream's POSTs), and one that gets no
answer, or 503, goes again with its number. A 410 ends the connection (1006).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import deque
from typing import Any, Final

import httpx2 as httpx
import orjson
from websockets.exceptions import ConnectionClosed, ConnectionClosedError, ConnectionClosedOK
from websockets.frames import Close

POST_TRIES: Final = 5
POST_RETRY_S: Final = 0.2
POST_MAX_CHARS: Final = 65_536


class SseConnection:
    """One stream; open it with :meth:`open`."""

    def __init__(self, http: httpx.AsyncClient, post_urls: list[str], rng: random.Random) -> None:
        self.http = http
        self.post_urls = post_urls
        self.rng = rng
        self.stream_id = ""
        self.close_code: int | None = None
        self.close_reason = ""
        self._texts: deque[str] = deque()
        self._arrived = asyncio.Event()
        self._outgoing: list[str] = []
        self._seq = 0
        self._poster: asyncio.Task[None] | None = None
        self._reader: asyncio.Task[None] | None = None

    @classmethod
    async def open(
        cls, http: httpx.AsyncClient, base_url: str, post_urls: list[str],
        query: dict[str, str], rng: random.Random | None = None,
    ) -> SseConnection:  # fmt: skip
        """A stream of ``base_url`` (query ``query``), its POSTs to ``post_urls``; raises
        :class:`ConnectionClosed` if it is refused or names no stream within 5 s."""
        conn = cls(http, [f"{url}/sse" for url in post_urls], rng or random.Random())
        opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        conn._reader = asyncio.create_task(conn._read(f"{base_url}/sse", query, opened))
        try:
            await asyncio.wait_for(asyncio.shield(opened), 5.0)
        except BaseException:
            await conn.close()
            raise
        return conn

    async def _read(self, url: str, query: dict[str, str], opened: asyncio.Future[None]) -> None:
        code, reason = 1006, "the stream ended without a close event"
        try:
            async with self.http.stream("GET", url, params=query, timeout=None) as response:
                if response.status_code != 200:
                    code, reason = 1006, f"HTTP {response.status_code}"
                    return
                event, data = "message", []
                async for line in response.aiter_lines():
                    if line:
                        field, _, value = line.partition(":")
                        if field == "event":
                            event = value.removeprefix(" ")
                        elif field == "data":
                            data.append(value.removeprefix(" "))
                        continue
                    if event == "stream":
                        self.stream_id = orjson.loads(data[0])["stream"]
                        opened.set_result(None)
                    elif event == "close":
                        closing = orjson.loads(data[0])
                        code, reason = int(closing["code"]), str(closing["reason"])
                    else:
                        self._texts.append("\n".join(data))
                        self._arrived.set()
                    event, data = "message", []
        except (httpx.HTTPError, OSError):
            pass
        finally:
            self._ended(code, reason)
            if not opened.done():
                opened.set_exception(self._closed())

    def _ended(self, code: int, reason: str) -> None:
        if self.close_code is None:
            self.close_code, self.close_reason = code, reason
        self._arrived.set()

    def _closed(self) -> ConnectionClosed:
        close = Close(self.close_code or 1006, self.close_reason)
        if self.close_code in (1000, 1001):
            return ConnectionClosedOK(close, None)
        return ConnectionClosedError(close, None)

    async def recv(self) -> str:
        """The next event's text (frames joined by ``\\n``, as a WebSocket text frame)."""
        while not self._texts:
            if self.close_code is not None:
                raise self._closed()
            self._arrived.clear()
            await self._arrived.wait()
        return self._texts.popleft()

    def __aiter__(self) -> SseConnection:
        return self

    async def __anext__(self) -> str:
        try:
            return await self.recv()
        except ConnectionClosedOK:
            raise StopAsyncIteration from None

    async def send(self, text: str) -> None:
        """Queue ``text`` (one frame) for the next POST."""
        if self.close_code is not None:
            raise self._closed()
        self._outgoing.append(text)
        if self._poster is None or self._poster.done():
            self._poster = asyncio.create_task(self._post_all())

    async def _post_all(self) -> None:
        while self._outgoing and self.close_code is None:
            size, count = 0, 0
            while count < len(self._outgoing) and (count == 0 or size < POST_MAX_CHARS):
                size += len(self._outgoing[count]) + 1
                count += 1
            body = "\n".join(self._outgoing[:count])
            del self._outgoing[:count]
            seq, self._seq = self._seq, self._seq + 1
            status = await self._post(body, seq)
            if status != 202:
                self._ended(1006, f"a POST was answered {status}")
                if self._reader is not None:
                    self._reader.cancel()

    async def _post(self, body: str, seq: int) -> int:
        status = 0
        headers = {"Hubbub-Stream": self.stream_id, "Hubbub-Seq": str(seq)}
        for attempt in range(POST_TRIES):
            try:
                url = self.rng.choice(self.post_urls)
                response = await self.http.post(url, content=body.encode(), headers=headers)
                status = response.status_code
                if status != 503:
                    return status
            except (httpx.HTTPError, OSError):
                status = 0
            await asyncio.sleep(POST_RETRY_S * (attempt + 1))
        return status

    async def close(self, *_: Any) -> None:
        """End the stream from this side."""
        self._ended(1000, "")
        for task in (self._reader, self._poster):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
