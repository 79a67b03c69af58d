"""Hub: this worker's connections, the rooms they are in, and local fan-out.

One Hub per worker. It is the broker's :class:`~app.broker.BrokerHandler` and never awaits a
socket: delivering a message is a loop of :meth:`Connection.offer
<app.connection.Connection.offer>` calls, each a bounded append. It subscribes the broker to a
room when the room's first local member joins and unsubscribes when the last one leaves (and
likewise to a user's direct messages), so a worker hears only what its clients need. It tells
the broker of presence changes per (room, user), however many tabs the user has here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter

from app.broker import Broker
from app.connection import Connection
from app.errors import BrokerUnavailable, CloseCode, ErrorCode
from app.metrics import Metrics
from app.protocol import error_frame, joined_frame

logger = logging.getLogger(__name__)

_Buffer = list[tuple[str, int]]


class Hub:
    """Rooms → local connections, users → local connections, and every open connection."""

    def __init__(self, broker: Broker, max_connections: int, metrics: Metrics) -> None:
        self._broker = broker
        self._metrics = metrics
        self._max_connections = max_connections
        self._rooms: dict[str, set[Connection]] = {}
        # Connections between "subscribed" and "history replayed": live frames wait here.
        self._joining: dict[str, dict[Connection, _Buffer]] = {}
        self._users: dict[str, set[Connection]] = {}
        self._present: Counter[tuple[str, str]] = Counter()
        # Newest message id delivered per room, and rooms catching up after a broker outage
        # (their live frames wait here until the missed ones have been delivered).
        self._last_id: dict[str, int] = {}
        self._catching_up: dict[str, _Buffer] = {}
        self._catch_up_task: asyncio.Task[None] | None = None
        self.connections: set[Connection] = set()
        self.draining = False

    # -- delivery (called by the broker; never awaits) ---------------------------------------

    def deliver_room(self, room: str, payload: bytes) -> None:
        """Queue ``payload`` (one encoded frame) on every local member of ``room``.

        The payload is decoded once for all recipients. Offers never change membership (a slow
        consumer's close happens later, in its own task), so iterating is safe.
        """
        frame = payload.decode()
        nbytes = len(payload)
        if self._catching_up and room in self._catching_up:
            self._catching_up[room].append((frame, nbytes))
        else:
            self._offer_members(room, frame, nbytes)
        if self._joining:
            for buffer in self._joining.get(room, {}).values():
                buffer.append((frame, nbytes))

    def _offer_members(self, room: str, frame: str, nbytes: int) -> None:
        members = self._rooms.get(room)
        if members:
            message_id = _message_id(frame)
            if message_id is not None:
                self._last_id[room] = message_id
                self._metrics.delivered_since_sync += len(members)
            for conn in members:
                conn.offer(frame, nbytes)

    def resubscribed(self) -> None:
        """After a broker outage, fetch what each room missed and deliver it, in order,
        before the live frames that arrive meanwhile (see :meth:`_catch_up`)."""
        if self._catch_up_task is None or self._catch_up_task.done():
            self._catch_up_task = asyncio.create_task(self._catch_up(), name="catch-up")

    async def _catch_up(self) -> None:
        """Deliver, room by room, the messages published while this worker was not
        subscribed (from the broker's history), then the live frames held back meanwhile,
        minus those the history already held. A room whose gap is not in the history any
        more gets a ``resync`` error frame: its members must reload it."""
        rooms = [room for room in self._rooms if room in self._last_id]
        for room in rooms:
            self._catching_up[room] = []
        for room in rooms:
            try:
                history = await self._broker.history_since(room, self._last_id[room])
            except BrokerUnavailable:
                history = None
            held = self._catching_up.pop(room)
            if history is None or not history.recovered:
                error = error_frame(
                    ErrorCode.RESYNC,
                    "messages of this room may have been missed: rejoin it with since",
                    {"room": room},
                )
                members = self._rooms.get(room, ())
                self._metrics.error_sent(ErrorCode.RESYNC, len(members))
                for conn in members:
                    conn.offer(error)
            else:
                for payload in history.frames:
                    self._offer_members(room, payload.decode(), len(payload))
            last = self._last_id.get(room, 0)
            for frame, nbytes in held:
                message_id = _message_id(frame)
                if message_id is None or message_id > last:
                    self._offer_members(room, frame, nbytes)
        logger.info("caught up %d rooms after a broker outage", len(rooms))

    def deliver_user(self, user: str, payload: bytes) -> None:
        """Queue a direct message on every local connection of ``user``."""
        conns = self._users.get(user)
        if conns:
            frame, nbytes = payload.decode(), len(payload)
            self._metrics.delivered_since_sync += len(conns)
            for conn in conns:
                conn.offer(frame, nbytes)

    def kick(self, user: str, reason: str) -> None:
        """Close every local connection of ``user`` with 4003 (moderation)."""
        for conn in list(self._users.get(user, ())):
            conn.close(CloseCode.FORBIDDEN, reason)

    # -- connections ------------------------------------------------------------------------

    def add(self, conn: Connection) -> bool:
        """Register a new connection; False when this worker is at ``max_connections``."""
        if len(self.connections) >= self._max_connections:
            return False
        self.connections.add(conn)
        return True

    async def register_user(self, conn: Connection) -> None:
        """Route direct messages for ``conn.user`` here (first local connection subscribes)."""
        conns = self._users.setdefault(conn.user, set())
        conns.add(conn)
        if len(conns) == 1:
            await self._broker.subscribe_user(conn.user)

    async def remove(self, conn: Connection) -> None:
        """Unregister ``conn``: out of every room, and out of its user's routing."""
        self.connections.discard(conn)
        for room in list(conn.rooms):
            await self.leave(conn, room)
        conns = self._users.get(conn.user)
        if conns is not None and conn in conns:
            conns.discard(conn)
            if not conns:
                del self._users[conn.user]
                await self._broker.unsubscribe_user(conn.user)

    # -- rooms ------------------------------------------------------------------------------

    async def join(self, conn: Connection, room: str, since: int | None) -> None:
        """Put ``conn`` in ``room`` and queue its ``joined`` frame, then (with ``since``) the
        missed messages, then live ones: no gap, no duplicate, in id order.

        Raises :class:`BrokerUnavailable` (and ``conn`` is not in the room) when the broker is
        down. Subscribing comes before reading history; live frames that arrive meanwhile are
        buffered and released after the replay, minus those the replay already held. Without
        ``since``, ``joined`` carries ``last``: every message with a larger id reaches the
        client live, so ``last`` is the ``since`` to rejoin with until a message has come.
        """
        if not self._broker.ready:
            raise BrokerUnavailable("the broker is not connected")
        first_here = room not in self._rooms and room not in self._joining
        buffer: _Buffer = []
        self._joining.setdefault(room, {})[conn] = buffer
        conn.rooms.add(room)
        key = (room, conn.user)
        counted = False
        try:
            if first_here:
                await self._broker.subscribe_room(room)
            history = None if since is None else await self._broker.history_since(room, since)
            last = await self._broker.last_id(room) if since is None else None
            self._present[key] += 1
            counted = True
            if self._present[key] == 1:
                await self._broker.presence_join(room, conn.user)
            presence = await self._broker.presence(room)
        except BaseException:
            if counted:
                self._present[key] -= 1
                if self._present[key] == 0:
                    del self._present[key]
                    # Undo a presence entry that may have been made, or it would be refreshed
                    # for a user who is not here.
                    with contextlib.suppress(BrokerUnavailable):
                        await self._broker.presence_leave(room, conn.user)
            self._stop_joining(conn, room)
            await self.leave(conn, room)
            raise
        # From here on nothing awaits: the replay and the buffered frames go out in one piece.
        self._stop_joining(conn, room)
        self._rooms.setdefault(room, set()).add(conn)
        recovered = None if history is None else history.recovered
        self._metrics.join_room_size.observe(presence.count)
        if last is not None:
            # Messages published between the subscription and the read of `last` come live,
            # from the buffer: `last` must stay below them, or a client would skip them.
            live = (_message_id(frame) for frame, _ in buffer)
            first_live = next((mid for mid in live if mid is not None), None)
            if first_live is not None:
                last = min(last, first_live - 1)
        conn.offer(joined_frame(room, recovered, presence.count, presence.users, last))
        last_replayed = since or 0
        if history is not None:
            for payload in history.frames:
                conn.offer(payload.decode(), len(payload))
            if history.frames:
                last_replayed = _message_id(history.frames[-1].decode()) or last_replayed
                self._last_id[room] = max(self._last_id.get(room, 0), last_replayed)
        for frame, nbytes in buffer:
            message_id = _message_id(frame)
            if history is not None and message_id is not None and message_id <= last_replayed:
                continue  # already in the replay
            conn.offer(frame, nbytes)

    def _stop_joining(self, conn: Connection, room: str) -> None:
        joining = self._joining.get(room)
        if joining is not None:
            joining.pop(conn, None)
            if not joining:
                del self._joining[room]

    async def leave(self, conn: Connection, room: str) -> None:
        """Take ``conn`` out of ``room``; the last local member out unsubscribes the broker."""
        if room not in conn.rooms:
            return
        conn.rooms.discard(room)
        members = self._rooms.get(room)
        was_member = members is not None and conn in members
        if members is not None:
            members.discard(conn)
            if not members:
                del self._rooms[room]
                self._last_id.pop(room, None)
        key = (room, conn.user)
        if was_member and self._present[key] > 0:
            self._present[key] -= 1
            if self._present[key] == 0:
                del self._present[key]
                # When the broker is down, the entry expires by itself (nobody refreshes it).
                with contextlib.suppress(BrokerUnavailable):
                    await self._broker.presence_leave(room, conn.user)
        if room not in self._rooms and room not in self._joining:
            await self._broker.unsubscribe_room(room)

    async def close(self) -> None:
        """Stop background work (a catch-up in progress)."""
        if self._catch_up_task is not None:
            self._catch_up_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._catch_up_task

    def members(self, room: str) -> frozenset[Connection]:
        return frozenset(self._rooms.get(room, ()))

    @property
    def room_count(self) -> int:
        return len(self._rooms) + len(self._joining)


def _message_id(frame: str) -> int | None:
    """The id of a ``message`` frame; None for frames without one (presence).

    Cheap on purpose (it runs once per fan-out): a message frame is ``{"type":"message",`` then
    ``"room"`` or ``"to"`` — names that cannot contain a quote — then ``"id":N,``, so the first
    ``,"id":`` is the id field.
    """
    if not frame.startswith('{"type":"message"'):
        return None
    start = frame.index(',"id":') + 6
    return int(frame[start : frame.index(",", start)])
