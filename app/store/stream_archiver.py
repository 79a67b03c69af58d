"""StreamArchiver: moves every published message from Redis into the store, in batches, off
the messages' latency path (the Redis broker's half of archiving).

The PUBLISH script appends each frame to its conversation's archive stream
(``{prefix}:archive``; on Redis Cluster one per partition, see :mod:`app.broker.keys`) in the
same atomic step that numbers and publishes it: a message that was acked is in a stream.
Every worker runs a StreamArchiver; one of them at a time leads, under a lease (a Redis key
it renews every third of ``CHAT_ARCHIVE_LEASE_S``), and consumes the streams through a
consumer group:

- it first claims what earlier leaders left pending (they died between reading and acking),
  then reads new entries, always in stream order, one batch of one stream at a time, taking
  the streams in turn;
- a batch is stored (idempotently: :meth:`~app.store.messages.MessageStore.add`), then the
  conversations' ``archived`` marks are raised, then its entries are acked and deleted;
- a batch the store cannot take (it is down) is retried, with a jittered backoff, until it
  is stored or the lease is lost (then the next leader claims it). Nothing is acked before
  it is stored;
- a batch the store refuses for its data (a row it cannot hold, see
  :meth:`~app.store.messages.MessageStore.add_isolating`) has every other row stored, and
  each refused row left out: counted (``rejected``), logged once by conversation and id,
  acked with the batch (never retried), and marked as the conversation's ``unarchived``
  hole, as a dropped message is, so recovery never reads the store across it. One bad row
  never stalls archiving.

Delivery guarantee: at least once into the store, each message stored once (idempotent by
conversation and id). Because one leader stores batches in stream order, and the stream is in
each conversation's id order, a conversation's ``archived`` mark means every message up to it
is stored: recovery may read those from the store
(:class:`app.conversations.history.ConversationHistory`).
What is lost: messages published while the stream holds ``CHAT_ARCHIVE_BACKLOG_MAX`` entries
(the store has been down long: counted, see ``_count_dropped``), and entries Redis loses with
its data (a restart without persistence).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
import time
from typing import Any, cast

import orjson
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from app.broker import redis_scripts as scripts
from app.broker.keys import KeyLayout
from app.conversations.names import is_direct
from app.ops.tracing import Tracing, in_frame
from app.redisio.clients import REDIS_ERRORS
from app.settings import Settings
from app.store.archiver import ArchiveStats, report_refused
from app.store.database import StoreError
from app.store.messages import MessageStore, StoredMessage, row_of

logger = logging.getLogger(__name__)

GROUP = "archivers"
# An entry as XREADGROUP returns it, unparsed: its id, and its fields as a flat list
# [b"c", conversation, b"f", frame] (None once deleted).
_Entry = tuple[bytes, list[bytes] | None]
_LAG_READ_INTERVAL_S = 2.0

# Renew the lease if this worker still holds it. KEYS: lease  ARGV: holder, lease ms
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""


# Raise conversations' `unarchived` marks (the newest message the store lacks: see the PUBLISH
# script) to the rows the store refused, for the rooms whose meta exists.
# KEYS: meta of each conversation   ARGV: the id refused, for each
_HOLE = """
for i, meta in ipairs(KEYS) do
  if redis.call('EXISTS', meta) == 1 then
    local hole = tonumber(redis.call('HGET', meta, 'unarchived') or '0')
    if tonumber(ARGV[i]) > hole then redis.call('HSET', meta, 'unarchived', ARGV[i]) end
  end
end
return 0
"""


class LeaseLost(Exception):
    """Another worker leads now (or Redis could not confirm this one still does)."""


class StreamArchiver:
    """See the module's contract. ``run`` until cancelled; ``stats`` for the metrics."""

    def __init__(self, redis: Redis, store: MessageStore, settings: Settings) -> None:
        """``redis``: a client of the archiver's own (it changes how XREADGROUP replies are
        parsed)."""
        self._redis = redis
        self._store = store
        self._settings = settings
        self._prefix = settings.redis_prefix
        # The streams (one, or one per partition on Redis Cluster), and for each the count of
        # what the PUBLISH script could not append to it.
        self._keys = KeyLayout.of(settings)
        self.streams = self._keys.archives()
        self._dropped_seen: int | None = None
        self._lease_key = f"{self._prefix}:archive:lease"
        self.name = f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        # redis-py would build a dict per entry; the archiver reads the flat reply itself
        # (its client is its own: see RunningStore).
        redis.set_response_callback("XREADGROUP", _unparsed)
        self._renew = redis.register_script(_RENEW)
        self._mark = redis.register_script(scripts.ARCHIVED)
        self._hole = redis.register_script(_HOLE)
        self._stats = ArchiveStats()
        self._leading = False
        # Traced messages get an `archive` span (None: tracing off, app.ops.tracing).
        self.tracing: Tracing | None = None

    @property
    def stats(self) -> ArchiveStats:
        return self._stats

    async def run(self) -> None:
        """Lead when the lease is free, follow (reading the lag) when it is not. Ends when
        cancelled, even if a library call it was in turned the cancellation into an error
        (redis-py may, cancelled mid-read: the task's cancel request is still pending)."""
        lease_s = self._settings.archive_lease_s
        lag_task = asyncio.create_task(self._watch_lag(), name="archive-lag")
        this = asyncio.current_task()
        try:
            while True:
                try:
                    if await self._acquire():
                        await self._lead()
                except LeaseLost as exc:
                    logger.warning("archiving: no longer leading (%s)", exc)
                except REDIS_ERRORS as exc:
                    logger.warning("archiving: redis unavailable: %r", exc)
                except Exception:  # a bug must not stop archiving for good: log, try again
                    logger.exception("archiving failed")
                finally:
                    self._leading = False
                    self._stats.leading = False
                if this is not None and this.cancelling():
                    raise asyncio.CancelledError  # asked to stop while in a call that hid it
                await asyncio.sleep(random.uniform(lease_s / 6, lease_s / 3))
        finally:
            lag_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await lag_task

    async def _acquire(self) -> bool:
        """Take the lease if it is free, or keep it if this worker still holds it (it stopped
        leading after an error: it need not wait for its own lease to expire)."""
        lease_ms = int(self._settings.archive_lease_s * 1000)
        if await self._redis.set(self._lease_key, self.name, nx=True, px=lease_ms):
            return True
        return bool(await self._renew(keys=[self._lease_key], args=[self.name, lease_ms]))

    async def _lead(self) -> None:
        """Consume the stream while the lease holds; raises LeaseLost when it does not."""
        logger.info("archiving: this worker leads (%s)", self.name)
        self._leading = True
        self._stats.leading = True
        for stream, _ in self.streams:
            with contextlib.suppress(ResponseError):  # BUSYGROUP: it exists
                await self._redis.xgroup_create(stream, GROUP, id="0", mkstream=True)
        renewing = asyncio.create_task(self._keep_lease(), name="archive-lease")
        consuming = asyncio.create_task(self._consume(), name="archive-consume")
        try:
            done, _ = await asyncio.wait({renewing, consuming}, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # raises what ended it
            raise LeaseLost("stopped")
        finally:
            for task in (renewing, consuming):
                task.cancel()
            await asyncio.gather(renewing, consuming, return_exceptions=True)

    async def _keep_lease(self) -> None:
        lease_s = self._settings.archive_lease_s
        while True:
            await asyncio.sleep(lease_s / 3)
            try:
                renewed = await self._renew(
                    keys=[self._lease_key], args=[self.name, int(lease_s * 1000)]
                )
            except REDIS_ERRORS as exc:
                raise LeaseLost(f"cannot renew: {exc!r}") from exc
            if not renewed:
                raise LeaseLost("the lease expired")

    async def _consume(self) -> None:
        settings = self._settings
        for stream, _ in self.streams:
            await self._claim_pending(stream)
        # Per stream: the entries this consumer holds (just claimed) first, then new ones.
        positions = {stream: "0" for stream, _ in self.streams}
        interval_ms = int(settings.archive_interval_s * 1000)
        single = len(positions) == 1
        this = asyncio.current_task()
        while True:
            if this is not None and this.cancelling():
                # Cancelled in a blocking read that swallowed it (see run): stop all the same.
                raise asyncio.CancelledError
            full = partial = False  # a batch filled up; one of new entries did not
            for stream, position in positions.items():
                # One stream: wait in Redis for new entries; several: look at each in turn.
                block = interval_ms if single and position == ">" else None
                reply: Any = await self._redis.xreadgroup(
                    GROUP, self.name, {stream: position}, count=settings.archive_batch_max,
                    block=block,
                )  # fmt: skip
                entries = _entries_of(reply)
                if not entries:
                    positions[stream] = ">"
                    continue
                await self._archive(stream, entries)
                if len(entries) == settings.archive_batch_max:
                    full = True
                elif position == ">":
                    partial = True
            # Unless a backlog is being worked off, let the next batches gather (several
            # streams are only looked at, not waited on).
            if not full and (partial or not single):
                await asyncio.sleep(settings.archive_interval_s)

    async def _claim_pending(self, stream: str) -> None:
        """Take over what earlier leaders read and did not ack (they died, or lost the lease)."""
        start = "0-0"
        while True:
            # [next start, claimed entries, deleted ids]: only the cursor matters here.
            reply: Any = await self._redis.xautoclaim(
                stream, GROUP, self.name, min_idle_time=0, start_id=start,
                count=self._settings.archive_batch_max,
            )  # fmt: skip
            start = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
            if start == "0-0":
                return

    async def _archive(self, stream: str, entries: list[_Entry]) -> None:
        batch: list[StoredMessage] = []
        tracing = self.tracing
        traced: list[tuple[StoredMessage, SpanContext]] = []
        for _, fields in entries:
            message = _stored(fields)
            if message is None:
                self._stats.dropped += 1  # trimmed while pending, or not ours
                continue
            batch.append(message)
            if tracing is not None and fields is not None:
                context = in_frame(fields[3])
                if context is not None:
                    traced.append((message, context))
        started = time.time_ns()
        refused = await self._store_until_stored(batch)
        if tracing is not None and traced:
            _trace_archived(tracing, traced, started, len(batch), refused)
        marks: dict[str, int] = {}
        for message in batch:
            marks[message.conversation] = message.id  # the batch is in id order
        # The stream's conversations: in its slot on Redis Cluster.
        if refused:
            holes: dict[str, int] = {}
            for message, _ in refused:
                holes[message.conversation] = message.id
            metas = [self._keys.room(c, "meta") for c in holes]
            await self._hole(keys=metas, args=list(holes.values()))
        if marks:
            metas = [self._keys.room(c, "meta") for c in marks]
            await self._mark(keys=metas, args=list(marks.values()))
        ids = [entry_id for entry_id, _ in entries]
        # Together (MULTI): an entry acked but left in the stream would count as lag forever.
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.xack(stream, GROUP, *ids)
            pipe.xdel(stream, *ids)
            await pipe.execute()
        self._stats.stored += len(batch) - len(refused)
        self._stats.rejected += len(refused)
        report_refused(refused)

    async def _store_until_stored(
        self, batch: list[StoredMessage]
    ) -> list[tuple[StoredMessage, str]]:
        """Store ``batch``, less the rows the store refuses (returned), retrying while the
        store fails."""
        backoff = self._settings.archive_interval_s
        while True:
            try:
                _, refused = await self._store.add_isolating(batch)
                return refused
            except StoreError as exc:
                self._stats.failures += 1
                logger.warning("archiving %d messages failed, retrying: %s", len(batch), exc)
                await asyncio.sleep(backoff * random.uniform(0.5, 1.5))
                backoff = min(backoff * 2, 5.0)

    async def _watch_lag(self) -> None:
        """Every worker reads how far archiving is behind: the stream's length, and the age
        of its oldest entry (entries are deleted once stored)."""
        while True:
            with contextlib.suppress(*REDIS_ERRORS):
                async with self._redis.pipeline(transaction=False) as pipe:
                    for stream, dropped_key in self.streams:
                        pipe.xlen(stream)
                        pipe.xrange(stream, "-", "+", count=1)
                        pipe.get(dropped_key)
                    replies = await pipe.execute()
                lengths, oldests, drops = replies[0::3], replies[1::3], replies[2::3]
                self._stats.lag_messages = sum(int(length) for length in lengths)
                ages = [_age_s(oldest[0][0]) for oldest in oldests if oldest]
                self._stats.lag_seconds = max(ages, default=0.0)
                self._count_dropped(sum(int(dropped or 0) for dropped in drops))
            await asyncio.sleep(_LAG_READ_INTERVAL_S)

    def _count_dropped(self, total: int) -> None:
        """The leader counts the deployment's drops (the PUBLISH script's counter) as its
        own, from when it first read it: every drop is counted once, by one worker."""
        if self._leading and self._dropped_seen is not None and total > self._dropped_seen:
            self._stats.dropped += total - self._dropped_seen
        self._dropped_seen = total


def _trace_archived(
    tracing: Tracing,
    traced: list[tuple[StoredMessage, SpanContext]],
    started_ns: int,
    batch_size: int,
    refused: list[tuple[StoredMessage, str]],
) -> None:
    """An ``archive`` span for each traced message of a batch just written (since
    ``started_ns``); an error for those the store refused."""
    not_stored = {id(message): reason for message, reason in refused}
    for message, context in traced:
        span = tracing.start_stage("archive", [context], SpanKind.INTERNAL, started_ns)
        span.set_attribute("hubbub.batch_size", batch_size)
        span.set_attribute("messaging.message.id", str(message.id))
        reason = not_stored.get(id(message))
        if reason is not None:
            span.set_status(Status(StatusCode.ERROR, reason))
        span.end()


def _age_s(entry_id: bytes) -> float:
    """How long ago a stream entry was added (its id starts with Redis' time in ms)."""
    return max(0.0, time.time() - int(entry_id.split(b"-")[0]) / 1000)


def _unparsed(response: Any, **_: Any) -> Any:
    return response


def _entries_of(reply: Any) -> list[_Entry]:
    """The entries of an unparsed XREADGROUP reply for one stream: RESP3's map
    {stream: entries}, RESP2's [[stream, entries]], or nothing (a timeout)."""
    if not reply:
        return []
    entries = next(iter(reply.values())) if isinstance(reply, dict) else reply[0][1]
    return cast(list[_Entry], entries)


def _stored(fields: list[bytes] | None) -> StoredMessage | None:
    """The message an archive entry holds (None for a deleted or malformed entry)."""
    if not fields or len(fields) != 4 or fields[0] != b"c" or fields[2] != b"f":
        return None
    try:
        frame: dict[str, Any] = orjson.loads(fields[3])
        conversation = fields[1].decode()
        if not is_direct(conversation) and frame.get("room") != conversation:
            return None
        return row_of(conversation, frame)
    except (ValueError, KeyError, TypeError):
        return None
