"""Connection: one client WebSocket as the rest of the server sees it.

It owns the socket's outbound side: a bounded :class:`~app.transport.outbox.Outbox`, written by
the worker's :class:`~app.transport.flusher.Flusher` at the end of the loop iteration in which
frames were offered, straight to the transport when it can (:mod:`app.transport.uvicorn_seam`).
A write that the socket takes at once (nearly all) needs no task; only a write that must wait
for a paused transport gets one, until the outbox is empty (an idle connection has no task of
its own). The inbound side, and so the socket's lifetime, belongs to :mod:`app.sockets.session`.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Final

from starlette.websockets import WebSocket, WebSocketDisconnect

from app.access.auth import Identity
from app.access.ratelimit import RateLimiter
from app.errors import CloseCode, close_reason
from app.ops.metrics import Metrics
from app.protocol import sender_of
from app.transport.eager import start_eagerly
from app.transport.flusher import Flusher
from app.transport.outbox import Outbox
from app.transport.stream_socket import StreamSocket
from app.transport.uvicorn_seam import DirectSocket, abort

logger = logging.getLogger(__name__)

# Errors a send raises once the peer is gone: uvicorn's ClientDisconnected is an OSError,
# Starlette raises RuntimeError when the socket is already closed on our side.
_GONE: Final = (OSError, RuntimeError, WebSocketDisconnect)


class Connection:
    """One accepted WebSocket: identity, rooms, outbox, writer, close.

    Contract:
    - :meth:`offer` never blocks and never raises. Offered frames reach the socket in offer
      order. If the outbox would overflow, the connection is closed with 4008 (slow consumer)
      and that frame and every later one are dropped: a slow client never slows anyone else.
    - :meth:`close` returns at once and is idempotent; the close frame is sent in the
      background. If the socket does not take it within ``close_timeout_s`` (the peer stopped
      reading), the TCP connection is aborted. Either way the session's receive loop then sees
      the disconnect and unregisters the connection: the session, not the caller, cleans up.
    - ``rooms`` is changed only by the :class:`~app.sockets.hub.Hub`.
    """

    __slots__ = (
        "_close_timeout_s",
        "_closer",
        "_direct",
        "_drain_waiters",
        "_flush_due",
        "_flusher",
        "_metrics",
        "_outbox",
        "_writer",
        "_ws",
        "close_code",
        "greeted",
        "hidden",
        "id",
        "identity",
        "ip",
        "last_seen",
        "limiter",
        "opened_at",
        "refresh_asked",
        "rooms",
        "transport",
        "user",
        "visible",
    )

    def __init__(
        self,
        ws: WebSocket | StreamSocket,
        user: str,
        outbox: Outbox,
        limiter: RateLimiter,
        close_timeout_s: float,
        now: float,
        metrics: Metrics,
        flusher: Flusher,
    ) -> None:
        self.id = secrets.token_hex(6)
        self.user = user
        self.identity = Identity(user)
        self.ip: str | None = None
        self.refresh_asked = False
        self.rooms: set[str] = set()
        # "websocket", or "sse": the HTTP fallback (app.sockets.stream).
        self.transport = "sse" if isinstance(ws, StreamSocket) else "websocket"
        self.last_seen = now
        self.opened_at = now
        self.limiter = limiter
        self.close_code: CloseCode | None = None
        # True once the client has its `hello`: the heartbeat pings only greeted connections.
        self.greeted = False
        # The client said it shows the chat to someone now (`visibility`): no push meanwhile.
        self.visible = False
        # Whom the user hides (muted and blocked, app.access.hiding): their messages and
        # typing are not offered here. Set by the Hub only.
        self.hidden: frozenset[str] = frozenset()
        self._ws = ws
        self._outbox = outbox
        self._close_timeout_s = close_timeout_s
        self._metrics = metrics
        self._flusher = flusher
        self._flush_due = False
        self._writer: asyncio.Task[None] | None = None
        self._closer: asyncio.Task[None] | None = None
        self._direct: DirectSocket | None = None
        # (bytes, future) of drained() calls waiting for the outbox to shrink to that size
        # (one per room replaying to this connection).
        self._drain_waiters: list[tuple[int, asyncio.Future[bool]]] | None = None

    def write_directly(self, direct: DirectSocket | None) -> None:
        """Write frames through ``direct`` whenever it is writable (after the accept)."""
        self._direct = direct

    @property
    def closing(self) -> bool:
        """True once the server has decided to close this connection (or it has ended)."""
        return self.close_code is not None

    def hides(self, frame: str) -> bool:
        """Whether ``frame`` comes from someone this connection's user hides."""
        return bool(self.hidden) and sender_of(frame.encode()) in self.hidden

    def offer(self, frame: str, nbytes: int | None = None) -> None:
        """Queue ``frame`` for this socket (``nbytes``: its UTF-8 size, when already known)."""
        if self.close_code is not None:
            return
        if nbytes is None:
            nbytes = len(frame) if frame.isascii() else len(frame.encode())
        if not self._outbox.put(frame, nbytes):
            self.close(CloseCode.SLOW_CONSUMER, "slow consumer: outbox full")
            return
        if self._writer is None and not self._flush_due:
            self._flush_due = True
            self._flusher.schedule(self)

    def flush(self) -> None:
        """Write what is queued (called by the :class:`~app.transport.flusher.Flusher`), unless a
        writer task is already at it or the connection is closing.

        Frames go straight to the transport (:mod:`app.transport.uvicorn_seam`) while it takes
        them; what is left goes through ASGI, in a task if the transport is paused. One write at
        a time: while that task runs, later flushes leave the outbox to it, so order is kept."""
        self._flush_due = False
        outbox = self._outbox
        if self._writer is not None or not outbox or self.close_code is not None:
            return
        direct = self._direct
        if direct is not None:
            encode, wrote = self._flusher.frames.encode, self._metrics.wrote
            while outbox and direct.writable():
                texts = outbox.take_frames()
                direct.write(encode(texts))
                wrote()
            if self._drain_waiters is not None:
                self._wake_drain_waiters()
            if not outbox:
                return
        self._writer = start_eagerly(self._write())

    async def _write(self) -> None:
        outbox, ws, metrics = self._outbox, self._ws, self._metrics
        try:
            while outbox:
                text = outbox.take()
                await ws.send_text(text)
                metrics.wrote()
                if self._drain_waiters is not None:
                    self._wake_drain_waiters()
        except _GONE:
            outbox.clear()
        finally:
            self._writer = None
            self._wake_drain_waiters()

    def drained(self, below: int) -> asyncio.Future[bool]:
        """A future that resolves to True once no more than ``below`` bytes are queued, or to
        False once the connection is closing (what it was waiting to send never will be).
        Paces replays by what the socket takes (:mod:`app.sockets.replay`); cancelling it is
        fine."""
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        if self.close_code is not None:
            future.set_result(False)
        elif self._outbox.queued_bytes <= below:
            future.set_result(True)
        else:
            if self._drain_waiters is None:
                self._drain_waiters = []
            self._drain_waiters.append((below, future))
        return future

    def _wake_drain_waiters(self) -> None:
        waiters = self._drain_waiters
        if waiters is None:
            return
        closing, queued = self.close_code is not None, self._outbox.queued_bytes
        waiting = []
        for below, future in waiters:
            if future.done():
                continue
            if closing or queued <= below:
                future.set_result(not closing)
            else:
                waiting.append((below, future))
        self._drain_waiters = waiting or None

    def close(self, code: CloseCode, reason: str) -> None:
        """Close the socket with ``code``; queued frames are dropped."""
        if self.close_code is not None:
            return
        self.close_code = code
        self._stop_writer()
        self._closer = asyncio.get_running_loop().create_task(self._close(code, reason))

    async def _close(self, code: CloseCode, reason: str) -> None:
        try:
            async with asyncio.timeout(self._close_timeout_s):
                await self._ws.close(int(code), close_reason(reason))
        except TimeoutError:
            logger.info("conn=%s close %d timed out; aborting the transport", self.id, code)
            if isinstance(self._ws, WebSocket):
                abort(self._ws)
        except _GONE:
            pass

    def discard(self) -> None:
        """Called by the session when the socket has ended: drop whatever is still queued."""
        if self.close_code is None:
            self.close_code = CloseCode.NORMAL_CLOSURE
        self._stop_writer()

    def _stop_writer(self) -> None:
        self._outbox.clear()
        if self._writer is not None:
            self._writer.cancel()
            self._writer = None
        self._wake_drain_waiters()

    @property
    def queued_bytes(self) -> int:
        return self._outbox.queued_bytes

    def __repr__(self) -> str:
        return f"<Connection {self.id} user={self.user!r} rooms={len(self.rooms)}>"
