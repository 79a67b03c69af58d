"""The moderation API: kick a user off every server, ban for a while, lift a ban.

Off unless ``CHAT_ADMIN_TOKEN`` is set (every route answers 404 then); each call needs
``Authorization: Bearer <CHAT_ADMIN_TOKEN>`` (401 otherwise). nginx/nginx.conf does not proxy
``/admin/``: call a server directly (``kubectl port-forward``, or from inside the network).

- ``POST /admin/users/{user}/kick`` — close the user's connections on every server (4003).
- ``PUT /admin/users/{user}/ban`` ``{"duration_s": S, "reason": R}`` — refuse the user's
  connections (4003) for S seconds, and kick the open ones.
- ``GET`` / ``DELETE /admin/users/{user}/ban`` — the ban in force (404 if none) / lift it.

Who is connected where (live, across every worker and pod: app.ops.roster):

- ``GET /admin/workers`` — every worker of the census (app.sockets.rebalance): id, host,
  pid, connections, ready, draining, when it last reported.
- ``GET /admin/connections?user=U`` and/or ``&room=R`` — the matching connections on every
  worker: id, user, transport, opened, rooms, outbox bytes, worker, host, pid; and the
  workers that did not answer in time (``workers_unanswered``).
- ``DELETE /admin/connections/{worker}/{conn}`` — close one connection (4003): 204, or 404
  when that worker does not hold it, 504 when it did not answer.
- ``GET /admin/`` — a page that does the three (``app/static/admin.html``: the token is typed
  in, kept for the tab, and sent by the page's requests; the page itself holds no data).
"""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, Response
from fastapi.responses import FileResponse
from pydantic import BaseModel, Field

from app.errors import BrokerUnavailable
from app.protocol import ROOM_PATTERN, USER_PATTERN
from app.sockets.rebalance import WorkerLoad
from app.state import ChatState
from app.web.bearer import bearer_guard
from app.web.page import SECURITY_HEADERS, STATIC_DIR

logger = logging.getLogger(__name__)


_authorized = bearer_guard(lambda settings: settings.admin_token, "moderation API")


router = APIRouter(prefix="/admin", include_in_schema=False)
Admin = Annotated[ChatState, Depends(_authorized)]
User = Annotated[str, Path(pattern=USER_PATTERN)]
# Worker and connection ids: 12 hex digits (RedisBroker.worker_id, Connection.id).
_ID_PATTERN = r"^[0-9a-f]{12}$"


class BanRequest(BaseModel):
    duration_s: float = Field(gt=0, le=10 * 365 * 86400)
    reason: str = Field("banned by a moderator", max_length=200)


async def _kick(state: ChatState, user: str, reason: str) -> None:
    try:
        await state.broker.kick(user, reason)
    except BrokerUnavailable:
        raise HTTPException(503, "the broker is unavailable: try again") from None


@router.post("/users/{user}/kick", status_code=202)
async def kick(state: Admin, user: User) -> dict[str, str]:
    await _kick(state, user, "kicked by a moderator")
    logger.info("moderation: kick", extra={"user": user})
    return {"kicked": user}


@router.put("/users/{user}/ban")
async def ban(state: Admin, user: User, body: BanRequest) -> dict[str, object]:
    await state.quotas.ban(user, body.duration_s, body.reason)
    await _kick(state, user, body.reason)
    logger.info("moderation: ban", extra={"user": user, "duration_s": body.duration_s})
    return {"banned": user, "duration_s": body.duration_s, "reason": body.reason}


@router.get("/users/{user}/ban")
async def ban_of(state: Admin, user: User) -> dict[str, object]:
    found = await state.quotas.ban_of(user)
    if found is None:
        raise HTTPException(404, "not banned")
    return {"banned": user, "reason": found.reason, "expires_in_s": round(found.expires_in_s, 3)}


@router.delete("/users/{user}/ban", status_code=204)
async def unban(state: Admin, user: User) -> Response:
    if not await state.quotas.unban(user):
        raise HTTPException(404, "not banned")
    logger.info("moderation: unban", extra={"user": user})
    return Response(status_code=204)


async def _workers(state: Admin) -> list[WorkerLoad]:
    try:
        return await state.rebalancer.loads()
    except BrokerUnavailable:
        raise HTTPException(503, "the broker is unavailable: try again") from None


@router.get("/workers")
async def workers(state: Admin) -> dict[str, object]:
    loads = sorted(await _workers(state), key=lambda load: (load.host, load.pid, load.worker))
    return {"workers": [_described(load) for load in loads]}


def _described(load: WorkerLoad) -> dict[str, object]:
    return {
        "worker": load.worker,
        "host": load.host,
        "pid": load.pid,
        "connections": load.connections,
        "ready": load.ready,
        "draining": load.draining,
        "reported_ms": load.at_ms,
    }


@router.get("/connections")
async def connections(
    state: Admin,
    user: Annotated[str | None, Query(pattern=USER_PATTERN)] = None,
    room: Annotated[str | None, Query(pattern=ROOM_PATTERN)] = None,
) -> dict[str, object]:
    if user is None and room is None:
        raise HTTPException(422, "give a user, a room, or both")
    loads = await _workers(state)
    try:
        found = await state.roster.find([load.worker for load in loads], user, room)
    except BrokerUnavailable:
        raise HTTPException(503, "the broker is unavailable: try again") from None
    return {
        "connections": found.connections,
        "workers_asked": found.asked,
        "workers_unanswered": found.unanswered,
    }


@router.delete("/connections/{worker}/{conn}", status_code=204)
async def close_connection(
    state: Admin,
    worker: Annotated[str, Path(pattern=_ID_PATTERN)],
    conn: Annotated[str, Path(pattern=_ID_PATTERN)],
) -> Response:
    try:
        closed = await state.roster.close(worker, conn)
    except BrokerUnavailable:
        raise HTTPException(503, "the broker is unavailable: try again") from None
    if closed is None:
        raise HTTPException(504, "the worker did not answer in time")
    if not closed:
        raise HTTPException(404, "no such connection on that worker")
    logger.info("admin: close", extra={"worker": worker, "conn": conn})
    return Response(status_code=204)


@router.get("/")
async def admin_page(request: Request) -> FileResponse:
    """The admin page (no data in it: it calls the routes above with the token typed in).
    404 while the admin API is off, as every route here."""
    state: ChatState = request.app.state.chat
    if state.settings.admin_token is None:
        raise HTTPException(404, "Not Found")
    return FileResponse(STATIC_DIR / "admin.html", headers=SECURITY_HEADERS)
