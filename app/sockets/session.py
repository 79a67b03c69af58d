"""Session: the life of one WebSocket, from upgrade to close, and every frame the client sends.

The session owns the socket: it accepts it, reads frames in order, answers each (an ``error``
frame when a frame is refused, never an exception out of the worker) and, when the socket ends
for whatever reason, unregisters the connection from the Hub. Nothing the client sends can
disturb another connection: a refused frame costs an error frame on this socket only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time

import orjson
from starlette.websockets import WebSocket

from app.access.admission import Refused, admit, admit_address, identify
from app.access.auth import AuthError, Identity
from app.access.conversations import claim_refusal
from app.access.hiding import frame_of, visible_history_before, visible_history_since
from app.access.quotas import JoinVerdict
from app.access.ratelimit import RateLimiter, Verdict
from app.broker import Published
from app.conversations.history import HistoryUnavailable, inbox_entry
from app.conversations.lifecycle import Change, Kind, Target
from app.conversations.names import direct, is_direct
from app.conversations.rooms import RoomError, RoomRecord, room_not_found
from app.conversations.search import search
from app.errors import (
    BrokerUnavailable,
    CloseCode,
    ErrorCode,
    FrameError,
    MessageGone,
    QuotaExceeded,
    close_reason,
)
from app.files.service import AlreadySent, Files
from app.ops.metrics import Metrics
from app.ops.tracing import Span, end_publish, trace_id_of, traceparent_of
from app.presence import RoomPresence
from app.protocol import (
    PONG_FRAME,
    Auth,
    Ban,
    CreateRoom,
    Delete,
    DescribeRoom,
    Edit,
    FileRequest,
    HiddenRequest,
    Hide,
    HistoryRequest,
    InboxRequest,
    Invite,
    Join,
    Kick,
    Leave,
    MentionsRequest,
    NotificationsRequest,
    Ping,
    PreviewRequest,
    PushSubscribe,
    PushUnsubscribe,
    React,
    Read,
    Remove,
    ReportMessage,
    ReportsRequest,
    ResolveReport,
    RoomsRequest,
    SearchRequest,
    Send,
    Typing,
    Upload,
    Visibility,
    ack_frame,
    authenticated_frame,
    encode,
    error_frame,
    file_frame,
    hello_frame,
    history_frame,
    inbox_frame,
    joined_frame,
    left_frame,
    parse_client_frame,
    raw_ref,
    receipt_frame,
    receipts_frame,
    reported_frame,
    reports_frame,
    resolved_frame,
    room_frame,
    rooms_frame,
    search_frame,
    typing_frame,
    upload_frame,
)
from app.settings import Settings
from app.sockets.connection import Connection
from app.sockets.send_window import SendWindow
from app.state import ChatState
from app.store.database import StoreError
from app.store.rooms import Role
from app.store.running import RunningStore
from app.transport.outbox import Outbox
from app.transport.stream_socket import StreamSocket
from app.transport.uvicorn_seam import FALLBACK_NO_PROTOCOL, DirectSocket

logger = logging.getLogger(__name__)
_NODE = secrets.token_hex(4)  # this worker process, opaque to clients (see _process_name)


def _process_name() -> str:
    """``host:pid`` of this worker: only with ``CHAT_HELLO_NAMES_PROCESS`` (debugging)."""
    return f"{socket.gethostname()}:{os.getpid()}"


_TOO_MANY_MESSAGES = "too many messages, slow down"
_CANNOT_WRITE_TO = "you cannot send direct messages to this user"


class Session:
    """Handles the frames of one connection. Created by :func:`serve`.

    Frames are answered in the order they came. ``send`` frames are pipelined
    (:class:`~app.sockets.send_window.SendWindow`): up to ``CHAT_SENDS_IN_FLIGHT_MAX`` are published
    at once, each started in the order it came, and their acks and errors are offered in that
    order too. Any other frame waits until the sends before it are answered (:meth:`settle`).
    """

    __slots__ = ("_broker", "_hub", "_sends", "_state", "conn", "metrics", "settings")

    def __init__(self, conn: Connection, state: ChatState) -> None:
        self.conn = conn
        self._state = state
        self._hub = state.hub
        self._broker = state.broker
        self.settings = state.settings
        self.metrics = state.metrics
        self._sends = SendWindow(self.settings.sends_in_flight_max, conn.offer)

    async def settle(self) -> None:
        """Return once every pipelined send so far is answered (acked or refused)."""
        await self._sends.settle()

    async def handle_text(self, text: str) -> None:
        """Answer one text frame. Raises nothing for bad input: the client gets an error frame."""
        received = self.metrics.frames_received_since_sync
        try:
            try:
                frame = parse_client_frame(text)
            except FrameError:
                received["invalid"] += 1
                raise
            received[frame.type] += 1
            blocked: bool | None = False  # a room's send: nobody to be blocked by
            if (
                isinstance(frame, Send)
                and frame.reply_to is None
                and frame.attachments is None
                and "@" not in frame.text  # mentions are resolved first: not pipelined
                and self._state.moderation is None  # decisions may come back in any order
                # A pipelined send must reach the broker before any later one: nothing may
                # wait before its publish (a DM's block check waits when not cached).
                and (
                    frame.to is None
                    or (blocked := self._state.hidden.cached_block(frame.to, self.conn.user))
                    is not None
                )
            ):
                await self._sends.admit()
                self._start_send(frame, text, blocked)
                return
            await self.settle()
            if isinstance(frame, Send):
                ack = await self._publish_send(frame)
                if ack is not None:
                    self.conn.offer(ack)
            elif isinstance(frame, Join):
                await self._join(frame)
            elif isinstance(frame, Leave):
                await self._leave(frame)
            elif isinstance(frame, Typing):
                await self._typing(frame)
            elif isinstance(frame, Auth):
                await self._reauthenticate(frame)
            elif isinstance(frame, HistoryRequest):
                await self._history(frame)
            elif isinstance(frame, Read):
                await self._read(frame)
            elif isinstance(frame, Edit | Delete | React):
                await self._change(frame)
            elif isinstance(frame, CreateRoom | DescribeRoom | Invite | Remove | RoomsRequest):
                await self._manage(frame)
            elif isinstance(frame, SearchRequest):
                await self._search(frame)
            elif isinstance(frame, Upload):
                await self._upload(frame)
            elif isinstance(frame, FileRequest):
                self.conn.offer(file_frame(await self._files().link(self.conn.identity, frame.id)))
            elif isinstance(frame, InboxRequest):
                if not await self._state.quotas.allow("history", self.conn.user):
                    raise FrameError(ErrorCode.RATE_LIMITED, "too many inbox reads, slow down")
                await self.send_inbox()
            elif isinstance(frame, Visibility):
                await self._hub.set_visible(self.conn, frame.visible)
            elif isinstance(
                frame, MentionsRequest | NotificationsRequest | PushSubscribe | PushUnsubscribe
            ):
                await self._notifications(frame)
            elif isinstance(frame, Hide):
                await self._state.hidden.change(self.conn.user, frame.user, frame.type)
            elif isinstance(frame, HiddenRequest):
                self.conn.offer(frame_of(await self._state.hidden.of(self.conn.user)))
            elif isinstance(frame, PreviewRequest):
                await self._preview(frame)
            elif isinstance(frame, ReportMessage | ReportsRequest | ResolveReport | Kick | Ban):
                await self._moderate(frame)
            elif isinstance(frame, Ping):
                self.conn.offer(PONG_FRAME)
            # Pong: nothing to do; receiving it already refreshed last_seen.
        except FrameError as exc:
            self.metrics.error_sent(exc.code)
            self.conn.offer(error_frame(exc.code, exc.message, _ref(text)))

    async def _join(self, frame: Join) -> None:
        """Join a room; a join with ``since`` of a room the connection is in replays from
        ``since`` again. A refused join changes nothing: a member stays a member."""
        conn = self.conn
        rejoin = frame.room in conn.rooms
        if not rejoin and len(conn.rooms) >= self.settings.max_rooms_per_connection:
            raise FrameError(
                ErrorCode.TOO_MANY_ROOMS,
                f"a connection may be in at most {self.settings.max_rooms_per_connection} rooms",
            )
        record = await self._room_for(frame.room)
        await self._allow_join(frame.room, known=rejoin or frame.room in self._hub.rooms_here)
        if rejoin and frame.since is None:
            presence = await self._presence(frame.room)
            conn.offer(joined_frame(frame.room, None, presence.count, presence.users))
            return
        try:
            private = record is not None and record.room.private
            await self._hub.join(conn, frame.room, frame.since, private=private)
        except BrokerUnavailable:
            raise FrameError(ErrorCode.BROKER_UNAVAILABLE, "cannot join now, try again") from None
        if record is not None:
            role = record.members.get(conn.user)
            conn.offer(room_frame(record.describe(role, members=role is not None)))
        await self._send_receipts(frame.room, record)

    async def _room_for(self, room: str) -> RoomRecord | None:
        """``room``'s record, if this user may read and write in it now (the one access
        decision, :mod:`app.access.conversations`); refused otherwise."""
        try:
            return await self._state.access.room(self.conn.identity, room)
        except RoomError as exc:
            raise FrameError(exc.code, exc.message) from None

    async def _manage(
        self, frame: CreateRoom | DescribeRoom | Invite | Remove | RoomsRequest
    ) -> None:
        """Rooms with a record (:mod:`app.conversations.rooms`): create one, describe it, add or
        remove a
        member, list yours. Answered with the room as it is now (``room``; ``rooms``)."""
        conn, rooms = self.conn, self._state.rooms
        if isinstance(frame, RoomsRequest):
            try:
                if frame.public:
                    listed = await rooms.directory(frame.q)
                else:
                    listed = await rooms.rooms_of(conn.user)
            except RoomError as exc:
                raise FrameError(exc.code, exc.message) from None
            # Not the rooms its token's rooms claim leaves out (app.access.conversations).
            allowed = [r for r in listed if conn.identity.may_use(r["room"])]
            conn.offer(rooms_frame(allowed, frame.public))
            return
        if not conn.identity.may_use(frame.room):
            raise _frame_error(claim_refusal(frame.room))
        try:
            if isinstance(frame, CreateRoom):
                if not await self._state.quotas.allow("new_room", conn.user):
                    raise FrameError(ErrorCode.RATE_LIMITED, "too many new rooms, slow down")
                record = await rooms.create(
                    frame.room, conn.user, frame.private, frame.title, frame.topic
                )
            elif isinstance(frame, DescribeRoom):
                record = await rooms.describe(frame.room, conn.user, frame.title, frame.topic)
            elif isinstance(frame, Invite):
                if not await self._state.quotas.allow("invite", conn.user):
                    raise FrameError(ErrorCode.RATE_LIMITED, "too many invites, slow down")
                if await self._state.hidden.blocks(frame.user, conn.user):
                    raise FrameError(ErrorCode.FORBIDDEN, "you cannot invite this user")
                record = await rooms.add(frame.room, frame.user, Role(frame.role), conn.user)
            else:
                record = await rooms.remove(frame.room, frame.user, conn.user)
        except RoomError as exc:
            raise FrameError(exc.code, exc.message) from None
        role = record.members.get(conn.user)
        conn.offer(room_frame(record.describe(role, members=role is not None)))

    async def _send_receipts(self, room: str, record: RoomRecord | None) -> None:
        """``receipts`` after ``joined``: where the room's readers are (with a store and read
        receipts on; in a private room, its members only). Best effort: a store that fails
        or is slow sends nothing."""
        store = self._state.store
        if store is None or not self.settings.read_receipts:
            return
        try:
            async with asyncio.timeout(self.settings.database_timeout_s):
                positions = await store.inbox.positions(room, self.settings.presence_max_members)
        except (StoreError, TimeoutError) as exc:
            logger.info("read positions of %s unavailable: %s", room, exc)
            return
        if record is not None and record.room.private:
            positions = {u: p for u, p in positions.items() if u in record.members}
        if positions:
            self.conn.offer(receipts_frame(room, positions))

    async def _allow_join(self, room: str, known: bool) -> None:
        """Take the join's token (rejoins cost the same), and a new-room token when it brings
        ``room`` into being; ``known``: the room exists (this worker is in it), no need to
        ask. Through Redis, the quotas ask whether it exists in the same call."""
        user, quotas = self.conn.user, self._state.quotas
        ask = None if known else self._broker.existence_key(room)
        verdict = await quotas.allow_join(user, ask)
        if verdict is JoinVerdict.JOIN_RATE:
            raise FrameError(ErrorCode.RATE_LIMITED, "too many joins, slow down")
        if verdict is JoinVerdict.ADMITTED and not known and ask is None:  # asked apart
            creates = not await self._room_exists(room)
            if creates and not await quotas.allow("new_room", user):
                verdict = JoinVerdict.NEW_ROOM_RATE
        if verdict is JoinVerdict.NEW_ROOM_RATE:
            raise FrameError(ErrorCode.RATE_LIMITED, "too many new rooms, slow down")

    async def _room_exists(self, room: str) -> bool:
        try:
            return await self._broker.room_exists(room)
        except BrokerUnavailable:
            raise FrameError(ErrorCode.BROKER_UNAVAILABLE, "cannot join now, try again") from None

    async def _presence(self, room: str) -> RoomPresence:
        try:
            return await self._state.presence.of(room)
        except BrokerUnavailable:
            raise FrameError(ErrorCode.BROKER_UNAVAILABLE, "cannot join now, try again") from None

    async def _leave(self, frame: Leave) -> None:
        if frame.room not in self.conn.rooms:
            raise FrameError(ErrorCode.NOT_JOINED, f"not in room {frame.room!r}")
        await self._hub.leave(self.conn, frame.room)
        self.conn.offer(left_frame(frame.room))

    async def _typing(self, frame: Typing) -> None:
        """Relay to the room; best effort: dropped without a word while the broker is down."""
        if frame.room not in self.conn.rooms:
            raise FrameError(ErrorCode.NOT_JOINED, f"join room {frame.room!r} before typing")
        if not await self._state.quotas.allow("typing", self.conn.user):
            raise FrameError(ErrorCode.RATE_LIMITED, "too many typing notices, slow down")
        with contextlib.suppress(BrokerUnavailable):
            await self._broker.broadcast(frame.room, typing_frame(frame.room, self.conn.user))

    async def _reauthenticate(self, frame: Auth) -> None:
        """A new token for this connection (after a ``refresh`` frame): same user, new expiry
        and rooms. An invalid token, or one for another user, closes the connection (4001)."""
        authenticator = self._state.authenticator
        if authenticator is None:
            raise FrameError(ErrorCode.BAD_FRAME, "this server does not use tokens")
        conn = self.conn
        try:
            identity = authenticator.verify(frame.token)
        except AuthError as exc:
            conn.close(CloseCode.AUTH_FAILED, str(exc)[:120])
            return
        if identity.user != conn.user:
            conn.close(CloseCode.AUTH_FAILED, "the new token is for another user")
            return
        conn.identity = identity
        conn.refresh_asked = False
        for room in [room for room in conn.rooms if not identity.may_use(room)]:
            await self._hub.leave(conn, room)
            conn.offer(left_frame(room))
        conn.offer(authenticated_frame(identity.user, identity.expires_at))

    async def _conversation(
        self,
        frame: HistoryRequest
        | Read
        | Edit
        | Delete
        | React
        | Upload
        | NotificationsRequest
        | ReportMessage,
    ) -> str:
        """The conversation a frame names, if this user may read it."""
        room = frame.room
        if room is not None:
            record = await self._room_for(room)
            if record is None and room not in self.conn.rooms:
                # A room nobody uses answers as a private room does to outsiders.
                try:
                    if not await self._state.rooms.in_use(room):
                        raise room_not_found(room)
                except RoomError as exc:
                    raise _frame_error(exc) from None
            return room
        assert frame.peer is not None  # the model guarantees room xor with
        return direct(self.conn.user, frame.peer)

    async def _history(self, frame: HistoryRequest) -> None:
        """A page of history (rooms need not be joined: the token's rooms are what counts)."""
        conversation = await self._conversation(frame)
        if not await self._state.quotas.allow("history", self.conn.user):
            raise FrameError(ErrorCode.RATE_LIMITED, "too many history reads, slow down")
        limit = min(frame.limit, self.settings.history_page_max)
        history, hidden = self._state.history, self.conn.hidden
        recovered: bool | None = None
        try:
            if frame.around is not None:
                # Up to it (it included), as it is now; then what came after, events included
                # (as after an `after`), which the client applies as it does live.
                older, _ = await visible_history_before(
                    history.history_before, conversation, frame.around + 1, limit // 2 + 1, hidden
                )
                rest = limit - len(older)
                newer = (
                    await visible_history_since(
                        history.history_since, conversation, frame.around, rest, hidden
                    )
                    if rest
                    else None
                )
                messages = older + (newer.messages if newer else [])
                more = newer.more if newer else True
            elif frame.after is not None:
                page = await visible_history_since(
                    history.history_since, conversation, frame.after, limit, hidden
                )
                messages, more, recovered = page.messages, page.more, page.recovered
            else:
                messages, more = await visible_history_before(
                    history.history_before, conversation, frame.before, limit, hidden
                )
        except BrokerUnavailable:
            raise FrameError(
                ErrorCode.BROKER_UNAVAILABLE, "history unavailable, try again"
            ) from None
        except HistoryUnavailable:
            raise FrameError(
                ErrorCode.STORE_UNAVAILABLE, "history unavailable, try again"
            ) from None
        payloads = [message.payload for message in messages]
        self.conn.offer(
            history_frame(frame.room, frame.peer, payloads, more, recovered, frame.around)
        )

    def _running_store(self) -> RunningStore:
        store = self._state.store
        if store is None:
            raise FrameError(ErrorCode.NO_STORE, "this server keeps no read state (no store)")
        return store

    async def _read(self, frame: Read) -> None:
        """Move the read position (with a store; it never moves back) and relay it as a
        ``receipt`` to the conversation's members (a room's, or both users of a direct one),
        unless receipts are off or the frame says ``receipt: false``. Nothing else is sent
        back. Receipts are best effort: at most once, dropped while the broker is down."""
        conversation = await self._conversation(frame)
        user = self.conn.user
        if not await self._state.quotas.allow("read", user):
            raise FrameError(ErrorCode.RATE_LIMITED, "too many read frames, slow down")
        position = frame.id
        store = self._state.store
        if store is not None:
            try:
                position = await store.inbox.mark_read(user, conversation, frame.id)
            except StoreError:
                raise FrameError(
                    ErrorCode.STORE_UNAVAILABLE, "read position not stored, try again"
                ) from None
        if not (frame.receipt and self.settings.read_receipts):
            return
        with contextlib.suppress(BrokerUnavailable):
            if frame.room is not None:
                if frame.room in self.conn.rooms:
                    receipt = receipt_frame("room", frame.room, user, position)
                    await self._broker.broadcast(frame.room, receipt)
            else:
                assert frame.peer is not None
                receipt = receipt_frame("to", frame.peer, user, position)
                await self._broker.notify_user(frame.peer, receipt)
                if frame.peer != user:
                    await self._broker.notify_user(user, receipt)

    async def _find(self, conversation: str, message_id: int) -> tuple[Target, bool]:
        """Message ``message_id`` of ``conversation``, and whether it came from the store
        (the broker's history no longer holds it). ``not_found`` when neither has it."""
        try:
            target = await self._broker.find(conversation, message_id)
        except BrokerUnavailable:
            raise FrameError(
                ErrorCode.BROKER_UNAVAILABLE, "cannot do that now, try again"
            ) from None
        if target is not None:
            return target, False
        store = self._state.store
        if store is not None:
            try:
                target = await store.messages.find(conversation, message_id)
            except StoreError:
                raise FrameError(
                    ErrorCode.STORE_UNAVAILABLE, "cannot do that now, try again"
                ) from None
            if target is not None:
                return target, True
        raise FrameError(ErrorCode.NOT_FOUND, f"no message {message_id} {_in(conversation)}")

    async def _preview(self, frame: PreviewRequest) -> None:
        """A link's preview (app.previews.service): ``preview``."""
        previews = self._state.previews
        if previews is None:
            raise FrameError(ErrorCode.PREVIEW_UNAVAILABLE, "this server shows no link previews")
        if not await self._state.quotas.allow("preview", self.conn.user):
            raise FrameError(ErrorCode.RATE_LIMITED, "too many previews, slow down")
        self.conn.offer(encode({"type": "preview", **await previews.preview(frame.url)}))

    async def _moderate(
        self, frame: ReportMessage | ReportsRequest | ResolveReport | Kick | Ban
    ) -> None:
        """Reports (app.moderation.reports), and the moderators' kicks and bans."""
        conn, state = self.conn, self._state
        identity = conn.identity
        if isinstance(frame, Kick | Ban):
            if not identity.moderator:
                raise FrameError(ErrorCode.FORBIDDEN, f"only moderators may {frame.type}")
            try:
                if isinstance(frame, Ban):
                    await state.quotas.ban(frame.user, frame.duration_s, frame.reason)
                await self._broker.kick(frame.user, frame.reason)
            except BrokerUnavailable:
                raise FrameError(ErrorCode.BROKER_UNAVAILABLE, "not done, try again") from None
            logger.info(f"moderation: {frame.type}", extra={"user": frame.user, "by": conn.user})
            done: dict[str, object] = {"type": "kicked", "user": frame.user}
            if isinstance(frame, Ban):
                done |= {"type": "banned", "duration_s": frame.duration_s, "reason": frame.reason}
            conn.offer(encode(done))
            return
        reports = state.reports
        if reports is None:
            raise FrameError(ErrorCode.NO_STORE, "this server keeps no reports (no store)")
        if isinstance(frame, ReportMessage):
            conversation = await self._conversation(frame)  # the one access decision
            report = await reports.report(identity, conversation, frame.id, frame.reason)
            conn.offer(reported_frame(report))
        elif isinstance(frame, ReportsRequest):
            page = await reports.queue(identity, frame.resolved, frame.before, frame.limit)
            conn.offer(reports_frame(page))
        else:
            report = await reports.resolve(frame.id, frame.action, identity, conn.user)
            conn.offer(resolved_frame(report))

    async def _not_blocked(self, peer: str | None) -> None:
        """Refuse a write in the direct conversation with ``peer`` (None: a room) when
        ``peer`` blocks this user (app.access.hiding): ``forbidden``, not saying why."""
        if peer is not None and await self._state.hidden.blocks(peer, self.conn.user):
            raise FrameError(ErrorCode.FORBIDDEN, _CANNOT_WRITE_TO)

    async def _change(self, frame: Edit | Delete | React) -> None:
        """Edit, delete or react to a message: checked here (it exists in this conversation,
        is not deleted, and this user may), then published as an event in the conversation's
        log (:mod:`app.conversations.lifecycle`), acked like a message when it carries a ``cid``."""
        conn = self.conn
        conversation = await self._conversation(frame)
        if frame.room is not None and frame.room not in conn.rooms:
            raise FrameError(ErrorCode.NOT_JOINED, f"join room {frame.room!r} first")
        if not isinstance(frame, Delete):  # one's own messages may always be deleted
            await self._not_blocked(frame.peer)
        settings = self.settings
        if isinstance(frame, Edit):
            self._check_text(frame.text)
            change = Change(Kind.EDITED, frame.id, conn.user, frame.text)
        elif isinstance(frame, Delete):
            change = Change(Kind.DELETED, frame.id, conn.user)
        else:
            if len(frame.emoji) > settings.reaction_max_chars:
                raise FrameError(
                    ErrorCode.BAD_FRAME,
                    f"emoji: at most {settings.reaction_max_chars} characters",
                )
            change = Change(Kind.REACTION_ON, frame.id, conn.user, frame.emoji)
        self._check_broker()
        target, from_store = await self._find(conversation, frame.id)
        if target.deleted:
            raise FrameError(ErrorCode.NOT_FOUND, f"message {frame.id} was deleted")
        if isinstance(frame, Edit) and target.user != conn.user:
            raise FrameError(ErrorCode.FORBIDDEN, "only its author may edit a message")
        if isinstance(frame, Delete) and not (target.user == conn.user or conn.identity.moderator):
            raise FrameError(
                ErrorCode.FORBIDDEN, "only its author or a moderator may delete a message"
            )
        if isinstance(frame, React):
            reactions = (target.state or {}).get("reactions", {})
            if (
                frame.emoji not in reactions
                and len(reactions) >= settings.reactions_per_message_max
            ):
                raise FrameError(
                    ErrorCode.BAD_FRAME,
                    f"a message may have at most {settings.reactions_per_message_max} "
                    "different reactions",
                )
        known = (target.state or {}) if from_store else None
        hook = self._state.moderation
        if isinstance(frame, Edit) and hook is not None:
            text = await hook.check("edit", conversation, conn.user, frame.text)
            change = Change(Kind.EDITED, frame.id, conn.user, text)
        try:
            published = await self._broker.publish_event(conversation, change, frame.cid, known)
        except MessageGone:
            raise FrameError(ErrorCode.NOT_FOUND, f"message {frame.id} was deleted") from None
        except QuotaExceeded:
            raise FrameError(ErrorCode.RATE_LIMITED, _TOO_MANY_MESSAGES) from None
        except BrokerUnavailable:
            self.metrics.publish_failures.inc()
            raise FrameError(
                ErrorCode.BROKER_UNAVAILABLE, "not done: the broker is unavailable"
            ) from None
        if frame.cid is not None:
            conn.offer(ack_frame(frame.cid, published.id, published.duplicate))
        files = self._state.files
        if isinstance(frame, Delete) and files is not None and not published.duplicate:
            await files.forget_message(conversation, frame.id)

    def _files(self) -> Files:
        files = self._state.files
        if files is None:
            raise FrameError(
                ErrorCode.NO_STORE,
                "this server keeps no files (CHAT_FILE_STORAGE=off, or no store)",
            )
        return files

    async def _upload(self, frame: Upload) -> None:
        """Where to upload a file for a message of the conversation (app.files.service)."""
        files = self._files()
        conversation = await self._conversation(frame)
        await self._not_blocked(frame.peer)
        file_id, target, expires = await files.start_upload(
            self.conn.identity, conversation, frame.name, frame.size
        )
        self.conn.offer(
            upload_frame(file_id, frame.cid, target.method, target.url, target.fields, expires)
        )

    async def _notifications(
        self, frame: MentionsRequest | NotificationsRequest | PushSubscribe | PushUnsubscribe
    ) -> None:
        """Mentions, levels and Web Push subscriptions (app.notify.service)."""
        notifications = self._state.notifications
        if notifications is None:
            raise FrameError(
                ErrorCode.NO_STORE, "this server keeps no notifications (no store, or off)"
            )
        identity = self.conn.identity
        try:
            if isinstance(frame, MentionsRequest):
                if not await self._state.quotas.allow("history", self.conn.user):
                    raise FrameError(ErrorCode.RATE_LIMITED, "too many mention reads, slow down")
                limit = min(frame.limit, self.settings.history_page_max)
                page = await notifications.mentions_page(
                    identity, frame.before, limit, self.conn.hidden
                )
                self.conn.offer(encode({"type": "mentions", **page}))
            elif isinstance(frame, NotificationsRequest):
                if frame.room is None and frame.peer is None:
                    levels = await notifications.levels(identity)
                    self.conn.offer(encode({"type": "notifications", "conversations": levels}))
                    return
                conversation = await self._conversation(frame)
                if frame.level is None and frame.mute_until is None:
                    level = await notifications.level(identity, conversation)
                else:
                    level = await notifications.set_level(
                        identity, conversation, frame.level, frame.mute_until
                    )
                self.conn.offer(encode({"type": "notifications", **level}))
            elif isinstance(frame, PushSubscribe):
                subscription = frame.subscription
                await notifications.subscribe(
                    identity, subscription.endpoint, subscription.keys.p256dh,
                    subscription.keys.auth,
                )  # fmt: skip
                self.conn.offer(
                    encode({"type": "push_subscribed", "endpoint": subscription.endpoint})
                )
            else:
                await notifications.unsubscribe(identity, frame.endpoint)
                self.conn.offer(encode({"type": "push_unsubscribed", "endpoint": frame.endpoint}))
        except RoomError as exc:
            raise _frame_error(exc) from None

    async def _mentions(self, frame: Send) -> str | None:
        """Who ``frame``'s text mentions (app.notify.service), in the stored form."""
        notifications = self._state.notifications
        if notifications is None:
            return None
        conn = self.conn
        if frame.room is not None:
            conversation, record = frame.room, await self._room_for(frame.room)
        else:
            conversation, record = direct(conn.user, frame.to or ""), None
        try:
            return await notifications.mentions_for_send(
                conn.identity, conversation, record, frame.text
            )
        except RoomError as exc:
            raise _frame_error(exc) from None
        except BrokerUnavailable:  # who is present, for @here
            raise FrameError(
                ErrorCode.BROKER_UNAVAILABLE, "message not sent: the broker is unavailable"
            ) from None

    def _check_text(self, text: str) -> None:
        if len(text) > self.settings.max_text_chars:
            raise FrameError(
                ErrorCode.TEXT_TOO_LONG,
                f"text is {len(text)} characters, at most "
                f"{self.settings.max_text_chars} are allowed",
            )

    def _check_broker(self) -> None:
        if not self._broker.ready:
            # Redis may take the publish, but this worker would not hear it: no ack for a
            # message the sender's own rooms here cannot be sure to get.
            self.metrics.publish_failures.inc()
            raise FrameError(
                ErrorCode.BROKER_UNAVAILABLE, "message not sent: the broker is unavailable"
            )

    async def _search(self, frame: SearchRequest) -> None:
        """Messages the user may read now matching ``q`` (app.conversations.search)."""
        settings = self.settings
        if frame.offset > settings.search_offset_max:
            raise FrameError(ErrorCode.BAD_FRAME, f"offset: at most {settings.search_offset_max}")
        if not await self._state.quotas.allow("search", self.conn.user):
            raise FrameError(ErrorCode.RATE_LIMITED, "too many searches, slow down")
        store = self._state.store
        try:
            page = await search(
                store.search if store is not None else None, self._state.access,  # None: off
                self._state.rooms, self.conn.identity, frame.q, frame.room, frame.peer, frame.order,
                min(frame.limit, settings.search_page_max), frame.offset, self.conn.hidden,
            )  # fmt: skip
        except RoomError as exc:
            raise FrameError(exc.code, exc.message) from None
        self.conn.offer(search_frame(page))

    async def send_inbox(self) -> None:
        """Queue the ``inbox`` frame: the user's conversations, newest activity first."""
        store = self._running_store()
        settings = self.settings
        try:
            entries = await store.inbox.entries(
                self.conn.user, settings.inbox_max_conversations, settings.unread_count_cap,
                self.conn.hidden,
            )  # fmt: skip
            # Only what the user may see now: not a room it was removed from, a room its
            # token no longer allows, a room made private after it marked it read.
            shown = await self._state.access.visible(
                self.conn.identity, [entry.conversation for entry in entries]
            )
        except (StoreError, RoomError):
            raise FrameError(ErrorCode.STORE_UNAVAILABLE, "inbox unavailable, try again") from None
        self.conn.offer(
            inbox_frame(
                [inbox_entry(entry, self.conn.user) for entry in entries
                 if entry.conversation in shown]
            )
        )  # fmt: skip

    def _start_send(self, frame: Send, text: str, blocked: bool | None) -> None:
        """Publish a pipelined ``send`` (handle_text: nothing waits before its publish): checked
        and handed to the broker now, without a task; its answer (its ack, None without a
        ``cid``, or an error frame) is offered in its turn once the broker has answered. An
        unexpected failure closes the connection (1011) and answers nothing."""
        give = self._sends.open()
        try:
            if blocked is None:  # handle_text pipelines a DM only once this is known
                raise RuntimeError("a pipelined direct message's block is not known")
            self._check_send(frame, blocked)
            started = time.perf_counter()
            span, traceparent = self._start_span(frame)
        except FrameError as exc:
            give(self._refused(exc, text))
            return
        except Exception:
            give(None)
            self._failed()
            return

        def done(outcome: Published | Exception) -> None:
            try:
                give(self._sent(frame, text, outcome, started, span))
            except Exception:
                give(None)
                self._failed()

        try:
            self._broker.publish_soon(
                frame.room, frame.to, self.conn.user, frame.text, frame.cid, traceparent, done
            )
        except Exception:  # a bug: done may not be called (a second answer is ignored)
            give(None)
            self._failed()

    def _sent(
        self,
        frame: Send,
        text: str,
        outcome: Published | Exception,
        started: float,
        span: Span | None,
    ) -> str | None:
        """What answers a pipelined send, now that its publish came to ``outcome``."""
        if isinstance(outcome, Published):
            if span is not None:
                end_publish(span, outcome)
            return self._acked(frame, outcome, started, span)
        if span is not None:
            end_publish(span, None)
        if isinstance(outcome, QuotaExceeded | BrokerUnavailable):
            return self._refused(self._publish_refusal(outcome), text)
        raise outcome

    def _refused(self, exc: FrameError, text: str) -> str:
        self.metrics.error_sent(exc.code)
        return error_frame(exc.code, exc.message, _ref(text))

    def _failed(self) -> None:
        logger.exception("unexpected error publishing a frame", extra={"conn": self.conn.id})
        self.conn.close(CloseCode.INTERNAL_ERROR, "internal error")

    def _check_send(self, frame: Send, blocked: bool | None) -> None:
        """What a ``send`` is checked for before anything waits: the conversation's claim, the
        membership decided at its join, its text, the broker; a DM to a user known to block
        the sender (``blocked``). Raises FrameError."""
        conn = self.conn
        if frame.room is not None and not conn.identity.may_use(frame.room):
            raise _frame_error(claim_refusal(frame.room))
        # Being in the room is the decision made at its join: a removal or a narrowed token
        # takes the connection out of it on every worker (app.conversations.rooms, _reauthenticate).
        if frame.room is not None and frame.room not in conn.rooms:
            raise FrameError(ErrorCode.NOT_JOINED, f"join room {frame.room!r} before sending")
        self._check_text(frame.text)
        self._check_broker()
        if blocked:  # known when the send was admitted (a pipelined DM)
            raise FrameError(ErrorCode.FORBIDDEN, _CANNOT_WRITE_TO)

    def _start_span(self, frame: Send) -> tuple[Span | None, str | None]:
        """The publish's span when tracing is on and samples it (else None), and the trace
        context its frame carries."""
        tracing = self._state.tracing
        if tracing is None:
            return None, None
        conversation = frame.room or direct(self.conn.user, frame.to or "")
        span = tracing.start_publish(frame.traceparent, conversation, "socket")
        return span, None if span is None else traceparent_of(span)

    def _publish_refusal(self, exc: QuotaExceeded | BrokerUnavailable) -> FrameError:
        """The error a publish the broker refused is answered with."""
        if isinstance(exc, QuotaExceeded):
            return FrameError(ErrorCode.RATE_LIMITED, _TOO_MANY_MESSAGES)
        self.metrics.publish_failures.inc()
        return FrameError(
            ErrorCode.BROKER_UNAVAILABLE, "message not sent: the broker is unavailable"
        )

    def _acked(
        self, frame: Send, published: Published, started: float, span: Span | None
    ) -> str | None:
        """A published send's ack (None without a ``cid``), its publish time recorded."""
        now = time.perf_counter()
        self.metrics.publish_took(now - started, now, None if span is None else trace_id_of(span))
        if frame.cid is None:
            return None
        return ack_frame(frame.cid, published.id, published.duplicate)

    async def _publish_send(self, frame: Send, blocked: bool | None = None) -> str | None:
        """Publish a ``send`` frame; its ack (None without a ``cid``). Raises FrameError."""
        conn = self.conn
        self._check_send(frame, blocked)
        if blocked is None:
            await self._not_blocked(frame.to)
        if frame.reply_to is not None:
            conversation = (
                frame.room if frame.room is not None else direct(conn.user, frame.to or "")
            )
            target, _ = await self._find(conversation, frame.reply_to)
            if target.deleted:
                raise FrameError(ErrorCode.NOT_FOUND, f"message {frame.reply_to} was deleted")
        hook = self._state.moderation
        mentions = None
        if "@" in frame.text and hook is None:  # else once the hook decided the text
            mentions = await self._mentions(frame)
        attachments: str | None = None
        if frame.attachments is not None:
            files = self._files()
            conversation = (
                frame.room if frame.room is not None else direct(conn.user, frame.to or "")
            )
            try:
                attachments = await files.claim(
                    conn.user, conversation, frame.attachments, frame.cid
                )
            except AlreadySent as sent:  # a retry of a send that was published
                return None if frame.cid is None else ack_frame(frame.cid, sent.message_id, True)
        started = time.perf_counter()
        published: Published | None = None
        span, traceparent = self._start_span(frame)
        text = frame.text
        try:
            if hook is not None:
                conversation = frame.room or direct(conn.user, frame.to or "")
                files_seen = None if attachments is None else orjson.loads(attachments)
                text = await hook.check("message", conversation, conn.user, text, files_seen)
                if "@" in text:
                    mentions = await self._mentions(frame.model_copy(update={"text": text}))
            if frame.room is not None:
                published = await self._broker.publish(
                    frame.room, conn.user, text, frame.cid, frame.reply_to,
                    attachments=attachments, mentions=mentions, traceparent=traceparent,
                )  # fmt: skip
            else:
                assert frame.to is not None  # the model guarantees room xor to
                published = await self._broker.publish_direct(
                    conn.user, frame.to, text, frame.cid, frame.reply_to,
                    attachments=attachments, mentions=mentions, traceparent=traceparent,
                )  # fmt: skip
        except (QuotaExceeded, BrokerUnavailable) as exc:
            raise self._publish_refusal(exc) from None
        finally:
            if span is not None:
                end_publish(span, published)
            if attachments is not None and frame.attachments is not None:
                if published is not None and not published.duplicate:
                    await self._files().attach(frame.attachments, published.id)
                else:  # not published, or a retry of a send of other files: free them
                    await self._files().release(frame.attachments)
        return self._acked(frame, published, started, span)


def _frame_error(error: RoomError) -> FrameError:
    return FrameError(error.code, error.message)


def _ref(text: str) -> dict[str, object] | None:
    """The fields of a refused frame the client needs to match the error to it (its ``type``
    as ``ref``, its ``room`` and its ``cid``), or None when the frame itself is malformed."""
    try:
        frame = parse_client_frame(text)
    except FrameError:
        return raw_ref(text)  # what parts of it are valid
    ref: dict[str, object] = {"ref": frame.type}
    room = getattr(frame, "room", None)
    if room is not None:
        ref["room"] = room
    peer = getattr(frame, "peer", None)
    if peer is not None:
        ref["with"] = peer
    cid = getattr(frame, "cid", None)
    if cid is not None:
        ref["cid"] = cid
    if isinstance(frame, Edit | Delete | React):
        ref["id"] = frame.id
    return ref


def _in(conversation: str) -> str:
    return "in this direct conversation" if is_direct(conversation) else f"in room {conversation!r}"


async def serve(ws: WebSocket | StreamSocket, state: ChatState) -> None:
    """Run one WebSocket from upgrade to close (the ``/ws`` endpoint), or one stream of the
    HTTP fallback transport (:mod:`app.sockets.stream`), which is served the same way.

    A foreign ``Origin`` gets HTTP 403 before any socket exists. Then, on the accepted socket:
    draining (1012), server full (1013), identity (:func:`app.access.admission.identify`: 4001,
    1008) and quotas (:func:`app.access.admission.admit`: 4003, 4029) may refuse it with a
    documented code.
    Logs one line when the connection opens and one when it ends (with its close code and who
    closed), and counts both in the metrics.
    """
    hub, settings, metrics = state.hub, state.settings, state.metrics
    if not state.origins.allows(ws.headers):
        metrics.upgrades_refused.labels("origin").inc()
        logger.info("upgrade refused: origin", extra={"origin": ws.headers.get("origin")})
        await ws.close(CloseCode.POLICY_VIOLATION)  # before accept: uvicorn answers HTTP 403
        return
    loop = asyncio.get_running_loop()
    now = loop.time()
    conn = Connection(
        ws,
        "",
        Outbox(settings.outbox_max_bytes, settings.coalesce_max_bytes, hub.outbox_budget),
        RateLimiter(
            settings.rate_limit_frames_per_s,
            settings.rate_limit_burst,
            settings.rate_limit_max_violations,
            settings.rate_limit_violation_window_s,
            now,
        ),
        settings.close_timeout_s,
        now,
        metrics,
        state.flusher,
    )
    conn.ip = ws.client.host if ws.client else None
    if hub.draining:
        await _refuse(ws, metrics, CloseCode.SERVICE_RESTART, "draining")
        return
    if not hub.add(conn):
        await _refuse(ws, metrics, CloseCode.TRY_AGAIN_LATER, "server full")
        logger.warning(
            "connection refused: server full", extra={"connections": len(hub.connections)}
        )
        return
    code: int = CloseCode.INTERNAL_ERROR
    admitted = False
    inbox_push: asyncio.Task[None] | None = None
    try:
        await ws.accept()
        if isinstance(ws, WebSocket):
            conn.write_directly(_direct_socket(ws, metrics))
        metrics.opened.inc()
        # The address pays for the socket now, not once it has authenticated: sockets that
        # never do cannot be opened for free.
        identity = await admit_address(state, conn.ip) or await identify(ws, state)
        if identity is None:
            code = 1001  # the client left before saying who it is
            return
        refused = identity if isinstance(identity, Refused) else None
        if refused is None:
            assert isinstance(identity, Identity)
            conn.user, conn.identity = identity.user, identity
            refused = await admit(state, conn)
            admitted = refused is None
        if refused is not None:
            code = conn.close_code = refused.code
            logger.info(
                "connection refused",
                extra={
                    "user": conn.user,
                    "ip": conn.ip,
                    "code": int(code),
                    "reason": refused.reason,
                },
            )
            await ws.close(code, close_reason(refused.reason))
            return
        logger.info("connection opened", extra={"conn": conn.id, "user": conn.user, "ip": conn.ip})
        # Before anything can reach it: whom its user hides is filtered out from the start.
        conn.hidden = await state.hidden.attach(conn.user)
        await hub.register_user(conn)
        conn.offer(
            hello_frame(
                conn.user,
                conn.id,
                _process_name() if settings.hello_names_process else _NODE,
                {
                    "heartbeat_interval_s": settings.heartbeat_interval_s,
                    "heartbeat_timeout_s": settings.heartbeat_timeout_s,
                    "max_frame_bytes": settings.max_frame_bytes,
                    "max_text_chars": settings.max_text_chars,
                    "max_rooms": settings.max_rooms_per_connection,
                    "rate_limit_frames_per_s": settings.rate_limit_frames_per_s,
                    "rate_limit_burst": settings.rate_limit_burst,
                },
                conn.identity.expires_at,
                conn.identity.guest_key,
                state.notifications.push_key if state.notifications is not None else None,
            )
        )
        # From now on the heartbeat pings it (never before `hello`, the first frame).
        conn.last_seen, conn.greeted = loop.time(), True
        session = Session(conn, state)
        if state.store is not None:
            # Beside the frames, not before them: a slow store must not hold the socket up.
            inbox_push = loop.create_task(_push_inbox(session))
        code = await _read_frames(ws, session, settings, loop)
        code = conn.close_code or code
    finally:
        if inbox_push is not None:
            inbox_push.cancel()
        duration = loop.time() - conn.opened_at
        metrics.connection_closed(code, duration)
        if admitted:
            logger.info(
                "connection closed",
                extra={
                    "conn": conn.id,
                    "user": conn.user,
                    "rooms": len(conn.rooms),
                    "code": int(code),
                    "by": "server" if conn.close_code is not None else "client",
                    "duration_s": round(duration, 3),
                },
            )
            try:
                await state.quotas.release(conn.user, conn.id)
            except Exception:  # the slot expires by itself; the rest of the cleanup must run
                logger.warning("could not release the connection slot", exc_info=True)
        await hub.remove(conn)
        conn.discard()


async def _push_inbox(session: Session) -> None:
    """The ``inbox`` soon after ``hello`` (what came while the user was away: DMs, unread
    counts), in a task beside the frames the client sends. Best effort: a store that fails or
    is slow costs this frame only (an error frame, ``store_unavailable``; the client may ask
    again with ``inbox``)."""
    try:
        async with asyncio.timeout(session.settings.database_timeout_s):
            await session.send_inbox()
    except (FrameError, TimeoutError) as exc:
        code = exc.code if isinstance(exc, FrameError) else ErrorCode.STORE_UNAVAILABLE
        session.metrics.error_sent(code)
        session.conn.offer(error_frame(code, "inbox unavailable, ask again", {"ref": "inbox"}))


def _direct_socket(ws: WebSocket, metrics: Metrics) -> DirectSocket | None:
    """How ``ws`` is written to: directly, or (None) through ASGI, which is counted by reason
    and, when it is a defect (the server is not ours), logged and flagged on the fast-path
    gauge."""
    direct = DirectSocket.of(ws)
    if isinstance(direct, DirectSocket):
        return direct
    metrics.transport_fallbacks.labels(direct).inc()
    if direct == FALLBACK_NO_PROTOCOL:
        metrics.fast_path_live.labels("direct_writes").set(0)
        metrics.fast_path_live.labels("abort").set(0)
        if direct not in _FALLBACKS_LOGGED:
            _FALLBACKS_LOGGED.add(direct)
            logger.warning(
                "connections are written through ASGI: the server does not expose its "
                "transport (run it with app.server.uvicorn_options)"
            )
    return None


_FALLBACKS_LOGGED: set[str] = set()


async def _refuse(
    ws: WebSocket | StreamSocket, metrics: Metrics, code: CloseCode, reason: str
) -> None:
    """Accept, then close at once with ``code``: browsers see close codes, not HTTP statuses."""
    await ws.accept()
    metrics.opened.inc()
    await ws.close(code, close_reason(reason))
    metrics.connection_closed(code, 0.0)


async def _read_frames(
    ws: WebSocket | StreamSocket,
    session: Session,
    settings: Settings,
    loop: asyncio.AbstractEventLoop,
) -> int:
    """Read and answer frames until the socket ends; returns the close code seen."""
    conn = session.conn
    metrics = session.metrics
    received = metrics.frames_received_since_sync
    max_frame = settings.max_frame_bytes
    while True:
        message = await ws.receive()
        if message["type"] == "websocket.disconnect":
            await session.settle()  # the sends in flight are published all the same
            return int(message.get("code", CloseCode.NORMAL_CLOSURE))
        if conn.closing:
            continue  # the server is closing this socket: the disconnect is on its way
        now = loop.time()
        conn.last_seen = now
        text = message.get("text")
        if text is not None and len(text) > max_frame:
            # uvicorn enforces ws_max_size itself; this catches a server run with a larger one.
            conn.close(CloseCode.MESSAGE_TOO_BIG, "frame too large")
            continue
        verdict = conn.limiter.check(now)
        if verdict is not Verdict.ALLOW or text is None:
            await session.settle()  # answers go out in the order of the frames
        if verdict is not Verdict.ALLOW:
            received["rate_limited"] += 1
            if verdict is Verdict.ABUSE:
                conn.close(CloseCode.POLICY_VIOLATION, "rate limit exceeded repeatedly")
            else:
                ref = _ref(text) if text is not None else None
                metrics.error_sent(ErrorCode.RATE_LIMITED)
                conn.offer(error_frame(ErrorCode.RATE_LIMITED, "too many frames, slow down", ref))
            continue
        if text is None:
            received["binary"] += 1
            metrics.error_sent(ErrorCode.BINARY_UNSUPPORTED)
            conn.offer(
                error_frame(ErrorCode.BINARY_UNSUPPORTED, "send JSON in text frames, not binary")
            )
            continue
        try:
            await session.handle_text(text)
        except Exception:
            logger.exception("unexpected error handling a frame", extra={"conn": conn.id})
            conn.close(CloseCode.INTERNAL_ERROR, "internal error")
