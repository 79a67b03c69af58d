"""The store as a worker runs it: opened from the settings, archived into (by the archiver
that matches the broker), and pruned by retention.

Contract: :meth:`RunningStore.open` checks the schema (raises
:class:`~app.store.database.StoreError`); :meth:`RunningStore.start` returns at once (tasks
run in the background); :meth:`RunningStore.stop` stops them, stores what the embedded
archiver still holds (best effort, bounded), and closes the database's connections.
Retention runs on the worker that archives only (one per deployment), every
``_RETENTION_INTERVAL_S`` (or a quarter of the retention, if shorter), a bounded batch at a
time.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Awaitable, Callable

from app.ops.tracing import Tracing
from app.settings import Settings
from app.store.archiver import Archiver, ArchiveStats
from app.store.database import StoreError, engine_for, migrate
from app.store.files import FileStore
from app.store.hidden import HiddenStore
from app.store.inbox import Inbox
from app.store.messages import MessageStore
from app.store.notifications import NotificationStore
from app.store.reports import ReportStore
from app.store.rooms import RoomStore
from app.store.search import SearchIndexer, SearchStore

logger = logging.getLogger(__name__)

_RETENTION_INTERVAL_S = 300.0
_RETENTION_BATCH = 10_000


class RunningStore:
    def __init__(self, settings: Settings) -> None:
        assert settings.database_url is not None
        self._settings = settings
        self.engine = engine_for(settings.database_url, settings.database_timeout_s)
        self.messages = MessageStore(
            self.engine,
            settings.search_index,
            int(settings.notify_grace_s * 1000) if settings.notifications else None,
        )
        self.notifications = NotificationStore(self.engine)
        self.search = (
            SearchStore(self.engine, settings.search_language) if settings.search_index else None
        )
        self.indexer = (
            SearchIndexer(self.engine, settings.search_language) if settings.search_index else None
        )
        self._indexing: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self.inbox = Inbox(self.engine)
        self.rooms = RoomStore(self.engine)
        self.files = FileStore(self.engine)
        self.hidden = HiddenStore(self.engine)
        self.reports = ReportStore(self.engine)
        # The embedded broker's archiver; the Redis broker's is a StreamArchiver.
        self.archiver: Archiver | None = None
        self._stats: Callable[[], ArchiveStats] = ArchiveStats
        self._tasks: list[asyncio.Task[None]] = []
        self._close_redis: Callable[[], Awaitable[None]] | None = None
        # Spans of archiving traced messages (None: tracing off, app.ops.tracing).
        self.tracing: Tracing | None = None

    async def open(self) -> None:
        """Check the schema is current (migrating it if not: a worker started without
        ``python -m app`` or gunicorn, e.g. ``uvicorn --factory``). Raises StoreError."""
        await migrate(self.engine)

    def embedded_archiver(self) -> Archiver:
        """The archiver the memory broker offers every message to."""
        settings = self._settings
        self.archiver = Archiver(
            self.messages,
            batch_max=settings.archive_batch_max,
            interval_s=settings.archive_interval_s,
            max_pending=settings.archive_backlog_max,
        )
        return self.archiver

    def archive_stats(self) -> ArchiveStats:
        stats = self._stats()
        if self.indexer is None:
            return stats
        return dataclasses.replace(stats, search_backlog=self.indexer.backlog)

    def start(self) -> None:
        settings = self._settings
        if self.archiver is not None:
            archiver = self.archiver
            self._stats = lambda: archiver.stats
            self._tasks.append(asyncio.create_task(archiver.run(), name="archiver"))
        else:
            from app.redisio.clients import close_client, command_client
            from app.store.stream_archiver import StreamArchiver

            redis = command_client(settings)
            self._close_redis = functools.partial(close_client, redis)
            streamer = StreamArchiver(redis, self.messages, settings)
            streamer.tracing = self.tracing
            self._stats = lambda: streamer.stats
            self._tasks.append(asyncio.create_task(streamer.run(), name="archiver"))
        if settings.retention_days > 0:
            self._tasks.append(asyncio.create_task(self._keep_retention(), name="retention"))
        if self.indexer is not None:
            self._indexing = asyncio.create_task(self._keep_indexing(self.indexer), name="indexer")

    async def _keep_indexing(self, indexer: SearchIndexer) -> None:
        """Search indexing, on the worker that archives (one per deployment): batch after
        batch while there is a backlog, else every ``CHAT_SEARCH_INDEX_INTERVAL_S``; a batch is
        never cut short (stop() waits for it)."""
        settings = self._settings
        while not self._stopping.is_set():
            applied = 0
            if self.archive_stats().leading:
                try:
                    applied = await indexer.index(settings.search_index_batch_max)
                except StoreError as exc:
                    logger.warning("search indexing: %s", exc)
                    applied = 0
            if applied < settings.search_index_batch_max:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(settings.search_index_interval_s):
                        await self._stopping.wait()

    async def _keep_retention(self) -> None:
        days = self._settings.retention_days
        interval_s = min(_RETENTION_INTERVAL_S, days * 86_400 / 4)
        while True:
            if self.archive_stats().leading:
                cutoff_ms = int((time.time() - days * 86_400) * 1000)
                try:
                    deleted = _RETENTION_BATCH
                    while deleted == _RETENTION_BATCH:  # a full batch: more may be due
                        deleted = await self.messages.delete_older_than(cutoff_ms, _RETENTION_BATCH)
                except StoreError as exc:
                    logger.warning("retention: %s", exc)
            await asyncio.sleep(interval_s)

    async def stop(self) -> None:
        if self.archiver is not None:
            # Not cancelled mid-batch (SQLite would keep its write lock): it stops after one.
            await self.archiver.close(self._settings.close_timeout_s)
        if self._indexing is not None:  # likewise: after its batch
            self._stopping.set()
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                async with asyncio.timeout(self._settings.close_timeout_s):
                    await asyncio.shield(self._indexing)
            self._tasks.append(self._indexing)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._close_redis is not None:
            await self._close_redis()
        await self.engine.dispose()
