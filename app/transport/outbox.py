"""Outbox: the bounded queue of frames waiting to be written to one socket. Pure, no I/O.

The bound is in bytes (UTF-8 size of the queued frames), so a few large messages and many
small ones cost the same room. When the writer catches up it takes everything queued, up to
``coalesce_max_bytes``, as one text frame of ``\\n``-separated JSON objects: under load a client
gets fewer, larger frames instead of falling behind.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.transport.budget import OutboxBudget


class Outbox:
    """FIFO of encoded frames with a byte bound. Order in is order out. With a ``budget``, the
    bytes it holds are also counted in the worker's :class:`~app.transport.budget.OutboxBudget`."""

    __slots__ = ("_budget", "_bytes", "_coalesce_max_bytes", "_frames", "_max_bytes")

    def __init__(
        self, max_bytes: int, coalesce_max_bytes: int, budget: OutboxBudget | None = None
    ) -> None:
        # Made on a put into an empty outbox and dropped when it empties again: a deque costs
        # ~760 bytes, times every idle connection.
        self._frames: deque[tuple[str, int]] | None = None
        self._bytes = 0
        self._max_bytes = max_bytes
        self._coalesce_max_bytes = coalesce_max_bytes
        self._budget = budget

    def put(self, frame: str, nbytes: int) -> bool:
        """Queue ``frame`` (``nbytes`` long in UTF-8). False, and nothing queued, if it would
        overflow the bound: the caller must then treat the consumer as too slow."""
        if self._bytes + nbytes > self._max_bytes:
            return False
        if self._frames is None:
            self._frames = deque()
        self._frames.append((frame, nbytes))
        self._bytes += nbytes
        budget = self._budget
        if budget is not None:
            budget.used += nbytes
            if budget.used > budget.limit:
                budget.exceeded()
        return True

    def take(self) -> str:
        """Remove and return the oldest frames, joined by ``\\n`` up to ``coalesce_max_bytes``
        (at least one frame, however large). The outbox must not be empty."""
        return "\n".join(self.take_frames())

    def take_frames(self) -> list[str]:
        """What :meth:`take` would join, unjoined."""
        frames = self._frames
        assert frames is not None
        queued = self._bytes
        frame, nbytes = frames.popleft()
        self._bytes -= nbytes
        batch, size = [frame], nbytes
        while frames and size + 1 + frames[0][1] <= self._coalesce_max_bytes:
            frame, nbytes = frames.popleft()
            self._bytes -= nbytes
            batch.append(frame)
            size += 1 + nbytes
        if not frames:
            self._frames = None  # an idle connection holds no deque
        if self._budget is not None:
            self._budget.used -= queued - self._bytes
        return batch

    def clear(self) -> None:
        if self._budget is not None:
            self._budget.used -= self._bytes
        self._frames = None
        self._bytes = 0

    @property
    def queued_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return 0 if self._frames is None else len(self._frames)
