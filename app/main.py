"""The ASGI application: :func:`create_app` wires settings, broker, hub and heartbeat.

Uvicorn: ``uvicorn --factory app.main:create_app``; ``python -m app`` does that with the
WebSocket options taken from the settings (see :mod:`app.server`).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_fastapi_instrumentator import Instrumentator

from app import __version__
from app.access.auth import Authenticator
from app.access.origin import OriginPolicy
from app.access.pending import PendingAuth
from app.access.quotas import create_quotas, keep_counts
from app.access.token_expiry import run_token_expiry
from app.broker import create_broker
from app.conversations.history import ConversationHistory
from app.conversations.rooms import RoomDirectory
from app.files.service import Files
from app.files.storage import storage_for
from app.moderation.hook import ModerationHook
from app.moderation.reports import Reports
from app.notify.notifier import Notifier
from app.notify.service import Notifications
from app.notify.webpush import push_sender
from app.ops.descriptors import connection_cap, raise_soft_limit
from app.ops.gc_tuning import GcTuning, keep_freezing
from app.ops.metrics import Metrics, run_metrics_sync
from app.ops.metrics_endpoint import MetricsEndpoint
from app.ops.roster import is_roster_payload
from app.ops.tracing import tracing_from
from app.presence import create_presence
from app.previews.service import LinkPreviews
from app.redisio import redis_seam
from app.settings import Settings, load_settings
from app.sockets.heartbeat import run_heartbeat
from app.sockets.hub import Hub
from app.sockets.replay import Pacing
from app.state import ChatState
from app.store.running import RunningStore
from app.transport import uvicorn_seam
from app.transport.flusher import Flusher
from app.web.admin import router as admin_router
from app.web.api import ChatSocket, router
from app.web.backend_api import router as backend_router
from app.web.files import router as files_router
from app.web.page import mount_page
from app.webhooks.wiring import connect_webhooks

logger = logging.getLogger(__name__)

# A shutdown step that runs longer than this is named in the log (it still runs to its end).
_SLOW_STEP_S = 5.0


async def _stop_tasks(tasks: list[asyncio.Task[Any]], within_s: float) -> None:
    """Cancel ``tasks`` and wait up to ``within_s`` for them to end; one that has not (it
    swallowed its cancellation) is logged by name and left behind, as is one that had
    failed. Never raises."""
    for task in tasks:
        task.cancel()
    if not tasks:
        return
    done, pending = await asyncio.wait(tasks, timeout=within_s)
    for task in done:
        if not task.cancelled() and task.exception() is not None:
            logger.error("shutdown: task %s had failed", task.get_name(), exc_info=task.exception())
    for task in pending:
        logger.error(
            "shutdown: task %s did not stop within %.0f s of its cancellation; left behind",
            task.get_name(), within_s,
        )  # fmt: skip


def _unchecked_versions(checked: dict[str, str]) -> dict[str, str]:
    """The installed version of each distribution in ``checked`` (name -> the version prefix
    a seam was checked against) that does not start with it."""
    installed = {name: importlib.metadata.version(name) for name in checked}
    return {
        name: version
        for name, version in installed.items()
        if not version.startswith(checked[name])
    }


def _report_fast_paths(metrics: Metrics, redis: bool) -> None:
    """Log once, and export, whether each fast path that relies on a dependency's internals
    works with the installed versions (app.transport.uvicorn_seam, app.redisio.redis_seam)."""
    paths = uvicorn_seam.fast_paths() | (redis_seam.fast_paths() if redis else {})
    unchecked = _unchecked_versions(uvicorn_seam.CHECKED_AGAINST | redis_seam.CHECKED_AGAINST)
    for path, live in paths.items():
        metrics.fast_path_live.labels(path).set(1 if live else 0)
    for reason in uvicorn_seam.FALLBACK_REASONS:  # exported at 0 from the start
        metrics.transport_fallbacks.labels(reason)
    off = sorted(path for path, live in paths.items() if not live)
    logger.log(
        logging.WARNING if off or unchecked else logging.INFO,
        "fast paths: %s",
        "all live" if not off else "off: " + ", ".join(off),
        extra={"unchecked_versions": unchecked} if unchecked else None,
    )


class _AsciiJSONResponse(JSONResponse):
    """JSON with every non-ASCII character escaped: it encodes whatever a string holds."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False).encode()


async def _invalid_request(_: Request, exc: Exception) -> Response:
    """FastAPI's 422, which echoes the refused input, escaped: a JSON body may spell an
    unpaired surrogate (``"\\ud800"``), which Python's JSON parser lets through and pydantic
    refuses, and the default answer cannot encode (a 500 instead of the 422)."""
    assert isinstance(exc, RequestValidationError)
    return _AsciiJSONResponse({"detail": jsonable_encoder(exc.errors())}, status_code=422)


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app. ``settings`` defaults to the ``CHAT_*`` environment."""
    settings = settings or load_settings()
    logging.getLogger("app").setLevel(settings.log_level.upper())
    metrics = Metrics()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        tracing = tracing_from(settings)
        store = RunningStore(settings) if settings.database_url else None
        if store is not None:
            store.tracing = tracing
        archiver = store.embedded_archiver() if store and not settings.uses_redis else None
        # A publish's ack leaves with the messages pushed just before its reply (Flusher.hold).
        flusher = Flusher()
        broker = create_broker(settings, archiver, flusher.hold)
        presence = create_presence(settings, broker)
        history = ConversationHistory(broker, store.messages if store else None, settings)
        hub = Hub(
            broker,
            presence,
            connection_cap(settings.max_connections, raise_soft_limit()),
            metrics,
            Pacing.of(settings),
            settings.worker_outbox_max_bytes,
            history,
            # A room's keys live CHAT_HISTORY_TTL_S after its last message at least.
            newest_known_for_s=settings.history_ttl_s / 2,
        )
        hub.tracing = tracing
        quotas = create_quotas(settings)
        authenticator = Authenticator(settings) if settings.auth_mode == "jwt" else None
        origins = OriginPolicy(settings.allowed_origins)
        pending_auth = PendingAuth(settings.max_pending_auth, settings.max_pending_auth_per_address)
        rooms = RoomDirectory(
            store.rooms if store else None, broker, hub, settings,
            store.messages if store else None,
        )  # fmt: skip
        dispatcher = connect_webhooks(settings, presence, hub, rooms)
        if dispatcher is not None:
            dispatcher.tracing = tracing
        state = ChatState(
            settings, broker, hub, presence, metrics, quotas, origins, authenticator,
            pending_auth, history, store, rooms, flusher=flusher,
        )  # fmt: skip
        state.tracing = tracing
        app.state.chat = state
        roster, streams = state.roster, state.streams
        hub.routed = lambda payload: (
            roster.deliver_routed(payload) if is_roster_payload(payload)
            else streams.deliver_routed(payload)
        )  # fmt: skip
        if store is not None:
            await store.open()
        storage = await storage_for(settings) if store is not None else None
        if storage is not None and store is not None:
            state.files = Files(settings, storage, store.files, state.access, quotas, metrics)
        if settings.previews:
            state.previews = LinkPreviews(settings, storage)
        if settings.moderation_hook_url is not None:
            state.moderation = ModerationHook(settings, metrics)
        if store is not None:
            state.reports = Reports(store.reports, state.access, history, broker, quotas, metrics)
            state.reports.files = state.files
            if dispatcher is not None:
                state.reports.enqueue = dispatcher.queue.enqueue
        notifier = None
        sender = push_sender(settings) if store is not None and settings.notifications else None
        if store is not None and settings.notifications:
            state.notifications = Notifications(
                settings, store.notifications, state.access, presence,
                sender.public_key if sender is not None else None,
            )  # fmt: skip
            notifier = Notifier(
                settings, store.notifications, state.access, presence, metrics, sender,
                dispatcher.queue.enqueue if dispatcher is not None else None,
                lambda: store.archive_stats().leading, state.hidden,
            )  # fmt: skip
        if sender is not None:
            await sender.start()
        await broker.start(hub)
        await presence.start()
        if store is not None:
            store.start()
        background = [
            asyncio.create_task(
                run_heartbeat(hub, settings.heartbeat_interval_s, settings.heartbeat_timeout_s),
                name="heartbeat",
            ),
            asyncio.create_task(
                run_metrics_sync(
                    metrics,
                    hub.snapshot,
                    broker,
                    store.archive_stats if store else None,
                    (lambda: dispatcher.stats) if dispatcher else None,
                ),
                name="metrics-sync",
            ),
            asyncio.create_task(
                keep_counts(quotas, hub, settings.presence_ttl_s / 3), name="quota-upkeep"
            ),
        ]
        if settings.uses_redis:
            background.append(asyncio.create_task(state.rebalancer.run(), name="rebalance"))
        if dispatcher is not None:
            background.append(asyncio.create_task(dispatcher.run(), name="webhooks"))
        if state.files is not None:
            background.append(asyncio.create_task(state.files.run_sweeps(), name="file-sweeps"))
        if notifier is not None:
            background.append(asyncio.create_task(notifier.run(), name="notifier"))
        if authenticator is not None:
            background.append(
                asyncio.create_task(
                    run_token_expiry(hub, settings.token_refresh_before_s), name="token-expiry"
                )
            )
        # What is built by now lives as long as the worker: see app.ops.gc_tuning.
        gc_tuning = GcTuning(metrics.gc_pauses_since_sync, settings.gc_freeze_interval_s > 0)
        gc_tuning.start()
        if settings.gc_freeze_interval_s > 0:
            background.append(
                asyncio.create_task(keep_freezing(settings.gc_freeze_interval_s), name="gc-freeze")
            )
        if settings.auth_mode == "names":
            logger.warning(
                "CHAT_AUTH_MODE=names: every connection is whoever its ?name= says, so anyone "
                "can be anyone. For tests and load generators only: use jwt (or guest)."
            )
        _report_fast_paths(metrics, redis=settings.uses_redis)
        logger.info(
            "hubbub ready",
            extra={
                "version": __version__,
                "broker": type(broker).__name__,
                "auth_mode": settings.auth_mode,
            },
        )
        try:
            yield
        finally:
            hub.draining = True
            await _stop_tasks(background, settings.shutdown_tasks_timeout_s)
            # Each step runs whatever the one before raised (Redis may be down by now).
            steps = [hub.close, state.hidden.close, presence.stop, broker.stop, quotas.close]
            if state.moderation is not None:
                steps.append(state.moderation.close)
            if state.previews is not None:
                steps.append(state.previews.close)
            if storage is not None:
                steps.append(storage.close)
            if sender is not None:
                steps.append(sender.close)
            if store is not None:
                steps.append(store.stop)  # after the broker: nothing more is offered
            if tracing is not None:  # last: the spans of all the above, exported
                steps.append(tracing.stop)
            for step in steps:
                # Said in the log if it runs long, so that a stuck step is named.
                slow = asyncio.get_running_loop().call_later(
                    _SLOW_STEP_S, logger.warning, "shutdown: %s still running after %.0f s",
                    step.__qualname__, _SLOW_STEP_S,
                )  # fmt: skip
                try:
                    await step()
                except Exception:
                    logger.exception("shutdown: %s failed", step.__qualname__)
                finally:
                    slow.cancel()
            gc_tuning.stop()
            # The last counts, before the worker's files go quiet.
            metrics.sync(hub.snapshot(), broker, store.archive_stats() if store else None)

    app = FastAPI(
        title="Hubbub",
        version=__version__,
        lifespan=lifespan,
        docs_url=None,
        # Tracing is app.ops.tracing's (CHAT_TRACING_ENDPOINT), per message. FastAPI's own
        # would make a span of each socket's whole life once anything in the process sets a
        # global OpenTelemetry provider, and asks whether one is set on every request and
        # upgrade (3 us each).
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.include_router(router)
    app.include_router(admin_router)
    app.include_router(backend_router)
    app.include_router(files_router)
    mount_page(app)
    Instrumentator(registry=metrics.registry, excluded_handlers=["/healthz", "/readyz"]).instrument(
        app
    )
    app.add_middleware(ChatSocket)  # inside MetricsEndpoint: no chat on the metrics port
    app.add_middleware(
        MetricsEndpoint,
        render=metrics.render,
        path=settings.metrics_path,
        port=settings.metrics_port,
    )
    return app
