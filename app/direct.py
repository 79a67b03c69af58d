"""Direct writes: pre-encoded text frames written straight to a WebSocket's transport.

A fan-out writes the same message to every socket of a room. Through ASGI, each write encodes
the text, builds a frame in websockets' sans-I/O protocol and passes Starlette's and uvicorn's
layers before the write system call. Frames from a server are not masked, so a room message is
the same bytes on every socket: :class:`FrameCache` encodes each distinct text once per flush,
and :class:`DirectSocket` hands those bytes to the transport.

Only uvicorn's ``websockets-sansio`` protocol, with no extension negotiated (permessage-deflate
compresses per socket), is written this way, and only while the socket is open and its
transport not paused; otherwise frames go through ASGI, which waits for a paused transport.
Either way a socket's frames leave in the order they were queued: a connection never has both
a direct write and an ASGI write in progress (see :mod:`app.connection`).
"""

from __future__ import annotations

from typing import Final

from starlette.websockets import WebSocket
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.frames import Frame, Opcode
from websockets.protocol import State

from app.abort import PROTOCOL_KEY

_OPEN: Final = State.OPEN


class DirectSocket:
    """The transport under one accepted WebSocket, for writing whole pre-encoded frames."""

    __slots__ = ("_protocol",)

    def __init__(self, protocol: WebSocketsSansIOProtocol) -> None:
        self._protocol = protocol

    @classmethod
    def of(cls, ws: WebSocket) -> DirectSocket | None:
        """For an accepted ``ws`` served by uvicorn's sans-I/O protocol without extensions;
        None otherwise (the caller writes through ASGI)."""
        protocol = ws.scope.get(PROTOCOL_KEY)
        if not isinstance(protocol, WebSocketsSansIOProtocol) or protocol.conn.extensions:
            return None
        return cls(protocol)

    def writable(self) -> bool:
        """True if a frame written now goes out: open, not closing, transport not paused."""
        protocol = self._protocol
        return (
            protocol.writable.is_set()
            and not protocol.close_sent
            and not protocol.disconnected
            and protocol.conn.state is _OPEN
            and not protocol.transport.is_closing()  # uvloop refuses writes to a closed one
        )

    def write(self, frame: bytes) -> None:
        """Queue ``frame`` (a whole encoded frame) on the transport; check :meth:`writable`
        first."""
        self._protocol.transport.write(frame)


class FrameCache:
    """Encoded text frames of one flush, by the texts they join: each distinct sequence of
    queued texts is encoded once, whatever the number of sockets it goes to."""

    __slots__ = ("_frames",)

    def __init__(self) -> None:
        self._frames: dict[str | tuple[str, ...], bytes] = {}

    def encode(self, texts: list[str]) -> bytes:
        """The text frame carrying ``texts`` joined by ``\\n`` (see :mod:`app.outbox`)."""
        key = texts[0] if len(texts) == 1 else tuple(texts)
        frame = self._frames.get(key)
        if frame is None:
            payload = "\n".join(texts).encode()
            frame = self._frames[key] = Frame(Opcode.TEXT, payload).serialize(mask=False)
        return frame

    def clear(self) -> None:
        self._frames.clear()
