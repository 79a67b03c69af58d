"""The wire protocol's frames, typed (docs/protocol.md in the Hubbub repository).

Every frame is one JSON object with a string ``type``; a server text frame holds one object,
or several separated by ``"\\n"``. These are the shapes as they travel: the client turns the
server's frames into the event classes of :mod:`hubbub_client.events` before handing them on.
Keys that are Python keywords (``with``) make some of them use the functional syntax.
"""

from __future__ import annotations

from typing import Any, Final, Literal, NotRequired, TypedDict

RoomName = str
"""A room's name: ``^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$``."""
UserId = str
"""A user's id (a guest's is its name, ``-`` and 16 hex digits)."""
Cid = str | int
"""A client message id: identifies a send for retries (dedup); at most 64 characters, or an
integer."""
FileId = str
"""A file's id, from an ``upload`` answer: ``^[A-Za-z0-9_-]{16,32}$``."""

ERROR_CODES: Final = (
    "bad_json", "bad_frame", "unknown_type", "binary_unsupported", "text_too_long",
    "not_joined", "too_many_rooms", "too_many_members", "rate_limited", "broker_unavailable",
    "resync", "forbidden", "store_unavailable", "no_store", "not_found", "exists",
    "file_too_large", "storage_unavailable", "too_many_hidden", "rejected",
    "moderation_unavailable", "preview_unavailable",
)  # fmt: skip
"""The codes of ``error`` frames: the connection stays open after each."""

TERMINAL_CLOSE_CODES: Final = frozenset({1000, 1007, 1008, 1009, 4001, 4003})
"""Close codes after which reconnecting would fail again the same way: the client stays
closed. After every other code it reconnects with jittered backoff."""

RETRY_JOIN_CODES: Final = frozenset({"broker_unavailable", "rate_limited"})
"""Error codes after which a refused join did not happen and is sent again later."""

Role = Literal["owner", "admin", "member"]
NotificationLevel = Literal["all", "mentions", "none"]
"""What notifies you of a conversation's messages: ``all`` of them (direct conversations'
default), ``mentions`` (mentions and direct messages; rooms' default) or ``none``."""

# -- client -> server ---------------------------------------------------------------------


class JoinFrame(TypedDict):
    type: Literal["join"]
    room: RoomName
    since: NotRequired[int]


class LeaveFrame(TypedDict):
    type: Literal["leave"]
    room: RoomName


class SendFrame(TypedDict):
    type: Literal["send"]
    room: NotRequired[RoomName]
    to: NotRequired[UserId]
    text: str
    cid: Cid
    reply_to: NotRequired[int]
    attachments: NotRequired[list[FileId]]
    traceparent: NotRequired[str]  # your W3C trace context (the server's spans continue it)


EditFrame = TypedDict(
    "EditFrame",
    {
        "type": Literal["edit"],
        "room": NotRequired[RoomName],
        "with": NotRequired[UserId],
        "id": int,
        "text": str,
        "cid": Cid,
    },
)
DeleteFrame = TypedDict(
    "DeleteFrame",
    {
        "type": Literal["delete"],
        "room": NotRequired[RoomName],
        "with": NotRequired[UserId],
        "id": int,
        "cid": Cid,
    },
)
ReactFrame = TypedDict(
    "ReactFrame",
    {
        "type": Literal["react"],
        "room": NotRequired[RoomName],
        "with": NotRequired[UserId],
        "id": int,
        "emoji": str,
        "cid": Cid,
    },
)


class TypingFrame(TypedDict):
    type: Literal["typing"]
    room: RoomName


class AuthFrame(TypedDict):
    type: Literal["auth"]
    token: NotRequired[str]
    name: NotRequired[str]
    guest: NotRequired[str]


HistoryRequestFrame = TypedDict(
    "HistoryRequestFrame",
    {
        "type": Literal["history"],
        "room": NotRequired[RoomName],
        "with": NotRequired[UserId],
        "before": NotRequired[int],
        "after": NotRequired[int],
        "limit": int,
    },
)
ReadFrame = TypedDict(
    "ReadFrame",
    {
        "type": Literal["read"],
        "room": NotRequired[RoomName],
        "with": NotRequired[UserId],
        "id": int,
        "receipt": NotRequired[bool],
    },
)


class InboxRequestFrame(TypedDict):
    type: Literal["inbox"]


class CreateFrame(TypedDict):
    type: Literal["create"]
    room: RoomName
    private: bool
    title: str
    topic: str


class DescribeFrame(TypedDict):
    type: Literal["describe"]
    room: RoomName
    title: NotRequired[str]
    topic: NotRequired[str]


class InviteFrame(TypedDict):
    type: Literal["invite"]
    room: RoomName
    user: UserId
    role: Literal["member", "admin"]


class RemoveFrame(TypedDict):
    type: Literal["remove"]
    room: RoomName
    user: UserId


class RoomsRequestFrame(TypedDict):
    type: Literal["rooms"]
    public: NotRequired[bool]
    q: NotRequired[str]


SearchRequestFrame = TypedDict(
    "SearchRequestFrame",
    {
        "type": Literal["search"],
        "q": str,
        "room": NotRequired[RoomName],
        "with": NotRequired[UserId],
        "order": NotRequired[Literal["newest", "best"]],
        "limit": NotRequired[int],
        "offset": NotRequired[int],
    },
)


UploadRequestFrame = TypedDict(
    "UploadRequestFrame",
    {
        "type": Literal["upload"],
        "room": NotRequired[RoomName],
        "with": NotRequired[UserId],
        "name": str,
        "size": int,
        "cid": Cid,
    },
)
"""A file to attach to a message of the conversation: answered with where to upload it."""


class FileRequestFrame(TypedDict):
    """Links to read file ``id``: answered with a ``file`` frame."""

    type: Literal["file"]
    id: FileId


class MentionsRequestFrame(TypedDict):
    """The messages that mention you, newest first: ``before`` a ``ts`` to page back from."""

    type: Literal["mentions"]
    before: NotRequired[int]
    limit: NotRequired[int]


NotificationsRequestFrame = TypedDict(
    "NotificationsRequestFrame",
    {
        "type": Literal["notifications"],
        "room": NotRequired[RoomName],
        "with": NotRequired[UserId],
        "level": NotRequired[NotificationLevel],
        "mute_until": NotRequired[int],
    },
)
"""Your notification level of a conversation; with ``level`` and/or ``mute_until`` (epoch ms,
0 unmutes), set it; without a conversation, every one whose level you changed."""


class VisibilityFrame(TypedDict):
    """Whether this connection shows the chat to someone now (no answer)."""

    type: Literal["visibility"]
    visible: bool


class PushKeysFrame(TypedDict):
    p256dh: str
    auth: str


class PushSubscriptionFrame(TypedDict):
    """A browser's Web Push subscription (``PushSubscription.toJSON()``), base64url keys."""

    endpoint: str
    keys: PushKeysFrame


class PushSubscribeFrame(TypedDict):
    type: Literal["push_subscribe"]
    subscription: PushSubscriptionFrame


class PushUnsubscribeFrame(TypedDict):
    type: Literal["push_unsubscribe"]
    endpoint: str


class MuteFrame(TypedDict):
    """Mute ``user``: their messages, the events on them and their typing are hidden from you
    everywhere until ``unmute`` (a blocked user stays blocked). Answered with ``hidden``."""

    type: Literal["mute"]
    user: UserId


class UnmuteFrame(TypedDict):
    """End a mute of ``user`` (a block stays). Answered with ``hidden``."""

    type: Literal["unmute"]
    user: UserId


class BlockFrame(TypedDict):
    """Block ``user``: muted, and they cannot write to you directly nor invite you. Answered
    with ``hidden``."""

    type: Literal["block"]
    user: UserId


class UnblockFrame(TypedDict):
    """End a block of ``user``. Answered with ``hidden``."""

    type: Literal["unblock"]
    user: UserId


class HiddenRequestFrame(TypedDict):
    """Whom you mute and block (answered with ``hidden``)."""

    type: Literal["hidden"]


HideFrame = MuteFrame | UnmuteFrame | BlockFrame | UnblockFrame | HiddenRequestFrame
"""The frames answered with ``hidden``: a change of whom you hide, or the request for the
lists."""


ReportFrame = TypedDict(
    "ReportFrame",
    {
        "type": Literal["report"],
        "room": NotRequired[RoomName],
        "with": NotRequired[UserId],
        "id": int,
        "reason": str,
    },
)
"""Report message ``id`` of a conversation you may read now (``room`` or ``with``), with
``reason`` (1-500 characters). Answered with ``reported``."""


class ReportsRequestFrame(TypedDict):
    """Moderators: a page of the reports queue: open reports oldest first after ``before``, or
    with ``resolved`` resolved ones newest first before it (``limit`` 1-100, default 20).
    Answered with ``reports``."""

    type: Literal["reports"]
    resolved: NotRequired[bool]
    before: NotRequired[int]
    limit: NotRequired[int]


class ResolveFrame(TypedDict):
    """Moderators: resolve report ``id``: ``dismiss`` it, or ``delete`` its message. Answered
    with ``resolved``."""

    type: Literal["resolve"]
    id: int
    action: Literal["dismiss", "delete"]


class KickFrame(TypedDict):
    """Moderators: close every connection of ``user`` (they may come back). Answered with
    ``kicked``."""

    type: Literal["kick"]
    user: UserId
    reason: NotRequired[str]


class BanFrame(TypedDict):
    """Moderators: keep ``user`` out for ``duration_s`` (their connections are closed).
    Answered with ``banned``."""

    type: Literal["ban"]
    user: UserId
    duration_s: float
    reason: NotRequired[str]


class PreviewRequestFrame(TypedDict):
    """The preview of link ``url`` (``http(s)://...``) found in a message. Answered with
    ``preview``."""

    type: Literal["preview"]
    url: str


class PingFrame(TypedDict):
    type: Literal["ping"]


class PongFrame(TypedDict):
    type: Literal["pong"]


AckedFrame = SendFrame | EditFrame | DeleteFrame | ReactFrame
"""The frames with a ``cid`` that the server acknowledges (and the client resends until it
does)."""

ClientFrame = (
    JoinFrame | LeaveFrame | SendFrame | EditFrame | DeleteFrame | ReactFrame | TypingFrame
    | AuthFrame | HistoryRequestFrame | ReadFrame | InboxRequestFrame | CreateFrame
    | DescribeFrame | InviteFrame | RemoveFrame | RoomsRequestFrame | SearchRequestFrame
    | UploadRequestFrame | FileRequestFrame | MentionsRequestFrame | NotificationsRequestFrame
    | VisibilityFrame | PushSubscribeFrame | PushUnsubscribeFrame | MuteFrame | UnmuteFrame
    | BlockFrame | UnblockFrame | HiddenRequestFrame | ReportFrame | ReportsRequestFrame
    | ResolveFrame | KickFrame | BanFrame | PreviewRequestFrame | PingFrame | PongFrame
)  # fmt: skip
"""Every frame a client may send."""

# -- server -> client ---------------------------------------------------------------------


class Limits(TypedDict):
    """The limits a ``hello`` announces (newer servers may add more)."""

    heartbeat_interval_s: float
    heartbeat_timeout_s: float
    max_frame_bytes: int
    max_text_chars: int
    max_rooms: int
    rate_limit_frames_per_s: float
    rate_limit_burst: int


class HelloFrame(TypedDict):
    type: Literal["hello"]
    user: UserId
    conn: str
    node: str
    limits: Limits
    guest: NotRequired[str]
    exp: NotRequired[int]
    push_key: NotRequired[str]


class JoinedFrame(TypedDict):
    type: Literal["joined"]
    room: RoomName
    count: int
    users: NotRequired[list[UserId]]
    recovered: NotRequired[bool]
    last: NotRequired[int]


class LeftFrame(TypedDict):
    type: Literal["left"]
    room: RoomName
    reason: NotRequired[str]


class AttachmentFrame(TypedDict):
    """A file a message carries: ``type`` sniffed from its bytes; ``image``: a PNG, JPEG, GIF
    or WebP with a thumbnail, then ``width`` and ``height`` (of the original)."""

    id: FileId
    name: str
    size: int
    type: str
    image: bool
    width: NotRequired[int]
    height: NotRequired[int]


class MessageFrame(TypedDict):
    """A room message (``room``) or a direct message (``to``); in history pages, as its
    events left it (``edited``, ``deleted``, ``reactions``); ``attachments``: its files;
    ``mentions``: the users it mentions, ``here``: ``@here`` (everyone present)."""

    type: Literal["message"]
    room: NotRequired[RoomName]
    to: NotRequired[UserId]
    id: int
    user: UserId
    text: str
    ts: int
    reply_to: NotRequired[int]
    edited: NotRequired[int]
    deleted: NotRequired[bool]
    reactions: NotRequired[dict[str, list[UserId]]]
    attachments: NotRequired[list[AttachmentFrame]]
    mentions: NotRequired[list[UserId]]
    traceparent: NotRequired[str]  # a traced message's W3C trace context
    here: NotRequired[Literal[True]]


class EditedFrame(TypedDict):
    type: Literal["edited"]
    room: NotRequired[RoomName]
    to: NotRequired[UserId]
    id: int
    target: int
    user: UserId
    text: str
    ts: int


class DeletedFrame(TypedDict):
    type: Literal["deleted"]
    room: NotRequired[RoomName]
    to: NotRequired[UserId]
    id: int
    target: int
    user: UserId
    ts: int


class ReactionFrame(TypedDict):
    type: Literal["reaction"]
    room: NotRequired[RoomName]
    to: NotRequired[UserId]
    id: int
    target: int
    user: UserId
    emoji: str
    on: bool
    ts: int


class PresenceFrame(TypedDict):
    type: Literal["presence"]
    room: RoomName
    count: int
    event: NotRequired[Literal["join", "leave"]]
    user: NotRequired[UserId]


class TypingNoticeFrame(TypedDict):
    type: Literal["typing"]
    room: RoomName
    user: UserId


class ReceiptFrame(TypedDict):
    type: Literal["receipt"]
    room: NotRequired[RoomName]
    to: NotRequired[UserId]
    user: UserId
    id: int


class ReceiptsFrame(TypedDict):
    type: Literal["receipts"]
    room: RoomName
    read: dict[UserId, int]


class AckFrame(TypedDict):
    type: Literal["ack"]
    cid: Cid
    id: int
    duplicate: NotRequired[bool]


ErrorFrame = TypedDict(
    "ErrorFrame",
    {
        "type": Literal["error"],
        "code": str,
        "message": str,
        "ref": NotRequired[str],
        "room": NotRequired[RoomName],
        "with": NotRequired[UserId],
        "to": NotRequired[UserId],
        "cid": NotRequired[Cid],
        "id": NotRequired[int],
    },
)


class RefreshFrame(TypedDict):
    type: Literal["refresh"]
    exp: int


class AuthenticatedFrame(TypedDict):
    type: Literal["authenticated"]
    user: UserId
    exp: NotRequired[int | None]


HistoryFrame = TypedDict(
    "HistoryFrame",
    {
        "type": Literal["history"],
        "room": NotRequired[RoomName],
        "with": NotRequired[UserId],
        "more": bool,
        "messages": list[MessageFrame],
        "recovered": NotRequired[bool],
    },
)
InboxEntryFrame = TypedDict(
    "InboxEntryFrame",
    {
        "room": NotRequired[RoomName],
        "with": NotRequired[UserId],
        "last": NotRequired[MessageFrame | None],
        "unread": NotRequired[int],
        "read": NotRequired[int],
        "peer_read": NotRequired[int],
        "mentions": NotRequired[int],
    },
)


class InboxFrame(TypedDict):
    type: Literal["inbox"]
    conversations: list[InboxEntryFrame]


class RoomRecordFrame(TypedDict):
    room: RoomName
    private: bool
    title: str
    topic: str
    role: NotRequired[Role | None]
    members: NotRequired[dict[UserId, Role]]


class RoomFrame(RoomRecordFrame):
    type: Literal["room"]


class RoomsFrame(TypedDict):
    type: Literal["rooms"]
    public: NotRequired[bool]
    rooms: list[RoomRecordFrame]


SearchResultFrame = TypedDict(
    "SearchResultFrame",
    {
        "room": NotRequired[RoomName],
        "with": NotRequired[UserId],
        "id": int,
        "user": UserId,
        "ts": int,
        "text": str,
        "highlights": list[list[int]],
    },
)


class SearchFrame(TypedDict):
    """The answer to ``search``: ``highlights`` are [start, end) in characters of ``text``."""

    type: Literal["search"]
    q: str
    results: list[SearchResultFrame]
    next_offset: int | None


class MemberFrame(TypedDict):
    type: Literal["member"]
    room: RoomName
    event: Literal["added", "removed"]
    user: UserId
    role: Role | None
    by: UserId | None


class InvitedFrame(RoomRecordFrame):
    type: Literal["invited"]
    by: UserId | None


class UploadFrame(TypedDict):
    """The answer to ``upload``: send the bytes before ``expires`` (epoch seconds). ``PUT``:
    the bytes as the body, to ``url`` (relative to the server: ``local`` storage); ``POST``
    (S3 storage): a ``multipart/form-data`` form with every entry of ``fields`` first and the
    file last, as field ``file``."""

    type: Literal["upload"]
    file: FileId
    cid: Cid | None
    method: Literal["PUT", "POST"]
    url: str
    fields: dict[str, str]
    expires: int


class FileFrame(TypedDict):
    """The answer to ``file``: URLs that work until ``expires`` (epoch seconds; ask again
    after). ``url`` serves the file, ``thumbnail`` an image's WebP preview (else None).
    ``HubbubClient.file_links`` makes relative URLs absolute."""

    type: Literal["file"]
    id: FileId
    name: str
    size: int
    content_type: str
    url: str
    thumbnail: str | None
    expires: int


MentionEntryFrame = TypedDict(
    "MentionEntryFrame",
    {
        "room": NotRequired[RoomName],
        "with": NotRequired[UserId],
        "id": int,
        "user": UserId,
        "text": str,
        "ts": int,
        "unread": bool,
    },
)


class MentionsFrame(TypedDict):
    """The answer to ``mentions``: newest first; ``unread`` how many of all are unread;
    ``more``: older ones follow."""

    type: Literal["mentions"]
    mentions: list[MentionEntryFrame]
    unread: int
    more: bool


NotificationSettingFrame = TypedDict(
    "NotificationSettingFrame",
    {
        "room": NotRequired[RoomName],
        "with": NotRequired[UserId],
        "level": NotificationLevel,
        "mute_until": int | None,
    },
)
NotificationsFrame = TypedDict(
    "NotificationsFrame",
    {
        "type": Literal["notifications"],
        "room": NotRequired[RoomName],
        "with": NotRequired[UserId],
        "level": NotRequired[NotificationLevel],
        "mute_until": NotRequired[int | None],
        "conversations": NotRequired[list[NotificationSettingFrame]],
    },
)
"""The answer to ``notifications``: one conversation's level and mute, or (``conversations``)
those you changed."""


class PushSubscribedFrame(TypedDict):
    type: Literal["push_subscribed"]
    endpoint: str


class PushUnsubscribedFrame(TypedDict):
    type: Literal["push_unsubscribed"]
    endpoint: str


class HiddenFrame(TypedDict):
    """Whom you mute and block, sorted (disjoint: a blocked user is muted too, and listed as
    blocked only): the answer to ``hidden``, ``mute``, ``unmute``, ``block`` and ``unblock``,
    and sent by itself to every connection of yours when the lists change (from another
    connection or the HTTP API)."""

    type: Literal["hidden"]
    muted: list[UserId]
    blocked: list[UserId]


class ReportedMessageFrame(TypedDict):
    """A reported message as it was when reported."""

    id: int
    user: UserId
    text: str


class ReportResolutionFrame(TypedDict):
    """How a report was resolved: by whom, with what outcome, when (epoch ms)."""

    by: UserId
    outcome: Literal["dismissed", "deleted"]
    ts: int


Report = TypedDict(
    "Report",
    {
        "id": int,
        "room": NotRequired[RoomName],
        "with": NotRequired[list[UserId]],
        "message": ReportedMessageFrame,
        "reporter": UserId,
        "reason": str,
        "ts": int,
        "resolved": ReportResolutionFrame | None,
    },
)
"""A report of a message, as the moderators' queue shows it: the message as it was when
reported, in ``room`` or the direct conversation of the two users ``with``; ``resolved``:
by whom, how and when (None: open)."""


class ReportedFrame(TypedDict):
    """The answer to ``report``: the report as stored (reporting a message again answers the
    first)."""

    type: Literal["reported"]
    report: Report


class ReportsFrame(TypedDict):
    """The answer to ``reports`` (moderators): reports of conversations you may read now;
    ``next``: the ``before`` of the next page (None: the last)."""

    type: Literal["reports"]
    reports: list[Report]
    next: int | None


class ResolvedFrame(TypedDict):
    """The answer to ``resolve``: the report as it is now."""

    type: Literal["resolved"]
    report: Report


class KickedFrame(TypedDict):
    """The answer to ``kick``."""

    type: Literal["kicked"]
    user: UserId


class BannedFrame(TypedDict):
    """The answer to ``ban``."""

    type: Literal["banned"]
    user: UserId
    duration_s: float
    reason: str


class PreviewImageFrame(TypedDict):
    """A preview's image: a link to the server's file storage (never the site's), a WebP
    thumbnail of ``width`` x ``height`` pixels."""

    url: str
    width: int
    height: int


class PreviewFrame(TypedDict):
    """The answer to ``preview``: plain texts (show them as text, never as markup) and the
    image (None: none). ``HubbubClient.preview`` makes the image's relative URL absolute."""

    type: Literal["preview"]
    url: str
    title: str | None
    description: str | None
    site: str | None
    image: PreviewImageFrame | None


ServerFrame = (
    HelloFrame | JoinedFrame | LeftFrame | MessageFrame | EditedFrame | DeletedFrame
    | ReactionFrame | PresenceFrame | TypingNoticeFrame | ReceiptFrame | ReceiptsFrame
    | AckFrame | ErrorFrame | RefreshFrame | AuthenticatedFrame | HistoryFrame | InboxFrame
    | RoomFrame | RoomsFrame | MemberFrame | InvitedFrame | SearchFrame | UploadFrame | FileFrame
    | MentionsFrame | NotificationsFrame | PushSubscribedFrame | PushUnsubscribedFrame
    | HiddenFrame | ReportedFrame | ReportsFrame | ResolvedFrame | KickedFrame | BannedFrame
    | PreviewFrame | PingFrame | PongFrame
)  # fmt: skip
"""Every frame a server sends (a newer server may send more types: they are ignored)."""

AnyFrame = dict[str, Any]
"""A frame as parsed, before its type is known."""
