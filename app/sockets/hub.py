"""Hub: this worker's connections, the rooms they are in, and local fan-out.

One Hub per worker. It is the broker's :class:`~app.broker.BrokerHandler` and never awaits a
socket: delivering a message is a loop of :meth:`Connection.offer
<app.sockets.connection.Connection.offer>` calls, each a bounded append. It subscribes the broker
to a
room when the room's first local member joins and unsubscribes when the last one leaves (and
likewise to a user's direct messages), so a worker hears only what its clients need. It tells
presence (:mod:`app.presence`) of changes per (room, user), however many tabs the user has
here.

Delivery: in each room a connection is either a live member, given every message the room
hears from the broker, or behind, with a :class:`~app.sockets.replay.Replay` that brings it up to
date
from the history and then makes it live. Every join starts behind (from its ``since``, or from
the room's newest id), and when the broker's subscription is lost every member of every room
falls behind, from the newest id its room delivered: what a worker missed while it was not
subscribed is recovered room by room, in order, or reported with a ``resync`` error frame.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import operator
import time
from collections import Counter
from collections.abc import Callable, Collection, Container
from dataclasses import dataclass, field

import orjson

from app.broker import Broker, History
from app.conversations.names import notice_user
from app.errors import BrokerUnavailable, CloseCode, ErrorCode
from app.notify import VISIBLE_ROOM
from app.ops.metrics import HubSnapshot, Metrics
from app.ops.tracing import Tracing
from app.presence import Presence
from app.protocol import error_frame, joined_frame, left_frame, sender_of
from app.sockets.connection import Connection
from app.sockets.replay import HistoryPages, HistorySource, Pacing, Replay, retrieve_exception
from app.sockets.slices import Slices
from app.transport.budget import OutboxBudget

logger = logging.getLogger(__name__)

# How a ``member`` frame (app.protocol.member_frame) begins: the only frames without an id that
# deliver_room looks into.
_MEMBER_PREFIX = b'{"type":"member"'
_QUEUED_BYTES = operator.attrgetter("queued_bytes")


@dataclass(slots=True, eq=False)
class _Room:
    """One room on this worker: live members, connections still behind, and ``heard``, the id
    of the newest message the broker delivered live here (every live member has all up to it).
    """

    members: set[Connection] = field(default_factory=set)
    behind: dict[Connection, Replay] = field(default_factory=dict)
    heard: int = 0
    # A private room's: a removal notice it carries takes the removed user's connections out
    # before anything after it on the room's channel can reach them (see deliver_room).
    private: bool = False
    # Some connection here hides someone (Connection.hidden): messages are filtered. Set on
    # such a join or change, recomputed when someone unhides.
    hiding: bool = False
    # The first join's subscription, awaited by the joins that come while it is under way.
    subscribed: asyncio.Future[None] | None = None
    # The room's newest id as the broker answered a join (``last_id``) while subscribed, and
    # the subscription it was answered in: ``epoch`` counts the subscription's losses here
    # (link_lost, rooms_lost). Every message after it comes live (see Hub._known_newest).
    known: int = 0
    known_epoch: int = -1
    epoch: int = 0
    # The ``last_id`` under way, shared by the joins of its epoch that come meanwhile.
    asking: asyncio.Future[int] | None = None
    asking_epoch: int = -1

    def __bool__(self) -> bool:
        return bool(self.members or self.behind)


class Hub:
    """Rooms → local connections, users → local connections, and every open connection."""

    def __init__(
        self,
        broker: Broker,
        presence: Presence,
        max_connections: int,
        metrics: Metrics,
        pacing: Pacing,
        outbox_budget_bytes: int = 2**62,
        history: HistorySource | None = None,
        newest_known_for_s: float = 0.0,
    ) -> None:
        """``history``: where replays read (the broker's own history without it).
        ``newest_known_for_s``: how long after its time a room's newest id known here may
        answer a join instead of the broker (0: never; see :meth:`_known_newest`)."""
        self._newest_known_for_ms = newest_known_for_s * 1000
        self._broker = broker
        self._presence = presence
        self._metrics = metrics
        self._max_connections = max_connections
        self._pacing = pacing
        self._rooms: dict[str, _Room] = {}
        self._users: dict[str, set[Connection]] = {}
        self._present: Counter[tuple[str, str]] = Counter()
        self._linked = asyncio.Event()
        self._linked.set()  # clear from link_lost to resubscribed (joins check broker.ready)
        # Rooms whose subscription alone is lost (rooms_lost): set when they are back.
        self._rooms_down: dict[str, asyncio.Event] = {}
        self.pages = HistoryPages(history or broker, pacing.page)
        self.connections: set[Connection] = set()
        self.slices = Slices()  # the same connections, in the heartbeat's groups
        self._memberships = 0  # connection-in-room pairs: the sum of len(conn.rooms)
        # Every room with a connection behind in it, and perhaps some no longer (pruned by
        # behind_count): what the gauges walk each second, not every room. Only rooms here:
        # a room's name goes with it.
        self._rooms_catching_up: set[str] = set()
        self._sse_connections = 0  # of them over the HTTP fallback (counted as they come and go)
        self.draining = False
        # Users with a connection here are present in the internal room app.webhooks.ONLINE_ROOM
        # (user.online / user.offline webhooks) when this is set.
        self.online_room: str | None = None
        # Users with a visible connection here (`visibility`) are present in the internal room
        # app.notify.VISIBLE_ROOM: the notifier pushes nothing to them.
        self._visible: dict[str, int] = {}
        # Told of every room whose record changed (None: any may have: app.conversations.rooms
        # rechecks).
        self.rooms_changed: Callable[[str | None], None] = lambda room: None
        # Told of every user whose hidden users changed (None: any may have: app.access.hiding
        # reads them again).
        self.hidden_changed: Callable[[str | None], None] = lambda user: None
        # POSTs of the HTTP fallback transport routed to this worker (app.sockets.stream).
        self.routed: Callable[[bytes], None] | None = None
        # Traced messages get a `fanout` span per worker (None: tracing off, app.ops.tracing).
        self.tracing: Tracing | None = None
        # Every outbox of this worker counts here (app.transport.budget); over it, the slowest
        # are cut.
        self.outbox_budget = OutboxBudget(outbox_budget_bytes, self._cut_slowest_consumers)

    # -- delivery (called by the broker; never awaits) ---------------------------------------

    def deliver_room(self, room: str, message_id: int | None, payload: bytes) -> None:
        """Queue ``payload`` (one encoded frame: message ``message_id``, or a frame without
        an id) on every live member of ``room``, and let each connection still behind in it
        see the frame (see :meth:`Replay.hear`).

        The payload is decoded once for all recipients. Offers never change membership (a slow
        consumer's close happens later, in its own task), so iterating is safe.
        """
        state = self._rooms.get(room)
        if state is None:
            return
        if message_id is None and state.private and payload.startswith(_MEMBER_PREFIX):
            self._fence_removal(state, room, payload)
        span = None
        if self.tracing is not None and message_id is not None:
            span = self.tracing.start_fanout(payload, room)
        frame = payload.decode()
        nbytes = len(payload)
        members = state.members
        recipients = len(members)
        if not state.hiding:
            for conn in members:
                conn.offer(frame, nbytes)
        else:
            sender = sender_of(payload)
            for conn in members:
                if sender is None or sender not in conn.hidden:
                    conn.offer(frame, nbytes)
        if message_id is not None:
            state.heard = message_id
            if members:
                self._metrics.delivered_since_sync += recipients
                self._metrics.sample_fanout(message_id)  # after the offers: see its contract
        if state.behind:
            caught_up = [
                replay for replay in state.behind.values() if replay.hear(frame, nbytes, message_id)
            ]
            for replay in caught_up:
                self._make_live(state, replay)
            self._metrics.delivered_since_sync += len(caught_up)  # each was given the frame
            recipients += len(caught_up)
        if span is not None:
            span.set_attribute("hubbub.recipients", recipients)
            span.end()

    def _fence_removal(self, state: _Room, room: str, payload: bytes) -> None:
        """A private room's removal notice came on its channel: the removed user's connections
        here leave the room now, before the notice (which they get once, on their user's
        channel) and before any frame published after the removal, which the channel brings
        after it. Rechecking the members from the store (:meth:`room_changed`) comes later."""
        notice = orjson.loads(payload)
        if notice.get("event") != "removed":
            return
        user = notice.get("user")
        for conn in [c for c in (*state.members, *state.behind) if c.user == user]:
            was_present = self._detach(conn, room)
            conn.offer(left_frame(room, "removed"))
            task = asyncio.ensure_future(self._after_leave(conn, room, was_present))
            task.add_done_callback(retrieve_exception)

    def link_lost(self) -> None:
        """The broker's subscription ended: every member of every room falls behind, from the
        newest message its room delivered, until the broker is back (see
        :mod:`app.sockets.replay`)."""
        if not self._linked.is_set():
            return  # already behind since this outage began
        self._linked.clear()
        behind = 0
        for room, state in self._rooms.items():
            state.epoch += 1
            for replay in state.behind.values():
                replay.link_lost()
            if state.members:
                self._rooms_catching_up.add(room)
            for conn in state.members:
                replay = Replay(self, self._pacing, conn, room, state.heard, joined=True)
                state.behind[conn] = replay
                replay.link_lost()  # frames heard before the fetch are not kept
                replay.start(None)
                behind += 1
            state.members.clear()
        logger.warning(
            "broker subscription lost: %d rooms, %d connections fall behind",
            len(self._rooms),
            behind,
        )

    def rooms_lost(self, rooms: Collection[str]) -> None:
        """Those ``rooms``' subscription ended (on Redis Cluster, their master failed): their
        members fall behind as in :meth:`link_lost`, the other rooms go on live; each waits
        for :meth:`rooms_back` before its replay reads history."""
        behind = 0
        for room in rooms:
            if room not in self._rooms_down:
                self._rooms_down[room] = asyncio.Event()
            state = self._rooms.get(room)
            if state is None:
                continue
            state.epoch += 1
            for replay in state.behind.values():
                replay.link_lost()
            if state.members:
                self._rooms_catching_up.add(room)
            for conn in state.members:
                replay = Replay(self, self._pacing, conn, room, state.heard, joined=True)
                state.behind[conn] = replay
                replay.link_lost()
                replay.start(None)
                behind += 1
            state.members.clear()
        logger.warning(
            "broker subscription of %d rooms lost: %d connections fall behind", len(rooms), behind
        )

    def rooms_back(self, rooms: Collection[str]) -> None:
        """Those rooms are subscribed again after :meth:`rooms_lost`: their replays fetch
        what was missed; their records are read again (a notice may have been missed)."""
        for room in rooms:
            down = self._rooms_down.pop(room, None)
            if down is not None:
                down.set()
                self.rooms_changed(room)
        logger.info("broker subscription of %d rooms back", len(rooms))

    def resubscribed(self) -> None:
        """The broker is subscribed again: replays fetch what was missed. Direct messages have
        no history: every connection with direct messages routed here is told (``resync``
        with ``to``) that some sent meanwhile may be missing."""
        if self._linked.is_set():
            return  # the first subscription: nothing was lost
        self._linked.set()
        for down in self._rooms_down.values():  # every room is subscribed again
            down.set()
        self._rooms_down.clear()
        self.notices_missed()
        logger.info("broker subscription back: %d rooms catching up", len(self._rooms))

    def notices_missed(self) -> None:
        """Direct messages and notices of room changes sent for a while may not have come
        (the broker's connection for them was lost): room records are read again, and every
        connection with direct messages routed here is told (``resync`` with ``to``)."""
        self.rooms_changed(None)
        self.hidden_changed(None)
        notice = "direct messages sent while this server was disconnected may be missing"
        for user, conns in self._users.items():
            error = error_frame(ErrorCode.RESYNC, notice, {"to": user})
            self._metrics.error_sent(ErrorCode.RESYNC, len(conns))
            for conn in conns:
                conn.offer(error)

    @property
    def linked(self) -> bool:
        return self._linked.is_set()

    def deliver_user(self, user: str, message_id: int | None, payload: bytes) -> None:
        """Queue a frame of a direct conversation (numbered ``message_id``, or None: a
        receipt) on every local connection of ``user``."""
        conns = self._users.get(user)
        if conns:
            span = None
            if self.tracing is not None and message_id is not None:
                span = self.tracing.start_fanout(payload, user)
            frame, nbytes = payload.decode(), len(payload)
            for conn in conns:
                if conn.hidden and message_id is not None and sender_of(payload) in conn.hidden:
                    continue  # from someone this user hides
                conn.offer(frame, nbytes)
            if message_id is not None:
                self._metrics.delivered_since_sync += len(conns)
                self._metrics.sample_fanout(message_id)
            if span is not None:
                span.set_attribute("hubbub.recipients", len(conns))
                span.end()

    def deliver_routed(self, payload: bytes) -> None:
        """A POST of the HTTP fallback transport routed here: to :mod:`app.sockets.stream`."""
        if self.routed is not None:
            self.routed(payload)

    def room_changed(self, room: str) -> None:
        """A room's record changed: :mod:`app.conversations.rooms` forgets it and rechecks who
        is in it. Or (a notice named by :func:`~app.conversations.names.hidden_notice`) whom a
        user hides changed: :mod:`app.access.hiding` reads it again."""
        user = notice_user(room)
        if user is not None:
            self.hidden_changed(user)
        else:
            self.rooms_changed(room)

    def set_hidden(self, user: str, hidden: frozenset[str], frame: str | None) -> None:
        """Whom ``user`` hides is now ``hidden``: their connections here filter by it from the
        next frame on (and are given ``frame``, when there is one)."""
        for conn in self._users.get(user, ()):
            if frame is not None:
                conn.offer(frame)
            if conn.hidden == hidden:
                continue
            conn.hidden = hidden
            for room in conn.rooms:
                state = self._rooms.get(room)
                if state is not None:
                    state.hiding = bool(hidden) or any(
                        c.hidden for c in (*state.members, *state.behind)
                    )

    async def expel(self, conn: Connection, room: str) -> None:
        """Take ``conn`` out of ``room`` (no longer a member) and tell it."""
        if room in conn.rooms:
            await self.leave(conn, room)
            conn.offer(left_frame(room, "removed"))

    def members_here(self, room: str) -> list[Connection]:
        """This worker's connections in ``room`` (live or catching up)."""
        state = self._rooms.get(room)
        return [] if state is None else [*state.members, *state.behind]

    def kick(self, user: str, reason: str, issued_at: float | None = None) -> None:
        """Close every local connection of ``user`` with 4003 (moderation); with
        ``issued_at`` (epoch seconds), only those opened before it."""
        opened_before = math.inf
        if issued_at is not None:
            # Connections keep their opening time on the loop's clock.
            loop = asyncio.get_running_loop()
            opened_before = loop.time() - (time.time() - issued_at)
        for conn in list(self._users.get(user, ())):
            if conn.opened_at < opened_before:
                conn.close(CloseCode.FORBIDDEN, reason)

    def _cut_slowest_consumers(self) -> None:
        """Close (4008) the connections with the most queued, until the worker's outboxes are
        back under nine tenths of their budget."""
        budget = self.outbox_budget
        target = budget.limit * 9 // 10
        cut = 0
        for conn in sorted(self.connections, key=lambda c: c.queued_bytes, reverse=True):
            if budget.used <= target or not conn.queued_bytes:
                break
            conn.close(CloseCode.SLOW_CONSUMER, "slow consumer: the server's memory is full")
            cut += 1
        logger.warning(
            "outbox budget exceeded: closed the %d slowest consumers",
            cut,
            extra={"queued_bytes": budget.used, "budget_bytes": budget.limit},
        )

    def local_users(self) -> list[str]:
        """Users with a connection on this worker."""
        return list(self._users)

    def has_user(self, user: str) -> bool:
        """Whether ``user`` has a connection on this worker."""
        return user in self._users

    # -- replays (the ReplayHost side) --------------------------------------------------------

    async def link_up(self, room: str) -> None:
        await self._linked.wait()
        down = self._rooms_down.get(room)
        if down is not None:
            await down.wait()

    def go_live(self, replay: Replay) -> None:
        state = self._rooms.get(replay.room)
        if state is None or state.behind.get(replay.conn) is not replay:
            return  # left meanwhile
        if replay.cursor > state.heard:
            # The replay ran ahead of the live stream: the frames up to the cursor are still
            # on their way here and will be dropped for this connection.
            replay.skip_to = replay.cursor
            return
        self._make_live(state, replay)

    def _make_live(self, state: _Room, replay: Replay) -> None:
        del state.behind[replay.conn]
        replay.cancel()
        state.members.add(replay.conn)

    def report_gap(self, replay: Replay) -> None:
        self._metrics.error_sent(ErrorCode.RESYNC)
        replay.conn.offer(
            error_frame(
                ErrorCode.RESYNC,
                "messages of this room may have been missed: rejoin it with since",
                {"room": replay.room},
            )
        )

    # -- connections ------------------------------------------------------------------------

    def add(self, conn: Connection) -> bool:
        """Register a new connection; False when this worker is at ``max_connections``."""
        if len(self.connections) >= self._max_connections:
            return False
        self.connections.add(conn)
        self.slices.add(conn)
        if conn.transport == "sse":
            self._sse_connections += 1
        return True

    async def register_user(self, conn: Connection) -> None:
        """Route direct messages for ``conn.user`` here (first local connection subscribes)."""
        conns = self._users.setdefault(conn.user, set())
        conns.add(conn)
        if len(conns) == 1:
            await self._broker.subscribe_user(conn.user)
            if self.online_room is not None:
                with contextlib.suppress(BrokerUnavailable):  # the next connection tries again
                    await self._presence.join(self.online_room, conn.user)

    async def set_visible(self, conn: Connection, visible: bool) -> None:
        """Record whether ``conn`` shows the chat to someone now; a user's first visible
        connection here enters :data:`app.notify.VISIBLE_ROOM`, the last one leaves it."""
        if conn.visible == visible:
            return
        conn.visible = visible
        count = self._visible.get(conn.user, 0) + (1 if visible else -1)
        if count > 0:
            self._visible[conn.user] = count
        else:
            self._visible.pop(conn.user, None)
        if count == (1 if visible else 0):
            with contextlib.suppress(BrokerUnavailable):  # else it expires, or the next tries
                if visible:
                    await self._presence.join(VISIBLE_ROOM, conn.user)
                else:
                    await self._presence.leave(VISIBLE_ROOM, conn.user)

    async def remove(self, conn: Connection) -> None:
        """Unregister ``conn``: out of every room, and out of its user's routing. Every step
        is taken even when the broker fails one (it is logged)."""
        if conn in self.connections and conn.transport == "sse":
            self._sse_connections -= 1
        self.connections.discard(conn)
        self.slices.discard(conn)
        await self.set_visible(conn, False)
        # Presence lingers for a client expected back (see Presence.leave): not for one the
        # server closed for good (kicked, banned, refused).
        code = conn.close_code
        linger = code is None or code.should_reconnect
        for room in list(conn.rooms):
            try:
                await self.leave(conn, room, linger=linger)
            except Exception:
                logger.exception("leaving %s for a closed connection failed", room)
        conns = self._users.get(conn.user)
        if conns is not None and conn in conns:
            conns.discard(conn)
            if not conns:
                del self._users[conn.user]
                with contextlib.suppress(BrokerUnavailable):
                    await self._broker.unsubscribe_user(conn.user)
                if self.online_room is not None:
                    with contextlib.suppress(BrokerUnavailable):  # else it expires
                        await self._presence.leave(self.online_room, conn.user)

    # -- rooms ------------------------------------------------------------------------------

    async def join(
        self, conn: Connection, room: str, since: int | None, *, private: bool = False
    ) -> None:
        """Put ``conn`` in ``room`` and queue its ``joined`` frame, then (with ``since``) the
        missed messages, paced by the socket, then live ones: no gap, no duplicate, in id
        order (see :mod:`app.sockets.replay`).

        Without ``since``, ``joined`` carries ``last``: every message with a larger id reaches
        the client, so ``last`` is the ``since`` to rejoin with until a message has come.

        A join with ``since`` of a room ``conn`` is already in replays from ``since`` again
        (the client lost track). Raises :class:`BrokerUnavailable` when the broker is down:
        a new member is then not in the room; a member rejoining stays in it, behind from
        where it was, and catches up by itself. ``private``: the room is private (what
        :meth:`deliver_room` fences removals in; a room never stops being private).
        """
        if not self._broker.ready or not self.linked:
            raise BrokerUnavailable("the broker is not connected")
        state = self._rooms.get(room)
        if state is None:
            state = self._rooms[room] = _Room()
            state.subscribed = asyncio.ensure_future(self._broker.subscribe_room(room))
            state.subscribed.add_done_callback(retrieve_exception)
        state.private = state.private or private
        state.hiding = state.hiding or bool(conn.hidden)
        subscribed = state.subscribed
        assert subscribed is not None
        previous = self._take_out(state, conn)
        cursor = state.heard if previous is None else previous
        replay = Replay(self, self._pacing, conn, room, cursor, joined=previous is not None)
        state.behind[conn] = replay
        self._rooms_catching_up.add(room)
        if room not in conn.rooms:
            conn.rooms.add(room)
            self._memberships += 1
        key = (room, conn.user)
        counted = False
        try:
            if not subscribed.done():
                await asyncio.shield(subscribed)
            subscribed.result()
            last: int | None = None
            if since is None:
                last = replay.cursor = await self._newest(room, state)
                page = History(True, [])
            elif since == self._known_newest(state):
                page, replay.cursor = History(True, []), since  # the rest comes live
            else:
                page = await self.pages.fetch(room, since)
                replay.cursor = since
            presence = None
            if not replay.joined:
                self._present[key] += 1
                counted = True
                if self._present[key] == 1:
                    presence = await self._presence.join(room, conn.user)
            if presence is None:
                presence = await self._presence.of(room)
        except BaseException:
            if previous is not None:
                # Still a member: catch up from where it was, by itself.
                replay.cursor = previous
                replay.link_lost()
                replay.start(None)
                raise
            if counted:
                self._present[key] -= 1
                if self._present[key] == 0:
                    del self._present[key]
                    # Undo a presence entry that may have been made, or it would be refreshed
                    # for a user who is not here.
                    with contextlib.suppress(BrokerUnavailable):
                        await self._presence.leave(room, conn.user)
            await self.leave(conn, room)
            raise
        replay.joined = True
        self._metrics.join_room_size.observe(presence.count)
        recovered = None if since is None else page.recovered
        conn.offer(joined_frame(room, recovered, presence.count, presence.users, last))
        replay.start(page)

    def _known_newest(self, state: _Room) -> int | None:
        """The room's newest id, as this worker knows it without asking the broker, or None.

        Known when a join asked the broker (``last_id``) after the room's subscription here
        was confirmed, and that subscription has not been lost since: a message after that
        answer was published after it, so it comes to this worker live, in order; the newest
        id is then the larger of that answer and the last message heard live. A lost
        subscription (link_lost, rooms_lost) moves the room to a new epoch, which voids it
        (:meth:`_asked` records none while the room is down); so does an id older than
        ``newest_known_for_s`` (the room's keys may have expired: the broker would start a
        new incarnation)."""
        if state.known_epoch != state.epoch:
            return None
        newest = max(state.known, state.heard)
        if newest // 1000 < time.time() * 1000 - self._newest_known_for_ms:
            return None
        return newest

    async def _newest(self, room: str, state: _Room) -> int:
        """``room``'s newest id for a join without ``since`` (every message with a larger id
        reaches the new member, who is already among the room's connections): known here
        (:meth:`_known_newest`), or asked of the broker and then known. The joins of a room
        that come while it is asked share the answer (a reconnect storm brings a room's
        members together), raised to what the room had heard when each came: a message the
        worker heard before that join, after the broker answered, is not the join's to get.
        The room's subscription must be confirmed."""
        floor = state.heard
        known = self._known_newest(state)
        if known is not None:
            return known
        asking = state.asking
        if asking is None or state.asking_epoch != state.epoch:
            asking = state.asking = asyncio.ensure_future(self._broker.last_id(room))
            state.asking_epoch = state.epoch
            asking.add_done_callback(retrieve_exception)
            asking.add_done_callback(functools.partial(self._asked, room, state, state.epoch))
        return max(await asyncio.shield(asking), floor)

    def _asked(self, room: str, state: _Room, epoch: int, asked: asyncio.Future[int]) -> None:
        """The broker answered a join's ``last_id``: known, if the subscription it was asked in
        is still the room's."""
        if state.asking is asked:
            state.asking = None
        if asked.cancelled() or asked.exception() is not None:
            return
        live = self.linked and room not in self._rooms_down and self._rooms.get(room) is state
        if live and state.epoch == epoch:
            state.known, state.known_epoch = max(state.known, asked.result()), epoch

    def _take_out(self, state: _Room, conn: Connection) -> int | None:
        """Take a rejoining ``conn`` out of live delivery: where it was (its cursor), or None
        when it is new to the room."""
        if conn in state.members:
            state.members.discard(conn)
            return state.heard
        replay = state.behind.pop(conn, None)
        if replay is None:
            return None
        replay.cancel()
        return replay.cursor if replay.joined else None

    async def leave(self, conn: Connection, room: str, *, linger: bool = False) -> None:
        """Take ``conn`` out of ``room``; the last local member out unsubscribes the broker.
        ``linger``: the connection ended without leaving (see
        :meth:`app.presence.Presence.leave`)."""
        if room not in conn.rooms:
            return
        await self._after_leave(conn, room, self._detach(conn, room), linger)

    def _detach(self, conn: Connection, room: str) -> bool:
        """Take ``conn`` (in ``room``) out of its delivery at once; whether it was present."""
        if room in conn.rooms:
            conn.rooms.discard(room)
            self._memberships -= 1
        state = self._rooms.get(room)
        was_present = False
        if state is not None:
            if conn in state.members:
                state.members.discard(conn)
                was_present = True
            replay = state.behind.pop(conn, None)
            if replay is not None:
                replay.cancel()
                was_present = replay.joined
            if not state:
                del self._rooms[room]
                self._rooms_catching_up.discard(room)
        return was_present

    async def _after_leave(
        self, conn: Connection, room: str, was_present: bool, linger: bool = False
    ) -> None:
        """What a leave does after :meth:`_detach`: presence, and the broker's subscription."""
        key = (room, conn.user)
        if was_present and self._present[key] > 0:
            self._present[key] -= 1
            if self._present[key] == 0:
                del self._present[key]
                # When the broker is down, the entry expires by itself (nobody refreshes it).
                with contextlib.suppress(BrokerUnavailable):
                    await self._presence.leave(room, conn.user, linger=linger)
        if room not in self._rooms:
            await self._broker.unsubscribe_room(room)

    async def close(self) -> None:
        """Stop background work (replays in progress)."""
        for state in self._rooms.values():
            for replay in state.behind.values():
                replay.cancel()

    def members(self, room: str) -> frozenset[Connection]:
        """Every local connection in ``room``, live or behind."""
        state = self._rooms.get(room)
        return frozenset() if state is None else frozenset({*state.members, *state.behind})

    def behind(self, room: str) -> int:
        """How many local connections of ``room`` are still catching up (for tests)."""
        state = self._rooms.get(room)
        return 0 if state is None else len(state.behind)

    @property
    def room_count(self) -> int:
        return len(self._rooms)

    @property
    def rooms_here(self) -> Container[str]:
        """Rooms with a connection of this worker in them."""
        return self._rooms.keys()

    def rooms_here_names(self) -> list[str]:
        return list(self._rooms)

    @property
    def behind_count(self) -> int:
        """Connection-in-room pairs catching up from history (not those only waiting for
        their first live message past what they were replayed). It walks the rooms a
        connection fell behind in since the last call, not all of them (5,000 rooms took
        0.7 ms, every second), and forgets those where none is behind any more."""
        count = 0
        for room in list(self._rooms_catching_up):
            state = self._rooms.get(room)
            if state is None or not state.behind:
                self._rooms_catching_up.discard(room)
                continue
            count += sum(replay.skip_to is None for replay in state.behind.values())
        return count

    def snapshot(self) -> HubSnapshot:
        """The gauges' view of this Hub (read once a second by the metrics). It walks the
        rooms, and the connections only while some have frames queued: a walk of 10,000
        connections held the loop a few milliseconds, which every message of that moment
        waited for."""
        conns = self.connections
        queued = self.outbox_budget.used  # what every connection's outbox holds
        return HubSnapshot(
            connections=len(conns),
            sse_connections=self._sse_connections,
            queued_bytes=queued,
            max_queued_bytes=max(map(_QUEUED_BYTES, conns), default=0) if queued else 0,
            rooms=len(self._rooms),
            memberships=self._memberships,
            memberships_behind=self.behind_count,
            draining=self.draining,
        )
