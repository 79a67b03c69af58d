"""Flusher: writes queued frames to their sockets once per event-loop iteration, for every
connection at once, without a task per write.

A fan-out offers one frame to a thousand connections; each asks the Flusher to write it. The
Flusher runs one callback at the end of the current iteration (so frames offered together in
that iteration leave coalesced, see :mod:`app.transport.outbox`) and starts each connection's
write eagerly (:func:`app.transport.eager.start_eagerly`): a socket that takes the frame at once
— nearly all — costs no task; one whose transport is paused gets a task that waits for it, and
only that connection waits. A frame written to many sockets in one flush is encoded once
(:class:`app.transport.frames.FrameCache`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from app.transport.frames import FrameCache

logger = logging.getLogger(__name__)


class Flushable(Protocol):
    def flush(self) -> None: ...


class Flusher:
    """One per worker (event loop). ``schedule`` never blocks; each scheduled connection's
    ``flush`` is called once, in scheduling order, in a later iteration of the loop."""

    __slots__ = ("_due", "frames")

    def __init__(self) -> None:
        self._due: list[Flushable] = []
        # Frames encoded during one flush, shared by the connections it writes.
        self.frames = FrameCache()

    def schedule(self, conn: Flushable) -> None:
        """Flush ``conn`` soon. The caller schedules a connection at most once per flush."""
        if not self._due:
            asyncio.get_running_loop().call_soon(self._flush)
        self._due.append(conn)

    def _flush(self) -> None:
        due, self._due = self._due, []
        for conn in due:
            try:
                conn.flush()
            except Exception:  # one connection's bug must not cost the others their frames
                logger.exception("flushing %r failed", conn)
        self.frames.clear()
