"""HTTP routes (``/rooms/{room}/messages``, ``/dms/{peer}/messages``, ``/inbox``, ``/search``,
``/mentions``, ``/me/hidden``, ``/me/muted/{user}``, ``/me/blocked/{user}``, ``/healthz``,
``/readyz``) and the chat socket, ``/ws``."""

from __future__ import annotations

from typing import Annotated, Literal

import orjson
from fastapi import APIRouter, HTTPException, Path, Query, Request, Response, WebSocket
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from app.access.auth import AuthError, Identity
from app.access.conversations import http_status
from app.access.hiding import Change, lists_of, visible_history_before
from app.conversations.history import HistoryUnavailable, inbox_entry
from app.conversations.names import direct
from app.conversations.rooms import RoomError, RoomRecord, room_not_found
from app.conversations.search import search
from app.errors import BrokerUnavailable, ErrorCode, FrameError
from app.protocol import ROOM_PATTERN, USER_PATTERN
from app.sockets.session import serve
from app.sockets.stream import open_stream, post_frames
from app.state import ChatState
from app.store.database import StoreError

router = APIRouter()


def _state(request: Request) -> ChatState:
    state: ChatState = request.app.state.chat
    return state


class ChatSocket:
    """ASGI middleware serving the chat socket, ``/ws`` (docs/protocol.md), and its HTTP
    fallback, ``/sse`` (:mod:`app.sockets.stream`), ahead of FastAPI's router; every other
    request, and WebSockets on other paths, go on to the app.

    A WebSocket holds its ASGI call stack for as long as it is open. Each layer between the
    middleware above and the session (the instrumentation, exception and exit-stack
    middleware, the router and the route: a dozen coroutines with their closures) would be
    held by every connection, in memory and in every full pass of the garbage collector, and
    none of them does anything for this socket.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket" and scope["path"] == "/ws":
            ws = WebSocket(scope, receive, send)
            await serve(ws, ws.app.state.chat)
            return
        if scope["type"] == "http" and scope["path"] == "/sse":
            state: ChatState = scope["app"].state.chat
            if state.settings.sse and scope["method"] in ("GET", "POST"):
                serve_sse = open_stream if scope["method"] == "GET" else post_frames
                await serve_sse(scope, receive, send, state)
                return
        await self.app(scope, receive, send)


@router.get("/rooms/{room}/messages")
async def room_messages(
    request: Request,
    room: Annotated[str, Path(pattern=ROOM_PATTERN)],
    before: Annotated[int | None, Query(ge=1, lt=2**63)] = None,
    limit: Annotated[int, Query(ge=1)] = 50,
) -> Response:
    """A page of a room's history, oldest first: up to ``limit`` messages with ids below
    ``before`` (the newest ones without it). Page backwards with ``before`` = the first id;
    with a store, paging reaches the room's first stored message.

    In ``jwt`` mode it takes the same token as the socket (``Authorization: Bearer``; 401
    without a valid one) and honours its rooms claim (403). A private room to anyone but
    its members, and a room nobody uses, are one answer: 404."""
    state = _state(request)
    reader, record = await _authorize_room(state, request, room)
    hidden = (await state.hidden.of(reader)).users if state.authenticator is not None else None
    return await history_response(
        state, reader, room, b'{"room":' + orjson.dumps(room), before, limit,
        must_exist=record is None, hidden=hidden,
    )  # fmt: skip


async def history_response(
    state: ChatState,
    reader: str | None,
    conversation: str,
    head: bytes,
    before: int | None,
    limit: int,
    must_exist: bool = False,
    hidden: frozenset[str] | None = None,
) -> Response:
    """A page of ``conversation``'s history as JSON: ``head`` (its name) and ``messages``;
    ``reader`` pays for it from its history quota (None: the backend API, not limited). With
    ``must_exist``, an empty first page of a room nobody uses is a 404, the
    answer a private room gives outsiders (app.access.conversations). Messages of the users
    in ``hidden`` (whom the reader mutes and blocks) are left out."""
    if reader is not None and not await state.quotas.allow("history", reader):
        raise HTTPException(429, "too many history reads, slow down", headers={"Retry-After": "1"})
    limit = min(limit, state.settings.history_page_max)
    try:
        messages, _ = await visible_history_before(
            state.history.history_before, conversation, before, limit, hidden or frozenset()
        )
    except BrokerUnavailable:
        raise HTTPException(503, "history unavailable: the broker is not connected") from None
    except HistoryUnavailable:
        raise HTTPException(503, "history unavailable: the store cannot be read") from None
    if must_exist and not messages and before is None:
        try:
            if not await state.rooms.in_use(conversation):
                raise room_not_found(conversation)
        except RoomError as exc:
            raise HTTPException(http_status(exc), exc.message) from None
    frames = b",".join(message.payload for message in messages)
    return Response(head + b',"messages":[' + frames + b"]}", media_type="application/json")


@router.get("/dms/{peer}/messages")
async def direct_messages(
    request: Request,
    peer: Annotated[str, Path(pattern=USER_PATTERN)],
    before: Annotated[int | None, Query(ge=1, lt=2**63)] = None,
    limit: Annotated[int, Query(ge=1)] = 50,
) -> Response:
    """A page of the direct messages between the token's user and ``peer``, as
    ``/rooms/{room}/messages`` pages a room's. Needs ``jwt`` mode and a bearer token."""
    state = _state(request)
    user = (await _reader(state, request)).user
    head = b'{"with":' + orjson.dumps(peer)
    hidden = (await state.hidden.of(user)).users
    return await history_response(
        state, user, direct(user, peer), head, before, limit, hidden=hidden
    )


@router.get("/inbox")
async def inbox(request: Request) -> Response:
    """The token's user's conversations, the most recently active first: each with its newest
    message, the user's read position and the unread count (as the ``inbox`` frame). Needs a
    store (404 without) and ``jwt`` mode with a bearer token."""
    state = _state(request)
    identity = await _reader(state, request)
    user = identity.user
    if state.store is None:
        raise HTTPException(404, "this server keeps no inboxes (no store: CHAT_DATABASE_URL)")
    settings = state.settings
    try:
        hidden = (await state.hidden.of(user)).users
        entries = await state.store.inbox.entries(
            user, settings.inbox_max_conversations, settings.unread_count_cap, hidden
        )
        shown = await state.access.visible(identity, [entry.conversation for entry in entries])
    except (StoreError, RoomError):
        raise HTTPException(503, "inbox unavailable: the store cannot be read") from None
    body = orjson.dumps(
        {"conversations": [inbox_entry(e, user) for e in entries if e.conversation in shown]}
    )
    return Response(body, media_type="application/json")


@router.get("/search")
async def search_messages(
    request: Request,
    q: Annotated[str, Query(min_length=1, max_length=200)],
    room: Annotated[str | None, Query(pattern=ROOM_PATTERN)] = None,
    peer: Annotated[str | None, Query(alias="with", pattern=USER_PATTERN)] = None,
    order: Annotated[Literal["newest", "best"], Query()] = "newest",
    limit: Annotated[int, Query(ge=1, le=500)] = 20,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> Response:
    """Messages the token's user may read now whose text matches ``q``, as the ``search``
    frame answers (docs/protocol.md): ``{"q", "results", "next_offset"}``. Needs ``jwt`` mode
    and a bearer token; 404 without a store, 429 over the user's search rate."""
    state = _state(request)
    identity = await _reader(state, request)
    settings = state.settings
    if "\x00" in q:
        raise HTTPException(422, "q: the store cannot hold NUL characters")
    if offset > settings.search_offset_max:
        raise HTTPException(422, f"offset: at most {settings.search_offset_max}")
    if room is not None and peer is not None:
        raise HTTPException(422, "give at most one of room or with")
    if not await state.quotas.allow("search", identity.user):
        raise HTTPException(429, "too many searches, slow down")
    store = state.store
    try:
        page = await search(
            store.search if store is not None else None, state.access, state.rooms, identity,
            q, room, peer, order, min(limit, settings.search_page_max), offset,
            (await state.hidden.of(identity.user)).users,
        )  # fmt: skip
    except RoomError as exc:
        status = 404 if exc.code is ErrorCode.NO_STORE else http_status(exc)
        raise HTTPException(status, exc.message) from None
    return Response(orjson.dumps(page), media_type="application/json")


@router.get("/mentions")
async def mentions(
    request: Request,
    before: Annotated[int | None, Query(ge=0)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 20,
) -> Response:
    """The messages that mention the token's user, newest first, in conversations it may read
    now, as the ``mentions`` frame answers (docs/protocol.md): ``{"mentions", "unread",
    "more"}``. Needs ``jwt`` mode and a bearer token; 404 without a store (or with
    ``CHAT_NOTIFICATIONS=false``), 429 over the user's history rate, 503 while the store
    cannot be read."""
    state = _state(request)
    identity = await _reader(state, request)
    if state.notifications is None:
        raise HTTPException(404, "this server keeps no mentions (no store, or notifications off)")
    if not await state.quotas.allow("history", identity.user):
        raise HTTPException(429, "too many mention reads, slow down")
    limit = min(limit, state.settings.history_page_max)
    try:
        hidden = (await state.hidden.of(identity.user)).users
        page = await state.notifications.mentions_page(identity, before, limit, hidden)
    except RoomError as exc:
        raise HTTPException(http_status(exc), exc.message) from None
    return Response(orjson.dumps(page), media_type="application/json")


@router.get("/me/hidden")
async def hidden_users(request: Request) -> Response:
    """Whom the token's user mutes and blocks, as the ``hidden`` frame says it:
    ``{"muted": [...], "blocked": [...]}``. Needs ``jwt`` mode and a bearer token."""
    state = _state(request)
    user = (await _reader(state, request)).user
    lists = lists_of(await state.hidden.of(user))
    return Response(orjson.dumps(lists), media_type="application/json")


@router.put("/me/muted/{user}")
async def mute(request: Request, user: Annotated[str, Path(pattern=USER_PATTERN)]) -> Response:
    """Mute ``user``: their messages are hidden from you everywhere (docs/protocol.md,
    "Block and mute"). Answers the lists as they are now; 404 without a store, 409 past
    ``CHAT_HIDDEN_USERS_MAX``, 422 for yourself."""
    return await _change_hidden(request, user, "mute")


@router.delete("/me/muted/{user}")
async def unmute(request: Request, user: Annotated[str, Path(pattern=USER_PATTERN)]) -> Response:
    """End a mute of ``user`` (a block stays). Answers the lists as they are now."""
    return await _change_hidden(request, user, "unmute")


@router.put("/me/blocked/{user}")
async def block(request: Request, user: Annotated[str, Path(pattern=USER_PATTERN)]) -> Response:
    """Block ``user``: muted, and they cannot write to you directly or invite you. Answers
    the lists as they are now; errors as for ``PUT /me/muted/{user}``."""
    return await _change_hidden(request, user, "block")


@router.delete("/me/blocked/{user}")
async def unblock(request: Request, user: Annotated[str, Path(pattern=USER_PATTERN)]) -> Response:
    """End a block of ``user``. Answers the lists as they are now."""
    return await _change_hidden(request, user, "unblock")


_HIDING_STATUS = {
    ErrorCode.NO_STORE: 404,
    ErrorCode.BAD_FRAME: 422,
    ErrorCode.TOO_MANY_HIDDEN: 409,
    ErrorCode.STORE_UNAVAILABLE: 503,
}


async def _change_hidden(request: Request, target: str, change: Change) -> Response:
    state = _state(request)
    user = (await _reader(state, request)).user
    try:
        hiding = await state.hidden.change(user, target, change)
    except FrameError as exc:
        raise HTTPException(_HIDING_STATUS.get(exc.code, 400), exc.message) from None
    return Response(orjson.dumps(lists_of(hiding)), media_type="application/json")


async def _reader(state: ChatState, request: Request) -> Identity:
    """The identity of the request's bearer token (401 without a valid one), refused (403)
    while banned; per-user routes exist in ``jwt`` mode only (403 in the others, where the
    socket's frames serve)."""
    if state.authenticator is None:
        raise HTTPException(403, "per-user routes need CHAT_AUTH_MODE=jwt")
    identity = _bearer_identity(state, request)
    await _not_banned(state, identity.user)
    return identity


async def _not_banned(state: ChatState, user: str) -> None:
    try:
        await state.access.require_not_banned(user)
    except RoomError as exc:
        raise HTTPException(http_status(exc), exc.message) from None
    except BrokerUnavailable:
        raise HTTPException(503, "unavailable: the broker is not connected") from None


async def _authorize_room(
    state: ChatState, request: Request, room: str
) -> tuple[str, RoomRecord | None]:
    """Raise unless the request may read ``room`` now (the one access decision,
    :mod:`app.access.conversations`: 401 without a valid token in ``jwt`` mode, 403 for a
    room outside its rooms claim or a banned user, 404 for a private room it is not a member
    of). Return who reads, for the quota (the user, or the client address in the other
    modes, where a private room's history is a 404 too), and the room's record."""
    if state.authenticator is None:
        identity = Identity(f"address:{request.client.host if request.client else '-'}")
    else:
        identity = _bearer_identity(state, request)
        await _not_banned(state, identity.user)
    try:
        record = await state.access.room(identity, room)
    except RoomError as exc:
        raise HTTPException(http_status(exc), exc.message) from None
    return identity.user, record


def _bearer_identity(state: ChatState, request: Request) -> Identity:
    """The identity of the request's bearer token; 401 without a valid one."""
    assert state.authenticator is not None
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    challenge = {"WWW-Authenticate": "Bearer"}
    if scheme.lower() != "bearer" or not token:
        raise HTTPException(401, "a bearer token is required", headers=challenge)
    try:
        return state.authenticator.verify(token.strip())
    except AuthError as exc:
        raise HTTPException(401, str(exc)[:120], headers=challenge) from None


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
