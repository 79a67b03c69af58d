"""HTTP and WebSocket routes: ``/ws``, ``/healthz``, ``/readyz``."""

from __future__ import annotations

from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import JSONResponse

from app.session import serve
from app.state import ChatState

router = APIRouter()


@router.websocket("/ws")
async def websocket_endpoint(ws: WebSocket) -> None:
    """The chat socket; see docs/protocol.md."""
    state: ChatState = ws.app.state.chat
    await serve(ws, state.hub, state.broker, state.settings)


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """Liveness: the worker's event loop answers. Deliberately checks nothing else."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"description": "not ready"}})
async def readyz(request: Request) -> JSONResponse:
    """Readiness: the broker is up and this worker is not draining. 503 otherwise."""
    state: ChatState = request.app.state.chat
    checks = {"broker": state.broker.ready, "accepting": not state.draining}
    ready = all(checks.values())
    return JSONResponse(
        {"status": "ready" if ready else "unavailable", "checks": checks},
        status_code=200 if ready else 503,
    )
