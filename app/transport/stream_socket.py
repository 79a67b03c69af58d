"""StreamSocket: one stream of the HTTP fallback transport, as a WebSocket to the session.

A stream is a server-sent-events response down and POSTs up (:mod:`app.sockets.stream` serves
both). The session (:func:`app.sockets.session.serve`) and its
:class:`~app.sockets.connection.Connection` run on it unchanged: it has the members of
Starlette's ``WebSocket`` they use (``headers``, ``query_params``, ``client``, ``accept``,
``receive``, ``send_text``, ``close``), so auth, frames, acks, limits, heartbeats and close
codes are the WebSocket's, by construction.

Up: POSTs are numbered (``Hubbub-Seq``: 0, 1, 2… per stream) and may arrive in any order, on
any worker (routed here through the broker). :meth:`post` hands their frames to ``receive`` in
number order, drops a number already taken (a retried POST), and holds at most
``posts_ahead_max`` POSTs that came before an earlier one. Frames waiting to be read are
bounded too. Past either bound the stream is closed with 1008.

Down: ``send_text`` writes one text (frames joined by ``\\n``, as a WebSocket text frame) as one
event, straight through the ASGI ``send`` of the response (uvicorn writes it to the socket
without suspending unless the socket is full: then it waits, the connection's outbox fills, and
a client that does not read is closed with 4008, exactly as a WebSocket's would be). ``close``
ends the session; :meth:`finish` then writes the last event, ``close``, with the code and
reason a WebSocket close frame would carry, and ends the response.

The response is written here rather than through a generator-based SSE response (such as
sse-starlette's): those run three tasks and a task group per stream and a cancel scope per
event, which cost this transport three times a WebSocket's memory and 2.4 times its CPU per delivery
(docs/benchmarks.md, "The HTTP fallback").
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections import deque
from typing import Any, Final

import orjson
from starlette.datastructures import Address, Headers, QueryParams
from starlette.types import Message, Receive, Scope, Send

from app.broker import Broker
from app.errors import BrokerUnavailable, CloseCode

logger = logging.getLogger(__name__)

# Close code for a client that leaves (its response ended before the server closed it).
GOING_AWAY: Final = 1001
# What the response carries: events, never cached, never buffered by a proxy (nginx reads
# X-Accel-Buffering), never compressed.
_HEADERS: Final = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-store"),
    (b"x-accel-buffering", b"no"),
]


def data_event(text: str) -> bytes:
    """An SSE event whose data is ``text`` (lines become ``data:`` lines: the client gets
    ``text`` back, its ``\\n``s included)."""
    return b"data: " + text.replace("\n", "\ndata: ").encode() + b"\n\n"


def named_event(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


class StreamSocket:
    """One stream (see the module's docstring). ``id`` is its secret name."""

    def __init__(
        self,
        scope: Scope,
        send: Send,
        stream_id: str,
        posts_ahead_max: int,
        inbound_max_frames: int,
    ) -> None:
        self.scope = scope
        self.headers = Headers(scope=scope)
        self.query_params = QueryParams(scope.get("query_string", b""))
        client = scope.get("client")
        self.client = Address(*client) if client else None
        self.id = stream_id
        self._send = send
        self._posts_ahead_max = posts_ahead_max
        self._inbound_max = inbound_max_frames
        self._inbound: deque[Message] = deque()
        self._inbound_ready: asyncio.Future[None] | None = None
        self._next_seq = 0
        self._ahead: dict[int, str] = {}
        self._last: bytes | None = None  # the close event, once closed
        self._gone = False  # the client left: nothing more can be written

    # -- the response ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Send the response's head and the ``stream`` event naming it."""
        await self._send({"type": "http.response.start", "status": 200, "headers": _HEADERS})
        await self._body(named_event("stream", {"stream": self.id}))

    async def watch(self, receive: Receive) -> None:
        """Until the client leaves (then the session sees a disconnect, 1001)."""
        while (await receive())["type"] != "http.disconnect":
            pass
        self._gone = True
        self._close_now(GOING_AWAY, "")

    async def finish(self, timeout_s: float) -> None:
        """Once the session is over: the ``close`` event and the response's end, given at most
        ``timeout_s`` to be written (a client that does not read is not waited for)."""
        self._close_now(GOING_AWAY, "")
        if self._gone:
            return
        assert self._last is not None
        with contextlib.suppress(TimeoutError, OSError, RuntimeError):
            async with asyncio.timeout(timeout_s):
                await self._body(self._last)
                await self._send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _body(self, chunk: bytes) -> None:
        await self._send({"type": "http.response.body", "body": chunk, "more_body": True})

    # -- up ------------------------------------------------------------------------------------

    def post(self, seq: int, body: str) -> None:
        """Take POST number ``seq`` (its frames, one per line), in number order."""
        if self._last is not None or seq < self._next_seq:
            return  # closed, or a POST already taken (a retry)
        if seq > self._next_seq:
            if seq not in self._ahead and len(self._ahead) >= self._posts_ahead_max:
                self.refuse("too many POSTs ahead of a missing one")
                return
            self._ahead[seq] = body
            return
        self._take(body)
        self._next_seq += 1
        while self._last is None and self._next_seq in self._ahead:
            self._take(self._ahead.pop(self._next_seq))
            self._next_seq += 1

    def _take(self, body: str) -> None:
        for line in body.split("\n"):
            if not line:
                continue
            if len(self._inbound) >= self._inbound_max:
                self.refuse("too many frames waiting to be read")
                return
            self._inbound.append({"type": "websocket.receive", "text": line})
        self._wake()

    def _wake(self) -> None:
        waiter = self._inbound_ready
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def refuse(self, reason: str) -> None:
        """Close the stream for breaking a bound (1008), dropping the frames not yet read."""
        self._close_now(CloseCode.POLICY_VIOLATION, reason)

    # -- the WebSocket members the session uses -------------------------------------------------

    async def accept(self) -> None:
        """Nothing to do: the response started when the stream opened."""

    async def receive(self) -> Message:
        """The next frame POSTed (in number order), or the disconnect once closed."""
        while not self._inbound:
            self._inbound_ready = asyncio.get_running_loop().create_future()
            await self._inbound_ready
        return self._inbound.popleft()

    async def send_text(self, text: str) -> None:
        """Write ``text`` as one event; raises RuntimeError once the stream is closed (as
        Starlette's WebSocket does)."""
        if self._last is not None:
            raise RuntimeError("the stream is closed")
        await self._body(data_event(text))

    async def close(self, code: int = 1000, reason: str | None = None) -> None:
        """End the stream with ``code`` and ``reason`` (the ``close`` event :meth:`finish`
        writes); the session sees a disconnect with ``code``."""
        self._close_now(code, reason or "")

    def _close_now(self, code: int, reason: str) -> None:
        if self._last is not None:
            return
        self._last = named_event("close", {"code": int(code), "reason": reason})
        self._inbound.clear()
        self._ahead.clear()
        self._inbound.append({"type": "websocket.disconnect", "code": int(code)})
        self._wake()

    @property
    def closed(self) -> bool:
        return self._last is not None


class Streams:
    """The streams this worker holds, by id, and the routing of POSTs between workers.

    A POST for a stream held by another worker goes to it through the broker
    (:meth:`~app.broker.Broker.route_to_worker`) with this worker's name and a number; the
    holder hands it to the stream and answers, the same way, whether it held the stream. So
    :meth:`route` tells a POST taken (True) from one for a stream that is gone (False), on
    Redis Cluster too (where a publish cannot tell whether anyone listened).
    """

    def __init__(self, broker: Broker, answer_timeout_s: float) -> None:
        self._broker = broker
        self._answer_timeout_s = answer_timeout_s
        self._held: dict[str, StreamSocket] = {}
        self._asked: dict[int, asyncio.Future[bool]] = {}
        self._numbers = itertools.count()
        self._answers: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._held)

    def add(self, stream: StreamSocket) -> None:
        self._held[stream.id] = stream

    def discard(self, stream: StreamSocket) -> None:
        self._held.pop(stream.id, None)

    def post(self, stream_id: str, seq: int, body: str) -> bool:
        """Hand a POST to the stream, if it is held here (and open)."""
        stream = self._held.get(stream_id)
        if stream is None or stream.closed:
            return False
        stream.post(seq, body)
        return True

    async def route(self, worker: str, stream_id: str, seq: int, body: str) -> bool | None:
        """Hand a POST to the stream held by ``worker``: whether it was taken, None when no
        answer came in time; raises BrokerUnavailable."""
        number = next(self._numbers)
        answer = self._asked[number] = asyncio.get_running_loop().create_future()
        routed = {"s": stream_id, "q": seq, "b": body, "r": self._broker.worker_id, "n": number}
        try:
            if not await self._broker.route_to_worker(worker, orjson.dumps(routed)):
                return False  # no such worker listens: gone
            async with asyncio.timeout(self._answer_timeout_s):
                return bool(await answer)
        except TimeoutError:
            return None
        finally:
            self._asked.pop(number, None)

    def deliver_routed(self, payload: bytes) -> None:
        """What another worker routed here: a POST for a stream (taken, then answered), or
        the answer to one this worker routed."""
        try:
            routed = orjson.loads(payload)
            if "ok" in routed:
                answer = self._asked.get(int(routed["n"]))
                if answer is not None and not answer.done():
                    answer.set_result(bool(routed["ok"]))
                return
            taken = self.post(routed["s"], int(routed["q"]), routed["b"])
            reply = orjson.dumps({"n": int(routed["n"]), "ok": taken})
            task = asyncio.ensure_future(self._answer(str(routed["r"]), reply))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            logger.warning("dropped a malformed routed POST")
            return
        self._answers.add(task)
        task.add_done_callback(self._answers.discard)

    async def _answer(self, worker: str, reply: bytes) -> None:
        with contextlib.suppress(BrokerUnavailable):  # the asker answers 503 after its wait
            await self._broker.route_to_worker(worker, reply)
