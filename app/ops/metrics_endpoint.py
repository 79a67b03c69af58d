"""The scrape endpoint: ``GET /metrics``, on the main port or on a port of its own.

:class:`MetricsEndpoint` is ASGI middleware, not a route, so scrapes skip routing and the HTTP
instrumentation. With ``CHAT_METRICS_PORT`` set, the server also listens there (gunicorn's
config and ``python -m app`` add the socket); requests are told apart by the local port they
arrived on, so ``/metrics`` answers only on that port, and that port answers nothing else. A
proxy that forwards only the main port can then never expose the metrics.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from app.ops.metrics import CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE


class MetricsEndpoint:
    """ASGI middleware serving ``render()`` at ``path`` (on ``port`` only, when given): in
    the OpenMetrics format (which carries exemplars) to a scraper that accepts it, else in the
    text format 0.0.4."""

    def __init__(
        self, app: ASGIApp, render: Callable[[bool], bytes], path: str, port: int | None
    ) -> None:
        self.app = app
        self._render = render
        self._path = path
        self._port = port

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        server = scope.get("server")
        if self._port is None:
            mine = kind == "http" and scope["path"] == self._path
        else:  # the metrics port takes every request that arrives on it, and nothing else
            mine = kind in ("http", "websocket") and server is not None and server[1] == self._port
        if not mine:
            await self.app(scope, receive, send)
            return
        if kind == "websocket":
            await send({"type": "websocket.close", "code": 1008})  # HTTP 403 to the upgrade
            return
        response: Response
        if scope["path"] != self._path:
            response = PlainTextResponse("only the metrics are served on this port", 404)
        elif scope["method"] not in ("GET", "HEAD"):
            response = PlainTextResponse("method not allowed", 405, headers={"Allow": "GET"})
        else:
            accept = Headers(scope=scope).get("accept", "")
            openmetrics = "application/openmetrics-text" in accept
            response = Response(
                self._render(openmetrics),
                media_type=OPENMETRICS_CONTENT_TYPE if openmetrics else CONTENT_TYPE,
            )
        await response(scope, receive, send)
