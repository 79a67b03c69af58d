"""RedisPresence: presence shared by every worker and pod through Redis.

Each worker keeps entries for the users it has in each room, refreshed every third of
``CHAT_PRESENCE_TTL_S``; a worker that dies stops refreshing, its entries expire, and the
survivors' sweeps announce those users' departure. The keys share their room's hash tag
(:class:`app.broker.keys.KeyLayout`), so each script stays within one cluster slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Iterator
from itertools import islice
from typing import Any, Final

from redis.asyncio import Redis

from app.broker import Broker
from app.broker.keys import KeyLayout
from app.errors import BrokerUnavailable
from app.presence import RoomPresence
from app.presence.announcer import PresenceAnnouncer
from app.presence.graces import Graces
from app.redisio.autopipeline import AutoPipeline
from app.redisio.clients import (
    REDIS_ERRORS,
    call_redis,
    close_client,
    command_client,
    preload,
)
from app.redisio.cluster import ClusterPipelines, pipelines_for
from app.redisio.spread import spread
from app.settings import Settings

logger = logging.getLogger(__name__)

# Script calls the upkeep makes and sends at a time: the next chunk waits for their replies
# (and its turn: the chunks are spread over half the interval), so the loop is held for one
# chunk's making (a fraction of a millisecond), and Redis for one chunk's calls, not for
# every room's at once (over 100 ms with 5,000 rooms: docs/benchmarks.md, "the presence
# upkeep"). A call refreshes one room's entries of at most UPKEEP_USERS users: a room with
# more (the internal rooms hold every user of the worker) takes several, swept in its last.
UPKEEP_CHUNK: Final = 32
UPKEEP_USERS: Final = 100

# Presence, per room: ``present`` is a sorted set user -> expiry (ms) of the user's freshest
# entry; ``tabs:<user>`` a sorted set worker -> expiry. A user is present while its ``present``
# score is in the future. Every operation is O(log n). JOIN/LEAVE return {changed, count}:
# changed is 1 when the call changed the user's presence (first entry in, last entry out) and
# 0 otherwise; count, the room's present users then (what an announcement says). JOIN also
# returns the present users, up to `limit` of them (what `of` reads).
JOIN: Final = """
-- KEYS: present, tabs   ARGV: user, worker, now_ms, expires_ms, ttl_ms, limit
local live = redis.call('ZCOUNT', KEYS[2], ARGV[3], '+inf')
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[2])
redis.call('ZADD', KEYS[1], 'GT', ARGV[4], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
redis.call('PEXPIRE', KEYS[2], ARGV[5])
return {live == 0 and 1 or 0, redis.call('ZCOUNT', KEYS[1], ARGV[3], '+inf'),
        redis.call('ZRANGEBYSCORE', KEYS[1], ARGV[3], '+inf', 'LIMIT', 0, ARGV[6])}
"""

# LEAVE with ARGV[4] '1' (the end of a grace, see LINGER) does nothing while this worker's
# entry is still live: the user came back to this worker since.
LEAVE: Final = """
-- KEYS: present, tabs   ARGV: user, worker, now_ms, lapsed only ('1') or not ('0')
if ARGV[4] == '1' then
  local score = redis.call('ZSCORE', KEYS[2], ARGV[2])
  if score and tonumber(score) > tonumber(ARGV[3]) then return {0, 0} end
end
redis.call('ZREM', KEYS[2], ARGV[2])
if redis.call('ZCOUNT', KEYS[2], ARGV[3], '+inf') > 0 then return {0, 0} end
redis.call('DEL', KEYS[2])
local changed = redis.call('ZREM', KEYS[1], ARGV[1])
return {changed, redis.call('ZCOUNT', KEYS[1], ARGV[3], '+inf')}
"""

# A user whose connection ended without a leave lingers (app.presence.Presence.leave): this
# worker's entry is kept until the grace ends (no longer refreshed), and the user's `present`
# score becomes its freshest entry's, so that once every entry has lapsed (this worker died in
# the grace) any worker's sweep finds the user gone. A JOIN in the grace finds a live entry:
# nothing is announced. When the grace ends the worker calls LEAVE, lapsed only.
LINGER: Final = """
-- KEYS: present, tabs   ARGV: user, worker, until_ms
redis.call('ZADD', KEYS[2], 'XX', ARGV[3], ARGV[2])
local freshest = redis.call('ZREVRANGE', KEYS[2], 0, 0, 'WITHSCORES')
if freshest[2] then redis.call('ZADD', KEYS[1], freshest[2], ARGV[1]) end
return 0
"""

# A room's upkeep, every ttl/3: refresh this worker's entries (the user of KEYS[i], i >= 2, is
# ARGV[i + 4]), then (given the tabs keys' prefix, not '') remove the users whose every entry
# expired (their workers died), with their tabs keys: returns those users. The tabs keys
# share the room's hash tag, so this stays within one cluster slot.
UPKEEP: Final = """
-- KEYS: present, tabs1, tabs2, ...
-- ARGV: worker, expires_ms, ttl_ms, now_ms, tabs key prefix or '', user1, user2, ...
for i = 2, #KEYS do
  redis.call('ZADD', KEYS[i], ARGV[2], ARGV[1])
  redis.call('PEXPIRE', KEYS[i], ARGV[3])
  redis.call('ZADD', KEYS[1], 'GT', ARGV[2], ARGV[i + 4])
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
if ARGV[5] == '' then return {} end
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[4])
for _, user in ipairs(gone) do
  redis.call('ZREM', KEYS[1], user)
  redis.call('DEL', ARGV[5] .. user)
end
return gone
"""


class RedisPresence:
    """A :class:`~app.presence.Presence` in Redis (7.0 or later)."""

    def __init__(self, settings: Settings, broker: Broker) -> None:
        assert settings.uses_redis
        self._settings = settings
        self._prefix = settings.redis_prefix
        self._room_key = KeyLayout.of(settings).room
        self.worker_id = secrets.token_hex(6)
        self._redis: Redis = command_client(settings)
        # Joins and leaves, counts and lists go through a pipeline (a reconnect storm is
        # thousands of them a second), and so does the upkeep, a chunk of rooms at a time.
        self._pipeline: AutoPipeline | ClusterPipelines = pipelines_for(self._redis, settings)
        self._join = self._redis.register_script(JOIN)
        self._leave = self._redis.register_script(LEAVE)
        self._linger = self._redis.register_script(LINGER)
        self._grace_s = settings.presence_leave_grace_s
        self._graces = Graces()  # the users lingering here
        self._upkeep_script = self._redis.register_script(UPKEEP)
        self._present: dict[str, set[str]] = {}  # room -> users present through this worker
        self._upkeep: asyncio.Task[None] | None = None
        self._announcer = PresenceAnnouncer(
            broker.broadcast,
            self._count,
            settings.presence_max_members,
            settings.presence_count_interval_s,
            settings.presence_coalesce_s,
        )

    def on_internal(self, listener: Callable[[str, str, str], Awaitable[None]]) -> None:
        self._announcer.internal_listener = listener

    @property
    def lingering(self) -> int:
        """Users lingering on this worker: their grace running, or its end being settled."""
        return len(self._graces)

    async def start(self) -> None:
        self._upkeep = asyncio.create_task(self._keep_up(), name="redis-presence")

    async def stop(self) -> None:
        """Withdraw this worker's entries, then send the announcements still waiting (the
        departures among them), before the broker stops. The users lingering here stay so
        until their grace ends (they may be coming back to another worker: a drain); then
        the other workers' sweeps find those who did not."""
        if self._upkeep is not None:
            self._upkeep.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._upkeep
        await self._graces.close()
        try:
            await self._withdraw()
        except (*REDIS_ERRORS, BrokerUnavailable) as exc:  # the entries expire by themselves
            logger.warning("could not withdraw presence on stop: %r", exc)
        await self._announcer.close()
        await self._pipeline.close()
        await close_client(self._redis)

    def _keys(self, room: str, user: str) -> list[str]:
        return [
            self._room_key(room, "present"),
            self._room_key(room, f"tabs:{user}"),
        ]

    async def join(self, room: str, user: str) -> RoomPresence:
        self._graces.cancel(room, user)  # back within its grace: JOIN refreshes the entry
        self._present.setdefault(room, set()).add(user)
        now = int(time.time() * 1000)
        ttl = int(self._settings.presence_ttl_s * 1000)
        keys = self._keys(room, user)
        most = self._settings.presence_max_members
        args: list[str | int] = [user, self.worker_id, now, now + ttl, ttl, most + 1]
        changed, count, users = await call_redis(
            lambda: self._pipeline.call(self._join, keys, args)
        )
        if changed:
            await self._announcer.announce(room, "join", user, count)
        return self._presence(int(count), users)

    def _presence(self, count: int, users: list[bytes]) -> RoomPresence:
        """A room's presence from its count and its users read up to one past the most
        shown (the count is only needed when they are that many)."""
        if len(users) <= self._settings.presence_max_members:
            return RoomPresence(len(users), sorted(u.decode() for u in users))
        return RoomPresence(max(count, len(users)), None)

    async def leave(self, room: str, user: str, linger: bool = False) -> None:
        users = self._present.get(room)
        if users is not None:
            users.discard(user)
            if not users:
                del self._present[room]
                self._announcer.forget(room)
        keys = self._keys(room, user)
        now = int(time.time() * 1000)
        if linger and self._grace_s > 0 and not room.startswith("~"):
            until = now + int(self._grace_s * 1000)
            await call_redis(
                lambda: self._pipeline.call(self._linger, keys, [user, self.worker_id, until])
            )
            # A little past `until`: the entry has lapsed by the time LEAVE runs.
            self._graces.start(room, user, self._grace_s + 0.05, self._lapse)
            return
        self._graces.cancel(room, user)
        args: list[str | int] = [user, self.worker_id, now, "0"]
        await self._depart(room, user, lambda: self._pipeline.submit(self._leave, keys, args))

    def _lapse(self, room: str, user: str) -> None:
        """The grace of ``user`` in ``room`` ended on this worker: it departs unless it came
        back to another worker. The LEAVE is handed to the pipeline here, ahead of any later
        JOIN of this worker (which would then be an arrival, announced after the departure)."""
        args: list[str | int] = [user, self.worker_id, int(time.time() * 1000), "1"]
        try:
            reply = self._pipeline.submit(self._leave, self._keys(room, user), args)
        except REDIS_ERRORS as exc:  # the entry lapses by itself: the sweeps find the user
            logger.warning("departure of %s from %s not settled: %r", user, room, exc)
            return
        self._graces.settle(self._depart_late(room, user, lambda: reply))

    async def _depart(self, room: str, user: str, leave: Callable[[], Awaitable[Any]]) -> None:
        """Announce ``user``'s departure from ``room`` if LEAVE's reply says it left."""
        changed, count = await call_redis(leave)
        if changed:
            await self._announcer.announce(room, "leave", user, count)

    async def _depart_late(self, room: str, user: str, leave: Callable[[], Awaitable[Any]]) -> None:
        """:meth:`_depart` at a grace's end, where no caller is left to raise to: Redis down is
        logged (the entry lapses by itself, and the other workers' sweeps announce it)."""
        try:
            await self._depart(room, user, leave)
        except BrokerUnavailable as exc:  # the entry lapses by itself: the sweeps find the user
            logger.warning("departure of %s from %s not settled: %r", user, room, exc)

    async def _count(self, room: str) -> int:
        key, now = self._room_key(room, "present"), int(time.time() * 1000)
        return int(
            await call_redis(lambda: self._pipeline.command(key, "ZCOUNT", key, now, "+inf"))
        )

    async def is_present(self, room: str, user: str) -> bool:
        key = self._room_key(room, "present")
        score = await call_redis(lambda: self._pipeline.command(key, "ZSCORE", key, user))
        return score is not None and float(score) >= time.time() * 1000

    async def of(self, room: str) -> RoomPresence:
        """The count and, up to ``presence_max_members``, the users: the list is asked for up
        to one past the most it may show, and only a list that long needs the count asked
        for too (a second round trip, for big rooms only)."""
        key, now = self._room_key(room, "present"), int(time.time() * 1000)
        most = self._settings.presence_max_members
        users = await call_redis(
            lambda: self._pipeline.command(
                key, "ZRANGEBYSCORE", key, now, "+inf", "LIMIT", 0, most + 1
            )
        )
        if len(users) <= most:
            return self._presence(len(users), users)
        count = await call_redis(lambda: self._pipeline.command(key, "ZCOUNT", key, now, "+inf"))
        return self._presence(int(count), users)

    async def _keep_up(self) -> None:
        """Keep this worker's entries up and sweep out users of dead workers: a pass every
        ttl/3 after the last one ended, spread over half of that. An entry is thus refreshed
        at most half the ttl after the last time: it never expires while its worker lives."""
        await preload(self._redis, self._upkeep_script)
        interval = self._settings.presence_ttl_s / 3
        while True:
            await asyncio.sleep(interval)
            try:
                await self.upkeep(spread_s=interval / 2)
            except (*REDIS_ERRORS, BrokerUnavailable) as exc:
                logger.warning("presence upkeep failed: %r", exc)

    async def upkeep(self, spread_s: float = 0.0) -> None:
        """One pass of the upkeep over the rooms this worker has users in: each room's
        entries of this worker refreshed, then the departure of its users whose every entry
        expired announced (each room is swept by every worker with a user there). A script
        call a room (or a hundred users of one), ``UPKEEP_CHUNK`` calls at a time, the chunks
        spread over ``spread_s`` (:func:`~app.redisio.spread.spread`); a room left meanwhile
        is skipped. Raises the first call's error once every room has been tried."""
        ttl = int(self._settings.presence_ttl_s * 1000)
        calls = sum(-(-len(users) // UPKEEP_USERS) for users in self._present.values())
        work = self._upkeep_calls(list(self._present))
        error: BaseException | None = None
        async for _ in spread(-(-calls // UPKEEP_CHUNK), spread_s):
            error = await self._upkeep_chunk(list(islice(work, UPKEEP_CHUNK)), ttl) or error
        while chunk := list(islice(work, UPKEEP_CHUNK)):  # users who came meanwhile
            error = await self._upkeep_chunk(chunk, ttl) or error
        if error is not None:
            raise error

    def _upkeep_calls(self, rooms: list[str]) -> Iterator[tuple[str, list[str], bool]]:
        """(room, users, whether the room's last) for each upkeep call over ``rooms``, a
        room's users read when its turn comes."""
        for room in rooms:
            users = list(self._present.get(room, ()))
            for start in range(0, len(users), UPKEEP_USERS):
                last = start + UPKEEP_USERS >= len(users)
                yield room, users[start : start + UPKEEP_USERS], last

    async def _upkeep_chunk(
        self, calls: list[tuple[str, list[str], bool]], ttl: int
    ) -> BaseException | None:
        """Make and send ``calls`` together, announce the departures their sweeps found;
        -> the first call's error."""
        now = int(time.time() * 1000)
        replies: list[asyncio.Future[Any]] = []
        for room, users, last in calls:
            tabs = self._room_key(room, "tabs:")
            keys = [self._room_key(room, "present"), *(tabs + user for user in users)]
            args = [self.worker_id, now + ttl, ttl, now, tabs if last else "", *users]
            replies.append(self._pipeline.submit(self._upkeep_script, keys, args))
        answers = await asyncio.gather(*replies, return_exceptions=True)
        error: BaseException | None = None
        for (room, _, _), gone in zip(calls, answers, strict=True):
            if isinstance(gone, BaseException):
                error = error or gone
                continue
            for user in gone:
                await self._announcer.announce(room, "leave", user.decode())
        return error

    async def _withdraw(self) -> None:
        """On a clean stop, leave every room at once instead of waiting for expiry."""
        for room, users in list(self._present.items()):
            for user in list(users):
                await self.leave(room, user)
