"""HTTP and WebSocket routes: ``/ws``, ``/rooms/{room}/messages``, ``/healthz``, ``/readyz``."""

from __future__ import annotations

from typing import Annotated

import orjson
from fastapi import APIRouter, HTTPException, Path, Query, Request, Response, WebSocket
from fastapi.responses import JSONResponse

from app.errors import BrokerUnavailable
from app.protocol import ROOM_PATTERN
from app.session import serve
from app.state import ChatState

router = APIRouter()


def _state(request: Request) -> ChatState:
    state: ChatState = request.app.state.chat
    return state


async def websocket_endpoint(ws: WebSocket) -> None:
    """The chat socket; see docs/protocol.md."""
    await serve(ws, ws.app.state.chat)


# A plain Starlette route: the endpoint takes no dependencies, and FastAPI's dependency
# machinery (two AsyncExitStacks and their frames) would be held for the socket's whole life,
# ~1.7 KiB times every connection.
router.add_websocket_route("/ws", websocket_endpoint)


@router.get("/rooms/{room}/messages")
async def room_messages(
    request: Request,
    room: Annotated[str, Path(pattern=ROOM_PATTERN)],
    before: Annotated[int | None, Query(ge=1, lt=2**63)] = None,
    limit: Annotated[int, Query(ge=1)] = 50,
) -> Response:
    """A page of a room's history, oldest first: up to ``limit`` messages with ids below
    ``before`` (the newest ones without it). Page backwards with ``before`` = the first id."""
    state = _state(request)
    limit = min(limit, state.settings.history_page_max)
    try:
        frames = await state.broker.history_before(room, before, limit)
    except BrokerUnavailable:
        raise HTTPException(503, "history unavailable: the broker is not connected") from None
    body = b'{"room":' + orjson.dumps(room) + b',"messages":['
    return Response(body + b",".join(frames) + b"]}", media_type="application/json")


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """Liveness: the worker's event loop answers. Deliberately checks nothing else."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"description": "not ready"}})
async def readyz(request: Request) -> JSONResponse:
    """Readiness: the broker is up and this worker is not draining. 503 otherwise."""
    state = _state(request)
    checks = {"broker": state.broker.ready, "accepting": not state.hub.draining}
    ready = all(checks.values())
    return JSONResponse(
        {"status": "ready" if ready else "unavailable", "checks": checks},
        status_code=200 if ready else 503,
    )
