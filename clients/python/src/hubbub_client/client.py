"""The Hubbub client: one WebSocket, kept open (reconnects with jittered backoff), rooms
rejoined with ``since``, every room message delivered once and in order, sends retried safely
(same ``cid``) and answered as futures. The browser client (``app/static/hubbub.js``) does
the same; docs/protocol.md is the contract of both.

Nothing here runs user code on the connection's read loop: events go to per-stream queues
(``events()``) and to one dispatcher task that runs the callbacks (``on()``), so a slow or
failing callback never holds up pings, acks or other frames.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import random
import typing
import urllib.error
import urllib.request
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, Literal, TypeVar, cast, overload
from urllib.parse import parse_qsl, urlencode, urljoin, urlsplit, urlunsplit

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State

from hubbub_client.errors import (
    AckTimeoutError,
    ClientClosedError,
    ConnectionLostError,
    HubbubError,
    HubbubTimeoutError,
)
from hubbub_client.events import (
    DM,
    EVENT_TYPES,
    Ack,
    Authenticated,
    ClientError,
    ConnectionState,
    Conversation,
    Deleted,
    DirectMessage,
    Edited,
    Event,
    Hello,
    HiddenUsers,
    HistoryPage,
    Inbox,
    Invited,
    Joined,
    Left,
    MemberChanged,
    Mentioned,
    MentionsPage,
    Message,
    NotificationSetting,
    Presence,
    Reaction,
    Receipt,
    Receipts,
    Resync,
    RoomInfo,
    RoomList,
    ServerError,
    StateChange,
    Typing,
)
from hubbub_client.frames import (
    RETRY_JOIN_CODES,
    TERMINAL_CLOSE_CODES,
    AckedFrame,
    AckFrame,
    AnyFrame,
    AuthenticatedFrame,
    AuthFrame,
    BanFrame,
    Cid,
    ClientFrame,
    CreateFrame,
    DeletedFrame,
    DeleteFrame,
    DescribeFrame,
    EditedFrame,
    EditFrame,
    ErrorFrame,
    FileFrame,
    FileId,
    FileRequestFrame,
    HelloFrame,
    HiddenFrame,
    HideFrame,
    HistoryFrame,
    HistoryRequestFrame,
    InboxFrame,
    InvitedFrame,
    JoinedFrame,
    JoinFrame,
    KickFrame,
    LeftFrame,
    MemberFrame,
    MentionsFrame,
    MentionsRequestFrame,
    MessageFrame,
    NotificationLevel,
    NotificationSettingFrame,
    NotificationsFrame,
    NotificationsRequestFrame,
    PresenceFrame,
    PreviewFrame,
    PreviewRequestFrame,
    PushSubscribedFrame,
    PushUnsubscribedFrame,
    ReactFrame,
    ReactionFrame,
    ReadFrame,
    ReceiptFrame,
    ReceiptsFrame,
    Report,
    ReportedFrame,
    ReportFrame,
    ReportsFrame,
    ReportsRequestFrame,
    ResolvedFrame,
    RoomFrame,
    RoomsFrame,
    RoomsRequestFrame,
    SearchFrame,
    SearchRequestFrame,
    SendFrame,
    TypingNoticeFrame,
    UploadFrame,
    UploadRequestFrame,
)

logger = logging.getLogger("hubbub_client")

VERSION = "0.1.0"

# The largest page of mentions the server gives (its ``limit`` bound).
MENTIONS_PAGE_MAX = 500
# The largest page of the reports queue the server gives, and its longest ban (10 years).
REPORTS_PAGE_MAX = 100
BAN_MAX_S = 10 * 365 * 86_400

# The requests of link previews, reports and moderation, by the type of their answer: each
# is answered (or refused, with its type as ``ref``) in the order asked among those of its
# type (the server answers a connection's frames in order).
_IN_ORDER_ANSWERS: dict[str, str] = {
    "preview": "preview", "reported": "report", "reports": "reports", "resolved": "resolve",
    "kicked": "kick", "banned": "ban",
}  # fmt: skip

# Close codes the client reports for ends the server did not name: the connection was lost
# or could not be opened (1006), or the server fell silent past its heartbeat (4000).
ABNORMAL_CLOSURE = 1006
NO_HEARTBEAT = 4000

E = TypeVar("E", bound=Event)
TokenSource = Callable[[], str | Awaitable[str]]
"""``get_token``: a function returning a JWT, or an awaitable of one."""
Callback = Callable[[E], object]
"""An event callback: a function of the event, or a coroutine function (awaited)."""

_END: Any = object()  # the end of an event stream


def backoff_delay(attempt: int, base_s: float, max_s: float) -> float:
    """Full jitter: a random delay in [0, min(max_s, base_s * 2**attempt)], at least 0.1 s, so
    that the clients of a restarted server do not all come back at the same moment."""
    cap = min(max_s, base_s * 2 ** min(attempt, 32))
    return max(0.1, random.uniform(0, cap))


def new_cid() -> str:
    """A fresh client message id."""
    return uuid.uuid4().hex


def _auth_frame_url(url: str) -> str:
    """``url`` with ``auth=frame``: who we are goes in the first frame, never in the URL
    (URLs end up in access logs and proxies' logs)."""
    parts = urlsplit(url)
    if parts.scheme not in ("ws", "wss"):
        raise ValueError(f"a Hubbub URL is ws:// or wss://, not {url!r}")
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "auth"] + [("auth", "frame")]
    return urlunsplit(parts._replace(query=urlencode(query)))


def _encode(frame: ClientFrame) -> str:
    return json.dumps(frame, ensure_ascii=False, separators=(",", ":"))


def _http_base(url: str) -> str:
    """The http(s) URL of the server at WebSocket URL ``url``: what relative file URLs are
    relative to."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(scheme="https" if parts.scheme == "wss" else "http"))


def _multipart(fields: dict[str, str], name: str, data: bytes) -> tuple[bytes, str]:
    """A ``multipart/form-data`` body: every field first, then the file as field ``file``
    (as S3's presigned POST wants it); and its content type."""
    boundary = f"hubbub-{uuid.uuid4().hex}"
    filename = name.replace("\\", "_").replace('"', "%22")
    chunks: list[bytes] = []
    for key, value in fields.items():
        disposition = f'Content-Disposition: form-data; name="{key}"'
        chunks.append(f"--{boundary}\r\n{disposition}\r\n\r\n{value}\r\n".encode())
    disposition = f'Content-Disposition: form-data; name="file"; filename="{filename}"'
    chunks.append(
        f"--{boundary}\r\n{disposition}\r\nContent-Type: application/octet-stream\r\n\r\n".encode()
    )
    chunks += [data, f"\r\n--{boundary}--\r\n".encode()]
    return b"".join(chunks), f"multipart/form-data; boundary={boundary}"


def _send_bytes(method: str, url: str, body: bytes, content_type: str, timeout_s: float) -> None:
    """One HTTP request with ``body`` (blocking: run in a thread). Raises HubbubError:
    ``file_too_large`` (413), ``storage_unavailable`` (no answer, or 5xx), ``upload_failed``
    (any other status that is not 2xx)."""
    request = urllib.request.Request(
        url, data=body, method=method, headers={"Content-Type": content_type}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            response.read()
    except urllib.error.HTTPError as exc:
        if exc.code == 413:
            raise HubbubError(
                "file_too_large", "the storage refused the file as too large"
            ) from None
        if exc.code >= 500:
            raise HubbubError(
                "storage_unavailable", f"the file storage answered {exc.code}, try again"
            ) from None
        raise HubbubError("upload_failed", f"the file storage answered {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise HubbubError(
            "storage_unavailable", f"the file storage could not be reached: {exc}"
        ) from None


class AckFuture(asyncio.Future[Ack]):
    """What ``send`` (``send_to``, ``edit``, ``delete``, ``react``) returns: awaitable, it
    resolves with the :class:`~hubbub_client.events.Ack` or raises
    :class:`~hubbub_client.errors.HubbubError` (the server refused it: ``code``),
    :class:`~hubbub_client.errors.AckTimeoutError` or
    :class:`~hubbub_client.errors.ClientClosedError`. ``cid`` is the send's id: pass it to a
    retry (``send(room, text, cid=...)``) to make it safe."""

    cid: Cid


@dataclass
class _Pending:
    """A send not acknowledged yet: written again after every reconnect."""

    frame: AckedFrame
    future: AckFuture
    timer: asyncio.TimerHandle | None = None


class EventStream(AsyncIterator[E], Generic[E]):
    """The client's events (those of the given types), from when the stream was made; the
    iteration ends once the client is closed. Unbounded: read it, or ``close()`` it."""

    def __init__(self, client: HubbubClient, types: tuple[type[Event], ...]) -> None:
        self._client = client
        self._types = types
        self._queue: asyncio.Queue[E] = asyncio.Queue()
        client._streams.add(self)
        if client.state == "closed":
            self._end()

    def _offer(self, event: Event) -> None:
        if isinstance(event, self._types):
            self._queue.put_nowait(cast(E, event))

    def _end(self) -> None:
        self._queue.put_nowait(_END)

    def close(self) -> None:
        """Stop receiving events."""
        self._client._streams.discard(self)

    def __aiter__(self) -> EventStream[E]:
        return self

    async def __anext__(self) -> E:
        event = await self._queue.get()
        if event is _END:
            self.close()
            raise StopAsyncIteration
        return event

    async def __aenter__(self) -> EventStream[E]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


class HubbubClient:
    """A chat connection, kept open until :meth:`close`.

    ``name`` (and ``guest_key``, which the client learns from ``hello`` when it has none:
    keep it to stay the same guest) for ``guest`` servers, ``name`` alone for ``names`` ones;
    ``get_token`` for ``jwt`` servers: called at every (re)connect and when the server asks
    for a refresh. Credentials go in the first frame (``auth``), never in the URL.

    Reconnects after every close but 1000, 1007, 1008, 1009, 4001 and 4003, with a random
    delay up to ``base_delay_s * 2**attempt`` (capped at ``max_delay_s``; the attempts count
    from zero again once a connection stayed up ``stable_after_s``). The server pings every
    ``heartbeat_interval_s`` (from ``hello``): silence for longer than that plus its
    ``heartbeat_timeout_s`` plus ``heartbeat_slack_s`` means the link is dead, and the
    client reconnects.

    ``ack_timeout_s``: how long a send waits for its ack once written on an open connection;
    ``request_timeout_s`` (default: ``ack_timeout_s``): how long ``history``, ``rooms``... wait
    for the connection and their answer; ``open_timeout_s``: for the WebSocket handshake and
    then the ``hello``; ``retry_s``: when a join refused with ``broker_unavailable`` or
    ``rate_limited``, or a send refused with ``broker_unavailable``, is tried again;
    ``max_size``: the largest server frame taken (bytes; None: any).

    Use it in a running event loop: ``async with HubbubClient(url, name="ada") as client:``
    (connects and waits for ``hello``), or ``client.connect()`` ... ``await client.close()``.
    """

    def __init__(
        self,
        url: str,
        *,
        name: str | None = None,
        guest_key: str | None = None,
        get_token: TokenSource | None = None,
        base_delay_s: float = 0.5,
        max_delay_s: float = 15.0,
        ack_timeout_s: float = 10.0,
        request_timeout_s: float | None = None,
        stable_after_s: float = 10.0,
        heartbeat_slack_s: float = 5.0,
        open_timeout_s: float = 10.0,
        retry_s: float = 1.0,
        max_size: int | None = 64 * 2**20,
    ) -> None:
        self.url = url
        self._ws_url = _auth_frame_url(url)
        self.name = name
        self.guest_key = guest_key
        self.get_token = get_token
        self.base_delay_s = base_delay_s
        self.max_delay_s = max_delay_s
        self.ack_timeout_s = ack_timeout_s
        self.request_timeout_s = ack_timeout_s if request_timeout_s is None else request_timeout_s
        self.stable_after_s = stable_after_s
        self.heartbeat_slack_s = heartbeat_slack_s
        self.open_timeout_s = open_timeout_s
        self.retry_s = retry_s
        self.max_size = max_size
        self.state: ConnectionState = "idle"
        self.hello: Hello | None = None
        self.rooms: set[str] = set()
        """Rooms this client wants to be in: rejoined after every reconnect."""
        self.last_id: dict[str, int] = {}
        """The newest id delivered per room: the ``since`` of the next join."""
        self.last_direct: dict[str, int] = {}
        """The newest direct message id seen per other user."""

        self._stopped = True
        self._attempt = 0
        self._run_task: asyncio.Task[None] | None = None
        self._ws: ClientConnection | None = None
        self._out: asyncio.Queue[str] | None = None
        self._pending: dict[Cid, _Pending] = {}
        self._answers: dict[str, deque[asyncio.Future[AnyFrame]]] = {}
        # Per request type (``file``, ``notifications``, ``push_subscribe``...), the keys of the
        # requests not answered yet, in the order written: an error that names none answers
        # the oldest, as the server answers a connection's frames in order.
        self._asks: dict[str, deque[str]] = {}
        # The ``mute``, ``unmute``, ``block``, ``unblock`` and ``hidden`` frames not answered
        # yet, in the order written (their futures wait on the key ``hidden``).
        self._hiding: deque[HideFrame] = deque()
        self._visible = False
        self._join_waiters: dict[str, list[asyncio.Future[Joined]]] = {}
        self._state_waiters: list[tuple[frozenset[str], asyncio.Future[ConnectionState]]] = []
        self._seen_direct: dict[int, None] = {}
        self._timers: set[asyncio.TimerHandle] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._streams: set[EventStream[Any]] = set()
        self._handlers: list[tuple[tuple[type[Event], ...], Callback[Any]]] = []
        self._dispatch: asyncio.Queue[Event] = asyncio.Queue()
        self._dispatcher: asyncio.Task[None] | None = None
        self._stable: asyncio.TimerHandle | None = None

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def user(self) -> str | None:
        """Who the server says this client is (after the first ``hello``)."""
        return self.hello.user if self.hello else None

    def connect(self) -> None:
        """Open the connection, and keep it open until :meth:`close` (or a terminal close
        code). Returns at once; :meth:`wait_open` waits for ``hello``."""
        if self._run_task is not None and not self._run_task.done():
            return
        self._stopped = False
        self._attempt = 0
        self._run_task = asyncio.get_running_loop().create_task(self._run())

    async def wait_open(self) -> Hello:
        """Wait until the connection is open (``hello``); raises
        :class:`~hubbub_client.errors.ClientClosedError` if the client is or becomes closed.
        Bound it with ``asyncio.timeout``: while the server is unreachable it waits on."""
        if self.state != "open" and await self.wait_for_state("open", "closed") == "closed":
            raise ClientClosedError("the client is closed")
        assert self.hello is not None
        return self.hello

    async def wait_for_state(self, *states: ConnectionState) -> ConnectionState:
        """Wait until the connection reaches one of ``states`` (now counts); returns it."""
        if self.state in states:
            return self.state
        future: asyncio.Future[ConnectionState] = asyncio.get_running_loop().create_future()
        entry = (frozenset(states), future)
        self._state_waiters.append(entry)
        try:
            return await future
        finally:
            with contextlib.suppress(ValueError):
                self._state_waiters.remove(entry)

    async def close(self) -> None:
        """Close for good (1000, no reconnect): what waits for an ack or an answer fails with
        :class:`~hubbub_client.errors.ClientClosedError`, event streams end, and the callbacks
        of the events so far run first (5 s at most)."""
        self._stopped = True
        ws = self._ws
        if ws is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2):
                    await ws.close(1000, "bye")
        task = self._run_task
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._end_session()
        self._fail_everything(ClientClosedError("the client was closed"))
        if self.state != "closed":
            self._set_state("closed", code=1000, reason="closed by the client")
        for task in list(self._tasks):
            task.cancel()
        dispatcher = self._dispatcher
        if dispatcher is not None and dispatcher is not asyncio.current_task():
            self._dispatch.put_nowait(_END)
            try:
                async with asyncio.timeout(5):
                    await asyncio.shield(dispatcher)
            except TimeoutError:
                dispatcher.cancel()
            self._dispatcher = None

    async def __aenter__(self) -> HubbubClient:
        """Connect, and wait for the server's ``hello``."""
        self.connect()
        try:
            await self.wait_open()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    # -- events ----------------------------------------------------------------------------

    @overload
    def events(self) -> EventStream[Event]: ...
    @overload
    def events(self, *types: type[E]) -> EventStream[E]: ...
    def events(self, *types: type[Event]) -> EventStream[Any]:
        """The events from now on (of ``types``; all without), as an async iterator that
        ends when the client is closed: ``async for event in client.events(Message): ...``."""
        return EventStream(self, types or (Event,))

    @overload
    def on(self, kind: type[E], callback: Callback[E]) -> Callable[[], None]: ...
    @overload
    def on(self, kind: str, callback: Callback[Any]) -> Callable[[], None]: ...
    def on(self, kind: type[Event] | str, callback: Callback[Any]) -> Callable[[], None]:
        """Call ``callback(event)`` for every event of class ``kind`` (or named ``kind``, as
        hubbub.js names them: ``"message"``, ``"direct"``, ``"state"``...); a coroutine
        function is awaited. Callbacks run one at a time, in the events' order, on a task of
        their own: never on the connection's read loop. One that raises is logged. Returns
        the function that removes the callback."""
        if isinstance(kind, str):
            if kind not in EVENT_TYPES:
                raise ValueError(f"no event is called {kind!r}: {sorted(EVENT_TYPES)}")
            types = EVENT_TYPES[kind]
        else:
            types = (kind,)
        entry: tuple[tuple[type[Event], ...], Callback[Any]] = (types, callback)
        self._handlers.append(entry)

        def remove() -> None:
            with contextlib.suppress(ValueError):
                self._handlers.remove(entry)

        return remove

    def _emit(self, event: Event) -> None:
        for stream in list(self._streams):
            stream._offer(event)
        if self._handlers:
            if self._dispatcher is None or self._dispatcher.done():
                self._dispatcher = asyncio.get_running_loop().create_task(self._dispatch_loop())
            self._dispatch.put_nowait(event)

    async def _dispatch_loop(self) -> None:
        while True:
            event = await self._dispatch.get()
            if event is _END:
                return
            for types, callback in list(self._handlers):
                if not isinstance(event, types):
                    continue
                try:
                    result = callback(event)
                    if inspect.isawaitable(result):
                        await result
                except Exception:
                    logger.exception("a callback for %s raised", type(event).__name__)

    # -- rooms and messages ----------------------------------------------------------------

    def join(self, room: str) -> asyncio.Future[Joined]:
        """Join ``room``, and rejoin it after every reconnect (with ``since`` = the newest id
        delivered). The future resolves with the ``joined`` answer (when the connection is
        down, once it is back), or raises :class:`~hubbub_client.errors.HubbubError` if the
        server refused the join (the room is then forgotten; ``broker_unavailable`` and
        ``rate_limited`` are retried instead)."""
        future: asyncio.Future[Joined] = asyncio.get_running_loop().create_future()
        _quiet(future)
        if self.state == "closed":
            future.set_exception(ClientClosedError("the client is closed"))
            return future
        self._join_waiters.setdefault(room, []).append(future)
        self.rooms.add(room)
        self._join_frame(room)
        return future

    def leave(self, room: str) -> None:
        """Leave ``room`` (and stop rejoining it)."""
        self.rooms.discard(room)
        self.last_id.pop(room, None)
        for future in self._join_waiters.pop(room, []):
            if not future.done():
                future.set_exception(HubbubError("left", f"left {room!r} before it was joined"))
        self._write({"type": "leave", "room": room})

    def send(
        self,
        room: str,
        text: str,
        *,
        reply_to: int | None = None,
        cid: Cid | None = None,
        attachments: Sequence[FileId] | None = None,
        traceparent: str | None = None,
    ) -> AckFuture:
        """Publish ``text`` to ``room`` (``reply_to``: the id of the message it answers;
        ``attachments``: files :meth:`upload` made for this room, and then ``text`` may be
        empty; ``traceparent``: your W3C trace context, which the server's spans continue
        when tracing is on). Resent with the same ``cid`` after a reconnect until acked (the
        server drops duplicates). ``cid``: retry an earlier send (a fresh one by default)."""
        frame: SendFrame = {"type": "send", "room": room, "text": text, "cid": cid or new_cid()}
        return self._send_acked(_with_options(frame, reply_to, attachments, traceparent))

    def send_to(
        self,
        user: str,
        text: str,
        *,
        reply_to: int | None = None,
        cid: Cid | None = None,
        attachments: Sequence[FileId] | None = None,
        traceparent: str | None = None,
    ) -> AckFuture:
        """A direct message to every connection of ``user`` (acked and resent as ``send``;
        ``attachments``: files :meth:`upload` made for ``DM(user)``)."""
        frame: SendFrame = {"type": "send", "to": user, "text": text, "cid": cid or new_cid()}
        return self._send_acked(_with_options(frame, reply_to, attachments, traceparent))

    def edit(
        self, conversation: Conversation, id: int, text: str, *, cid: Cid | None = None
    ) -> AckFuture:
        """Replace the text of your message ``id`` in ``conversation`` (a room, or
        ``DM(user)``); acked and resent like a send."""
        frame: EditFrame = {"type": "edit", "id": id, "text": text, "cid": cid or new_cid()}
        _set_conversation(frame, conversation)
        return self._send_acked(frame)

    def delete(self, conversation: Conversation, id: int, *, cid: Cid | None = None) -> AckFuture:
        """Delete message ``id`` (yours; anyone's for a moderator)."""
        frame: DeleteFrame = {"type": "delete", "id": id, "cid": cid or new_cid()}
        _set_conversation(frame, conversation)
        return self._send_acked(frame)

    def react(
        self, conversation: Conversation, id: int, emoji: str, *, cid: Cid | None = None
    ) -> AckFuture:
        """Toggle your reaction ``emoji`` on message ``id`` (the ``Reaction`` event says
        whether it is now on)."""
        frame: ReactFrame = {"type": "react", "id": id, "emoji": emoji, "cid": cid or new_cid()}
        _set_conversation(frame, conversation)
        return self._send_acked(frame)

    def typing(self, room: str) -> bool:
        """Tell ``room`` you are typing (call it at most every few seconds). Dropped (False)
        while the connection is not open."""
        return self._write({"type": "typing", "room": room})

    def read(self, conversation: Conversation, id: int, *, receipt: bool = True) -> bool:
        """Everything up to message ``id`` of ``conversation`` is read (servers with a
        store); ``receipt=False`` keeps it from the others. Dropped (False) while the
        connection is not open."""
        frame: ReadFrame = {"type": "read", "id": id}
        _set_conversation(frame, conversation)
        if not receipt:
            frame["receipt"] = False
        return self._write(frame)

    # -- requests with an answer -----------------------------------------------------------

    async def history(
        self, room: str, *, before: int | None = None, limit: int = 50
    ) -> list[Message]:
        """A page of ``room``'s history, oldest first: the newest ``limit`` messages, or
        those before ``before``, as they are now (edited, deleted, reactions). Without
        ``before`` it also moves this client's position in the room forward (after a
        :class:`~hubbub_client.events.Resync`, reload with it)."""
        frame: HistoryRequestFrame = {"type": "history", "room": room, "limit": limit}
        if before is not None:
            frame["before"] = before
        page = cast(HistoryFrame, await self._ask(_history_key(room, None), frame))
        messages = [Message.from_frame(m) for m in page["messages"]]
        newest = messages[-1].id if messages else 0
        if before is None and room in self.rooms and newest > self.last_id.get(room, 0):
            self.last_id[room] = newest
        return messages

    async def direct_history(
        self, user: str, *, before: int | None = None, after: int | None = None, limit: int = 50
    ) -> HistoryPage:
        """A page of the direct messages with ``user``, oldest first: the newest ``limit``
        before ``before`` (the newest of all without it), or the oldest after ``after``."""
        page = await self._direct_page(user, before=before, after=after, limit=limit)
        me = self.user
        return HistoryPage(
            messages=tuple(DirectMessage.from_frame(m, me) for m in page["messages"]),
            more=page["more"],
            recovered=page.get("recovered"),
        )

    async def create_room(
        self, room: str, *, private: bool = False, title: str = "", topic: str = ""
    ) -> RoomInfo:
        """Create ``room`` with you as its owner (``private``: members only; servers with a
        store)."""
        frame: CreateFrame = {
            "type": "create", "room": room, "private": private, "title": title, "topic": topic,
        }  # fmt: skip
        return RoomInfo.from_frame(cast(RoomFrame, await self._ask(f"room:{room}", frame)))

    async def describe(
        self, room: str, *, title: str | None = None, topic: str | None = None
    ) -> RoomInfo:
        """Change ``room``'s title and/or topic (its owner or an admin)."""
        frame: DescribeFrame = {"type": "describe", "room": room}
        if title is not None:
            frame["title"] = title
        if topic is not None:
            frame["topic"] = topic
        return RoomInfo.from_frame(cast(RoomFrame, await self._ask(f"room:{room}", frame)))

    async def invite(
        self, room: str, user: str, role: Literal["member", "admin"] = "member"
    ) -> RoomInfo:
        """Make ``user`` a member of ``room`` (or change its role)."""
        frame: ClientFrame = {"type": "invite", "room": room, "user": user, "role": role}
        return RoomInfo.from_frame(cast(RoomFrame, await self._ask(f"room:{room}", frame)))

    async def remove(self, room: str, user: str) -> RoomInfo:
        """Take ``user`` out of ``room``'s members (yourself: leave it for good)."""
        frame: ClientFrame = {"type": "remove", "room": room, "user": user}
        return RoomInfo.from_frame(cast(RoomFrame, await self._ask(f"room:{room}", frame)))

    async def list_rooms(self) -> list[RoomInfo]:
        """The rooms you are a member of (servers with a store)."""
        answer = cast(RoomsFrame, await self._ask("rooms", {"type": "rooms"}))
        return list(RoomList.from_frame(answer).rooms)

    async def find_rooms(self, q: str | None = None) -> list[RoomInfo]:
        """The directory (servers with a store): public rooms with a record, by name; with
        ``q`` (at most 64 characters), those whose name, title or topic holds it. Private
        rooms are never listed."""
        frame: RoomsRequestFrame = {"type": "rooms", "public": True}
        if q:
            frame["q"] = q
        answer = cast(RoomsFrame, await self._ask("rooms", frame))
        return list(RoomList.from_frame(answer).rooms)

    async def search(
        self,
        q: str,
        *,
        room: str | None = None,
        peer: str | None = None,
        order: Literal["newest", "best"] = "newest",
        limit: int = 20,
        offset: int = 0,
    ) -> SearchFrame:
        """Messages you may read now whose text matches ``q`` (words, "quoted phrases",
        ``-word``; servers with a store): in ``room``, in the direct conversation with
        ``peer``, or in all; newest first or best match first. Raises :class:`HubbubError`
        when refused (``not_found`` for a conversation you may not read, ``no_store``,
        ``rate_limited``). Page on with the answer's ``next_offset`` (None: the last page)."""
        frame: SearchRequestFrame = {"type": "search", "q": q, "order": order, "limit": limit,
                                     "offset": offset}  # fmt: skip
        if room is not None:
            frame["room"] = room
        if peer is not None:
            frame["with"] = peer
        return cast(SearchFrame, await self._ask("search", frame))

    async def upload(
        self, conversation: Conversation, data: bytes, name: str, *, timeout_s: float = 300.0
    ) -> FileId:
        """Upload ``data`` as file ``name`` to attach it to a message of ``conversation`` (a
        room, or ``DM(user)``; servers with a store and file storage): asks the server where
        to (an ``upload`` frame), then sends the bytes there (``PUT`` to the server, or
        ``POST`` to an S3 bucket; in a thread, within ``timeout_s``). Returns the file's id,
        for ``send(..., attachments=[id])``. Raises :class:`HubbubError`: the server's
        refusal (``file_too_large``, ``rate_limited``, ``storage_unavailable``, ``no_store``,
        ``not_found``...), or the storage's (``file_too_large``, ``storage_unavailable``,
        ``upload_failed``)."""
        cid = new_cid()
        frame: UploadRequestFrame = {
            "type": "upload", "name": name, "size": len(data), "cid": cid,
        }  # fmt: skip
        if isinstance(conversation, DM):
            frame["with"] = conversation.user
        else:
            frame["room"] = conversation
        asked = cast(UploadFrame, await self._ask(f"upload:{cid}", frame))
        url = urljoin(_http_base(self.url), asked["url"])
        if asked["method"] == "POST":
            body, content_type = _multipart(asked["fields"], name, data)
        else:
            body, content_type = data, "application/octet-stream"
        await asyncio.to_thread(_send_bytes, asked["method"], url, body, content_type, timeout_s)
        return asked["file"]

    async def file_links(self, id: FileId) -> FileFrame:
        """Links to read file ``id`` (of a message you may read now): ``url``, ``thumbnail``
        (an image's preview, else None), absolute, and ``expires`` (epoch seconds: ask
        again after). Raises :class:`HubbubError` (``not_found`` for a file you may not
        read, ``storage_unavailable``)."""
        frame: FileRequestFrame = {"type": "file", "id": id}
        answer = cast(
            FileFrame,
            await self._ask_in_order("file", f"file:{id}", frame),
        )
        base = _http_base(self.url)
        links: FileFrame = {**answer, "url": urljoin(base, answer["url"])}
        thumbnail = answer["thumbnail"]
        links["thumbnail"] = None if thumbnail is None else urljoin(base, thumbnail)
        return links

    async def mentions(self, *, before: int | None = None, limit: int = 20) -> MentionsPage:
        """The messages that mention you (servers with a store), newest first, in
        conversations you may read now, with their text as it is now and whether each is
        ``unread``; the page's ``unread`` counts all the unread ones. Page back with
        ``before`` = the last one's ``ts`` while ``more``. Raises :class:`HubbubError`
        (``no_store``, ``rate_limited``), or ``ValueError`` for a ``limit`` out of 1-500 or a
        negative ``before``."""
        frame: MentionsRequestFrame = {
            "type": "mentions", "limit": _integer("limit", limit, 1, MENTIONS_PAGE_MAX)
        }  # fmt: skip
        if before is not None:
            frame["before"] = _integer("before", before, 0)
        return MentionsPage.from_frame(cast(MentionsFrame, await self._ask("mentions", frame)))

    async def notification_level(self, conversation: Conversation) -> NotificationSetting:
        """Your notification level of ``conversation`` (a room, or ``DM(user)``; servers with
        a store): rooms default to ``mentions``, direct conversations to ``all``."""
        frame: NotificationsRequestFrame = {"type": "notifications"}
        return await self._notifications(conversation, frame)

    async def set_notification_level(
        self,
        conversation: Conversation,
        level: NotificationLevel | None = None,
        *,
        mute_until: int | None = None,
    ) -> NotificationSetting:
        """Change your notification level of ``conversation``: ``level`` what notifies you
        (``all``; ``mentions``: mentions and direct messages; ``none``), ``mute_until``
        nothing until then (epoch ms; 0 unmutes). None leaves either as it is. Returns the
        level as it is now; raises :class:`HubbubError` (``not_found`` for a conversation you
        may not read, ``no_store``...), or ``ValueError`` for a level that does not exist or
        a time that is not one (checked here: the server's refusal of a malformed frame names
        no request to answer)."""
        frame: NotificationsRequestFrame = {"type": "notifications"}
        if level is not None:
            if level not in typing.get_args(NotificationLevel):
                raise ValueError(f"no notification level {level!r}")
            frame["level"] = level
        if mute_until is not None:
            frame["mute_until"] = _integer("mute_until", mute_until, 0)
        return await self._notifications(conversation, frame)

    async def notification_levels(self) -> list[NotificationSetting]:
        """Every conversation whose notification level or mute you changed."""
        frame: NotificationsRequestFrame = {"type": "notifications"}
        key = _notifications_key(None, None)
        answer = cast(NotificationsFrame, await self._ask_in_order("notifications", key, frame))
        return [NotificationSetting.from_frame(c) for c in answer.get("conversations", [])]

    def set_visible(self, visible: bool) -> bool:
        """Say whether this connection shows the chat to someone now (an app in the
        foreground, used in the last minutes). While one of your connections is visible,
        nothing is pushed to you. Remembered: a new connection starts not visible, so it is
        said again after every reconnect. Whether it was written now (False: not connected,
        it goes out once connected)."""
        self._visible = visible
        return self._write({"type": "visibility", "visible": visible})

    async def subscribe_push(self, subscription: Mapping[str, Any]) -> str:
        """Have the server push notifications to a browser (servers with a store and Web
        Push): ``subscription`` is its ``PushSubscription`` JSON,
        ``{"endpoint": URL, "keys": {"p256dh": K, "auth": A}}``, made with the
        ``hello``'s ``push_key``. Returns the endpoint; raises :class:`HubbubError` (an
        endpoint on no push service the server allows, ``no_store``...), or ``ValueError``
        for a subscription without endpoint or keys."""
        keys = subscription.get("keys") or {}
        endpoint, p256dh, auth = subscription.get("endpoint"), keys.get("p256dh"), keys.get("auth")
        if not (isinstance(endpoint, str) and isinstance(p256dh, str) and isinstance(auth, str)):
            raise ValueError("a push subscription has an endpoint and keys p256dh and auth")
        frame: ClientFrame = {
            "type": "push_subscribe",
            "subscription": {"endpoint": endpoint, "keys": {"p256dh": p256dh, "auth": auth}},
        }
        answer = await self._ask_in_order("push_subscribe", f"push_subscribe:{endpoint}", frame)
        return cast(PushSubscribedFrame, answer)["endpoint"]

    async def unsubscribe_push(self, endpoint: str) -> str:
        """Stop pushing to ``endpoint`` (a subscription of yours). Returns the endpoint."""
        frame: ClientFrame = {"type": "push_unsubscribe", "endpoint": endpoint}
        key = f"push_unsubscribe:{endpoint}"
        answer = await self._ask_in_order("push_unsubscribe", key, frame)
        return cast(PushUnsubscribedFrame, answer)["endpoint"]

    async def mute(self, user: str) -> HiddenUsers:
        """Mute ``user`` (servers with a store): their messages, the events on them and their
        typing are hidden from you everywhere (live, history, search, the inbox, mentions,
        notifications) until :meth:`unmute`; nothing is deleted, and everyone else sees them
        as before. Muting a blocked user leaves the block. Returns the lists as they are now
        (a :class:`~hubbub_client.events.HiddenUsers` event comes too, on every connection of
        yours); raises :class:`HubbubError`: ``bad_frame`` (yourself, or not a user name),
        ``too_many_hidden``, ``no_store``, ``store_unavailable``, ``rate_limited``."""
        return await self._hide({"type": "mute", "user": user})

    async def unmute(self, user: str) -> HiddenUsers:
        """End a mute of ``user`` (a block stays: :meth:`unblock` ends it). As :meth:`mute`."""
        return await self._hide({"type": "unmute", "user": user})

    async def block(self, user: str) -> HiddenUsers:
        """Block ``user`` (servers with a store): muted, and they cannot write to you directly
        (messages, edits, reactions, files) nor invite you to a room; you may still write to
        them. Blocking a muted user makes the mute a block. As :meth:`mute`."""
        return await self._hide({"type": "block", "user": user})

    async def unblock(self, user: str) -> HiddenUsers:
        """End a block of ``user``. As :meth:`mute`."""
        return await self._hide({"type": "unblock", "user": user})

    async def hidden(self) -> HiddenUsers:
        """Whom you mute and block (empty on a server without a store). Changes made while
        this client was disconnected are not sent to it: ask again after a reconnect
        (:class:`~hubbub_client.events.Hello`) to be sure."""
        return await self._hide({"type": "hidden"})

    async def preview(self, url: str) -> PreviewFrame:
        """The preview of link ``url`` (``http(s)://...``, at most 2048 characters) found in a
        message: ``title``, ``description`` and ``site`` as plain text (show them as text,
        never as markup), and ``image`` (``url``, absolute, to the server's file storage,
        never the site's; ``width``, ``height``; None without one). Raises
        :class:`HubbubError`: ``preview_unavailable`` (not a public address, not a page, too
        slow, nothing to show, or previews off), ``rate_limited``, ``bad_frame`` (not an
        http(s) link). The server caches previews and failures: asking again is cheap."""
        frame: PreviewRequestFrame = {"type": "preview", "url": url}
        answer = cast(PreviewFrame, await self._ask_in_order("preview", f"preview:{url}", frame))
        image = answer["image"]
        if image is None:
            return answer
        return {**answer, "image": {**image, "url": urljoin(_http_base(self.url), image["url"])}}

    async def report(self, conversation: Conversation, id: int, reason: str) -> Report:
        """Report message ``id`` of ``conversation`` (a room, or ``DM(user)``; one you may read
        now; servers with a store) to the moderators, with ``reason`` (1-500 characters).
        Returns the report as stored (reporting the same message again returns the first
        report); raises :class:`HubbubError`: ``not_found`` (no such message, deleted, or a
        conversation you may not read), ``bad_frame`` (a reason out of bounds),
        ``rate_limited``, ``no_store``."""
        frame: ReportFrame = {"type": "report", "id": id, "reason": reason}
        _set_conversation(frame, conversation)
        answer = await self._ask_in_order("report", "report", frame)
        return cast(ReportedFrame, answer)["report"]

    async def reports(
        self, *, resolved: bool = False, before: int | None = None, limit: int = 20
    ) -> ReportsFrame:
        """Moderators (a token whose ``roles`` claim holds ``"moderator"``): a page of the
        reports queue, of the conversations you may read now: open reports oldest first
        after ``before``, or with ``resolved`` resolved ones newest first before it;
        ``next`` is the ``before`` of the next page (None: the last). Raises
        :class:`HubbubError` (``forbidden`` for anyone else, ``no_store``), or ``ValueError``
        for a ``limit`` out of 1-100 or a negative ``before``."""
        frame: ReportsRequestFrame = {
            "type": "reports", "resolved": resolved,
            "limit": _integer("limit", limit, 1, REPORTS_PAGE_MAX),
        }  # fmt: skip
        if before is not None:
            frame["before"] = _integer("before", before, 0)
        return cast(ReportsFrame, await self._ask_in_order("reports", "reports", frame))

    async def resolve(self, id: int, action: Literal["dismiss", "delete"]) -> Report:
        """Moderators: resolve report ``id``: ``dismiss`` it, or ``delete`` its message
        (everyone in the conversation gets ``deleted``). Returns the report as it is now (one
        resolved already: as it was); raises :class:`HubbubError` (``forbidden``,
        ``not_found`` for a report you may not read), or ``ValueError`` for another action."""
        if action not in ("dismiss", "delete"):
            raise ValueError(f"no action {action!r}: dismiss or delete")
        frame: ClientFrame = {"type": "resolve", "id": id, "action": action}
        answer = await self._ask_in_order("resolve", f"resolve:{id}", frame)
        return cast(ResolvedFrame, answer)["report"]

    async def kick(self, user: str, reason: str | None = None) -> None:
        """Moderators: close every connection of ``user`` on every server (close code 4003;
        they may reconnect), with ``reason`` (at most 200 characters) in the close. Returns
        once done; raises :class:`HubbubError` (``forbidden``, ``broker_unavailable``)."""
        frame: KickFrame = {"type": "kick", "user": user}
        if reason is not None:
            frame["reason"] = reason
        await self._ask_in_order("kick", f"kick:{user}", frame)

    async def ban(self, user: str, duration_s: float, reason: str | None = None) -> None:
        """Moderators: close ``user``'s connections and refuse new ones for ``duration_s``
        seconds (at most 10 years), with ``reason`` (at most 200 characters). Returns once
        done; raises :class:`HubbubError` (``forbidden``, ``broker_unavailable``), or
        ``ValueError`` for a duration out of bounds."""
        if isinstance(duration_s, bool) or not 0 < duration_s <= BAN_MAX_S:
            raise ValueError(f"duration_s must be above 0 and at most {BAN_MAX_S}")
        frame: BanFrame = {"type": "ban", "user": user, "duration_s": duration_s}
        if reason is not None:
            frame["reason"] = reason
        await self._ask_in_order("ban", f"ban:{user}", frame)

    async def inbox(self) -> Inbox:
        """Your conversations (servers with a store). The next ``inbox`` frame answers: the
        one the server sends by itself after ``hello`` may be it."""
        answer = cast(InboxFrame, await self._ask("inbox", {"type": "inbox"}))
        return Inbox.from_frame(answer, self.user)

    # -- internals: requests ---------------------------------------------------------------

    async def _notifications(
        self, conversation: Conversation, frame: NotificationsRequestFrame
    ) -> NotificationSetting:
        if isinstance(conversation, DM):
            frame["with"] = conversation.user
            key = _notifications_key(None, conversation.user)
        else:
            frame["room"] = conversation
            key = _notifications_key(conversation, None)
        answer = await self._ask_in_order("notifications", key, frame)
        return NotificationSetting.from_frame(cast(NotificationSettingFrame, answer))

    async def _hide(self, frame: HideFrame) -> HiddenUsers:
        """Write ``frame`` and return the ``hidden`` frame that answers it. The server answers
        a connection's frames in order, but also sends ``hidden`` by itself when the lists
        change elsewhere, which may come first: a ``hidden`` frame answers the oldest request
        waiting only when its lists can be that request's answer (:func:`_answers_hide`);
        any other is only the event. A refusal (its type as ``ref``) answers the oldest."""
        answer = await self._ask("hidden", frame, on_write=lambda: self._hiding.append(frame))
        return HiddenUsers.from_frame(cast(HiddenFrame, answer))

    def _answer_hide(self, value: HiddenUsers | HubbubError) -> bool:
        """Hand a ``hidden`` frame or a refusal of a hide request to the oldest one waiting;
        whether one took it."""
        if not self._hiding:
            return False
        if isinstance(value, HiddenUsers):
            if not _answers_hide(self._hiding[0], value):
                return False
            self._hiding.popleft()
            return self._answer("hidden", cast(AnyFrame, value.raw))
        self._hiding.popleft()
        return self._answer("hidden", value)

    def _send_acked(self, frame: AckedFrame) -> AckFuture:
        _encode(frame).encode()  # a text that cannot be sent fails here, not on the socket
        cid = frame["cid"]
        known = self._pending.get(cid)
        if known is not None and not known.future.done():
            known.frame = frame  # the same cid again: one future, the newest frame
            self._write_pending(cid)
            return known.future
        future = AckFuture(loop=asyncio.get_running_loop())
        future.cid = cid
        _quiet(future)
        if self.state == "closed":
            future.set_exception(ClientClosedError("the client is closed", cid=cid))
            return future
        pending = _Pending(frame, future)
        self._pending[cid] = pending
        future.add_done_callback(lambda _: self._forget(cid, pending))
        self._write_pending(cid)
        return future

    def _forget(self, cid: Cid, pending: _Pending) -> None:
        if self._pending.get(cid) is pending:
            del self._pending[cid]
        if pending.timer is not None:
            pending.timer.cancel()

    def _write_pending(self, cid: Cid) -> None:
        """Write a pending send if the connection is open, and time its ack from now."""
        pending = self._pending.get(cid)
        if pending is None or not self._write(pending.frame):
            return
        if pending.timer is not None:
            pending.timer.cancel()
        pending.timer = asyncio.get_running_loop().call_later(
            self.ack_timeout_s, self._settle, cid, AckTimeoutError(cid)
        )

    def _settle(self, cid: Cid, outcome: Ack | HubbubError) -> None:
        pending = self._pending.pop(cid, None)
        if pending is None:
            return
        if pending.timer is not None:
            pending.timer.cancel()
        if pending.future.done():
            return
        if isinstance(outcome, HubbubError):
            pending.future.set_exception(outcome)
        else:
            pending.future.set_result(outcome)

    async def _ask(
        self, key: str, frame: ClientFrame, on_write: Callable[[], None] | None = None
    ) -> AnyFrame:
        """Write ``frame`` once the connection is open and wait for its answer, paired by
        ``key`` in the order asked (the server answers a connection's frames in order).
        ``on_write``: called as the frame is written."""
        try:
            async with asyncio.timeout(self.request_timeout_s):
                await self.wait_open()
                future: asyncio.Future[AnyFrame] = asyncio.get_running_loop().create_future()
                self._answers.setdefault(key, deque()).append(future)
                if self._write(frame) and on_write is not None:
                    on_write()
                return await future
        except TimeoutError as exc:
            if isinstance(exc, HubbubError):
                raise
            raise HubbubTimeoutError(f"no answer to {frame['type']!r} in time") from None

    async def _ask_in_order(self, ref: str, key: str, frame: ClientFrame) -> AnyFrame:
        """:meth:`_ask`, noting ``key`` in the order written: a refusal of ``ref`` that names
        no key answers the oldest (:meth:`_answer_in_order`)."""
        return await self._ask(
            key, frame, on_write=lambda: self._asks.setdefault(ref, deque()).append(key)
        )

    def _answer_in_order(self, ref: str, key: str | None, value: AnyFrame | HubbubError) -> bool:
        """Hand ``value`` to the request of type ``ref`` waiting on ``key``; an error that
        names none of them (``key`` None, or not asked) goes to the oldest of its type."""
        keys = self._asks.get(ref, deque())
        if key is not None and key in keys:
            keys.remove(key)
        elif isinstance(value, HubbubError):
            key = keys.popleft() if keys else None
        if not keys:
            self._asks.pop(ref, None)
        # (An answer to no request asked: a late one, taken by the request that gave up.)
        return key is not None and self._answer(key, value)

    def _answer(self, key: str, value: AnyFrame | HubbubError, every: bool = False) -> bool:
        """Hand ``value`` to the oldest request waiting on ``key`` (every one: ``every``);
        whether one was waiting. A request that gave up still takes its answer."""
        waiting = self._answers.get(key)
        if not waiting:
            return False
        futures = list(waiting) if every else [waiting.popleft()]
        if every or not waiting:
            del self._answers[key]
        for future in futures:
            if future.done():
                continue
            if isinstance(value, HubbubError):
                future.set_exception(value)
            else:
                future.set_result(value)
        return True

    async def _direct_page(
        self, user: str, *, before: int | None, after: int | None, limit: int
    ) -> HistoryFrame:
        frame: HistoryRequestFrame = {"type": "history", "with": user, "limit": limit}
        if before is not None:
            frame["before"] = before
        if after is not None:
            frame["after"] = after
        return cast(HistoryFrame, await self._ask(_history_key(None, user), frame))

    async def _catch_up_direct(self, user: str) -> None:
        """After a reconnect (or a ``resync`` of direct messages): fetch the direct messages
        with ``user`` that came meanwhile."""
        after = self.last_direct.get(user)
        while True:
            page = await self._direct_page(user, before=None, after=after, limit=100)
            if page.get("recovered") is False:
                # Some cannot be vouched for: deliver the newest page, and say so.
                newest = await self._direct_page(user, before=None, after=None, limit=100)
                for frame in newest["messages"]:
                    self._deliver_direct(frame)
                self._emit(Resync(to=user))
                return
            for frame in page["messages"]:
                self._deliver_direct(frame)
            if not page["more"] or not page["messages"]:
                return
            after = page["messages"][-1]["id"]

    def _spawn_catch_up(self, user: str, resync_on_failure: bool) -> None:
        async def catch_up() -> None:
            try:
                await self._catch_up_direct(user)
            except HubbubError as exc:
                # A later reconnect tries again; after a resync, say what may be missing.
                logger.info("catching up direct messages with %s: %s", user, exc)
                if resync_on_failure:
                    self._emit(Resync(to=user))

        task = asyncio.get_running_loop().create_task(catch_up())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- internals: the connection ---------------------------------------------------------

    async def _run(self) -> None:
        try:
            while not self._stopped:
                self._set_state("connecting" if self._attempt == 0 else "reconnecting")
                try:
                    code, reason = await self._session()
                finally:
                    self._end_session()
                if self._stopped:
                    return
                if code in TERMINAL_CLOSE_CODES:
                    self._stopped = True
                    self._fail_everything(ClientClosedError(f"closed by the server ({code})"))
                    self._set_state("closed", code=code, reason=reason or "closed by the server")
                    return
                delay = backoff_delay(self._attempt, self.base_delay_s, self.max_delay_s)
                self._attempt += 1
                self._set_state("reconnecting", delay_s=delay, code=code, reason=reason)
                await asyncio.sleep(delay)
        except Exception:  # a bug here must not leave the client silently dead
            logger.exception("the Hubbub client failed")
            self._stopped = True
            self._fail_everything(ClientClosedError("the client failed"))
            self._set_state("closed", code=ABNORMAL_CLOSURE, reason="the client failed")

    async def _session(self) -> tuple[int, str]:
        """One connection, from opening to its end: the close code and reason."""
        try:
            ws = await connect(
                self._ws_url, open_timeout=self.open_timeout_s, ping_interval=None,
                close_timeout=2, max_size=self.max_size,
                user_agent_header=f"hubbub-client-python/{VERSION}",
            )  # fmt: skip
        except Exception as exc:  # refused, unreachable, an HTTP status instead of 101...
            return ABNORMAL_CLOSURE, f"cannot connect: {exc!r}"
        out: asyncio.Queue[str] = asyncio.Queue()
        self._ws, self._out = ws, out
        writer = asyncio.get_running_loop().create_task(self._writer(ws, out))
        try:
            auth: AuthFrame = {"type": "auth"}
            if self.get_token is not None:
                try:
                    auth["token"] = await self._token()
                except Exception as exc:
                    self._emit(ClientError(code="token_unavailable", message=repr(exc)))
                    return ABNORMAL_CLOSURE, "token unavailable"
            else:
                if self.name:
                    auth["name"] = self.name
                if self.guest_key:
                    auth["guest"] = self.guest_key
            out.put_nowait(_encode(auth))
            return await self._read(ws)
        finally:
            writer.cancel()
            if ws.state is not State.CLOSED:
                ws.transport.abort()

    async def _read(self, ws: ClientConnection) -> tuple[int, str]:
        deadline: float | None = self.open_timeout_s  # for hello
        while True:
            try:
                async with asyncio.timeout(deadline):
                    data = await ws.recv()
            except TimeoutError:
                silent = "no hello" if self.state != "open" else "no heartbeat"
                logger.info("%s from the server in %.1f s: reconnecting", silent, deadline)
                ws.transport.abort()
                return NO_HEARTBEAT, f"{silent} from the server"
            except ConnectionClosed as exc:
                if exc.rcvd is not None:
                    return exc.rcvd.code, exc.rcvd.reason
                return ABNORMAL_CLOSURE, "connection lost"
            if isinstance(data, str):
                for line in data.split("\n"):
                    if line:
                        self._handle_line(line)
            deadline = self._silence_limit()

    def _silence_limit(self) -> float | None:
        """How long the server may stay silent: its ping interval, the time it gives us to
        answer, and slack."""
        if self.hello is None or self.state != "open":
            return self.open_timeout_s
        limits = self.hello.limits
        try:
            interval = float(limits["heartbeat_interval_s"]) + float(limits["heartbeat_timeout_s"])
        except (KeyError, TypeError, ValueError):
            return None
        return interval + self.heartbeat_slack_s

    async def _writer(self, ws: ClientConnection, out: asyncio.Queue[str]) -> None:
        while True:
            data = await out.get()
            try:
                await ws.send(data)
            except ConnectionClosed:
                return  # the read loop sees the close too
            except Exception:
                logger.exception("cannot write a frame")

    def _write(self, frame: ClientFrame) -> bool:
        """Queue ``frame`` for the socket if the connection is open; whether it was."""
        if self.state != "open" or self._out is None:
            return False
        data = _encode(frame)
        data.encode()  # a text that cannot be sent (a lone surrogate) fails here
        self._out.put_nowait(data)
        return True

    async def _token(self) -> str:
        assert self.get_token is not None
        token = self.get_token()
        if inspect.isawaitable(token):
            return await token
        return token

    def _end_session(self) -> None:
        """The connection is gone: answers will not come, acks are timed again once resent."""
        self._ws, self._out = None, None
        if self._stable is not None:
            self._stable.cancel()
            self._stable = None
        self._fail_answers(ConnectionLostError())
        for pending in self._pending.values():
            if pending.timer is not None:
                pending.timer.cancel()
                pending.timer = None

    def _fail_answers(self, error: HubbubError) -> None:
        self._asks.clear()
        self._hiding.clear()
        answers, self._answers = self._answers, {}
        for waiting in answers.values():
            for future in waiting:
                if not future.done():
                    future.set_exception(error)

    def _fail_everything(self, error: ClientClosedError) -> None:
        self._fail_answers(error)
        for cid in list(self._pending):
            self._settle(cid, ClientClosedError(error.message, cid=cid))
        waiters, self._join_waiters = self._join_waiters, {}
        for futures in waiters.values():
            for future in futures:
                if not future.done():
                    future.set_exception(error)
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()

    def _later(self, delay: float, callback: Callable[[], None]) -> None:
        def run() -> None:
            self._timers.discard(handle)
            if not self._stopped:
                callback()

        handle = asyncio.get_running_loop().call_later(delay, run)
        self._timers.add(handle)

    def _reset_attempts(self) -> None:
        self._attempt = 0

    def _set_state(
        self,
        state: ConnectionState,
        *,
        delay_s: float | None = None,
        code: int | None = None,
        reason: str | None = None,
    ) -> None:
        if state == self.state and delay_s is None and code is None:
            return
        self.state = state
        self._emit(StateChange(state=state, delay_s=delay_s, code=code, reason=reason))
        for states, future in list(self._state_waiters):
            if state in states and not future.done():
                future.set_result(state)
        if state == "closed":
            for stream in list(self._streams):
                stream._end()

    # -- internals: frames -----------------------------------------------------------------

    def _handle_line(self, line: str) -> None:
        try:
            frame = json.loads(line)
            if isinstance(frame, dict):
                self._handle(frame)
        except Exception:  # one odd frame must not end the connection
            logger.exception("cannot handle a frame from the server: %.200s", line)

    def _handle(self, frame: AnyFrame) -> None:
        kind = frame.get("type")
        if kind == "hello":
            self._hello(cast(HelloFrame, frame))
        elif kind == "ping":
            self._write({"type": "pong"})
        elif kind == "refresh":
            if self.get_token is not None:
                task = asyncio.get_running_loop().create_task(self._refresh())
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        elif kind in ("message", "edited", "deleted", "reaction"):
            # Messages and the events on them share one id sequence per conversation.
            room = frame.get("room")
            if room is None:
                self._deliver_direct(cast(MessageFrame, frame))
            elif frame["id"] > self.last_id.get(room, 0):  # else: delivered already
                self.last_id[room] = frame["id"]
                self._emit_numbered(self._numbered_event(frame))
        elif kind == "history":
            self._answer(_history_key(frame.get("room"), frame.get("with")), frame)
        elif kind == "search":
            self._answer("search", frame)
        elif kind == "upload":
            self._answer(f"upload:{frame.get('cid')}", frame)
        elif kind == "file":
            self._answer_in_order("file", f"file:{frame['id']}", frame)
        elif kind == "mentions":
            self._answer("mentions", frame)
        elif kind == "notifications":
            listed = "conversations" in frame  # the answer to notification_levels()
            key = _notifications_key(None if listed else frame.get("room"),
                                     None if listed else frame.get("with"))  # fmt: skip
            self._answer_in_order("notifications", key, frame)
        elif kind in ("push_subscribed", "push_unsubscribed"):
            ref = "push_subscribe" if kind == "push_subscribed" else "push_unsubscribe"
            self._answer_in_order(ref, f"{ref}:{frame.get('endpoint')}", frame)
        elif kind in _IN_ORDER_ANSWERS:
            ref = _IN_ORDER_ANSWERS[kind]
            self._answer_in_order(ref, _answer_key(ref, frame), frame)
        elif kind == "hidden":
            hidden = HiddenUsers.from_frame(cast(HiddenFrame, frame))
            self._answer_hide(hidden)
            self._emit(hidden)
        elif kind == "inbox":
            self._inbox(cast(InboxFrame, frame))
        elif kind == "joined":
            self._joined(cast(JoinedFrame, frame))
        elif kind == "ack":
            ack = Ack.from_frame(cast(AckFrame, frame))
            self._settle(ack.cid, ack)
            self._emit(ack)
        elif kind == "error":
            self._error(cast(ErrorFrame, frame))
        elif kind == "left":
            left = Left.from_frame(cast(LeftFrame, frame))
            if left.reason == "removed":  # out of a private room's members: not rejoined
                self.rooms.discard(left.room)
                self.last_id.pop(left.room, None)
            self._emit(left)
        elif kind == "room":
            self._answer(f"room:{frame['room']}", frame)
            self._emit(RoomInfo.from_frame(cast(RoomFrame, frame)))
        elif kind == "rooms":
            self._answer("rooms", frame)
            self._emit(RoomList.from_frame(cast(RoomsFrame, frame)))
        elif kind == "member":
            self._emit(MemberChanged.from_frame(cast(MemberFrame, frame)))
        elif kind == "invited":
            self._emit(Invited.from_frame(cast(InvitedFrame, frame)))
        elif kind == "presence":
            self._emit(Presence.from_frame(cast(PresenceFrame, frame)))
        elif kind == "typing":
            self._emit(Typing.from_frame(cast(TypingNoticeFrame, frame)))
        elif kind == "receipt":
            self._emit(Receipt.from_frame(cast(ReceiptFrame, frame)))
        elif kind == "receipts":
            self._emit(Receipts.from_frame(cast(ReceiptsFrame, frame)))
        elif kind == "authenticated":
            self._emit(Authenticated.from_frame(cast(AuthenticatedFrame, frame)))
        # pong, and the frame types of newer servers: nothing to do

    def _hello(self, frame: HelloFrame) -> None:
        hello = Hello.from_frame(frame)
        self.hello = hello
        if hello.guest:
            self.guest_key = hello.guest  # made for us: reconnect as the same guest
        self._set_state("open")
        self._stable = asyncio.get_running_loop().call_later(
            self.stable_after_s, self._reset_attempts
        )
        self._emit(hello)
        if self._visible:  # a new connection is not visible until it says so
            self._write({"type": "visibility", "visible": True})
        for room in self.rooms:
            self._join_frame(room)
        for cid in list(self._pending):
            self._write_pending(cid)
        for user in list(self.last_direct):
            self._spawn_catch_up(user, resync_on_failure=False)

    def _joined(self, frame: JoinedFrame) -> None:
        joined = Joined.from_frame(frame)
        # A room with no message for us yet: recover from where it stood at the join.
        if joined.last is not None and joined.room not in self.last_id:
            self.last_id[joined.room] = joined.last
        for future in self._join_waiters.pop(joined.room, []):
            if not future.done():
                future.set_result(joined)
        self._emit(joined)
        if joined.recovered is False:
            self._emit(Resync(room=joined.room))

    def _inbox(self, frame: InboxFrame) -> None:
        for entry in frame["conversations"]:
            peer = entry.get("with")
            if peer is not None and peer not in self.last_direct:
                # Where a reconnect's catch-up of this conversation starts.
                last = entry.get("last")
                self.last_direct[peer] = last["id"] if last else entry.get("read", 0)
        self._answer("inbox", cast(AnyFrame, frame), every=True)
        self._emit(Inbox.from_frame(frame, self.user))

    def _error(self, frame: ErrorFrame) -> None:
        code, ref, room, cid = frame["code"], frame.get("ref"), frame.get("room"), frame.get("cid")
        if code == "resync" and room is not None:
            # The server lost track of the room: rejoin it from our position (a Resync event
            # follows if that cannot be recovered).
            self._join_frame(room)
            return
        if code == "resync" and frame.get("to") is not None:
            for user in list(self.last_direct):
                self._spawn_catch_up(user, resync_on_failure=True)
            return
        error = HubbubError(code, frame.get("message", ""), frame)
        answered = False
        if ref == "history":
            answered = self._answer(_history_key(room, frame.get("with")), error)
        elif ref in ("create", "describe", "invite", "remove") and room is not None:
            answered = self._answer(f"room:{room}", error)
        elif ref in ("rooms", "inbox", "search", "mentions"):
            answered = self._answer(ref, error, every=ref == "inbox")
        elif ref == "upload" and cid is not None:
            answered = self._answer(f"upload:{cid}", error)
        elif ref in ("file", "notifications", "push_subscribe", "push_unsubscribe"):
            # Most name no request: the oldest is answered (answers come in order). A refused
            # ``notifications`` of a conversation names it.
            named = ref == "notifications" and (room is not None or "with" in frame)
            key = _notifications_key(room, frame.get("with")) if named else None
            answered = self._answer_in_order(ref, key, error)
        elif ref in ("mute", "unmute", "block", "unblock", "hidden"):
            answered = self._answer_hide(error)
        elif ref is not None and ref in _IN_ORDER_ANSWERS.values():
            answered = self._answer_in_order(ref, None, error)  # names none: the oldest
        elif ref == "join" and room is not None:
            if code in RETRY_JOIN_CODES:
                # The join did not happen: try again later, or the room stays silent.
                self._later(self.retry_s, lambda: self._rejoin(room))
            else:
                self.rooms.discard(room)
                self.last_id.pop(room, None)
                for future in self._join_waiters.pop(room, []):
                    if not future.done():
                        future.set_exception(error)
        if cid is not None and code == "broker_unavailable":
            # Not published: the same cid again in a moment.
            self._later(self.retry_s, lambda: self._write_pending(cid))
        elif cid is not None:
            self._settle(cid, error)  # refused for good (too long, not joined...)
        if not answered:
            self._emit(ServerError.from_frame(frame))

    def _rejoin(self, room: str) -> None:
        if room in self.rooms:
            self._join_frame(room)

    def _join_frame(self, room: str) -> None:
        frame: JoinFrame = {"type": "join", "room": room}
        since = self.last_id.get(room)
        if since is not None:
            frame["since"] = since
        self._write(frame)

    def _numbered_event(
        self, frame: AnyFrame
    ) -> Message | DirectMessage | Edited | Deleted | Reaction:
        kind, me = frame["type"], self.user
        if kind == "edited":
            return Edited.from_frame(cast(EditedFrame, frame), me)
        if kind == "deleted":
            return Deleted.from_frame(cast(DeletedFrame, frame), me)
        if kind == "reaction":
            return Reaction.from_frame(cast(ReactionFrame, frame), me)
        if "room" in frame:
            return Message.from_frame(cast(MessageFrame, frame))
        return DirectMessage.from_frame(cast(MessageFrame, frame), me)

    def _deliver_direct(self, frame: MessageFrame | AnyFrame) -> None:
        message_id: int = frame["id"]
        if message_id in self._seen_direct:
            return
        self._seen_direct[message_id] = None
        if len(self._seen_direct) > 1000:
            del self._seen_direct[next(iter(self._seen_direct))]
        user, to = frame["user"], frame.get("to")
        peer = to if user == self.user else user
        if peer is not None and message_id > self.last_direct.get(peer, 0):
            self.last_direct[peer] = message_id
        self._emit_numbered(self._numbered_event(cast(AnyFrame, frame)))

    def _emit_numbered(self, event: Message | DirectMessage | Edited | Deleted | Reaction) -> None:
        """Emit a message or an event on one; then :class:`Mentioned` for a message of
        someone else that mentions this user or ``here``."""
        self._emit(event)
        if isinstance(event, Message | DirectMessage) and event.mentions_user(self.user):
            self._emit(Mentioned(message=event, raw=event.raw))

    async def _refresh(self) -> None:
        """The token expires soon: hand the server a new one (same user)."""
        try:
            token = await self._token()
        except Exception as exc:
            self._emit(ClientError(code="token_unavailable", message=repr(exc)))
            return
        self._write({"type": "auth", "token": token})


def _with_options(
    frame: SendFrame,
    reply_to: int | None,
    attachments: Sequence[FileId] | None,
    traceparent: str | None,
) -> SendFrame:
    if reply_to is not None:
        frame["reply_to"] = reply_to
    if attachments:
        frame["attachments"] = list(attachments)
    if traceparent is not None:
        frame["traceparent"] = traceparent
    return frame


def _integer(name: str, value: int, low: int, high: int = 2**53) -> int:
    """``value`` if it is an integer in [low, high], else ValueError."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} must be an integer from {low} to {high}, not {value!r}")
    return value


def _notifications_key(room: str | None, peer: str | None) -> str:
    """Where the answers to ``notifications`` frames are paired: per conversation; ``*``: the
    list of those you changed."""
    if room is not None:
        return f"notifications:{room}"
    return f"notifications:@{peer}" if peer is not None else "notifications:*"


def _answers_hide(frame: HideFrame, lists: HiddenUsers) -> bool:
    """Whether ``lists`` can be the answer to ``frame``: the lists as they are after it
    (``mute``: the user muted or blocked; ``block``: blocked; ``unmute``: not muted;
    ``unblock``: not blocked; the request for the lists: any). A ``hidden`` frame that cannot
    is one the server sent by itself."""
    if frame["type"] == "hidden":
        return True
    user = frame["user"]
    if frame["type"] == "mute":
        return user in lists.muted or user in lists.blocked
    if frame["type"] == "block":
        return user in lists.blocked
    if frame["type"] == "unmute":
        return user not in lists.muted
    return user not in lists.blocked


def _answer_key(ref: str, frame: AnyFrame) -> str:
    """Where the answers to the requests of ``_IN_ORDER_ANSWERS`` are paired: per link, report
    or user where the answer names one; else one key per request type."""
    if ref == "preview":
        return f"preview:{frame.get('url')}"
    if ref == "resolve":
        return f"resolve:{frame.get('report', {}).get('id')}"
    if ref in ("kick", "ban"):
        return f"{ref}:{frame.get('user')}"
    return ref


def _history_key(room: str | None, peer: str | None) -> str:
    """Where the answers to ``history`` frames are paired: per conversation, in order."""
    return f"history:{room}" if room is not None else f"history:@{peer}"


def _set_conversation(
    frame: EditFrame | DeleteFrame | ReactFrame | ReadFrame | ReportFrame,
    conversation: Conversation,
) -> None:
    if isinstance(conversation, DM):
        frame["with"] = conversation.user
    else:
        frame["room"] = conversation


def _quiet(future: asyncio.Future[Any]) -> None:
    """A caller that never awaits the future (fire and forget) leaves no "exception never
    retrieved" log behind; one that awaits it still gets the exception."""
    future.add_done_callback(lambda f: f.cancelled() or f.exception())
