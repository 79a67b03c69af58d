"""Encoded WebSocket text frames, made once per flush however many sockets they go to.

Frames from a server are not masked, so the frame carrying a room message is the same bytes on
every socket of the room (see :mod:`app.transport.uvicorn_seam` for how they are written).
"""

from __future__ import annotations

from websockets.frames import Frame, Opcode


class FrameCache:
    """Encoded text frames of one flush, by the texts they join: each distinct sequence of
    queued texts is encoded once, whatever the number of sockets it goes to."""

    __slots__ = ("_frames",)

    def __init__(self) -> None:
        self._frames: dict[str | tuple[str, ...], bytes] = {}

    def encode(self, texts: list[str]) -> bytes:
        """The text frame carrying ``texts`` joined by ``\\n`` (see :mod:`app.transport.outbox`)."""
        key = texts[0] if len(texts) == 1 else tuple(texts)
        frame = self._frames.get(key)
        if frame is None:
            payload = "\n".join(texts).encode()
            frame = self._frames[key] = Frame(Opcode.TEXT, payload).serialize(mask=False)
        return frame

    def clear(self) -> None:
        self._frames.clear()
