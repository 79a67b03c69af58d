"""HiddenUsers: block and mute, as every path that shows messages applies them.

Contract:
- Each user hides others as **muted** or **blocked** (a block includes a mute):
  ``mute`` hides a user not hidden (a blocked one stays blocked); ``block`` blocks, muted or
  not; ``unmute`` ends a mute (not a block); ``unblock`` ends a block. Nobody hides themself;
  at most ``CHAT_HIDDEN_USERS_MAX`` users (``too_many_hidden``). Needs the store
  (``no_store`` without one).
- **Hidden, not deleted**: a hidden user's messages, events on them (edits, deletions,
  reactions) and typing are not given to the user in live delivery (rooms and direct
  messages), replays, history (frames and HTTP), search, the inbox (unread counts, mentions
  and the newest message shown), the mentions list and notifications. Ending it shows them
  again: nothing was removed. Everyone else sees them as before.
- **Blocked** users also cannot write in their direct conversation with the user (messages,
  edits, reactions, files; deleting their own messages stays theirs), nor invite them:
  ``forbidden``, the same words a user who cannot be written to for any reason would get
  (no "you are blocked").
- A change is stored first, then announced to every worker (a room notice,
  :func:`~app.conversations.names.hidden_notice`): each forgets its copy and, where the user
  has connections, reads the lists again, filters their delivery by them from the next frame
  on, and gives each a ``hidden`` frame (every tab knows). The connection that asked has them
  at once.
- Lists are read through a per-worker cache (at most ``CHAT_HIDDEN_CACHE_S`` old; notices make
  changes visible sooner; a worker that may have missed notices reads its users' lists
  again). While the store cannot be read, the last lists read are used (none: nobody hidden),
  and chat goes on; a new connection waits for its user's lists half a second at most (what
  is read later applies to it then).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Literal

from app.broker import Broker, History, Message
from app.conversations.names import hidden_notice
from app.errors import BrokerUnavailable, ErrorCode, FrameError
from app.protocol import hidden_frame, sender_of
from app.settings import Settings
from app.sockets.hub import Hub
from app.store.database import StoreError
from app.store.hidden import NOBODY, HiddenStore, Hiding

logger = logging.getLogger(__name__)

Change = Literal["mute", "unmute", "block", "unblock"]

_CACHE_MAX = 10_000
# Users read in one query when a worker reads many lists again.
_READ_BATCH = 500
# How long a new connection waits for its user's lists before it goes on without them.
_ATTACH_WAIT_S = 0.5
# Pages a history read fetches at most to fill one page with messages nobody hid.
_REFILL_PAGES = 5

HistoryBefore = Callable[[str, int | None, int], Awaitable[list[Message]]]
HistorySince = Callable[[str, int, int], Awaitable[History]]


def visible(messages: list[Message], hidden: frozenset[str]) -> list[Message]:
    """Those of ``messages`` not sent by someone in ``hidden``."""
    if not hidden:
        return messages
    return [m for m in messages if sender_of(m.payload) not in hidden]


def lists_of(hiding: Hiding) -> dict[str, list[str]]:
    """``hiding`` as the ``hidden`` frame and ``GET /me/hidden`` show it."""
    return {"muted": sorted(hiding.muted), "blocked": sorted(hiding.blocked)}


def frame_of(hiding: Hiding) -> str:
    """The ``hidden`` frame of ``hiding``."""
    return hidden_frame(**lists_of(hiding))


class HiddenUsers:
    """One per worker (see the module's contract)."""

    def __init__(
        self, store: HiddenStore | None, broker: Broker, hub: Hub, settings: Settings
    ) -> None:
        self._store = store
        self._broker = broker
        self._hub = hub
        self._settings = settings
        self._cache: OrderedDict[str, tuple[float, Hiding]] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()
        # The read again each user waits for (its token): a read that finishes after a newer
        # one began, or after a change made here, is stale and dropped.
        self._reads = itertools.count(1)
        self._awaited: dict[str, int] = {}
        hub.hidden_changed = self._changed

    async def of(self, user: str) -> Hiding:
        """Whom ``user`` hides now (nobody without a store; the last read while it fails)."""
        if self._store is None:
            return NOBODY
        now = time.monotonic()
        cached = self._cache.get(user)
        if cached is not None and now - cached[0] < self._settings.hidden_cache_s:
            self._cache.move_to_end(user)
            return cached[1]
        try:
            hiding = (await self._store.of([user]))[user]
        except StoreError as exc:
            logger.warning("whom %s hides could not be read: %s", user, exc)
            return NOBODY if cached is None else cached[1]
        self._remember(user, hiding, now)
        return hiding

    def cached_block(self, user: str, other: str) -> bool | None:
        """Whether ``user`` blocks ``other``, when known without reading the store (None:
        :meth:`blocks` would read it)."""
        if self._store is None:
            return False
        cached = self._cache.get(user)
        if cached is None or time.monotonic() - cached[0] >= self._settings.hidden_cache_s:
            return None
        return other in cached[1].blocked

    async def blocks(self, user: str, other: str) -> bool:
        """Whether ``user`` blocks ``other``."""
        return other in (await self.of(user)).blocked

    async def change(self, user: str, target: str, change: Change) -> Hiding:
        """Apply ``change`` to whom ``user`` hides; returns the lists as they are now. Raises
        :class:`FrameError`: ``bad_frame`` (``target`` is ``user``), ``too_many_hidden``,
        ``no_store``, ``store_unavailable``."""
        store = self._store
        if store is None:
            raise FrameError(ErrorCode.NO_STORE, "this server cannot mute or block (no store)")
        if target == user:
            raise FrameError(ErrorCode.BAD_FRAME, "you cannot mute or block yourself")
        try:
            before = (await store.of([user]))[user]
            if change == "block" or (change == "mute" and target not in before.users):
                most = self._settings.hidden_users_max
                if not await store.hide(user, target, change == "block", _now_ms(), most):
                    raise FrameError(
                        ErrorCode.TOO_MANY_HIDDEN, f"you already mute or block {most} users"
                    )
            elif (change == "unmute" and target in before.muted) or (
                change == "unblock" and target in before.blocked
            ):
                await store.unhide(user, target)
            hiding = (await store.of([user]))[user]
        except StoreError:
            raise FrameError(ErrorCode.STORE_UNAVAILABLE, "not changed, try again") from None
        self._awaited.pop(user, None)  # a read again under way is older than this
        self._remember(user, hiding, time.monotonic())
        # Every connection of the user here (the one that asked too) filters by it from now on
        # and is told.
        self._hub.set_hidden(user, hiding.users, frame_of(hiding))
        if hiding != before:
            try:
                await self._broker.room_changed(hidden_notice(user))
            except BrokerUnavailable:  # other workers read it again within the cache's age
                logger.warning("could not announce that whom %s hides changed", user)
        return hiding

    async def attach(self, user: str) -> frozenset[str]:
        """Whom a new connection of ``user`` must not be given messages from. A slow store
        does not hold the connection up: past ``_ATTACH_WAIT_S`` it gets the last lists read
        (none: nobody), and the lists read later are given to the user's connections then."""
        if self._store is None:
            return NOBODY.users
        cached = self._cache.get(user)
        if cached is not None and time.monotonic() - cached[0] < self._settings.hidden_cache_s:
            return cached[1].users  # most connects: no task, no wait
        reading = asyncio.ensure_future(self.of(user))
        try:
            async with asyncio.timeout(_ATTACH_WAIT_S):
                return (await asyncio.shield(reading)).users
        except TimeoutError:
            reading.add_done_callback(lambda done: self._late(user, done))
            return (NOBODY if cached is None else cached[1]).users

    def _late(self, user: str, reading: asyncio.Future[Hiding]) -> None:
        if not reading.cancelled() and reading.exception() is None:
            self._hub.set_hidden(user, reading.result().users, None)

    def _remember(self, user: str, hiding: Hiding, now: float) -> None:
        self._cache[user] = (now, hiding)
        self._cache.move_to_end(user)
        while len(self._cache) > _CACHE_MAX:
            self._cache.popitem(last=False)

    def _changed(self, user: str | None) -> None:
        """A notice: whom ``user`` hides changed (None: anyone's may have). Forget it, and
        read it again for the users connected here."""
        if self._store is None:
            return
        if user is None:
            users = self._hub.local_users()
            stale = list(self._cache)
        else:
            users = [user] if self._hub.has_user(user) else []
            stale = [user] if user in self._cache else []
        for name in stale:  # kept to compare with, but read again before any use
            self._cache[name] = (-math.inf, self._cache[name][1])
        if users:
            token = next(self._reads)
            for name in users:
                self._awaited[name] = token
            task = asyncio.get_running_loop().create_task(self._reread(users, token))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _reread(self, users: list[str], token: int) -> None:
        assert self._store is not None
        for start in range(0, len(users), _READ_BATCH):
            batch = users[start : start + _READ_BATCH]
            try:
                found = await self._store.of(batch)
            except StoreError as exc:
                logger.warning("whom %d users hide could not be read again: %s", len(batch), exc)
                for user in users[start:]:
                    if self._awaited.get(user) == token:
                        del self._awaited[user]
                return
            now = time.monotonic()
            for user, hiding in found.items():
                if self._awaited.get(user) != token:
                    continue  # a newer read, or a change made here, has it
                del self._awaited[user]
                known = self._cache.get(user)
                self._remember(user, hiding, now)
                if known is None or known[1] != hiding:  # else this worker made the change
                    self._hub.set_hidden(user, hiding.users, frame_of(hiding))

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def _now_ms() -> int:
    return int(time.time() * 1000)


async def visible_history_before(
    fetch: HistoryBefore, conversation: str, before: int | None, limit: int, hidden: frozenset[str]
) -> tuple[list[Message], bool]:
    """A page of history as ``fetch`` (``ConversationHistory.history_before``) gives it, less
    the messages of ``hidden`` users, fetching further back (a few pages at most) to fill it;
    returns the messages and whether older ones may exist."""
    if not hidden:
        page = await fetch(conversation, before, limit)
        return page, len(page) == limit
    shown: list[Message] = []
    for _ in range(_REFILL_PAGES):
        page = await fetch(conversation, before, limit)
        shown = visible(page, hidden) + shown
        if len(page) < limit:
            return shown[-limit:], False
        if len(shown) >= limit:
            return shown[-limit:], True
        before = page[0].id
    return shown, True


async def visible_history_since(
    fetch: HistorySince, conversation: str, since: int, limit: int, hidden: frozenset[str]
) -> History:
    """As :func:`visible_history_before`, forwards from ``since``
    (``ConversationHistory.history_since``)."""
    if not hidden:
        return await fetch(conversation, since, limit)
    shown: list[Message] = []
    for _ in range(_REFILL_PAGES):
        page = await fetch(conversation, since, limit)
        if not page.recovered:
            return History(False, visible(page.messages, hidden), page.more)
        shown += visible(page.messages, hidden)
        if not page.more or not page.messages:
            return History(True, shown[:limit], len(shown) > limit)
        if len(shown) >= limit:
            return History(True, shown[:limit], True)
        since = page.messages[-1].id
    return History(True, shown, True)
