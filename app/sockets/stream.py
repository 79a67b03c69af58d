"""The HTTP fallback transport's endpoints: ``GET /sse`` opens a stream, ``POST /sse`` carries
frames up to it, from any worker or pod (docs/protocol.md, "HTTP fallback").

A stream is served by the very session a WebSocket is (:func:`app.sockets.session.serve`) on a
:class:`~app.transport.stream_socket.StreamSocket`. Its id is ``WORKER.SECRET``: the worker
holding it (the broker's :attr:`~app.broker.Broker.worker_id`) and 128 random bits. A POST
taken by another worker is routed to that one through the broker (no sticky sessions); one for
a worker that is gone, or a stream that is not held, is answered 410 and the client opens
another stream (and rejoins with ``since``).

The id is what lets a POST speak for the stream's user, so it never goes in a URL (access logs
have URLs): the stream's first event carries it, POSTs send it in ``Hubbub-Stream``.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
from typing import Final

from starlette.datastructures import Headers
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from app.errors import BrokerUnavailable
from app.sockets.session import serve
from app.state import ChatState
from app.transport.stream_socket import StreamSocket

logger = logging.getLogger(__name__)

STREAM_HEADER: Final = "hubbub-stream"
SEQ_HEADER: Final = "hubbub-seq"
_STREAM_ID = re.compile(r"[0-9a-f]{12}\.[A-Za-z0-9_-]{22}")
_MAX_SEQ: Final = 2**53  # what a JavaScript number counts to exactly


async def open_stream(scope: Scope, receive: Receive, send: Send, state: ChatState) -> None:
    """``GET /sse``: a stream, served by the session (in this task, as a WebSocket's is) until
    either side ends it."""
    settings = state.settings
    if not state.origins.allows(Headers(scope=scope)):
        state.metrics.upgrades_refused.labels("origin").inc()
        await Response(status_code=403)(scope, receive, send)
        return
    stream = StreamSocket(
        scope,
        send,
        f"{state.broker.worker_id}.{secrets.token_urlsafe(16)}",
        settings.sse_posts_ahead_max,
        settings.sse_inbound_max_frames,
    )
    await stream.start()
    watcher = asyncio.ensure_future(stream.watch(receive))
    state.streams.add(stream)
    try:
        await serve(stream, state)
    finally:
        state.streams.discard(stream)
        watcher.cancel()
        await stream.finish(settings.close_timeout_s)


async def post_frames(scope: Scope, receive: Receive, send: Send, state: ChatState) -> None:
    """``POST /sse``: frames for a stream (``Hubbub-Stream``, ``Hubbub-Seq``), one per line.
    202 taken (by this worker, or routed to the one holding the stream), 410 no such stream,
    400 or 413 a bad POST, 403 a foreign origin, 503 the broker is down (send it again)."""
    headers = Headers(scope=scope)
    try:
        response = await _answer_post(headers, receive, state)
    except _ClientGone:
        return  # before its body was whole: nothing taken, nobody to answer
    await response(scope, receive, send)


async def _answer_post(headers: Headers, receive: Receive, state: ChatState) -> Response:
    if not state.origins.allows(headers):
        return _problem(403, "origin not allowed")
    stream_id, seq_text = headers.get(STREAM_HEADER, ""), headers.get(SEQ_HEADER, "")
    if not _STREAM_ID.fullmatch(stream_id):
        return _problem(400, "Hubbub-Stream must name a stream (its `stream` event's)")
    if not seq_text.isdigit() or int(seq_text) >= _MAX_SEQ:
        return _problem(400, "Hubbub-Seq must be the POST's number: 0, 1, 2…")
    body = await _body(receive, state.settings.sse_post_max_bytes)
    if body is None:
        return _problem(413, f"a POST carries at most {state.settings.sse_post_max_bytes} bytes")
    try:
        text = body.decode()
    except UnicodeDecodeError:
        return _problem(400, "frames are UTF-8 JSON, one per line")
    seq, worker = int(seq_text), stream_id.partition(".")[0]
    taken: bool | None
    if worker == state.broker.worker_id:
        taken = state.streams.post(stream_id, seq, text)
    else:
        try:
            taken = await state.streams.route(worker, stream_id, seq, text)
        except BrokerUnavailable:
            taken = None
    if taken is None:
        return _problem(503, "cannot reach the stream now: send this POST again")
    if not taken:
        return _problem(410, "no such stream: open another (and rejoin with since)")
    return Response(status_code=202)


class _ClientGone(Exception):
    """The client left before its POST's body was whole."""


async def _body(receive: Receive, limit: int) -> bytes | None:
    """The request's body, or None past ``limit`` bytes (read no further)."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _problem(status: int, detail: str) -> Response:
    return JSONResponse({"detail": detail}, status_code=status)
