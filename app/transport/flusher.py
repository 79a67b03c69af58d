"""Flusher: writes queued frames to their sockets once per event-loop iteration, for every
connection at once, without a task per write.

A fan-out offers one frame to a thousand connections; each asks the Flusher to write it. The
Flusher runs one callback at the end of the current iteration (so frames offered together in
that iteration leave coalesced, see :mod:`app.transport.outbox`) and starts each connection's
write eagerly (:func:`app.transport.eager.start_eagerly`): a socket that takes the frame at once
— nearly all — costs no task; one whose transport is paused gets a task that waits for it, and
only that connection waits. A frame written to many sockets in one flush is encoded once
(:class:`app.transport.frames.FrameCache`).

Replies from Redis wake their tasks a pass of the loop later than the callbacks already
queued, the flush among them: a publish's pushed message reaches the sender's socket in the
flush, its ack (written by the task the reply wakes) in a second write. :meth:`Flusher.hold`
lets the flush wait for them (the Redis broker calls it as it hands replies over).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final, Protocol

from app.transport.frames import FrameCache

logger = logging.getLogger(__name__)

# How many passes of the loop one flush may be held back (hold): a merged script call's
# reply wakes its callers two passes after it is read. Bounded, so that replies read in
# every pass cannot hold the frames back for ever.
MAX_HOLDS: Final = 2


class Flushable(Protocol):
    def flush(self) -> None: ...


class Flusher:
    """One per worker (event loop). ``schedule`` never blocks; each scheduled connection's
    ``flush`` is called once, in scheduling order, in a later iteration of the loop."""

    __slots__ = ("_due", "_held", "_holding", "frames")

    def __init__(self) -> None:
        self._due: list[Flushable] = []
        self._holding = False  # hold() asked for one more pass
        self._held = 0  # passes the pending flush has been held back
        # Frames encoded during one flush, shared by the connections it writes.
        self.frames = FrameCache()

    def schedule(self, conn: Flushable) -> None:
        """Flush ``conn`` soon. The caller schedules a connection at most once per flush."""
        if not self._due:
            asyncio.get_running_loop().call_soon(self._flush)
        self._due.append(conn)

    def hold(self) -> None:
        """Let the pending flush, if any, wait one more pass of the loop, so that the frames
        of the callbacks queued before it runs (tasks a reply just woke) leave in the same
        writes as the frames already offered. A flush is held back at most
        :data:`MAX_HOLDS` passes; nothing pending, nothing to hold."""
        self._holding = bool(self._due)

    def _flush(self) -> None:
        if self._holding and self._held < MAX_HOLDS:
            self._holding = False
            self._held += 1
            asyncio.get_running_loop().call_soon(self._flush)
            return
        self._holding, self._held = False, 0
        due, self._due = self._due, []
        for conn in due:
            try:
                conn.flush()
            except Exception:  # one connection's bug must not cost the others their frames
                logger.exception("flushing %r failed", conn)
        self.frames.clear()
