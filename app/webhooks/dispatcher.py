"""The webhook dispatcher: every worker delivers events from the queue to the backend.

Contract:
- Every worker is a consumer of the queue's consumer group: each event is read by one of
  them, POSTed to ``CHAT_WEBHOOK_URL`` (signed, :mod:`app.webhooks.signing`), and removed
  from the queue (XACK and XDEL, together) only once the backend answered 2xx: delivered
  at least once.
- A failed attempt (an error, a timeout, any other status) is retried by the same worker with
  capped, jittered exponential backoff, for up to ``CHAT_WEBHOOK_RETRY_MAX_S`` after the
  event was queued; then it is given up (removed, counted, logged).
- While it retries, the worker keeps its events claimed. Events a worker read and did not
  finish (it died) are taken over by another once idle for ``CHAT_WEBHOOK_CLAIM_AFTER_S``.
- With ``CHAT_WEBHOOK_BATCH_MAX`` above 1, the events read together (up to that many) go in
  one request, a JSON array, retried and removed together.
- At most ``CHAT_WEBHOOK_CONCURRENCY`` requests per worker are in flight, and a worker holds
  at most :data:`HELD_PER_REQUEST` times as many events (those waiting out a backoff): a few
  events the backend keeps refusing do not stop the others.
- :attr:`stats` feeds the metrics (deliveries, failures, given up, the queue's age and size).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import time
from dataclasses import dataclass
from typing import Any

import httpx2 as httpx
import orjson
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from app.ops.tracing import Span, Tracing, in_frame, traceparent_of
from app.redisio.clients import REDIS_ERRORS, close_client
from app.settings import Settings
from app.webhooks.queue import WebhookQueue
from app.webhooks.signing import HEADER, signature

logger = logging.getLogger(__name__)

GROUP = "webhooks"
_BACKOFF_BASE_S = 0.5
_BACKOFF_CAP_S = 60.0
_WATCH_EVERY_S = 2.0
HELD_PER_REQUEST = 16


@dataclass(slots=True)
class WebhookStats:
    delivered: int = 0
    failed_attempts: int = 0
    given_up: int = 0
    not_queued: int = 0  # the queue was full (its `dropped` counter)
    lag_s: float = 0.0  # the oldest event in the queue, by its queueing time
    backlog: int = 0


class WebhookDispatcher:
    def __init__(
        self, redis: Redis, queue: WebhookQueue, settings: Settings, consumer: str
    ) -> None:
        assert settings.webhook_url is not None and settings.webhook_secret is not None
        self._redis = redis
        self._queue = queue
        self.queue = queue  # (others queue events too: app.notify.notifier)
        self._settings = settings
        self._consumer = consumer
        self._url = str(settings.webhook_url)
        self._secret = settings.webhook_secret.get_secret_value().encode()
        self._in_flight: dict[bytes, asyncio.Task[None]] = {}
        self._slots = asyncio.Semaphore(settings.webhook_concurrency)
        self.stats = WebhookStats()
        # Webhooks of traced messages are spans (None: tracing off, app.ops.tracing).
        self.tracing: Tracing | None = None
        self._http = httpx.AsyncClient(
            timeout=settings.webhook_timeout_s, follow_redirects=False, trust_env=False
        )

    async def run(self) -> None:
        """Deliver until cancelled (Redis errors are logged and retried)."""
        loops = [self._read(), self._maintain()]
        try:
            await asyncio.gather(*loops)
        finally:
            for task in list(self._in_flight.values()):
                task.cancel()
            await asyncio.gather(*self._in_flight.values(), return_exceptions=True)
            await self._http.aclose()
            await close_client(self._redis)  # made for it (app.webhooks.wiring)

    async def _read(self) -> None:
        group_made = False
        while True:
            try:
                if not group_made:
                    await self._make_group()
                    group_made = True
                held_max = self._settings.webhook_concurrency * HELD_PER_REQUEST
                batch = self._settings.webhook_batch_max
                free = min(
                    held_max - len(self._in_flight), self._settings.webhook_concurrency * batch
                )
                if free <= 0:
                    await asyncio.sleep(0.05)
                    continue
                reply: Any = await self._redis.xreadgroup(
                    GROUP, self._consumer, {self._queue.queue: ">"}, count=free, block=1000
                )
                for _, entries in _streams(reply):
                    self._start(entries)
            except ResponseError as exc:
                if "NOGROUP" in str(exc):  # the queue was deleted (an emptied Redis)
                    group_made = False
                    continue
                logger.warning("webhooks: reading the queue failed: %r", exc)
                await asyncio.sleep(1.0)
            except REDIS_ERRORS as exc:
                logger.warning("webhooks: reading the queue failed: %r", exc)
                await asyncio.sleep(1.0)

    async def _make_group(self) -> None:
        with contextlib.suppress(ResponseError):  # BUSYGROUP: it exists
            await self._redis.xgroup_create(self._queue.queue, GROUP, id="0", mkstream=True)

    async def _maintain(self) -> None:
        """Every couple of seconds: queue due offlines, keep this worker's events claimed,
        take over abandoned ones, and read the queue's age and size for the metrics."""
        claim_after_ms = int(self._settings.webhook_claim_after_s * 1000)
        while True:
            await asyncio.sleep(_WATCH_EVERY_S * random.uniform(0.75, 1.25))
            try:
                await self._queue.offline_due()
                if self._in_flight:
                    await self._redis.xclaim(
                        self._queue.queue, GROUP, self._consumer, 0,
                        list(self._in_flight), justid=True,
                    )  # fmt: skip
                _, claimed, _ = await self._redis.xautoclaim(
                    self._queue.queue, GROUP, self._consumer, claim_after_ms, count=100
                )
                self._start([(entry_id, fields) for entry_id, fields in claimed if fields])
                await self._watch()
            except ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    logger.warning("webhooks: upkeep failed: %r", exc)
            except REDIS_ERRORS as exc:
                logger.warning("webhooks: upkeep failed: %r", exc)

    async def _watch(self) -> None:
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.xrange(self._queue.queue, "-", "+", count=1)
            pipe.xlen(self._queue.queue)
            pipe.get(self._queue.dropped)
            oldest, length, dropped = await pipe.execute()
        self.stats.backlog = int(length)
        self.stats.lag_s = _age_s(oldest[0][0]) if oldest else 0.0
        self.stats.not_queued = int(dropped or 0)

    def _start(self, entries: list[tuple[bytes, dict[bytes, bytes]]]) -> None:
        """Deliver ``entries`` not in flight here yet, ``CHAT_WEBHOOK_BATCH_MAX`` a request."""
        fresh = [(i, f) for i, f in entries if i not in self._in_flight]
        size = self._settings.webhook_batch_max
        for start in range(0, len(fresh), size):
            batch = fresh[start : start + size]
            task = asyncio.create_task(self._deliver(batch))
            ids = [entry_id for entry_id, _ in batch]
            for entry_id in ids:
                self._in_flight[entry_id] = task
            task.add_done_callback(functools.partial(self._forget, ids))

    def _forget(self, ids: list[bytes], _: object) -> None:
        for entry_id in ids:
            self._in_flight.pop(entry_id, None)

    async def _deliver(self, batch: list[tuple[bytes, dict[bytes, bytes]]]) -> None:
        """POST events (one, or a batch) until the backend takes them, or give them up."""
        ids = [entry_id for entry_id, _ in batch]
        if self._settings.webhook_batch_max == 1:
            body, event = _body(*batch[0]), batch[0][1].get(b"e", b"?").decode()
        else:
            body, event = b"[" + b",".join(_body(i, f) for i, f in batch) + b"]", "batch"
        # Traced messages' contexts (app.ops.tracing): each attempt is a `webhook` span.
        parents: list[SpanContext] = []
        if self.tracing is not None:
            parents = [context for _, fields in batch if b"f" in fields
                       and (context := in_frame(fields[b"f"])) is not None]  # fmt: skip
        attempt = 0
        while True:
            async with self._slots:
                span = None
                if parents and self.tracing is not None:
                    span = self.tracing.start_stage("webhook", parents, SpanKind.CLIENT, None)
                ok = await self._post(ids[0], event, body, span)
            if ok:
                self.stats.delivered += len(ids)
                await self._remove(ids)
                return
            self.stats.failed_attempts += 1
            if _age_s(ids[0]) > self._settings.webhook_retry_max_s:
                self.stats.given_up += len(ids)
                logger.error(
                    "webhooks: gave up %s %s (%d events) after %d attempts",
                    event, ids[0].decode(), len(ids), attempt + 1,
                )  # fmt: skip
                await self._remove(ids)
                return
            cap = min(_BACKOFF_CAP_S, _BACKOFF_BASE_S * 2**attempt)
            attempt += 1
            await asyncio.sleep(random.uniform(cap / 2, cap))

    async def _post(self, entry_id: bytes, event: str, body: bytes, span: Span | None) -> bool:
        """One attempt; True when the backend took it. ``span``: this attempt's, when it
        carries traced messages (its context goes in the ``traceparent`` header; ended here)."""
        headers = {
            "Content-Type": "application/json",
            "Hubbub-Event": event,
            "Hubbub-Delivery": entry_id.decode(),
            HEADER: signature(self._secret, int(time.time()), body),
        }
        if span is not None:
            headers["traceparent"] = traceparent_of(span)
        try:
            response = await self._http.post(self._url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            logger.info("webhooks: %s %s failed: %r", event, entry_id.decode(), exc)
            if span is not None:
                span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
                span.end()
            return False
        ok = 200 <= response.status_code < 300
        if span is not None:
            span.set_attribute("http.response.status_code", response.status_code)
            if not ok:
                span.set_status(Status(StatusCode.ERROR, f"HTTP {response.status_code}"))
            span.end()
        if ok:
            return True
        logger.info("webhooks: %s %s answered %d", event, entry_id.decode(), response.status_code)
        return False

    async def _remove(self, ids: list[bytes]) -> None:
        """Ack and delete together (an entry acked but left would count as lag forever);
        retried until Redis takes it (a redelivery, if this worker dies meanwhile, is what
        at-least-once allows)."""
        while True:
            try:
                async with self._redis.pipeline(transaction=True) as pipe:
                    pipe.xack(self._queue.queue, GROUP, *ids)
                    pipe.xdel(self._queue.queue, *ids)
                    await pipe.execute()
                return
            except REDIS_ERRORS as exc:
                logger.warning("webhooks: removing a delivered event failed: %r", exc)
                await asyncio.sleep(1.0)


def _streams(reply: Any) -> list[tuple[Any, list[tuple[bytes, dict[bytes, bytes]]]]]:
    """XREADGROUP's reply as (stream, entries) pairs: a map in RESP3, a list in RESP2."""
    if not reply:
        return []
    if isinstance(reply, dict):
        pairs = []
        for name, value in reply.items():
            entries = value[0] if value and isinstance(value[0], list) else value
            pairs.append((name, entries))
        return pairs
    return [(name, entries) for name, entries in reply]


def _age_s(entry_id: bytes) -> float:
    """How long ago a stream entry was added (its id starts with Redis' time in ms)."""
    return max(0.0, time.time() - int(entry_id.split(b"-", 1)[0]) / 1000)


def _body(entry_id: bytes, fields: dict[bytes, bytes]) -> bytes:
    """``{"id", "type", "ts", "data"}``: a message's data is its conversation and its frame,
    as delivered; other events carry theirs (``d``)."""
    event = fields.get(b"e", b"message.created")
    if b"f" in fields:
        conversation = orjson.dumps(fields.get(b"c", b"").decode())
        data = b'{"conversation":' + conversation + b',"message":' + fields[b"f"] + b"}"
    else:
        data = fields.get(b"d", b"{}")
    ts = int(entry_id.split(b"-", 1)[0])
    head: dict[str, Any] = {"id": entry_id.decode(), "type": event.decode(), "ts": ts}
    return orjson.dumps(head)[:-1] + b',"data":' + data + b"}"
