"""OpenTelemetry traces of a message's path: publish, fan-out on each worker, archiving, the
webhook.

Contract:
- Off unless ``CHAT_TRACING_ENDPOINT`` is set: :func:`tracing_from` returns None and every
  path that could trace tests ``tracing is None`` first, so tracing off costs one attribute
  test per message on those paths, nothing else (no SDK call, no field in any frame).
- On, a message is traced when the W3C ``traceparent`` it came with says sampled (the
  ``send`` frame's ``traceparent`` field, or the backend API's ``traceparent`` header), or,
  without one, with probability ``CHAT_TRACING_SAMPLE_RATIO``. An unsampled message costs one
  random draw: the SDK is not called.
- A traced message carries its trace context in its own frame, as the field
  ``"traceparent":"00-<trace id>-<publish span id>-01"`` just before ``ts``: through Redis to
  every worker, into history, the archive stream and the webhook queue, so each stage that
  handles it continues the same trace (and clients may read it). Untraced frames have no such
  field.
- Spans: ``publish`` (PRODUCER, on the sender's worker: from the frame or API call to Redis'
  answer), ``fanout`` (CONSUMER, once per worker that delivers the message, with the number of
  connections it was queued on: never one span per recipient), ``archive`` (the write of the
  batch that stored it), ``webhook`` (CLIENT: the POST to the backend, whose ``traceparent``
  header is this span's context).
- Recording a span on the event loop is a few attribute stores and a deque append (this
  module's :class:`Span`); the OpenTelemetry SDK's spans are built, encoded and sent over
  OTLP/HTTP by the worker's export thread every ``CHAT_TRACING_EXPORT_INTERVAL_S``, in one
  warm batch (building SDK spans one by one on the loop cost ~170 µs per traced message
  instead of ~93 µs, and 1 % tracing 21 % of closed-loop throughput: docs/benchmarks.md).
  At most ``CHAT_TRACING_QUEUE_MAX`` spans wait: past that the oldest are dropped; a
  collector that is down or slow loses spans, never delays a message.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import random
import re
import socket
import threading
import time
from collections.abc import Sequence
from typing import Final, Protocol

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.util.types import AttributeValue

from app.protocol import TRACEPARENT_PATTERN
from app.settings import Settings

logger = logging.getLogger(__name__)

_SAMPLED: Final = TraceFlags(TraceFlags.SAMPLED)
_EXPORT_BATCH_MAX: Final = 512
_TRACEPARENT = re.compile(TRACEPARENT_PATTERN)
# How a traced frame carries its context (app.protocol.message_frame_parts puts it last but
# `ts`). A message's text cannot contain these bytes: JSON escapes its quotes.
FRAME_FIELD: Final = b',"traceparent":"'
_FIELD_LENGTH: Final = 55  # len("00-" + 32 + "-" + 16 + "-01")


def parse(traceparent: str | None) -> SpanContext | None:
    """The remote span context ``traceparent`` names (None: absent, malformed, or the
    all-zero ids W3C calls invalid)."""
    if traceparent is None or not _TRACEPARENT.match(traceparent):
        return None
    _, trace_id, span_id, flags = traceparent.split("-")
    context = SpanContext(
        int(trace_id, 16), int(span_id, 16), is_remote=True, trace_flags=TraceFlags(int(flags, 16))
    )
    return context if context.is_valid else None


class Span:
    """A span being recorded on the event loop: its ids, times and attributes, nothing else
    (the SDK's span is made at export). :meth:`end` hands it to the export thread."""

    __slots__ = (
        "_finished", "attributes", "end_ns", "kind", "links", "name", "parent", "span_id",
        "start_ns", "status", "trace_id",
    )  # fmt: skip

    def __init__(
        self,
        finished: collections.deque[Span],
        name: str,
        kind: SpanKind,
        parent: SpanContext | None,
        attributes: dict[str, AttributeValue],
        links: Sequence[SpanContext] = (),
        start_ns: int | None = None,
    ) -> None:
        self._finished = finished
        self.name, self.kind, self.parent, self.attributes = name, kind, parent, attributes
        self.links = links
        self.trace_id = parent.trace_id if parent is not None else random.getrandbits(128) or 1
        self.span_id = random.getrandbits(64) or 1
        self.start_ns = time.time_ns() if start_ns is None else start_ns
        self.end_ns = 0
        self.status: Status | None = None

    def set_attribute(self, key: str, value: AttributeValue) -> None:
        self.attributes[key] = value

    def set_status(self, status: Status) -> None:
        self.status = status

    def end(self) -> None:
        """The span is over: it goes to the next export (at most once)."""
        if not self.end_ns:
            self.end_ns = time.time_ns()
            self._finished.append(self)

    def readable(self, resource: Resource, scope: InstrumentationScope) -> ReadableSpan:
        """The SDK's span for this one (export thread)."""
        context = SpanContext(self.trace_id, self.span_id, is_remote=False, trace_flags=_SAMPLED)
        return ReadableSpan(
            self.name, context, self.parent, resource, self.attributes,
            links=[Link(link) for link in self.links], kind=self.kind,
            status=self.status or Status(StatusCode.UNSET), start_time=self.start_ns,
            end_time=self.end_ns, instrumentation_scope=scope,
        )  # fmt: skip


def traceparent_of(span: Span) -> str:
    """The W3C ``traceparent`` of ``span`` (sampled)."""
    return f"00-{span.trace_id:032x}-{span.span_id:016x}-01"


def trace_id_of(span: Span) -> str:
    """The trace id of ``span``, in hex (as exemplars and trace UIs show it)."""
    return f"{span.trace_id:032x}"


class Outcome(Protocol):
    """What a publish answered (:class:`app.broker.Published`)."""

    @property
    def id(self) -> int: ...

    @property
    def duplicate(self) -> bool: ...


def end_publish(span: Span, published: Outcome | None) -> None:
    """End a ``publish`` span: with the message's id, or as an error when nothing was
    published (``published`` None)."""
    if published is None:
        span.set_status(Status(StatusCode.ERROR, "not published"))
    else:
        span.set_attribute("messaging.message.id", str(published.id))
        if published.duplicate:
            span.set_attribute("hubbub.duplicate", True)
    span.end()


def in_frame(payload: bytes) -> SpanContext | None:
    """The trace context a message frame carries (None: it is not traced)."""
    start = payload.rfind(FRAME_FIELD)
    if start < 0:
        return None
    start += len(FRAME_FIELD)
    return parse(payload[start : start + _FIELD_LENGTH].decode("ascii", "replace"))


class Tracing:
    """This worker's tracer: spans of the message paths, exported over OTLP/HTTP by a thread
    of its own."""

    def __init__(self, settings: Settings) -> None:
        assert settings.tracing_endpoint is not None
        self._resource = Resource.create({
            "service.name": settings.tracing_service_name,
            "service.instance.id": f"{socket.gethostname()}:{os.getpid()}",
        })  # fmt: skip
        self._scope = InstrumentationScope("hubbub")
        endpoint = str(settings.tracing_endpoint).rstrip("/") + "/v1/traces"
        self._exporter = OTLPSpanExporter(
            endpoint=endpoint, timeout=settings.tracing_export_timeout_s
        )
        self._finished: collections.deque[Span] = collections.deque(
            maxlen=settings.tracing_queue_max
        )
        self._interval_s = settings.tracing_export_interval_s
        self._ratio = settings.tracing_sample_ratio
        self._random = random.random
        self._stopping = threading.Event()
        self._thread = threading.Thread(
            target=self._export_loop, name="hubbub-tracing", daemon=True
        )
        self._thread.start()

    def start_publish(self, traceparent: str | None, conversation: str, via: str) -> Span | None:
        """A ``publish`` span for a message about to be published (None: not traced). Its
        parent is ``traceparent`` when that is valid; a parent that says "not sampled" is not
        traced. ``via``: ``socket`` or ``api``."""
        parent = parse(traceparent)
        if parent is None:
            if self._random() >= self._ratio:
                return None
        elif not parent.trace_flags.sampled:
            return None
        return Span(
            self._finished, "publish", SpanKind.PRODUCER, parent,
            {"messaging.system": "hubbub", "messaging.operation.type": "publish",
             "messaging.destination.name": conversation, "hubbub.via": via},
        )  # fmt: skip

    def start_fanout(self, payload: bytes, conversation: str) -> Span | None:
        """A ``fanout`` span for delivering message frame ``payload`` on this worker (None:
        the frame is not traced)."""
        parent = in_frame(payload)
        if parent is None:
            return None
        return Span(
            self._finished, "fanout", SpanKind.CONSUMER, parent,
            {"messaging.system": "hubbub", "messaging.operation.type": "process",
             "messaging.destination.name": conversation, "hubbub.worker": os.getpid()},
        )  # fmt: skip

    def start_stage(
        self, name: str, parents: Sequence[SpanContext], kind: SpanKind, start_time: int | None
    ) -> Span:
        """A span of a stage that handles traced messages together (``archive``,
        ``webhook``): the child of the first of ``parents``, linked to the others.
        ``start_time``: in ns since the epoch (None: now)."""
        first, *others = parents
        return Span(self._finished, name, kind, first, {}, others, start_time)

    def _export_loop(self) -> None:
        """The export thread: every interval (and once more when stopping), what ended."""
        while not self._stopping.wait(self._interval_s):
            self._export()
        self._export()

    def _export(self) -> None:
        finished = self._finished
        while finished:
            batch: list[ReadableSpan] = []
            while finished and len(batch) < _EXPORT_BATCH_MAX:
                batch.append(finished.popleft().readable(self._resource, self._scope))
            try:
                self._exporter.export(batch)  # retries within its timeout; logs failures
            except Exception:
                logger.exception("tracing: exporting %d spans failed", len(batch))

    async def stop(self) -> None:
        """Export what is waiting (within the export timeout) and stop."""
        self._stopping.set()
        await asyncio.to_thread(self._thread.join)
        self._exporter.shutdown()  # type: ignore[no-untyped-call]  # untyped upstream


def tracing_from(settings: Settings) -> Tracing | None:
    """The worker's tracing, or None when ``CHAT_TRACING_ENDPOINT`` is unset (off)."""
    if settings.tracing_endpoint is None:
        return None
    return Tracing(settings)
