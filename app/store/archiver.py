"""The archiver: moves published messages into the store in batches, off the messages'
latency path.

Contract:
- :meth:`Archiver.offer` never blocks and never raises: a publish hands its message over and
  goes on. Messages are stored in the order offered, in batches of at most ``batch_max``,
  at least every ``interval_s`` while any wait.
- A batch that fails (the database is down) is kept and retried, with a jittered backoff up
  to ``retry_max_s``, until it is stored: nothing offered is skipped. Storing is idempotent
  (:meth:`app.store.messages.MessageStore.add`), so a batch stored twice is stored once.
- A batch the database refuses for its data (a row it cannot hold) is not retried as it is:
  every other row is stored, and each refused one is left out, counted (``rejected``) and
  logged once with its conversation and id (:func:`report_refused`). One bad row never holds
  back the rows after it, in any conversation.
- At most ``max_pending`` messages wait; past that the oldest are dropped and counted
  (``dropped``): the memory a database outage may cost is bounded, and the loss is visible.
- ``lag`` is how many wait (the archive-lag metric); :meth:`close` stores what waits, within
  ``close_timeout_s``.
- ``archived(conversation)``: every message of the conversation offered up to that id is
  stored (batches are stored in offer order), which lets recovery read them from the store.
  A conversation that lost a message (dropped, or refused) is vouched for no more.

This is the embedded path (the memory broker: one process, ``make run``): what waits is lost
if the process is killed. The Redis broker archives from Redis instead
(:mod:`app.store.stream_archiver`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import deque
from dataclasses import dataclass

from app.store.database import StoreError
from app.store.messages import MessageStore, StoredMessage

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class ArchiveStats:
    """For the metrics: messages waiting to be stored and the age of the oldest (the lag),
    messages stored, failed attempts to store a batch, messages dropped unstored, messages
    the store refused (left out, never retried), and whether this worker is the one
    archiving."""

    lag_messages: int = 0
    lag_seconds: float = 0.0
    stored: int = 0
    failures: int = 0
    dropped: int = 0
    leading: bool = False
    rejected: int = 0
    search_backlog: int = 0  # stored rows the search indexer has not applied yet


def report_refused(refused: list[tuple[StoredMessage, str]]) -> None:
    """Log each row the store refused, once, by conversation and id: never its text."""
    for message, reason in refused:
        logger.error(
            "archiving: the store refused message %d of %s, left out (not retried): %s",
            message.id, message.conversation, reason,
            extra={"conversation": message.conversation, "id": message.id},
        )  # fmt: skip


class Archiver:
    def __init__(
        self,
        store: MessageStore,
        batch_max: int = 1000,
        interval_s: float = 0.2,
        retry_max_s: float = 5.0,
        max_pending: int = 1_000_000,
    ) -> None:
        self._store = store
        self._batch_max = batch_max
        self._interval_s = interval_s
        self._retry_max_s = retry_max_s
        self._max_pending = max_pending
        self._pending: deque[StoredMessage] = deque()
        self._wake = asyncio.Event()
        self._closing = False
        self._running = False
        self._stopped = asyncio.Event()
        self._marks: dict[str, int] = {}
        self.stored = 0
        self.dropped = 0
        self.failures = 0
        self.rejected = 0

    @property
    def lag(self) -> int:
        return len(self._pending)

    @property
    def stats(self) -> ArchiveStats:
        oldest = self._pending[0].ts_ms / 1000 if self._pending else None
        return ArchiveStats(
            lag_messages=len(self._pending),
            lag_seconds=0.0 if oldest is None else max(0.0, time.time() - oldest),
            stored=self.stored,
            failures=self.failures,
            dropped=self.dropped,
            leading=True,
            rejected=self.rejected,
        )

    def archived(self, conversation: str) -> int:
        """Every message of ``conversation`` offered up to this id is stored (0: none known)."""
        return self._marks.get(conversation, 0)

    def offer(self, message: StoredMessage) -> None:
        if len(self._pending) >= self._max_pending:
            lost = self._pending.popleft()
            self.dropped += 1
            # The marks must not vouch past a message that was never stored.
            self._marks[lost.conversation] = -1
        self._pending.append(message)
        if len(self._pending) >= self._batch_max:
            self._wake.set()

    async def run(self) -> None:
        """Store what is offered until :meth:`close` (or cancelled: do not cancel it in the
        middle of a batch if you can help it, a database may hold its write lock for a
        while)."""
        self._running = True
        try:
            await self._keep_storing()
        finally:
            self._running = False
            self._stopped.set()

    async def _keep_storing(self) -> None:
        backoff = self._interval_s
        while not self._closing:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._interval_s)
            self._wake.clear()
            while self._pending and not self._closing:
                try:
                    await self._store_one_batch()
                    backoff = self._interval_s
                except StoreError as exc:
                    self.failures += 1
                    logger.warning("archiving failed, retrying: %s", exc)
                    await asyncio.sleep(backoff * (0.5 + random.random()))
                    backoff = min(self._retry_max_s, backoff * 2)

    async def _store_one_batch(self) -> None:
        batch = [self._pending[n] for n in range(min(self._batch_max, len(self._pending)))]
        _, refused = await self._store.add_isolating(batch)
        for message, _ in refused:
            # As for a drop: the marks must not vouch past a message the store lacks.
            self._marks[message.conversation] = -1
        for message in batch:
            if self._marks.get(message.conversation, 0) >= 0:
                self._marks[message.conversation] = message.id
        # Offers during the write only appended; drops during it took from the front, which
        # may have been this batch's own messages: remove what is still there of it.
        for message in batch:
            if self._pending and self._pending[0] is message:
                self._pending.popleft()
        self.stored += len(batch) - len(refused)
        self.rejected += len(refused)
        report_refused(refused)

    async def close(self, close_timeout_s: float = 5.0) -> None:
        """Have :meth:`run` return after the batch it is storing, then store what waits (best
        effort, within ``close_timeout_s``)."""
        self._closing = True
        self._wake.set()
        try:
            async with asyncio.timeout(close_timeout_s):
                if self._running:
                    await self._stopped.wait()
                while self._pending:
                    await self._store_one_batch()
        except (StoreError, TimeoutError) as exc:
            logger.warning("%d messages not archived at shutdown: %s", self.lag, exc)
