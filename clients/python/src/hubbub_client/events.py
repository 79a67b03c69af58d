"""What the client hands on: each server frame (and each change of the connection's state) as
a typed, immutable event.

Receive them with ``async for event in client.events(Message)`` or
``client.on(Message, callback)``; ``kind`` is the event's name as the browser client
(hubbub.js) calls it, and ``client.on("message", callback)`` works too. ``raw`` is the frame
as it came (fields of newer servers included).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from hubbub_client.frames import (
    AckFrame,
    AttachmentFrame,
    AuthenticatedFrame,
    Cid,
    DeletedFrame,
    EditedFrame,
    ErrorFrame,
    HelloFrame,
    HiddenFrame,
    InboxEntryFrame,
    InboxFrame,
    InvitedFrame,
    JoinedFrame,
    LeftFrame,
    Limits,
    MemberFrame,
    MentionEntryFrame,
    MentionsFrame,
    MessageFrame,
    NotificationLevel,
    NotificationSettingFrame,
    PresenceFrame,
    ReactionFrame,
    ReceiptFrame,
    ReceiptsFrame,
    Role,
    RoomRecordFrame,
    RoomsFrame,
    TypingNoticeFrame,
)

ConnectionState = Literal["idle", "connecting", "open", "reconnecting", "closed"]
"""Where the connection stands. ``idle``: before ``connect()``; ``connecting``: the first
try; ``open``: the server said ``hello``; ``reconnecting``: lost, trying again (after a
backoff); ``closed``: for good (``close()``, or a close code that rules out reconnecting)."""


@dataclass(frozen=True)
class DM:
    """The direct conversation with ``user`` (where a room name would go)."""

    user: str


Conversation = str | DM
"""A room's name, or :class:`DM` (the direct messages with a user)."""


@dataclass(frozen=True, kw_only=True)
class Event:
    """The base of every event."""

    kind: ClassVar[str] = "event"
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True, kw_only=True)
class StateChange(Event):
    """The connection's state changed. ``reconnecting`` after a loss carries ``delay_s``, the
    wait before the next try; ``code`` and ``reason`` say how the last connection ended
    (1006: lost, or it could not be opened; 4000: the server fell silent)."""

    kind: ClassVar[str] = "state"
    state: ConnectionState
    delay_s: float | None = None
    code: int | None = None
    reason: str | None = None


@dataclass(frozen=True, kw_only=True)
class Hello(Event):
    """The server's first frame: who you are (``user``) and the limits that apply; ``guest``:
    a new guest's key; ``exp``: when a JWT expires; ``push_key``: when the server sends Web
    Push, its application server key (base64url) for ``pushManager.subscribe``."""

    kind: ClassVar[str] = "hello"
    user: str
    conn: str
    node: str
    limits: Limits
    guest: str | None = None
    exp: int | None = None
    push_key: str | None = None

    @classmethod
    def from_frame(cls, frame: HelloFrame) -> Hello:
        return cls(
            user=frame["user"], conn=frame["conn"], node=frame["node"], limits=frame["limits"],
            guest=frame.get("guest"), exp=frame.get("exp"), push_key=frame.get("push_key"),
            raw=frame,
        )  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Joined(Event):
    """A join took effect. ``recovered``: only for a rejoin with ``since`` (False: messages
    may be missing, a :class:`Resync` follows); ``last``: only for a first join."""

    kind: ClassVar[str] = "joined"
    room: str
    count: int
    users: tuple[str, ...] | None = None
    recovered: bool | None = None
    last: int | None = None

    @classmethod
    def from_frame(cls, frame: JoinedFrame) -> Joined:
        users = frame.get("users")
        return cls(
            room=frame["room"], count=frame["count"],
            users=None if users is None else tuple(users), recovered=frame.get("recovered"),
            last=frame.get("last"), raw=frame,
        )  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Left(Event):
    """Out of ``room``; ``reason`` ``"removed"``: taken out of a private room's members (the
    client no longer rejoins it)."""

    kind: ClassVar[str] = "left"
    room: str
    reason: str | None = None

    @classmethod
    def from_frame(cls, frame: LeftFrame) -> Left:
        return cls(room=frame["room"], reason=frame.get("reason"), raw=frame)


@dataclass(frozen=True, kw_only=True)
class Attachment:
    """A file a message carries: ``type`` is sniffed from its bytes (not what the uploader
    said); ``image``: a PNG, JPEG, GIF or WebP with a thumbnail, then ``width`` and ``height``
    (of the original). Links to read it: ``await client.file_links(attachment.id)``."""

    id: str
    name: str
    size: int
    type: str
    image: bool = False
    width: int | None = None
    height: int | None = None

    @classmethod
    def from_frame(cls, frame: AttachmentFrame) -> Attachment:
        return cls(
            id=frame["id"], name=frame["name"], size=frame["size"], type=frame["type"],
            image=frame.get("image", False), width=frame.get("width"), height=frame.get("height"),
        )  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class BaseMessage(Event):
    """A message: :class:`Message` (a room's) or :class:`DirectMessage`. From history pages,
    as its events left it (``edited``, ``deleted``, ``reactions``); ``attachments``: its
    files (none once deleted); ``mentions``: the users it mentions (``@name``: each one who
    may read the conversation and takes part in it, never the sender); ``here``: it
    mentions everyone present (``@here``)."""

    id: int
    user: str
    text: str
    ts: int
    reply_to: int | None = None
    edited: int | None = None
    deleted: bool = False
    reactions: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    attachments: tuple[Attachment, ...] = ()
    mentions: tuple[str, ...] = ()
    here: bool = False

    @property
    def conversation(self) -> Conversation:
        raise NotImplementedError

    def mentions_user(self, user: str | None) -> bool:
        """Whether this message is for ``user`` in particular: someone else's that mentions
        them, or everyone present (``here``)."""
        return user is not None and self.user != user and (self.here or user in self.mentions)


def _message_fields(frame: MessageFrame) -> dict[str, Any]:
    return {
        "id": frame["id"], "user": frame["user"], "text": frame["text"], "ts": frame["ts"],
        "reply_to": frame.get("reply_to"), "edited": frame.get("edited"),
        "deleted": frame.get("deleted", False),
        "reactions": {e: tuple(users) for e, users in frame.get("reactions", {}).items()},
        "attachments": tuple(Attachment.from_frame(a) for a in frame.get("attachments", [])),
        "mentions": tuple(frame.get("mentions", ())), "here": frame.get("here", False),
        "raw": frame,
    }  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Message(BaseMessage):
    """A message of a room you are in: at most once per id, in id order per room."""

    kind: ClassVar[str] = "message"
    room: str

    @property
    def conversation(self) -> Conversation:
        return self.room

    @classmethod
    def from_frame(cls, frame: MessageFrame) -> Message:
        return cls(room=frame.get("room", ""), **_message_fields(frame))


@dataclass(frozen=True, kw_only=True)
class DirectMessage(BaseMessage):
    """A direct message from ``user`` to ``to``; ``peer`` is the other user from where this
    client stands (``to`` when you sent it, from another connection, else ``user``). At most
    once per id; those missed while away are fetched after a reconnect."""

    kind: ClassVar[str] = "direct"
    to: str
    peer: str

    @property
    def conversation(self) -> Conversation:
        return DM(self.peer)

    @classmethod
    def from_frame(cls, frame: MessageFrame, me: str | None) -> DirectMessage:
        to = frame.get("to", "")
        peer = to if frame["user"] == me else frame["user"]
        return cls(to=to, peer=peer, **_message_fields(frame))


@dataclass(frozen=True, kw_only=True)
class Mentioned(Event):
    """A message of someone else that mentions you, or everyone present (``here``): right
    after its :class:`Message` or :class:`DirectMessage` event, once per message."""

    kind: ClassVar[str] = "mention"
    message: Message | DirectMessage

    @property
    def conversation(self) -> Conversation:
        return self.message.conversation

    @property
    def here(self) -> bool:
        """Whether it mentions everyone present (``@here``) rather than you by name."""
        return self.message.here


@dataclass(frozen=True, kw_only=True)
class MessageEvent(Event):
    """An event on message ``target`` (:class:`Edited`, :class:`Deleted`, :class:`Reaction`)
    of a room (``room``) or a direct conversation (``peer``). It has its own ``id``, from the
    conversation's sequence: delivered like messages, at most once and in order."""

    room: str | None = None
    to: str | None = None
    peer: str | None = None
    id: int
    target: int
    user: str
    ts: int

    @property
    def conversation(self) -> Conversation:
        return self.room if self.room is not None else DM(self.peer or "")


def _event_fields(frame: EditedFrame | DeletedFrame | ReactionFrame, me: str | None) -> Any:
    to = frame.get("to")
    peer = None if to is None else (to if frame["user"] == me else frame["user"])
    return {
        "room": frame.get("room"), "to": to, "peer": peer, "id": frame["id"],
        "target": frame["target"], "user": frame["user"], "ts": frame["ts"], "raw": frame,
    }  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Edited(MessageEvent):
    """``user`` edited message ``target``: its text is now ``text``."""

    kind: ClassVar[str] = "edited"
    text: str

    @classmethod
    def from_frame(cls, frame: EditedFrame, me: str | None) -> Edited:
        return cls(text=frame["text"], **_event_fields(frame, me))


@dataclass(frozen=True, kw_only=True)
class Deleted(MessageEvent):
    """Message ``target`` was deleted (by its author or a moderator, ``user``)."""

    kind: ClassVar[str] = "deleted"

    @classmethod
    def from_frame(cls, frame: DeletedFrame, me: str | None) -> Deleted:
        return cls(**_event_fields(frame, me))


@dataclass(frozen=True, kw_only=True)
class Reaction(MessageEvent):
    """``user``'s reaction ``emoji`` on message ``target`` is now ``on`` (True) or off."""

    kind: ClassVar[str] = "reaction"
    emoji: str
    on: bool

    @classmethod
    def from_frame(cls, frame: ReactionFrame, me: str | None) -> Reaction:
        return cls(emoji=frame["emoji"], on=frame["on"], **_event_fields(frame, me))


@dataclass(frozen=True, kw_only=True)
class Resync(Event):
    """The discontinuity: messages may be missing. ``room``: a rejoin was answered
    ``recovered: false``; reload the room (``await client.history(room)``). ``to``: direct
    messages with that user may be missing (the newest page was delivered; older ones with
    ``client.direct_history(to, before=...)``)."""

    kind: ClassVar[str] = "resync"
    room: str | None = None
    to: str | None = None


@dataclass(frozen=True, kw_only=True)
class Presence(Event):
    """A user arrived in ``room`` (``event`` ``"join"``) or left it; in big rooms only the
    ``count``."""

    kind: ClassVar[str] = "presence"
    room: str
    count: int
    event: Literal["join", "leave"] | None = None
    user: str | None = None

    @classmethod
    def from_frame(cls, frame: PresenceFrame) -> Presence:
        return cls(
            room=frame["room"], count=frame["count"], event=frame.get("event"),
            user=frame.get("user"), raw=frame,
        )  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Typing(Event):
    """``user`` is typing in ``room`` (your own notices come back too)."""

    kind: ClassVar[str] = "typing"
    room: str
    user: str

    @classmethod
    def from_frame(cls, frame: TypingNoticeFrame) -> Typing:
        return cls(room=frame["room"], user=frame["user"], raw=frame)


@dataclass(frozen=True, kw_only=True)
class Receipt(Event):
    """``user`` has read everything up to ``id`` in ``room``, or in the direct conversation
    with ``to``."""

    kind: ClassVar[str] = "receipt"
    room: str | None = None
    to: str | None = None
    user: str
    id: int

    @classmethod
    def from_frame(cls, frame: ReceiptFrame) -> Receipt:
        return cls(
            room=frame.get("room"), to=frame.get("to"), user=frame["user"], id=frame["id"],
            raw=frame,
        )  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Receipts(Event):
    """After ``joined`` (servers with a store): where the room's readers are."""

    kind: ClassVar[str] = "receipts"
    room: str
    read: Mapping[str, int]

    @classmethod
    def from_frame(cls, frame: ReceiptsFrame) -> Receipts:
        return cls(room=frame["room"], read=dict(frame["read"]), raw=frame)


@dataclass(frozen=True, kw_only=True)
class RoomInfo(Event):
    """A room's record, as it is now (``room`` frames: after ``joined``, and the answer to
    ``create_room``, ``describe``, ``invite``, ``remove``). ``role`` (yours) and ``members``
    only when you are a member."""

    kind: ClassVar[str] = "room"
    room: str
    private: bool
    title: str
    topic: str
    role: Role | None = None
    members: Mapping[str, Role] | None = None

    @classmethod
    def from_frame(cls, frame: RoomRecordFrame) -> RoomInfo:
        members = frame.get("members")
        return cls(
            room=frame["room"], private=frame["private"], title=frame["title"],
            topic=frame["topic"], role=frame.get("role"),
            members=None if members is None else dict(members), raw=frame,
        )  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class RoomList(Event):
    """The rooms you are a member of (the answer to ``rooms()``)."""

    kind: ClassVar[str] = "rooms"
    rooms: tuple[RoomInfo, ...]

    @classmethod
    def from_frame(cls, frame: RoomsFrame) -> RoomList:
        return cls(rooms=tuple(RoomInfo.from_frame(r) for r in frame["rooms"]), raw=frame)


@dataclass(frozen=True, kw_only=True)
class MemberChanged(Event):
    """``room``'s members changed: ``user`` was ``added`` (with ``role``) or ``removed``, by
    ``by`` (None: the backend API)."""

    kind: ClassVar[str] = "member"
    room: str
    event: Literal["added", "removed"]
    user: str
    role: Role | None
    by: str | None

    @classmethod
    def from_frame(cls, frame: MemberFrame) -> MemberChanged:
        return cls(
            room=frame["room"], event=frame["event"], user=frame["user"], role=frame["role"],
            by=frame["by"], raw=frame,
        )  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Invited(Event):
    """You are now a member of ``room`` (join it to read it)."""

    kind: ClassVar[str] = "invited"
    room: str
    private: bool
    title: str
    topic: str
    role: Role | None
    by: str | None

    @classmethod
    def from_frame(cls, frame: InvitedFrame) -> Invited:
        return cls(
            room=frame["room"], private=frame["private"], title=frame["title"],
            topic=frame["topic"], role=frame.get("role"), by=frame["by"], raw=frame,
        )  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class InboxEntry:
    """A conversation of the inbox: a room (``room``) or the direct messages with ``peer``;
    its newest stored message, your read position and the unread count."""

    room: str | None = None
    peer: str | None = None
    last: BaseMessage | None = None
    unread: int = 0
    read: int = 0
    peer_read: int = 0
    mentions: int = 0
    """How many of the unread messages mention you."""

    @classmethod
    def from_frame(cls, entry: InboxEntryFrame, me: str | None) -> InboxEntry:
        frame = entry.get("last")
        last: BaseMessage | None = None
        if frame is not None:
            last = (
                Message.from_frame(frame) if "room" in frame
                else DirectMessage.from_frame(frame, me)
            )  # fmt: skip
        return cls(
            room=entry.get("room"), peer=entry.get("with"), last=last,
            unread=entry.get("unread", 0), read=entry.get("read", 0),
            peer_read=entry.get("peer_read", 0), mentions=entry.get("mentions", 0),
        )  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Inbox(Event):
    """Your conversations, the most recently active first (servers with a store): after every
    ``hello``, and the answer to ``inbox()``."""

    kind: ClassVar[str] = "inbox"
    conversations: tuple[InboxEntry, ...]

    @classmethod
    def from_frame(cls, frame: InboxFrame, me: str | None) -> Inbox:
        entries = tuple(InboxEntry.from_frame(e, me) for e in frame["conversations"])
        return cls(conversations=entries, raw=frame)


@dataclass(frozen=True, kw_only=True)
class Ack(Event):
    """A send (edit, deletion, reaction) with ``cid`` was published as ``id``. ``duplicate``:
    a retry the server had already published (not delivered again; ``id`` is the first's)."""

    kind: ClassVar[str] = "ack"
    cid: Cid
    id: int
    duplicate: bool = False

    @classmethod
    def from_frame(cls, frame: AckFrame) -> Ack:
        return cls(
            cid=frame["cid"], id=frame["id"], duplicate=frame.get("duplicate", False), raw=frame
        )


@dataclass(frozen=True, kw_only=True)
class ServerError(Event):
    """An ``error`` frame: a frame was refused, the connection stays open. ``ref`` (the
    refused frame's type), ``room``/``peer``, ``cid`` and ``id`` when the server could tell."""

    kind: ClassVar[str] = "error"
    code: str
    message: str
    ref: str | None = None
    room: str | None = None
    peer: str | None = None
    cid: Cid | None = None
    id: int | None = None

    @classmethod
    def from_frame(cls, frame: ErrorFrame) -> ServerError:
        return cls(
            code=frame["code"], message=frame.get("message", ""), ref=frame.get("ref"),
            room=frame.get("room"), peer=frame.get("with", frame.get("to")),
            cid=frame.get("cid"), id=frame.get("id"), raw=frame,
        )  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class ClientError(Event):
    """An error of the client itself: ``token_unavailable`` (``get_token`` raised)."""

    kind: ClassVar[str] = "error"
    code: str
    message: str


@dataclass(frozen=True, kw_only=True)
class Authenticated(Event):
    """A refreshed token was accepted (``exp``: its expiry, epoch seconds)."""

    kind: ClassVar[str] = "authenticated"
    user: str
    exp: int | None = None

    @classmethod
    def from_frame(cls, frame: AuthenticatedFrame) -> Authenticated:
        return cls(user=frame["user"], exp=frame.get("exp"), raw=frame)


@dataclass(frozen=True, kw_only=True)
class HiddenUsers(Event):
    """Whom you mute and block, as it is now (sorted): ``muted`` users' messages, the events
    on them and their typing are hidden from you; ``blocked`` ones are hidden as well and
    cannot write to you directly nor invite you (a blocked user is listed as blocked only).
    The answer to :meth:`~hubbub_client.HubbubClient.mute`, ``unmute``, ``block``,
    ``unblock`` and ``hidden``, and the event of every ``hidden`` frame, including those the
    server sends by itself when another connection of yours (or the HTTP API) changes the
    lists."""

    kind: ClassVar[str] = "hidden"
    muted: tuple[str, ...] = ()
    blocked: tuple[str, ...] = ()

    @classmethod
    def from_frame(cls, frame: HiddenFrame) -> HiddenUsers:
        return cls(muted=tuple(frame["muted"]), blocked=tuple(frame["blocked"]), raw=frame)


@dataclass(frozen=True, kw_only=True)
class HistoryPage:
    """A page of direct messages, oldest first. ``more``: older ones (a ``before`` page) or
    newer ones (an ``after`` page) follow; ``recovered`` False (``after`` pages): some after
    ``after`` are gone, page back with ``before`` instead."""

    messages: tuple[DirectMessage, ...]
    more: bool
    recovered: bool | None = None


@dataclass(frozen=True, kw_only=True)
class Mention:
    """A message that mentions you (from :meth:`HubbubClient.mentions`), with its text as it
    is now, in ``room`` or the direct conversation with ``peer``; ``unread``: after your read
    position."""

    room: str | None = None
    peer: str | None = None
    id: int
    user: str
    text: str
    ts: int
    unread: bool

    @property
    def conversation(self) -> Conversation:
        return self.room if self.room is not None else DM(self.peer or "")

    @classmethod
    def from_frame(cls, frame: MentionEntryFrame) -> Mention:
        return cls(
            room=frame.get("room"), peer=frame.get("with"), id=frame["id"], user=frame["user"],
            text=frame["text"], ts=frame["ts"], unread=frame["unread"],
        )  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class MentionsPage:
    """A page of your mentions, newest first, in conversations you may read now. ``unread``:
    how many of all your mentions are unread; ``more``: older ones follow (ask again with
    ``before`` = the last one's ``ts``)."""

    mentions: tuple[Mention, ...]
    unread: int
    more: bool

    @classmethod
    def from_frame(cls, frame: MentionsFrame) -> MentionsPage:
        return cls(
            mentions=tuple(Mention.from_frame(m) for m in frame["mentions"]),
            unread=frame["unread"], more=frame["more"],
        )  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class NotificationSetting:
    """Your notification level of ``room`` or of the direct conversation with ``peer``:
    ``level`` (``all``, ``mentions`` or ``none``), and ``mute_until`` (epoch ms; None: not
    muted)."""

    room: str | None = None
    peer: str | None = None
    level: NotificationLevel
    mute_until: int | None = None

    @property
    def conversation(self) -> Conversation:
        return self.room if self.room is not None else DM(self.peer or "")

    @classmethod
    def from_frame(cls, frame: NotificationSettingFrame) -> NotificationSetting:
        return cls(
            room=frame.get("room"), peer=frame.get("with"), level=frame["level"],
            mute_until=frame.get("mute_until"),
        )  # fmt: skip


EVENT_TYPES: Mapping[str, tuple[type[Event], ...]] = {
    kind: tuple(t for t in (
        StateChange, Hello, Joined, Left, Message, DirectMessage, Mentioned, Edited, Deleted,
        Reaction, Resync, Presence, Typing, Receipt, Receipts, RoomInfo, RoomList,
        MemberChanged, Invited, Inbox, Ack, ServerError, ClientError, Authenticated,
        HiddenUsers,
    ) if t.kind == kind)
    for kind in (
        "state", "hello", "joined", "left", "message", "direct", "mention", "edited",
        "deleted", "reaction", "resync", "presence", "typing", "receipt", "receipts", "room",
        "rooms", "member", "invited", "inbox", "ack", "error", "authenticated", "hidden",
    )
}  # fmt: skip
"""The event classes by name (``client.on("message", ...)``)."""


def apply_event(message: BaseMessage, event: MessageEvent) -> BaseMessage:
    """``message`` as ``event`` (an edit, deletion or reaction on it) leaves it: a new object,
    as the server's history pages show messages."""
    if isinstance(event, Edited):
        return dataclasses.replace(message, text=event.text, edited=event.ts)
    if isinstance(event, Deleted):
        return dataclasses.replace(
            message,
            text="",
            deleted=True,
            reactions={},
            reply_to=None,
            attachments=(),
            mentions=(),
            here=False,
        )
    if isinstance(event, Reaction):
        reactions = dict(message.reactions)
        users = [user for user in reactions.get(event.emoji, ()) if user != event.user]
        if event.on:
            users.append(event.user)
        if users:
            reactions[event.emoji] = tuple(users)
        else:
            reactions.pop(event.emoji, None)
        return dataclasses.replace(message, reactions=reactions)
    return message


_GUEST_SUFFIX = re.compile(r"-[0-9a-f]{16}$")


def display_name(user: str) -> str:
    """The display name of a user id: a guest's id is its name, ``-`` and 16 hex digits."""
    return _GUEST_SUFFIX.sub("", user)
