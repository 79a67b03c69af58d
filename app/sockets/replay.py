"""Replay: bring one connection up to date in one room from the broker's history, at the pace
its socket takes, then hand it over to live delivery.

A connection's message frames in a room come either from live delivery (the Hub's fan-out to
the room's members) or from a Replay. A Replay exists while the connection is behind the
room's live stream: during and after a join (with ``since`` or not), and after the worker lost
its broker subscription (every member of every room gets one, from the last message the room
delivered). It

* fetches pages of the history after its ``cursor`` (the id of the last message the client
  was given), once the broker is subscribed again; replays of a room that ask for the same page
  in the same loop iteration share one fetch (:class:`HistoryPages`);
* offers them to the connection no faster than its outbox drains: it never queues more than
  ``Pacing.budget`` bytes, so recovery never ends as a slow-consumer close (4008) for a client
  that reads;
* meanwhile holds the live message frames the Hub hears for the room (up to
  ``Pacing.buffer``): when a page is the last one, these continue it without a gap or a
  duplicate; when too many came, or the subscription was lost meanwhile, it fetches again;
* then asks its host to make the connection a live member (:meth:`ReplayHost.go_live`).

Delivery guarantee: every message published to the room after the starting cursor reaches the
connection exactly once, in id order, or the connection is told that some are gone: the host's
:meth:`~ReplayHost.report_gap` (a ``resync`` error frame), or a join's ``recovered:false``.
Frames without an id (presence, typing) are passed on at once. Whoever removes the connection
from the room cancels its Replay.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from app.broker import History, Message
from app.errors import BrokerUnavailable
from app.settings import Settings

if TYPE_CHECKING:
    from app.sockets.connection import Connection

logger = logging.getLogger(__name__)

_RETRY_S = 0.5  # after a failed fetch, while the subscription is up (Redis slow to answer)

# A live message frame heard while replaying: the frame, its UTF-8 size and its message id.
_Heard = tuple[str, int, int]


@dataclass(frozen=True, slots=True)
class Pacing:
    """How a replay paces itself: ``budget`` bytes queued on the socket at most (it resumes
    when half of that is left), ``page`` messages per history fetch, ``buffer`` live frames
    held while it fetches and offers a page."""

    budget: int
    page: int
    buffer: int

    @classmethod
    def of(cls, settings: Settings) -> Pacing:
        """Half an outbox queued at most (live frames to other rooms fit beside it), pages of
        ``CHAT_RECOVERY_PAGE_MESSAGES``, and as many live frames held as a replay may owe."""
        return cls(
            budget=settings.outbox_max_bytes // 2,
            page=settings.recovery_page_messages,
            buffer=max(settings.recovery_max_messages, settings.recovery_page_messages),
        )


class ReplayHost(Protocol):
    """What a Replay needs from the Hub."""

    @property
    def pages(self) -> HistoryPages: ...

    async def link_up(self, room: str) -> None:
        """Return once the broker is subscribed, to ``room`` too (at once when it is)."""
        ...

    def go_live(self, replay: Replay) -> None:
        """The replay has given the connection everything up to ``replay.cursor``."""
        ...

    def report_gap(self, replay: Replay) -> None:
        """Messages after ``replay.cursor`` are gone: tell the client."""
        ...


class HistorySource(Protocol):
    """Where replays read history: the broker, or
    :class:`app.conversations.history.ConversationHistory`
    (the broker's, continued into the store)."""

    async def history_since(self, room: str, since: int, limit: int) -> History: ...


class HistoryPages:
    """History pages for replays: one broker call for every replay of a room that asks for
    the same page in the same loop iteration (after an outage, a room's members all start
    from the same cursor at once).

    Sharing is limited to one iteration on purpose: a replay holds the live frames heard from
    the moment it asks, which pub/sub delivers only between iterations, so a page fetched for
    another replay in the same iteration leaves no frame out between the page and the held
    ones; a page fetched earlier could.
    """

    def __init__(self, source: HistorySource, page: int) -> None:
        self._source = source
        self._page = page
        self._fetching: dict[tuple[str, int], asyncio.Future[History]] = {}

    async def fetch(self, room: str, since: int) -> History:
        """The page of ``room`` after ``since``; raises what the broker raises."""
        key = (room, since)
        fetching = self._fetching.get(key)
        if fetching is None:
            fetching = asyncio.ensure_future(self._source.history_since(room, since, self._page))
            fetching.add_done_callback(retrieve_exception)
            self._fetching[key] = fetching
            asyncio.get_running_loop().call_soon(self._fetching.pop, key, None)
        return await asyncio.shield(fetching)


def retrieve_exception(future: asyncio.Future[Any]) -> None:
    """A done callback for a future shared by awaiters that may all be gone (cancelled) by
    the time it fails: its exception is then retrieved here, not logged as never retrieved."""
    if not future.cancelled():
        future.exception()


class Replay:
    """One connection catching up in one room (see the module's contract)."""

    __slots__ = (
        "_buffer",
        "_early",
        "_host",
        "_pacing",
        "_task",
        "conn",
        "cursor",
        "joined",
        "room",
        "skip_to",
    )

    def __init__(
        self,
        host: ReplayHost,
        pacing: Pacing,
        conn: Connection,
        room: str,
        cursor: int,
        *,
        joined: bool,
    ) -> None:
        self._host = host
        self._pacing = pacing
        self.conn = conn
        self.room = room
        self.cursor = cursor
        # True once the client has its `joined` frame (its presence counts).
        self.joined = joined
        # Live frames heard since the current fetch began; None: not kept (fetch again).
        self._buffer: list[_Heard] | None = []
        # Replayed up to here past what the room has heard live: later live frames up to this
        # id are already with the client, and the first one above it makes the client live.
        self.skip_to: int | None = None
        # Frames without an id heard before the client has its `joined` frame.
        self._early: list[tuple[str, int]] = []
        self._task: asyncio.Task[None] | None = None

    def start(self, first: History | None) -> None:
        """Run in the background from ``first`` (a page a join already fetched and answered in
        its ``joined`` frame), or from a fetch after the cursor. Frames without an id heard
        before go out first."""
        early, self._early = self._early, []
        for frame, nbytes in early:
            if not self.conn.hides(frame):
                self.conn.offer(frame, nbytes)
        nothing_to_replay = first is not None and first == History(True, [])
        if nothing_to_replay and self._buffer is not None:  # most joins: no task needed
            self._release_buffer()
            self._host.go_live(self)
            return
        self._task = asyncio.get_running_loop().create_task(self._run(first))

    def cancel(self) -> None:
        """Stop catching up (the connection left the room, or went live)."""
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    def hear(self, frame: str, nbytes: int, message_id: int | None) -> bool:
        """A live frame of the room. Returns True when the connection must go live now (it
        was given this frame, the first one past ``skip_to``); the caller moves it."""
        if message_id is None:
            if self.joined:
                if not self.conn.hides(frame):
                    self.conn.offer(frame, nbytes)
            elif len(self._early) < self._pacing.buffer:
                self._early.append((frame, nbytes))
            return False
        if self.skip_to is not None:
            if message_id <= self.skip_to:
                return False
            if not self.conn.hides(frame):
                self.conn.offer(frame, nbytes)
            self.cursor = message_id
            return True
        buffer = self._buffer
        if buffer is not None:
            if len(buffer) < self._pacing.buffer:
                buffer.append((frame, nbytes, message_id))
            else:
                self._buffer = None
        return False

    def link_lost(self) -> None:
        """The broker's subscription ended: frames heard from now on may have gaps."""
        self._buffer = None
        if self.skip_to is not None:
            self.skip_to = None
            self.start(None)

    async def _run(self, page: History | None) -> None:
        host = self._host
        answered = page is not None
        try:
            while True:
                if page is None:
                    await host.link_up(self.room)
                    self._buffer = []
                    try:
                        page = await host.pages.fetch(self.room, self.cursor)
                    except BrokerUnavailable as exc:
                        logger.info("history of %s unavailable, retrying: %s", self.room, exc)
                        self._buffer = None
                        await asyncio.sleep(_RETRY_S)
                        continue
                    answered = False
                if not page.recovered:
                    # A join answered `recovered:false` told the client of the gap before it;
                    # live frames lost since the fetch began (the subscription was lost, or
                    # the buffer overflowed) are a new one.
                    if not answered or self._buffer is None:
                        host.report_gap(self)
                    self._release_buffer()
                    host.go_live(self)
                    return
                if not await self._offer_paced(page.messages):
                    return  # the connection is closing
                if page.more or self._buffer is None:
                    page = None
                    continue
                self._release_buffer()
                host.go_live(self)
                return
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug here must not leave the client silently behind
            logger.exception("replay of %s for %r failed", self.room, self.conn)
            host.report_gap(self)
            self._release_buffer()
            host.go_live(self)
        finally:
            self._task = None

    async def _offer_paced(self, messages: list[Message]) -> bool:
        conn, budget = self.conn, self._pacing.budget
        for message_id, payload in messages:
            nbytes = len(payload)
            full = conn.queued_bytes and conn.queued_bytes + nbytes > budget
            if full and not await conn.drained(budget // 2):
                return False
            if conn.closing:
                return False
            frame = payload.decode()
            if not conn.hides(frame):
                conn.offer(frame, nbytes)
            self.cursor = message_id
        return True

    def _release_buffer(self) -> None:
        """Offer the held live frames that follow the cursor."""
        buffer, self._buffer = self._buffer, None
        for frame, nbytes, message_id in buffer or ():
            if message_id > self.cursor:
                if not self.conn.hides(frame):
                    self.conn.offer(frame, nbytes)
                self.cursor = message_id

    def __repr__(self) -> str:
        return f"<Replay {self.room} {self.conn!r} cursor={self.cursor}>"
