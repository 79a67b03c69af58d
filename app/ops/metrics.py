"""Metrics: what a worker tells Prometheus, and how the workers' numbers add up.

One :class:`Metrics` per worker (built by the app's lifespan), registered in a registry of its
own. Under Gunicorn every worker is a process with its own metrics, so ``deploy/
gunicorn.conf.py`` sets ``PROMETHEUS_MULTIPROC_DIR`` (prometheus_client's multiprocess mode):
each worker writes its values to files there and whichever worker answers a scrape reads them
all (:func:`exposition`). Counters sum over workers, dead ones included, so they never go
backwards; gauges of countable things (connections, rooms, queued bytes) are ``livesum`` and
per-worker gauges (CPU, memory, broker state) ``liveall`` with a ``pid`` label — both forget a
worker as soon as Gunicorn reaps it (``child_exit`` calls ``mark_process_dead``).

Cost on the hot paths: fan-out and socket writes bump plain ``int`` attributes, which
:meth:`Metrics.sync` moves into Prometheus once a second; the fan-out latency histogram is
observed at most :data:`LATENCY_SAMPLES_PER_S` times a second per worker. No label carries a
room or a user name: label values come from fixed sets.
"""

from __future__ import annotations

import asyncio
import os
import resource
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from prometheus_client import (
    CONTENT_TYPE_PLAIN_0_0_4,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as OPENMETRICS_TYPE
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.registry import Collector

from app import __version__
from app.errors import CloseCode, ErrorCode
from app.ops.exemplars import Exemplars, attach

if TYPE_CHECKING:
    from app.broker import Broker
    from app.store.archiver import ArchiveStats
    from app.webhooks.dispatcher import WebhookStats

MULTIPROC_ENV: Final = "PROMETHEUS_MULTIPROC_DIR"
CONTENT_TYPE: Final = CONTENT_TYPE_PLAIN_0_0_4  # the text format every Prometheus reads
OPENMETRICS_CONTENT_TYPE: Final = OPENMETRICS_TYPE  # what carries exemplars
LATENCY_SAMPLES_PER_S: Final = 1000
SYNC_INTERVAL_S: Final = 1.0

# Close codes get their own label value; any other code a client sends counts as "other".
# 1001 going away (tab closed), 1005 no status, 1006 abnormal (TCP lost) come from clients.
CLIENT_CLOSE_CODES: Final = (1001, 1005, 1006)
_CLOSE_LABELS: Final = {code: str(code) for code in (*map(int, CloseCode), *CLIENT_CLOSE_CODES)}
FRAME_TYPES: Final = (
    "join", "leave", "send", "typing", "ping", "pong", "invalid", "binary", "rate_limited",
)  # fmt: skip

_LATENCY_BUCKETS: Final = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
PUBLISH_LATENCY: Final = "hubbub_broker_publish_duration_seconds"
_PUBLISH_BUCKETS: Final = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
)  # fmt: skip
_DURATION_BUCKETS: Final = (1, 10, 60, 300, 900, 3600, 4 * 3600, 12 * 3600, 24 * 3600)
# 0.02: no collection under traffic may pause a worker longer (issue 19); a bound to read it by.
_GC_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
_SIZE_BUCKETS: Final = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)
_PAGE_SIZE: Final = os.sysconf("SC_PAGE_SIZE")


def close_label(code: int) -> str:
    """The ``code`` label of a close: the code itself when known, else ``other``."""
    return _CLOSE_LABELS.get(code, "other")


def multiprocess_dir() -> str | None:
    """The multiprocess directory when prometheus_client runs in multiprocess mode."""
    return os.environ.get(MULTIPROC_ENV) or None


class _WithExemplars(Collector):
    """Every worker's metrics (multiprocess mode), with the exemplars they saved."""

    def __init__(self, directory: str) -> None:
        self._directory = directory
        self._metrics = MultiProcessCollector(None)  # type: ignore[no-untyped-call]  # untyped upstream

    def collect(self) -> Iterable[Metric]:
        return attach(self._metrics.collect(), self._directory)  # type: ignore[no-untyped-call]  # untyped upstream


def exposition(registry: CollectorRegistry, openmetrics: bool = False) -> bytes:
    """The exposition of the whole server: every worker's files in multiprocess mode, else
    ``registry`` (one process). In the text format 0.0.4, or with ``openmetrics`` in the
    OpenMetrics format, which carries the latency histograms' exemplars (links to traces)."""
    generate = generate_openmetrics if openmetrics else generate_latest
    directory = multiprocess_dir()
    if directory is None:
        return generate(registry)
    merged = CollectorRegistry()
    if openmetrics:
        merged.register(_WithExemplars(directory))
    else:
        MultiProcessCollector(merged)  # type: ignore[no-untyped-call]  # untyped upstream
    return generate(merged)


@dataclass(frozen=True, slots=True)
class HubSnapshot:
    """What the worker's Hub holds, as the gauges show it (the Hub makes it: see
    :meth:`app.sockets.hub.Hub.snapshot`)."""

    connections: int
    sse_connections: int  # of which over the HTTP fallback transport
    queued_bytes: int
    max_queued_bytes: int
    rooms: int
    memberships: int
    memberships_behind: int
    draining: bool


class Metrics:
    """This worker's Prometheus metrics, and the plain counters the hot paths bump.

    Contract: the ``*_since_sync`` counters and :meth:`wrote` may be called from the event
    loop's thread only; :meth:`sync` publishes them (call it once a second and once at exit).
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, labels, registry=r)

        def gauge(name: str, doc: str, mode: str, labels: tuple[str, ...] = ()) -> Gauge:
            return Gauge(name, doc, labels, registry=r, multiprocess_mode=mode)  # type: ignore[arg-type]

        self.info = gauge("hubbub_build_info", "Always 1; the version is a label.", "livemax",
                          ("version",))  # fmt: skip
        self.info.labels(__version__).set(1)

        # -- connections
        self.connections = gauge("hubbub_connections", "Open WebSocket connections.", "livesum")
        self.rebalance_shed = counter(
            "hubbub_rebalance_shed_total",
            "Connections closed with 1012 to move them to a less loaded worker "
            "(app.sockets.rebalance).",
        )
        self.rebalance_average = gauge(
            "hubbub_rebalance_average_connections",
            "The deployment's average connections per worker, as this worker last read the census.",
            "livemax",
        )
        self.by_transport = gauge(
            "hubbub_connections_by_transport",
            "Open connections by transport: `websocket`, or `sse` (the HTTP fallback).",
            "livesum",
            ("transport",),
        )
        self.opened = counter("hubbub_connections_opened_total", "WebSocket upgrades accepted.")
        self.upgrades_refused = counter(
            "hubbub_upgrades_refused_total",
            "WebSocket upgrades refused with HTTP 403 before any socket, by reason.",
            ("reason",),
        )
        self.upgrades_refused.labels("origin")
        self.closed = counter(
            "hubbub_connections_closed_total",
            "WebSocket connections ended, by close code (sent by the server, or the client's; "
            "`other` for codes outside the documented set).",
            ("code",),
        )
        for label in (*_CLOSE_LABELS.values(), "other"):
            self.closed.labels(label)
        self.duration = Histogram(
            "hubbub_connection_duration_seconds",
            "How long connections lasted, observed when they end.",
            buckets=_DURATION_BUCKETS,
            registry=r,
        )

        # -- frames and messages
        self.frames_received = counter(
            "hubbub_frames_received_total",
            "Client frames, by type (`invalid`: unparsable, `rate_limited`: dropped unread).",
            ("type",),
        )
        for frame_type in FRAME_TYPES:
            self.frames_received.labels(frame_type)
        self.frames_sent = counter(
            "hubbub_frames_sent_total",
            "WebSocket frames written (one may carry several coalesced messages).",
        )
        self.published = counter(
            "hubbub_messages_published_total", "Chat messages accepted from this server's clients."
        )
        self.delivered = counter(
            "hubbub_messages_delivered_total",
            "Chat messages queued for this server's sockets (one per recipient connection).",
        )
        self.errors = counter(
            "hubbub_error_frames_total", "Error frames sent to clients, by code.", ("code",)
        )
        for error_code in ErrorCode:
            self.errors.labels(error_code.value)
        self.fanout_latency = Histogram(
            "hubbub_fanout_latency_seconds",
            "From a message's publish (its id's timestamp) until the loop iteration that heard it "
            "wrote it to its sockets (or queued it for paused ones); "
            "sampled.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )

        # -- queues and rooms
        self.outbox_bytes = gauge(
            "hubbub_outbox_queued_bytes", "Bytes queued for slow sockets, all connections.",
            "livesum",
        )  # fmt: skip
        self.outbox_max_bytes = gauge(
            "hubbub_outbox_max_queued_bytes", "The fullest connection's queued bytes.", "livemax"
        )
        self.rooms = gauge(
            "hubbub_rooms", "Rooms with a member connected here, summed over workers.", "livesum"
        )
        self.memberships = gauge(
            "hubbub_room_memberships", "Connection-in-room pairs (joins held).", "livesum"
        )
        self.memberships_behind = gauge(
            "hubbub_room_memberships_behind",
            "Connection-in-room pairs still catching up from history (a join with since, or "
            "every membership of a worker after its broker subscription was lost).",
            "livesum",
        )
        self.join_room_size = Histogram(
            "hubbub_join_room_size",
            "Users present in a room (all servers) when a connection joins it.",
            buckets=_SIZE_BUCKETS,
            registry=r,
        )

        # -- broker
        self.broker_connected = gauge(
            "hubbub_broker_connected",
            "1 while this worker's broker subscription is up (readiness), else 0.",
            "liveall",
        )
        self.broker_reconnects = counter(
            "hubbub_broker_reconnects_total",
            "Broker subscription losses, by reason (`deaf`: canaries stopped arriving; "
            "`failover`: the Sentinels named a new master).",
            ("reason",),
        )
        for reason in ("error", "deaf", "failover"):
            self.broker_reconnects.labels(reason)
        self.acks_not_replicated = counter(
            "hubbub_broker_acks_not_replicated_total",
            "Sends answered broker_unavailable because fewer than CHAT_REDIS_WAIT_REPLICAS "
            "replicas confirmed them in time (written on the master, not acked).",
        )
        self.acks_without_replicas = counter(
            "hubbub_broker_acks_without_replicas_total",
            "Sends acked without waiting for CHAT_REDIS_WAIT_REPLICAS replicas, as the master "
            "had too few (CHAT_REDIS_WAIT_POLICY=available): a failover may lose them.",
        )
        self.pubsub_lag = gauge(
            "hubbub_broker_pubsub_lag_seconds",
            "Latest canary's trip through the broker's pub/sub, per worker.",
            "liveall",
        )
        self.redis_memory_used = gauge(
            "hubbub_redis_memory_used_bytes",
            "Redis' used_memory, as a worker last read it (every CHAT_PRESENCE_TTL_S / 3).",
            "liveall",
        )
        self.redis_memory_max = gauge(
            "hubbub_redis_memory_max_bytes",
            "Redis' maxmemory (0: no limit), as a worker last read it.",
            "liveall",
        )
        self.publish_latency = Histogram(
            PUBLISH_LATENCY,
            "Duration of one publish to the broker (sampled).",
            buckets=_PUBLISH_BUCKETS,
            registry=r,
        )
        # Traced publishes' latencies, for the exposition under gunicorn (app.ops.exemplars).
        self.exemplars = Exemplars()
        self.publish_failures = counter(
            "hubbub_broker_publish_failures_total", "Publishes refused: the broker was down."
        )

        # -- the store's archive
        self.archive_lag_messages = gauge(
            "hubbub_archive_lag_messages",
            "Messages published and not yet stored (the archive stream's length), as a worker "
            "last read it (every 2 s).",
            "liveall",
        )
        self.archive_lag = gauge(
            "hubbub_archive_lag_seconds",
            "Age of the oldest message not yet stored (0: none waits), as a worker last read "
            "it. Grows while the store is down.",
            "liveall",
        )
        self.archived = counter("hubbub_archived_total", "Messages stored by this worker.")
        self.archive_failures = counter(
            "hubbub_archive_failures_total", "Batches the store refused (each is retried)."
        )
        self.archive_dropped = counter(
            "hubbub_archive_dropped_total",
            "Messages that will never be stored: dropped past CHAT_ARCHIVE_BACKLOG_MAX.",
        )
        self.archive_rejected = counter(
            "hubbub_archive_rejected_total",
            "Messages the store refused for their data (a value it cannot hold): left out, "
            "never retried; the rest of their batch is stored.",
        )
        self.search_backlog = gauge(
            "hubbub_search_backlog",
            "Stored messages, edits and deletions the search indexer has not applied yet (they "
            "are not found by search until it has), on the worker that indexes.",
            "liveall",
        )
        self.archive_leading = gauge(
            "hubbub_archive_leader",
            "1 on the worker that archives (one per deployment), else 0.",
            "liveall",
        )

        # -- files (app.files)
        self.file_uploads = counter(
            "hubbub_file_uploads_total", "Upload URLs handed out (uploads started)."
        )
        self.files_attached = counter(
            "hubbub_files_attached_total", "Files attached to messages sent."
        )
        self.files_deleted = counter(
            "hubbub_files_deleted_total",
            "Files deleted with their objects: of deleted or expired messages, or never sent.",
        )
        self.file_storage_errors = counter(
            "hubbub_file_storage_errors_total",
            "Calls to the file storage that failed (answered storage_unavailable, or retried "
            "by the next sweep), by operation.",
            ("operation",),
        )
        for operation in ("upload", "attach", "link", "delete"):
            self.file_storage_errors.labels(operation)

        # -- the moderation hook (app.moderation.hook)
        self.moderation_decisions = counter(
            "hubbub_moderation_decisions_total",
            "Messages and edits the moderation hook decided, by decision: accept, reject, "
            "replace; failed_accept and failed_reject when it failed or was slow and "
            "CHAT_MODERATION_HOOK_ON_FAILURE decided.",
            ("decision",),
        )
        for decision in ("accept", "reject", "replace", "failed_accept", "failed_reject"):
            self.moderation_decisions.labels(decision)
        self.moderation_hook_latency = Histogram(
            "hubbub_moderation_hook_seconds",
            "Time from a message reaching the hook's queue to its decision (failures included).",
            buckets=_PUBLISH_BUCKETS,
            registry=r,
        )
        self.moderation_hook_batch = Histogram(
            "hubbub_moderation_hook_batch_size",
            "Messages per hook request.",
            buckets=_SIZE_BUCKETS,
            registry=r,
        )

        # -- reports (app.moderation.reports)
        self.reports = counter(
            "hubbub_reports_total",
            "Reports of messages, by outcome: reported (a new report queued), dismissed and "
            "deleted (resolved by a moderator or the backend API, the message kept or deleted).",
            ("outcome",),
        )
        for outcome in ("reported", "dismissed", "deleted"):
            self.reports.labels(outcome)

        # -- notifications (app.notify)
        self.notifications = counter(
            "hubbub_notifications_total",
            "Pending notifications decided, by outcome: sent (pushed and/or to the webhook), "
            "read (the user read it first), visible (a visible connection of theirs), "
            "unwanted (level or mute), forbidden (may no longer read the conversation), "
            "deleted (the message was), hidden (its author is muted or blocked by the user), "
            "deferred (within CHAT_NOTIFY_INTERVAL_S of the last).",
            ("outcome",),
        )
        for outcome in (
            "sent",
            "read",
            "visible",
            "unwanted",
            "forbidden",
            "deleted",
            "hidden",
            "deferred",
        ):
            self.notifications.labels(outcome)
        self.pushes = counter(
            "hubbub_web_pushes_total",
            "Web Push requests by outcome: delivered (2xx), gone (404/410: the subscription "
            "was removed), failed (an error, a timeout, any other status).",
            ("outcome",),
        )
        for outcome in ("delivered", "gone", "failed"):
            self.pushes.labels(outcome)

        # -- webhooks
        self.webhook_deliveries = counter(
            "hubbub_webhook_deliveries_total",
            "Webhook attempts by outcome: delivered (2xx), failed (retried), given_up (failing "
            "for CHAT_WEBHOOK_RETRY_MAX_S: removed).",
            ("outcome",),
        )
        for outcome in ("delivered", "failed", "given_up"):
            self.webhook_deliveries.labels(outcome)
        self.webhook_lag = gauge(
            "hubbub_webhook_lag_seconds",
            "Age of the oldest event waiting in the webhook queue (0: none), as a worker last "
            "read it (every 2 s). Grows while the backend fails.",
            "liveall",
        )
        self.webhook_backlog = gauge(
            "hubbub_webhook_backlog",
            "Events waiting in the webhook queue, as a worker last read it.",
            "liveall",
        )
        self.webhook_not_queued = gauge(
            "hubbub_webhook_events_not_queued",
            "Events never queued since the queue began: it held CHAT_WEBHOOK_BACKLOG_MAX.",
            "liveall",
        )

        # -- the worker
        self.ready = gauge(
            "hubbub_ready",
            "1 while this worker is ready (`/readyz` 200: broker up, not draining), else 0.",
            "liveall",
        )
        self.draining = gauge(
            "hubbub_draining", "1 while this worker drains its connections (deploy).", "liveall"
        )
        self.cpu = gauge(
            "hubbub_worker_cpu_seconds",
            "CPU time (user + system) this worker used since it started; use rate().",
            "liveall",
        )
        self.memory = gauge(
            "hubbub_worker_resident_memory_bytes", "Resident memory of this worker.", "liveall"
        )
        self.fast_path_live = gauge(
            "hubbub_fast_path_live",
            "1 when a fast path that relies on a dependency's internals works with the installed "
            "version (app/transport/uvicorn_seam.py, app/redisio/redis_seam.py), else 0; set at "
            "start, and to 0 when a connection had to fall back.",
            "livemin",
            ("path",),
        )
        self.transport_fallbacks = counter(
            "hubbub_transport_fallbacks_total",
            "Connections written through ASGI instead of directly, by reason "
            "(permessage_deflate: expected when compression is on; no_protocol: a defect).",
            ("reason",),
        )
        self.gc_pauses = Histogram(
            "hubbub_gc_pause_seconds",
            "Pauses of Python's cyclic garbage collector (the worker serves nobody meanwhile), "
            "by generation; generation 2 walks every open socket's objects.",
            ("generation",),
            buckets=_GC_BUCKETS,
            registry=r,
        )
        for generation in ("0", "1", "2"):
            self.gc_pauses.labels(generation)
        self.gc_collected = counter(
            "hubbub_gc_collected_objects_total",
            "Objects the cyclic garbage collector found in reference cycles and freed, by "
            "generation: serving should make none (a steady rise is a cycle per connection or "
            "message, which frozen objects would leak: see CHAT_GC_FREEZE_INTERVAL_S).",
            ("generation",),
        )
        for generation in ("0", "1", "2"):
            self.gc_collected.labels(generation)

        # Bumped on the hot paths, published by sync().
        self.delivered_since_sync = 0
        self.frames_sent_since_sync = 0
        self.published_since_sync = 0
        self.frames_received_since_sync: Tally[str] = Tally()
        # (generation, seconds) of each collection, appended by app.ops.gc_tuning.GcTuning.
        self.gc_pauses_since_sync: list[tuple[int, float, int]] = []
        self._broker_reconnects = 0
        self._broker_deaf = 0
        self._broker_failovers = self._acks_not_replicated = self._acks_without_replicas = 0
        # stored, failures, dropped, rejected: as last synced
        self._archive_counts = (0, 0, 0, 0)
        self._webhook_counts = (0, 0, 0)  # delivered, failed, given up: as last synced
        self._next_latency_sample = 0.0
        self._next_publish_sample = 0.0

    # -- hot paths --------------------------------------------------------------------------

    def wrote(self) -> None:
        """A socket write finished (one frame, maybe several coalesced messages)."""
        self.frames_sent_since_sync += 1

    def sample_fanout(self, message_id: int) -> None:
        """Message ``message_id`` was just offered to its local recipients: at most
        :data:`LATENCY_SAMPLES_PER_S` times a second, observe its fan-out latency once the
        frames offered in this loop iteration are written (the Flusher's callback, scheduled
        by the first offer, runs before this one)."""
        now = time.time()
        if now >= self._next_latency_sample:
            self._next_latency_sample = now + 1 / LATENCY_SAMPLES_PER_S
            asyncio.get_running_loop().call_soon(self._observe_fanout, message_id)

    def _observe_fanout(self, message_id: int) -> None:
        # Message ids are 1000 * the publish time in ms (see the brokers), plus a small
        # counter within one ms: id / 1e6 is the publish time in seconds.
        self.fanout_latency.observe(max(0.0, time.time() - message_id / 1e6))

    def publish_took(self, seconds: float, now: float, trace_id: str | None = None) -> None:
        """A publish took ``seconds`` (observed at most once per millisecond, and always
        when the message was traced: ``trace_id``, the exemplar that links the histogram's
        bucket to the trace, app.ops.tracing)."""
        self.published_since_sync += 1
        if trace_id is not None:
            self.publish_latency.observe(seconds, {"trace_id": trace_id})
            self.exemplars.heard(PUBLISH_LATENCY, _PUBLISH_BUCKETS, seconds, trace_id)
        elif now >= self._next_publish_sample:
            self._next_publish_sample = now + 1 / LATENCY_SAMPLES_PER_S
            self.publish_latency.observe(seconds)

    def connection_closed(self, code: int, duration_s: float) -> None:
        self.closed.labels(close_label(code)).inc()
        self.duration.observe(duration_s)

    def error_sent(self, code: ErrorCode, count: int = 1) -> None:
        self.errors.labels(code.value).inc(count)

    # -- once a second ----------------------------------------------------------------------

    def sync(self, hub: HubSnapshot, broker: Broker, archive: ArchiveStats | None = None) -> None:
        """Publish the hot-path counters and sample the gauges (``archive``: with a store)."""
        directory = multiprocess_dir()
        if directory is not None:
            self.exemplars.save(directory)
        if self.delivered_since_sync:
            self.delivered.inc(self.delivered_since_sync)
            self.delivered_since_sync = 0
        if self.frames_sent_since_sync:
            self.frames_sent.inc(self.frames_sent_since_sync)
            self.frames_sent_since_sync = 0
        if self.published_since_sync:
            self.published.inc(self.published_since_sync)
            self.published_since_sync = 0
        for frame_type, count in self.frames_received_since_sync.items():
            self.frames_received.labels(frame_type).inc(count)
        self.frames_received_since_sync.clear()
        pending = self.gc_pauses_since_sync  # drained in place: the collector holds this list
        pauses = pending[:]
        del pending[: len(pauses)]  # pauses appended meanwhile stay for the next sync
        for generation, seconds, collected in pauses:
            self.gc_pauses.labels(str(generation)).observe(seconds)
            if collected:
                self.gc_collected.labels(str(generation)).inc(collected)

        self.connections.set(hub.connections)
        self.by_transport.labels("websocket").set(hub.connections - hub.sse_connections)
        self.by_transport.labels("sse").set(hub.sse_connections)
        self.outbox_bytes.set(hub.queued_bytes)
        self.outbox_max_bytes.set(hub.max_queued_bytes)
        self.rooms.set(hub.rooms)
        self.memberships.set(hub.memberships)
        self.memberships_behind.set(hub.memberships_behind)
        self.draining.set(1 if hub.draining else 0)

        stats = broker.stats
        self.broker_connected.set(1 if broker.ready else 0)
        self.ready.set(1 if broker.ready and not hub.draining else 0)
        self.pubsub_lag.set(stats.pubsub_lag_s)
        self.redis_memory_used.set(stats.memory_used_bytes)
        self.redis_memory_max.set(stats.memory_max_bytes)
        deaf = stats.deaf_reconnects - self._broker_deaf
        failovers = stats.failovers - self._broker_failovers
        errors = stats.reconnects - self._broker_reconnects - deaf - failovers
        for reason, count in (("deaf", deaf), ("failover", failovers), ("error", errors)):
            if count > 0:
                self.broker_reconnects.labels(reason).inc(count)
        self._broker_reconnects, self._broker_deaf = stats.reconnects, stats.deaf_reconnects
        self._broker_failovers = stats.failovers
        if stats.not_replicated > self._acks_not_replicated:
            self.acks_not_replicated.inc(stats.not_replicated - self._acks_not_replicated)
            self._acks_not_replicated = stats.not_replicated
        if stats.acked_without_replicas > self._acks_without_replicas:
            self.acks_without_replicas.inc(
                stats.acked_without_replicas - self._acks_without_replicas
            )
            self._acks_without_replicas = stats.acked_without_replicas

        if archive is not None:
            self._sync_archive(archive)

        usage = resource.getrusage(resource.RUSAGE_SELF)
        self.cpu.set(usage.ru_utime + usage.ru_stime)
        self.memory.set(_resident_bytes())

    def _sync_archive(self, archive: ArchiveStats) -> None:
        self.archive_lag_messages.set(archive.lag_messages)
        self.archive_lag.set(archive.lag_seconds)
        self.archive_leading.set(1 if archive.leading else 0)
        self.search_backlog.set(archive.search_backlog)
        counts = (archive.stored, archive.failures, archive.dropped, archive.rejected)
        for counter, now, before in zip(
            (self.archived, self.archive_failures, self.archive_dropped, self.archive_rejected),
            counts,
            self._archive_counts,
            strict=True,
        ):
            if now > before:
                counter.inc(now - before)
        self._archive_counts = counts

    def sync_webhooks(self, stats: WebhookStats) -> None:
        self.webhook_lag.set(stats.lag_s)
        self.webhook_backlog.set(stats.backlog)
        self.webhook_not_queued.set(stats.not_queued)
        counts = (stats.delivered, stats.failed_attempts, stats.given_up)
        for outcome, now, before in zip(
            ("delivered", "failed", "given_up"), counts, self._webhook_counts, strict=True
        ):
            if now > before:
                self.webhook_deliveries.labels(outcome).inc(now - before)
        self._webhook_counts = counts

    def render(self, openmetrics: bool = False) -> bytes:
        """The exposition for a scrape (the whole server's, in multiprocess mode), in the
        OpenMetrics format (with exemplars) when ``openmetrics``."""
        return exposition(self.registry, openmetrics)


def _resident_bytes() -> int:
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE_SIZE
    except OSError:  # not Linux: the peak is the best there is (KiB on Linux, bytes on macOS)
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


async def run_metrics_sync(
    metrics: Metrics,
    snapshot: Callable[[], HubSnapshot],
    broker: Broker,
    archive: Callable[[], ArchiveStats] | None = None,
    webhooks: Callable[[], WebhookStats] | None = None,
) -> None:
    """Call :meth:`Metrics.sync` with a fresh ``snapshot()`` (and ``archive()``, and the
    webhook dispatcher's stats) every :data:`SYNC_INTERVAL_S` until cancelled."""
    while True:
        metrics.sync(snapshot(), broker, archive() if archive is not None else None)
        if webhooks is not None:
            metrics.sync_webhooks(webhooks())
        await asyncio.sleep(SYNC_INTERVAL_S)
