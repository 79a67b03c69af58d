"""The wire format: client frames in, server frames out. Pure functions, no I/O.

Client frames are single JSON objects in text frames, told apart by ``type``. A server text
frame holds one JSON object, or several separated by ``\\n`` when the writer coalesces queued
frames (see :mod:`app.transport.outbox`). ``docs/protocol.md`` documents every frame.

:func:`parse_client_frame` never raises anything but :class:`~app.errors.FrameError`, whatever
the input: a property-based test holds it to that.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Final, Literal

import orjson
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from app.conversations.lifecycle import FRAME_TYPES, NUMBERED_TYPES, Kind
from app.errors import ErrorCode, FrameError
from app.notify.mentions import from_stored

ROOM_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,63}$"
USER_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,31}$"
CID_MAX_CHARS: Final = 64

RoomName = Annotated[str, StringConstraints(pattern=ROOM_PATTERN)]
UserName = Annotated[str, StringConstraints(pattern=USER_PATTERN)]
ClientMessageId = (
    Annotated[str, StringConstraints(min_length=1, max_length=CID_MAX_CHARS)]
    | Annotated[int, Field(ge=-(2**63), lt=2**63)]
)


MessageId = Annotated[int, Field(ge=0, lt=2**63)]
# W3C trace context, version 00 (app.ops.tracing): version-traceid-parentid-flags, lower-case.
TRACEPARENT_PATTERN: Final = r"^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$"
Traceparent = Annotated[str, StringConstraints(pattern=TRACEPARENT_PATTERN)]

# What no stored text may hold: U+0000 (PostgreSQL's TEXT refuses it; one such row once stalled
# archiving for every conversation). Unpaired surrogates cannot get this far: orjson refuses
# them in frames (bad_json), pydantic in any str field (the HTTP API's bodies: 422).
UNSTORABLE_MESSAGE: Final = "must not contain U+0000 (NUL)"


def storable(text: str) -> str:
    """``text`` if the store can hold it; raises ValueError saying why not."""
    if "\x00" in text:
        raise ValueError(UNSTORABLE_MESSAGE)
    return text


# Every client text that ends up in the store (message and edit texts, emojis, room titles
# and topics; the backend API's too): refused with bad_frame (HTTP: 422), nothing published.
StorableText = Annotated[str, AfterValidator(storable)]


class _Frame(BaseModel):
    # strict: no coercion ("1" is not 1); unknown fields are ignored so clients may add their own.
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


class Join(_Frame):
    type: Literal["join"]
    room: RoomName
    since: Annotated[int, Field(ge=0, lt=2**63)] | None = None


class Leave(_Frame):
    type: Literal["leave"]
    room: RoomName


FileId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_\-]{16,32}$")]


class Send(_Frame):
    """To a room (``room``) or to every connection of one user (``to``): exactly one of them.
    ``attachments``: the ids of files the sender uploaded for this conversation (``upload``)."""

    type: Literal["send"]
    room: RoomName | None = None
    to: UserName | None = None
    text: StorableText
    cid: ClientMessageId | None = None
    reply_to: MessageId | None = None
    attachments: Annotated[list[FileId], Field(min_length=1, max_length=100)] | None = None
    # The sender's trace context: the message's spans continue its trace (app.ops.tracing).
    traceparent: Traceparent | None = None

    @model_validator(mode="after")
    def _one_target(self) -> Send:
        if (self.room is None) == (self.to is None):
            raise ValueError("give exactly one of room or to")
        return self


class Typing(_Frame):
    """The sender is typing in ``room``: relayed to its members, never stored."""

    type: Literal["typing"]
    room: RoomName


class Auth(_Frame):
    """A token: the first frame in ``jwt`` mode without ``?token=``, or a refreshed one."""

    type: Literal["auth"]
    token: Annotated[str, StringConstraints(min_length=1, max_length=8192)]


class Ping(_Frame):
    type: Literal["ping"]


class Pong(_Frame):
    type: Literal["pong"]


class _Conversation(_Frame):
    """Names a conversation: a room (``room``) or the direct messages with a user (``with``)."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True, populate_by_name=True)
    room: RoomName | None = None
    peer: UserName | None = Field(None, alias="with")

    @model_validator(mode="after")
    def _one_conversation(self) -> _Conversation:
        if (self.room is None) == (self.peer is None):
            raise ValueError("give exactly one of room or with")
        return self


class HistoryRequest(_Conversation):
    """A page of a conversation's history: the newest ``limit`` before ``before`` (the newest
    of all without it), the oldest ``limit`` after ``after`` (recovery), or ``limit`` around
    ``around`` (half up to it, half after it: a search result in its context)."""

    type: Literal["history"]
    before: MessageId | None = None
    after: MessageId | None = None
    around: MessageId | None = None
    limit: Annotated[int, Field(ge=1, le=1000)] = 50

    @model_validator(mode="after")
    def _one_direction(self) -> HistoryRequest:
        if sum(x is not None for x in (self.before, self.after, self.around)) > 1:
            raise ValueError("give at most one of before, after and around")
        return self


class Read(_Conversation):
    """Everything up to message ``id`` of a conversation is read; ``receipt: false`` keeps
    it from the others (no ``receipt`` frame)."""

    type: Literal["read"]
    id: MessageId
    receipt: bool = True


class Edit(_Conversation):
    """The author replaces the text of message ``id``."""

    type: Literal["edit"]
    id: MessageId
    text: StorableText
    cid: ClientMessageId | None = None


class Delete(_Conversation):
    """The author (or a moderator) deletes message ``id``."""

    type: Literal["delete"]
    id: MessageId
    cid: ClientMessageId | None = None


class React(_Conversation):
    """Toggle the sender's reaction ``emoji`` on message ``id``."""

    type: Literal["react"]
    id: MessageId
    emoji: Annotated[str, StringConstraints(min_length=1), AfterValidator(storable)]
    cid: ClientMessageId | None = None


def file_name(name: str) -> str:
    """``name`` if it can name a file: no control characters, no path separators."""
    if any(c in "/\\" or not c.isprintable() for c in name):
        raise ValueError("must not contain control characters, '/' or '\\'")
    return name


class Upload(_Conversation):
    """Upload a file to attach to a message in a conversation: answered with where to upload
    it (an ``upload`` frame), or an error."""

    type: Literal["upload"]
    name: Annotated[str, StringConstraints(min_length=1, max_length=255), AfterValidator(file_name)]
    size: Annotated[int, Field(ge=1, lt=2**53)]
    cid: ClientMessageId | None = None


class FileRequest(_Frame):
    """Links to read file ``id`` (of a message you may read now): a ``file`` frame."""

    type: Literal["file"]
    id: FileId


class InboxRequest(_Frame):
    type: Literal["inbox"]


SearchQuery = Annotated[
    str, StringConstraints(min_length=1, max_length=200), AfterValidator(storable)
]


class SearchRequest(_Frame):
    """Messages you may read now whose text matches ``q`` (words, "quoted phrases",
    ``-word``): in one conversation (``room`` or ``with``) or in all; ``order`` newest first
    or best match first; a page of ``limit`` after skipping ``offset``."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True, populate_by_name=True)
    CONVERSATION_OPTIONAL: ClassVar[bool] = True  # room and with: at most one (AsyncAPI)
    type: Literal["search"]
    q: SearchQuery
    room: RoomName | None = None
    peer: UserName | None = Field(None, alias="with")
    order: Literal["newest", "best"] = "newest"
    limit: Annotated[int, Field(ge=1, le=500)] = 20
    offset: Annotated[int, Field(ge=0, le=100_000)] = 0

    @model_validator(mode="after")
    def _at_most_one_conversation(self) -> SearchRequest:
        if self.room is not None and self.peer is not None:
            raise ValueError("give at most one of room or with")
        return self


class MentionsRequest(_Frame):
    """The messages that mention you, newest first: sent before ``before`` (a ``ts``, to page
    back), at most ``limit``."""

    type: Literal["mentions"]
    before: Annotated[int, Field(ge=0)] | None = None
    limit: Annotated[int, Field(ge=1, le=500)] = 20


class NotificationsRequest(_Frame):
    """Your notification level of one conversation (``room`` or ``with``): read it, or set
    ``level`` and/or ``mute_until`` (epoch ms; 0 unmutes); without a conversation, every
    level you chose."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True, populate_by_name=True)
    CONVERSATION_OPTIONAL: ClassVar[bool] = True  # room and with: at most one (AsyncAPI)
    type: Literal["notifications"]
    room: RoomName | None = None
    peer: UserName | None = Field(None, alias="with")
    level: Literal["all", "mentions", "none"] | None = None
    mute_until: Annotated[int, Field(ge=0, le=2**53)] | None = None

    @model_validator(mode="after")
    def _a_conversation_to_set(self) -> NotificationsRequest:
        if self.room is not None and self.peer is not None:
            raise ValueError("give at most one of room or with")
        if (
            self.room is None
            and self.peer is None
            and (self.level is not None or self.mute_until is not None)
        ):
            raise ValueError("give room or with to set a level")
        return self


class Visibility(_Frame):
    """Whether this connection shows the chat to someone now (the page: visible and used)."""

    type: Literal["visibility"]
    visible: bool


PushKey = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_\-]{16,200}={0,2}$")]


class PushKeys(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)
    p256dh: PushKey
    auth: PushKey


class PushSubscriptionJson(BaseModel):
    """A browser's ``PushSubscription.toJSON()`` (``expirationTime`` is ignored)."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)
    endpoint: Annotated[str, StringConstraints(min_length=8, max_length=2048)]
    keys: PushKeys


class PushSubscribe(_Frame):
    type: Literal["push_subscribe"]
    subscription: PushSubscriptionJson


class PushUnsubscribe(_Frame):
    type: Literal["push_unsubscribe"]
    endpoint: Annotated[str, StringConstraints(min_length=8, max_length=2048)]


Title = Annotated[str, StringConstraints(max_length=200), AfterValidator(storable)]
Topic = Annotated[str, StringConstraints(max_length=1000), AfterValidator(storable)]


class CreateRoom(_Frame):
    """A new room with the sender as its owner: ``private`` ones admit members only."""

    type: Literal["create"]
    room: RoomName
    private: bool = False
    title: Title = ""
    topic: Topic = ""


class DescribeRoom(_Frame):
    """Change a room's title and/or topic (its owner or an admin)."""

    type: Literal["describe"]
    room: RoomName
    title: Title | None = None
    topic: Topic | None = None


class Invite(_Frame):
    """Make ``user`` a member of ``room`` (or change its role)."""

    type: Literal["invite"]
    room: RoomName
    user: UserName
    role: Literal["member", "admin"] = "member"


class Remove(_Frame):
    """Take ``user`` out of ``room``'s members (yourself: leave it for good)."""

    type: Literal["remove"]
    room: RoomName
    user: UserName


class RoomsRequest(_Frame):
    """The rooms you are a member of; with ``public``, the directory: the public rooms with
    a record (whose name, title or topic holds ``q``, when given), for anyone to find."""

    type: Literal["rooms"]
    public: bool = False
    q: Annotated[str, StringConstraints(max_length=64)] | None = None


class Mute(_Frame):
    """Mute ``user``: their messages are hidden from you everywhere (app.access.hiding)."""

    type: Literal["mute"]
    user: UserName


class Unmute(_Frame):
    """End a mute of ``user`` (a block stays)."""

    type: Literal["unmute"]
    user: UserName


class Block(_Frame):
    """Block ``user``: muted, and they cannot write to you directly or invite you."""

    type: Literal["block"]
    user: UserName


class Unblock(_Frame):
    """End a block of ``user``."""

    type: Literal["unblock"]
    user: UserName


Hide = Mute | Unmute | Block | Unblock


class PreviewRequest(_Frame):
    """The preview of ``url`` (a link in a message): title, description, image
    (app.previews.service)."""

    type: Literal["preview"]
    url: Annotated[str, StringConstraints(min_length=8, max_length=2048,
                                          pattern=r"^https?://[^\s]+$")]  # fmt: skip


class ReportMessage(_Conversation):
    """Report message ``id`` of a conversation you may read, with ``reason``
    (app.moderation.reports)."""

    type: Literal["report"]
    id: MessageId
    reason: Annotated[StorableText, StringConstraints(min_length=1, max_length=500)]


class ReportsRequest(_Frame):
    """Moderators: a page of the open reports (oldest first, after ``before``), or with
    ``resolved`` the resolved ones (newest first, before ``before``)."""

    type: Literal["reports"]
    resolved: bool = False
    before: Annotated[int, Field(ge=0, lt=2**63)] | None = None
    limit: Annotated[int, Field(ge=1, le=100)] = 20


class ResolveReport(_Frame):
    """Moderators: resolve report ``id``: ``dismiss`` it, or ``delete`` its message."""

    type: Literal["resolve"]
    id: Annotated[int, Field(ge=0, lt=2**63)]
    action: Literal["dismiss", "delete"]


class Kick(_Frame):
    """Moderators: close every connection of ``user`` (they may come back)."""

    type: Literal["kick"]
    user: UserName
    reason: Annotated[str, StringConstraints(max_length=200)] = "kicked by a moderator"


class Ban(_Frame):
    """Moderators: keep ``user`` out for ``duration_s`` (their connections are closed)."""

    type: Literal["ban"]
    user: UserName
    duration_s: Annotated[float, Field(gt=0, le=10 * 365 * 86400)]
    reason: Annotated[str, StringConstraints(max_length=200)] = "banned by a moderator"


class HiddenRequest(_Frame):
    """Whom you mute and block (answered with ``hidden``)."""

    type: Literal["hidden"]


ClientFrame = (
    Join
    | Leave
    | Send
    | Typing
    | Auth
    | Ping
    | Pong
    | HistoryRequest
    | Read
    | InboxRequest
    | Edit
    | Delete
    | React
    | CreateRoom
    | DescribeRoom
    | Invite
    | Remove
    | RoomsRequest
    | SearchRequest
    | Upload
    | FileRequest
    | MentionsRequest
    | NotificationsRequest
    | Visibility
    | PushSubscribe
    | PushUnsubscribe
    | Mute
    | Unmute
    | Block
    | Unblock
    | HiddenRequest
    | PreviewRequest
    | ReportMessage
    | ReportsRequest
    | ResolveReport
    | Kick
    | Ban
)
_CLIENT_FRAME: Final[TypeAdapter[ClientFrame]] = TypeAdapter(
    Annotated[ClientFrame, Field(discriminator="type")]
)
CLIENT_TYPES: Final = (
    "join", "leave", "send", "typing", "auth", "ping", "pong", "history", "read", "inbox",
    "edit", "delete", "react", "create", "describe", "invite", "remove", "rooms", "search",
    "upload", "file", "mentions", "notifications", "visibility", "push_subscribe",
    "push_unsubscribe", "mute", "unmute", "block", "unblock", "hidden", "report", "reports",
    "resolve", "kick", "ban", "preview",
)  # fmt: skip


_ROOM = re.compile(ROOM_PATTERN)


def raw_ref(data: str) -> dict[str, object] | None:
    """What a frame that does not validate still says of itself, for its error frame: its
    ``type`` (as ``ref``), ``room`` and ``cid``, each only when it is valid on its own (None:
    not a JSON object of a known type)."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or obj.get("type") not in CLIENT_TYPES:
        return None
    ref: dict[str, object] = {"ref": obj["type"]}
    room, cid = obj.get("room"), obj.get("cid")
    if isinstance(room, str) and _ROOM.match(room):
        ref["room"] = room
    if (isinstance(cid, str) and 1 <= len(cid) <= CID_MAX_CHARS) or (
        type(cid) is int and -(2**63) <= cid < 2**63
    ):
        ref["cid"] = cid
    return ref


def parse_client_frame(data: str) -> ClientFrame:
    """Decode and validate one client text frame, or raise :class:`FrameError` saying why."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise FrameError(ErrorCode.BAD_JSON, f"frame is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise FrameError(ErrorCode.BAD_FRAME, "frame must be a JSON object")
    kind = obj.get("type")
    if not isinstance(kind, str):
        raise FrameError(ErrorCode.BAD_FRAME, 'frame needs a string "type"')
    if kind not in CLIENT_TYPES:
        shown = kind if len(kind) <= 32 else kind[:32] + "…"
        raise FrameError(ErrorCode.UNKNOWN_TYPE, f"unknown frame type {shown!r}")
    try:
        return _CLIENT_FRAME.validate_python(obj)
    except ValidationError as exc:
        raise FrameError(ErrorCode.BAD_FRAME, _describe(exc)) from None


def _describe(exc: ValidationError) -> str:
    first = exc.errors(include_url=False, include_input=False)[0]
    # loc is (tag, field, ...) for a discriminated union; only the field means anything to a client.
    field = str(first["loc"][1]) if len(first["loc"]) > 1 else "frame"
    message = first["msg"].removeprefix("Value error, ")
    if field == "cid":
        message = f"must be a string of 1 to {CID_MAX_CHARS} characters or a 64-bit integer"
    elif field == "traceparent":
        message = "must be a W3C traceparent: 00-<32 hex digits>-<16 hex digits>-<2 hex digits>"
    elif first["type"] == "string_pattern_mismatch":
        message = "invalid name (letters, digits and _ . - :, starting with a letter or digit)"
    return f"{field}: {message}"


def encode(frame: dict[str, Any]) -> str:
    """One server frame as JSON text."""
    return orjson.dumps(frame).decode()


def message_frame_parts(
    target: str,
    name: str,
    user: str,
    text: str,
    reply_to: int | None = None,
    attachments: str | None = None,
    mentions: str | None = None,
    traceparent: str | None = None,
) -> tuple[bytes, bytes]:
    """The parts of a ``message`` frame that do not depend on its id and timestamp: the head
    (up to ``"id":``) and the body (from after the id up to ``"ts":``). ``target`` is
    ``room`` (a room message, to room ``name``) or ``to`` (a direct message to user ``name``);
    ``reply_to``: the id of the message this one answers; ``attachments``: its files, the JSON
    list :mod:`app.files.attachments` made (inserted as it is); ``mentions``: who it mentions, in
    the stored form of :mod:`app.notify.mentions` (``mentions`` and ``here`` in the frame);
    ``traceparent``: the trace context of a traced message (:mod:`app.ops.tracing`), last but
    ``ts``.

    Both brokers build every message frame from these parts with :func:`message_frame`; the
    Redis PUBLISH script does the same concatenation in Lua, since only Redis knows the id.
    """
    head = b'{"type":"message","' + target.encode() + b'":' + orjson.dumps(name) + b',"id":'
    body = b',"user":' + orjson.dumps(user) + b',"text":' + orjson.dumps(text)
    if reply_to is not None:
        body += b',"reply_to":%d' % reply_to
    if attachments is not None:
        body += b',"attachments":' + attachments.encode()
    if mentions is not None:
        users, here = from_stored(mentions)
        if users:
            body += b',"mentions":' + orjson.dumps(users)
        if here:
            body += b',"here":true'
    if traceparent is not None:
        body += b',"traceparent":"' + traceparent.encode() + b'"'
    return head, body + b',"ts":'


def event_frame_parts(
    kind: Kind, target: str, name: str, message_id: int, user: str, text: str
) -> tuple[bytes, bytes]:
    """As :func:`message_frame_parts`, for an event on message ``message_id`` (see
    :mod:`app.conversations.lifecycle`): ``edited`` (with the new ``text``), ``deleted``, or
    ``reaction``
    (``text`` is the emoji; ``on`` is true for REACTION_ON, false for REACTION_OFF).
    ``target`` and ``name`` name the conversation as for a message: ``to`` is the other user
    from the one acting."""
    head = (
        b'{"type":"' + FRAME_TYPES[kind].encode() + b'","' + target.encode() + b'":'
        + orjson.dumps(name) + b',"id":'
    )  # fmt: skip
    body = b',"target":%d,"user":' % message_id + orjson.dumps(user)
    if kind is Kind.EDITED:
        body += b',"text":' + orjson.dumps(text)
    elif kind in (Kind.REACTION_ON, Kind.REACTION_OFF):
        body += b',"emoji":' + orjson.dumps(text)
        body += b',"on":true' if kind is Kind.REACTION_ON else b',"on":false'
    return head, body + b',"ts":'


def message_frame(parts: tuple[bytes, bytes], message_id: int, ts_ms: int) -> bytes:
    """The ``message`` frame, encoded once per fan-out and forwarded as-is to every
    recipient: ``{"type":"message","room"|"to":…,"id":…,"user":…,"text":…,"ts":…}``."""
    head, body = parts
    return b"%s%d%s%d}" % (head, message_id, body, ts_ms)


_MESSAGE_START: Final = b'{"type":"message"'


def is_message_frame(frame: bytes) -> bool:
    """Whether a numbered frame is a ``message`` (not an event on one)."""
    return frame.startswith(_MESSAGE_START)


_NUMBERED_STARTS: Final = tuple(b'{"type":"%s"' % t.encode() for t in sorted(NUMBERED_TYPES))


def message_id_of(frame: bytes) -> int | None:
    """The id of a numbered frame (a ``message``, or an event: ``edited``, ``deleted``,
    ``reaction``) built by :func:`message_frame`; None for any other frame (presence, typing,
    receipts). The Redis broker reads it once per frame it hears, at the boundary, and hands
    it to the Hub beside the frame.

    Cheap on purpose: a numbered frame starts ``{"type":"<type>",`` then ``"room"`` or
    ``"to"`` (a name that cannot hold a quote), then ``"id":N,`` — so the first ``,"id":`` is
    the id.
    """
    if not frame.startswith(_NUMBERED_STARTS):
        return None
    start = frame.index(b',"id":') + 6
    return int(frame[start : frame.index(b",", start)])


def typing_frame(room: str, user: str) -> bytes:
    """``typing``: ``user`` is typing in ``room`` (relayed to the room, sender included)."""
    return orjson.dumps({"type": "typing", "room": room, "user": user})


def receipt_frame(target: str, name: str, user: str, message_id: int) -> bytes:
    """``receipt``: ``user`` has read everything up to ``id`` in the conversation (``room``, or
    ``to``: the other user of a direct conversation). Relayed live, never stored as a frame."""
    return orjson.dumps({"type": "receipt", target: name, "user": user, "id": message_id})


def receipts_frame(room: str, positions: dict[str, int]) -> str:
    """``receipts``: where each member of ``room`` has read up to (after a ``joined``)."""
    return encode({"type": "receipts", "room": room, "read": positions})


def presence_frame(room: str, event: str, user: str | None, count: int) -> dict[str, Any]:
    """A ``presence`` frame; without ``user`` (big rooms) it only carries the new count."""
    if user is None:
        return {"type": "presence", "room": room, "count": count}
    return {"type": "presence", "room": room, "event": event, "user": user, "count": count}


PING_FRAME: Final = encode({"type": "ping"})
PONG_FRAME: Final = encode({"type": "pong"})


def hello_frame(
    user: str,
    connection_id: str,
    node: str,
    limits: dict[str, int | float],
    expires_at: float | None = None,
    guest_key: str | None = None,
    push_key: str | None = None,
) -> str:
    """``hello``: who you are, which server process you reached, and the limits that apply
    (plus ``exp``, when your token expires, in ``jwt`` mode; ``guest``, the key the server
    made you, in ``guest`` mode: keep it and connect with ``?guest=`` to stay you)."""
    frame: dict[str, Any] = {
        "type": "hello", "user": user, "conn": connection_id, "node": node, "limits": limits,
    }  # fmt: skip
    if expires_at is not None:
        frame["exp"] = int(expires_at)
    if guest_key is not None:
        frame["guest"] = guest_key
    if push_key is not None:
        frame["push_key"] = push_key
    return encode(frame)


def refresh_frame(expires_at: float) -> str:
    """``refresh``: your token expires at ``exp``; send ``auth`` with a new one before then."""
    return encode({"type": "refresh", "exp": int(expires_at)})


def authenticated_frame(user: str, expires_at: float | None) -> str:
    """``authenticated``: the new token of an ``auth`` frame was accepted."""
    return encode({"type": "authenticated", "user": user, "exp": expires_at and int(expires_at)})


def joined_frame(
    room: str,
    recovered: bool | None,
    count: int,
    users: list[str] | None,
    last: int | None = None,
) -> str:
    """``joined``: ``recovered`` only for a join with ``since``, ``last`` only for one without;
    ``users`` only below the presence threshold."""
    frame: dict[str, Any] = {"type": "joined", "room": room}
    if recovered is not None:
        frame["recovered"] = recovered
    if last is not None:
        frame["last"] = last
    frame["count"] = count
    if users is not None:
        frame["users"] = users
    return encode(frame)


def conversation_fields(room: str | None, peer: str | None) -> bytes:
    """``"room":R`` or ``"with":U``: how server frames name a conversation."""
    if room is not None:
        return b'"room":' + orjson.dumps(room)
    return b'"with":' + orjson.dumps(peer)


def history_frame(
    room: str | None,
    peer: str | None,
    messages: list[bytes],
    more: bool,
    recovered: bool | None = None,
    around: int | None = None,
) -> str:
    """``history``: a page of ``message`` frames, oldest first (as stored: forwarded as-is).
    ``recovered`` only for a page ``after`` an id: False when messages after it are gone;
    ``around`` for a page around an id."""
    head = b'{"type":"history",' + conversation_fields(room, peer)
    if around is not None:
        head += b',"around":%d' % around
    if recovered is not None:
        head += b',"recovered":' + (b"true" if recovered else b"false")
    head += b',"more":' + (b"true" if more else b"false")
    return (head + b',"messages":[' + b",".join(messages) + b"]}").decode()


def search_frame(page: dict[str, Any]) -> str:
    """``search``: a page of results (app.conversations.search)."""
    return encode({"type": "search", **page})


def upload_frame(
    file_id: str,
    cid: str | int | None,
    method: str,
    url: str,
    fields: dict[str, str],
    expires: int,
) -> str:
    """``upload``: where to upload file ``file`` (``method`` to ``url``; a POST sends
    ``fields`` first, then the file as field ``file``) until ``expires``."""
    return encode({
        "type": "upload", "file": file_id, "cid": cid, "method": method, "url": url,
        "fields": fields, "expires": expires,
    })  # fmt: skip


def file_frame(link: dict[str, Any]) -> str:
    """``file``: links to read a file (app.files.service.Files.link)."""
    return encode({"type": "file", **link})


def hidden_frame(muted: list[str], blocked: list[str]) -> str:
    """``hidden``: whom the user mutes and blocks now (the answer to ``hidden`` and to each
    change, and sent to every connection of the user when the lists change)."""
    return encode({"type": "hidden", "muted": muted, "blocked": blocked})


_SENDER_STARTS: Final = (
    *(b'{"type":"%s"' % t.encode() for t in ("message", "edited", "deleted", "reaction")),
    b'{"type":"typing"',
)
_SENDER_FIELD: Final = b',"user":"'


def sender_of(frame: bytes) -> str | None:
    """Who sent a ``message``, an event on one, or a ``typing`` frame (None: another frame).

    Cheap on purpose: these frames name their conversation (a room or a user name, which
    cannot hold a quote) before ``"user"``, so the first ``,"user":"`` is the sender's."""
    if not frame.startswith(_SENDER_STARTS):
        return None
    start = frame.find(_SENDER_FIELD)
    if start < 0:
        return None
    start += len(_SENDER_FIELD)
    return frame[start : frame.index(b'"', start)].decode()


def reported_frame(report: dict[str, Any]) -> str:
    """``reported``: the answer to ``report`` (the report as stored)."""
    return encode({"type": "reported", "report": report})


def reports_frame(page: dict[str, Any]) -> str:
    """``reports``: a page of the moderators' queue (``reports``, ``next``)."""
    return encode({"type": "reports", **page})


def resolved_frame(report: dict[str, Any]) -> str:
    """``resolved``: the answer to ``resolve`` (the report as it is now)."""
    return encode({"type": "resolved", "report": report})


def inbox_frame(conversations: list[dict[str, Any]]) -> str:
    """``inbox``: the user's conversations, the most recently active first."""
    return encode({"type": "inbox", "conversations": conversations})


def room_frame(record: dict[str, Any]) -> str:
    """``room``: a room's record (``room``, ``private``, ``title``, ``topic``, your ``role``)."""
    return encode({"type": "room", **record})


def rooms_frame(records: list[dict[str, Any]], public: bool = False) -> str:
    """``rooms``: the rooms you are a member of; with ``public``, the public rooms found."""
    if public:
        return encode({"type": "rooms", "public": True, "rooms": records})
    return encode({"type": "rooms", "rooms": records})


def member_frame(room: str, user: str, event: str, role: str | None, by: str | None) -> bytes:
    """``member``: ``user`` was ``added`` to (or ``removed`` from) ``room``'s members."""
    return orjson.dumps(
        {"type": "member", "room": room, "event": event, "user": user, "role": role, "by": by}
    )


def invited_frame(record: dict[str, Any], by: str | None) -> bytes:
    """``invited``: you are now a member of a room (to your connections)."""
    return orjson.dumps({"type": "invited", **record, "by": by})


def left_frame(room: str, reason: str | None = None) -> str:
    """``left``: the connection is out of ``room`` (``reason`` when the server took it out:
    ``removed`` from a private room's members)."""
    if reason is None:
        return encode({"type": "left", "room": room})
    return encode({"type": "left", "room": room, "reason": reason})


def ack_frame(cid: str | int | None, message_id: int, duplicate: bool) -> str:
    frame: dict[str, Any] = {"type": "ack", "cid": cid, "id": message_id}
    if duplicate:
        frame["duplicate"] = True
    return encode(frame)


def error_frame(code: ErrorCode, message: str, ref: dict[str, Any] | None = None) -> str:
    """An ``error`` frame; ``ref`` echoes what the client needs to match it (frame type, cid)."""
    frame: dict[str, Any] = {"type": "error", "code": code.value, "message": message}
    if ref:
        frame.update(ref)
    return encode(frame)
