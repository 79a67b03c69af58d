"""The backend API: what the application's own backend calls (``/api/v1/...``).

Off unless ``CHAT_SERVICE_TOKEN`` is set (every route answers 404 then). Each call needs
``Authorization: Bearer <CHAT_SERVICE_TOKEN>``, a service credential (user tokens are
refused: 401); failed attempts lock the address out like the moderation API's. Documented in
the app's OpenAPI (``/openapi.json``), not proxied by nginx/nginx.conf: call a server from
inside the network.

- Rooms: create (public or private, any owner), read (with members), describe, add or change a
  member (any role), remove a member (its sockets leave the room everywhere), list a user's.
- Publishing: into a room or to a user (a direct message from ``CHAT_SERVICE_USER``),
  idempotent with ``cid`` (a retry returns the first id, ``duplicate: true``), at
  ``CHAT_SERVICE_MESSAGES_PER_S``.
- Reading: a room's presence, a room's history (newest page, or before an id), a file's links
  (``message.created`` webhooks carry messages' ``attachments``).
- Moderation: disconnect a user (every connection, on every server: close 4003).
"""

from __future__ import annotations

import logging
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Depends, Header, HTTPException, Path, Query, Response
from pydantic import AfterValidator, BaseModel, Field

from app.access.hiding import lists_of
from app.conversations.names import direct
from app.conversations.rooms import RoomError, RoomRecord
from app.errors import BrokerUnavailable, ErrorCode, FrameError, QuotaExceeded
from app.files.service import FILE_ID_PATTERN
from app.moderation.reports import Reports
from app.ops.tracing import end_publish, traceparent_of
from app.protocol import CID_MAX_CHARS, ROOM_PATTERN, USER_PATTERN, storable
from app.state import ChatState
from app.store.rooms import Role
from app.web.api import history_response
from app.web.bearer import bearer_guard

logger = logging.getLogger(__name__)


_authorized = bearer_guard(lambda settings: settings.service_token, "backend API")


router = APIRouter(prefix="/api/v1", tags=["backend"])
Service = Annotated[ChatState, Depends(_authorized)]
RoomName = Annotated[str, Path(pattern=ROOM_PATTERN)]
UserName = Annotated[str, Path(pattern=USER_PATTERN)]

_STATUS = {
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.EXISTS: 409,
    ErrorCode.FORBIDDEN: 403,
    ErrorCode.NO_STORE: 501,
    ErrorCode.STORE_UNAVAILABLE: 503,
    ErrorCode.BROKER_UNAVAILABLE: 503,
}


def _refused(exc: RoomError) -> HTTPException:
    return HTTPException(_STATUS.get(exc.code, 400), exc.message)


# What the store cannot hold (U+0000) is refused with 422, as over the socket
# (app.protocol.storable; pydantic refuses unpaired surrogates, which JSON bodies may carry).
Storable = AfterValidator(storable)


class NewRoom(BaseModel):
    room: str = Field(pattern=ROOM_PATTERN)
    private: bool = False
    title: Annotated[str, Field(max_length=200), Storable] = ""
    topic: Annotated[str, Field(max_length=1000), Storable] = ""
    owner: str | None = Field(None, pattern=USER_PATTERN, description="CHAT_SERVICE_USER if unset")


class RoomDescription(BaseModel):
    title: Annotated[str, Field(max_length=200), Storable] | None = None
    topic: Annotated[str, Field(max_length=1000), Storable] | None = None


class Membership(BaseModel):
    role: Literal["owner", "admin", "member"] = "member"


class NewMessage(BaseModel):
    text: Annotated[str, Field(min_length=1), Storable]
    cid: str | None = Field(None, min_length=1, max_length=CID_MAX_CHARS,
                            description="makes retries safe: the first id is returned")  # fmt: skip


class Published(BaseModel):
    id: int
    duplicate: bool = False


class Resolution(BaseModel):
    action: Literal["dismiss", "delete"]
    by: str | None = Field(
        None, pattern=USER_PATTERN, description="who decided (CHAT_SERVICE_USER if unset)"
    )


class Disconnect(BaseModel):
    reason: str = Field("disconnected by the service", max_length=120)


def _shown(record: RoomRecord) -> dict[str, Any]:
    return record.describe(members=True)


@router.post("/rooms", status_code=201)
async def create_room(state: Service, body: NewRoom) -> dict[str, Any]:
    """Create a room (409 if it exists or is in use)."""
    owner = body.owner or state.settings.service_user
    try:
        record = await state.rooms.create(body.room, owner, body.private, body.title, body.topic)
    except RoomError as exc:
        raise _refused(exc) from None
    return _shown(record)


@router.get("/rooms/{room}")
async def get_room(state: Service, room: RoomName) -> dict[str, Any]:
    """A room's record and members (404: no record, a plain public room)."""
    try:
        record = await state.rooms.record(room)
    except RoomError as exc:
        raise _refused(exc) from None
    if record is None:
        raise HTTPException(404, f"room {room!r} has no record")
    return _shown(record)


@router.patch("/rooms/{room}")
async def describe_room(state: Service, room: RoomName, body: RoomDescription) -> dict[str, Any]:
    try:
        return _shown(await state.rooms.describe(room, None, body.title, body.topic))
    except RoomError as exc:
        raise _refused(exc) from None


@router.put("/rooms/{room}/members/{user}")
async def add_member(
    state: Service, room: RoomName, user: UserName, body: Membership
) -> dict[str, Any]:
    """Add ``user`` with ``role``, or change its role."""
    try:
        return _shown(await state.rooms.add(room, user, Role(body.role), None))
    except RoomError as exc:
        raise _refused(exc) from None


@router.delete("/rooms/{room}/members/{user}")
async def remove_member(state: Service, room: RoomName, user: UserName) -> dict[str, Any]:
    """Remove ``user``: its connections leave the room on every server at once."""
    try:
        return _shown(await state.rooms.remove(room, user, None))
    except RoomError as exc:
        raise _refused(exc) from None


@router.get("/users/{user}/rooms")
async def rooms_of(state: Service, user: UserName) -> dict[str, Any]:
    try:
        return {"user": user, "rooms": await state.rooms.rooms_of(user)}
    except RoomError as exc:
        raise _refused(exc) from None


@router.get("/users/{user}/hidden")
async def hidden_by(state: Service, user: UserName) -> dict[str, Any]:
    """Whom ``user`` mutes and blocks (app.access.hiding), as ``GET /me/hidden`` shows the
    user: for support tools. Read only: only the user changes them."""
    return {"user": user, **lists_of(await state.hidden.of(user))}


def _reports(state: ChatState) -> Reports:
    if state.reports is None:
        raise HTTPException(501, "reports need a store (CHAT_DATABASE_URL)")
    return state.reports


_REPORT_STATUS = {
    ErrorCode.NOT_FOUND: 404, ErrorCode.RATE_LIMITED: 429,
    ErrorCode.STORE_UNAVAILABLE: 503, ErrorCode.BROKER_UNAVAILABLE: 503,
}  # fmt: skip


@router.get("/reports")
async def report_queue(
    state: Service,
    resolved: bool = False,
    before: Annotated[int | None, Query(ge=0, lt=2**63)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> dict[str, Any]:
    """The moderators' queue (app.moderation.reports): open reports oldest first (page on
    with ``before`` = ``next``), or with ``resolved`` the resolved ones, newest first."""
    try:
        return await _reports(state).queue(None, resolved, before, limit)
    except FrameError as exc:
        raise HTTPException(_REPORT_STATUS.get(exc.code, 400), exc.message) from None


@router.post("/reports/{report_id}/resolve")
async def resolve_report(
    state: Service, report_id: Annotated[int, Path(ge=0, lt=2**63)], body: Resolution
) -> dict[str, Any]:
    """Resolve a report: ``dismiss``, or ``delete`` its message (every client gets
    ``deleted``). A resolved report is answered as it is."""
    by = body.by or state.settings.service_user
    try:
        return await _reports(state).resolve(report_id, body.action, None, by)
    except FrameError as exc:
        raise HTTPException(_REPORT_STATUS.get(exc.code, 400), exc.message) from None


# W3C trace context of the backend's request (app.ops.tracing): the message's spans continue
# its trace. An invalid one is ignored, as W3C asks (the message is then traced, or not, on
# its own).
TraceparentHeader = Annotated[str | None, Header()]


async def _publish(
    state: ChatState, room: str | None, to: str | None, body: NewMessage, traceparent: str | None
) -> Published:
    settings = state.settings
    if len(body.text) > settings.max_text_chars:
        raise HTTPException(422, f"text is longer than {settings.max_text_chars} characters")
    quota = (settings.service_messages_per_s, settings.service_message_burst)
    tracing = state.tracing
    span = None
    if tracing is not None:
        conversation = room if room is not None else direct(settings.service_user, to or "")
        span = tracing.start_publish(traceparent, conversation, "api")
    context = None if span is None else traceparent_of(span)
    published = None
    try:
        if room is not None:
            published = await state.broker.publish(
                room, settings.service_user, body.text, body.cid, quota=quota, traceparent=context
            )
        else:
            assert to is not None
            published = await state.broker.publish_direct(
                settings.service_user, to, body.text, body.cid, quota=quota, traceparent=context
            )
    except QuotaExceeded:
        raise HTTPException(
            429, "over CHAT_SERVICE_MESSAGES_PER_S", headers={"Retry-After": "1"}
        ) from None
    except BrokerUnavailable:
        raise HTTPException(503, "the broker is unavailable: retry with the same cid") from None
    finally:
        if span is not None:
            end_publish(span, published)
    return Published(id=published.id, duplicate=published.duplicate)


@router.post("/rooms/{room}/messages", status_code=201)
async def publish_to_room(
    state: Service, room: RoomName, body: NewMessage, traceparent: TraceparentHeader = None
) -> Published:
    """Publish into ``room`` as ``CHAT_SERVICE_USER`` (private rooms too)."""
    return await _publish(state, room, None, body, traceparent)


@router.post("/users/{user}/messages", status_code=201)
async def publish_to_user(
    state: Service, user: UserName, body: NewMessage, traceparent: TraceparentHeader = None
) -> Published:
    """A direct message from ``CHAT_SERVICE_USER`` to ``user`` (stored, in their inbox)."""
    if user == state.settings.service_user:
        raise HTTPException(422, "the service cannot message itself")
    return await _publish(state, None, user, body, traceparent)


@router.get("/rooms/{room}/presence")
async def presence_of(state: Service, room: RoomName) -> dict[str, Any]:
    """Who is in ``room`` now (``users`` only up to ``CHAT_PRESENCE_MAX_MEMBERS``)."""
    try:
        present = await state.presence.of(room)
    except BrokerUnavailable:
        raise HTTPException(503, "the broker is unavailable") from None
    return {"room": room, "count": present.count, "users": present.users}


@router.get("/rooms/{room}/messages")
async def room_history(
    state: Service,
    room: RoomName,
    before: Annotated[int | None, Query(ge=1, lt=2**63)] = None,
    limit: Annotated[int, Query(ge=1)] = 50,
) -> Response:
    """A page of ``room``'s history, as it is now, oldest first (private rooms too)."""
    return await history_response(
        state, None, room, b'{"room":' + orjson.dumps(room), before, limit
    )


@router.get("/users/{user}/messages")
async def direct_history(
    state: Service,
    user: UserName,
    before: Annotated[int | None, Query(ge=1, lt=2**63)] = None,
    limit: Annotated[int, Query(ge=1)] = 50,
) -> Response:
    """A page of the direct conversation of ``CHAT_SERVICE_USER`` and ``user``."""
    conversation = direct(state.settings.service_user, user)
    return await history_response(
        state, None, conversation, b'{"with":' + orjson.dumps(user), before, limit
    )


@router.get("/files/{file_id}")
async def file_links(
    state: Service, file_id: Annotated[str, Path(pattern=FILE_ID_PATTERN)]
) -> dict[str, Any]:
    """A file attached to a message (any conversation): its name, size, sniffed type, and
    URLs that read it until ``expires`` (``thumbnail`` for an image), as the ``file`` frame.
    404 for no such file (or one whose message was deleted), 501 without file storage."""
    if state.files is None:
        raise HTTPException(501, "this server keeps no files")
    try:
        return await state.files.link(None, file_id)
    except FrameError as exc:
        status = {ErrorCode.NOT_FOUND: 404}.get(exc.code, 503)
        raise HTTPException(status, exc.message) from None


@router.post("/users/{user}/disconnect", status_code=202)
async def disconnect(state: Service, user: UserName, body: Disconnect) -> dict[str, str]:
    """Close every connection of ``user`` on every server (4003; the moderation API's kick)."""
    try:
        await state.broker.kick(user, body.reason)
    except BrokerUnavailable:
        raise HTTPException(503, "the broker is unavailable: try again") from None
    logger.info("backend API: disconnect", extra={"user": user})
    return {"disconnected": user}
