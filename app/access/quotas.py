"""Quotas and bans that hold across every worker and pod: connections per user, join, typing,
new-room and history-read rates per user (the message rate is the broker's, see
:meth:`app.broker.Broker.publish`), connection rate per client address, and bans.

:class:`RedisQuotas` keeps them in Redis (one small Lua script per check, Redis' clock, keys
that expire by themselves: a pod that dies leaves nothing behind for longer than
``CHAT_PRESENCE_TTL_S``). :class:`MemoryQuotas` is the same for a single process (the memory
broker). Every check fails open when Redis is unreachable: an outage must not lock everyone
out, and publishing is refused anyway while the broker is down.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal, Protocol

from redis.asyncio import Redis

from app.access.buckets import TokenBuckets
from app.broker.redis_scripts import ABSENT, NOW, TOKEN_BUCKET, sharded
from app.redisio.autopipeline import AutoPipeline
from app.redisio.clients import REDIS_ERRORS, close_client, command_client, preload
from app.redisio.cluster import ClusterPipelines, pipelines_for
from app.redisio.spread import spread
from app.settings import Settings

if TYPE_CHECKING:
    from app.sockets.hub import Hub

logger = logging.getLogger(__name__)

# The message rate is the broker's: it takes a token inside each publish.
Rate = Literal[
    "join",
    "typing",
    "new_room",
    "history",
    "read",
    "invite",
    "search",
    "upload",
    "report",
    "preview",
]


class JoinVerdict(enum.Enum):
    """The quotas' answer to a join (:meth:`Quotas.allow_join`)."""

    ADMITTED = "admitted"  # a join token taken; the room exists, or nobody asked
    NEW_ROOM = "new room"  # a join token and a new-room token taken: the room is new
    JOIN_RATE = "too many joins"  # nothing taken
    NEW_ROOM_RATE = "too many new rooms"  # the join token taken, the room is new


class Refusal(enum.Enum):
    """Why a connection was not admitted."""

    BANNED = "banned"
    TOO_MANY_CONNECTIONS = "too many connections for this user"
    IP_RATE = "too many new connections from this address"


@dataclass(frozen=True, slots=True)
class Ban:
    reason: str
    expires_in_s: float


class Quotas(Protocol):
    """Contract: ``admit`` and ``release`` are called once per connection (a connection
    admitted must be released); ``refresh`` every third of ``CHAT_PRESENCE_TTL_S`` with the
    worker's open connections; ``allow`` before each join, typing frame and history read
    (the broker takes a message token inside each publish)."""

    async def admit_address(self, ip: str | None) -> bool:
        """Take a token from ``ip``'s bucket of new connections (at the upgrade, before the
        client says who it is); False: refuse the socket (4029). Fails open."""
        ...

    async def admit(self, user: str, conn_id: str, ip: str | None) -> Refusal | None: ...

    async def release(self, user: str, conn_id: str) -> None: ...

    async def refresh(self, conns: Iterable[tuple[str, str]]) -> None: ...

    async def prepare(self) -> None:
        """Get ready for :meth:`refresh` (which runs every few seconds, first long after
        start)."""
        ...

    async def allow(self, rate: Rate, user: str) -> bool: ...

    async def allow_join(self, user: str, room_key: str | None) -> JoinVerdict:
        """Take a join token from ``user``; then, given ``room_key`` (a Redis key that exists
        while the room does, :meth:`app.broker.Broker.existence_key`), and the room being
        new, a new-room token too. One round trip on one Redis (three on Redis Cluster,
        whose keys are in different slots). Fails open, as :meth:`allow`: when Redis is
        unreachable the room counts as existing (the join then fails at the broker)."""
        ...

    async def ban(self, user: str, duration_s: float, reason: str) -> None: ...

    async def unban(self, user: str) -> bool: ...

    async def ban_of(self, user: str) -> Ban | None: ...

    async def close(self) -> None: ...


def _rates(settings: Settings) -> dict[str, tuple[float, int]]:
    return {
        "join": (settings.user_joins_per_s, settings.user_join_burst),
        "typing": (settings.user_typing_per_s, settings.user_typing_burst),
        "new_room": (settings.user_new_rooms_per_s, settings.user_new_room_burst),
        "invite": (settings.user_invites_per_s, settings.user_invite_burst),
        "history": (settings.history_reads_per_s, settings.history_read_burst),
        "read": (settings.user_reads_per_s, settings.user_read_burst),
        "search": (settings.user_searches_per_s, settings.user_search_burst),
        "upload": (settings.user_uploads_per_s, settings.user_upload_burst),
        "report": (settings.user_reports_per_s, settings.user_report_burst),
        "preview": (settings.user_previews_per_s, settings.user_preview_burst),
        "ip": (settings.ip_connections_per_s, settings.ip_connection_burst),
    }


# -- Redis --------------------------------------------------------------------------------


# KEYS: bucket   ARGV: rate, burst   -> 1 allowed, 0 refused
TAKE: Final = NOW + TOKEN_BUCKET + "return take(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), now)"

# KEYS: join bucket, new-room bucket, the room's existence key ('': not asked)
# ARGV: join rate, join burst, new-room rate, new-room burst
# -> 0 join refused, 1 new room refused, 2 admitted, 3 admitted, the room new
JOIN_GATE: Final = (
    NOW
    + TOKEN_BUCKET
    + """
if take(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), now) == 0 then return 0 end
if KEYS[3] == '' or redis.call('EXISTS', KEYS[3]) == 1 then return 2 end
if take(KEYS[2], tonumber(ARGV[3]), tonumber(ARGV[4]), now) == 0 then return 1 end
return 3
"""
)
_JOIN_VERDICTS: Final = (
    JoinVerdict.JOIN_RATE,
    JoinVerdict.NEW_ROOM_RATE,
    JoinVerdict.ADMITTED,
    JoinVerdict.NEW_ROOM,
)

# KEYS: ip bucket (or ''), ban, user's connections (sorted set conn -> expiry ms)
# ARGV: ip rate, ip burst, conn id, max connections, ttl ms
# -> 0 admitted, 1 banned, 2 too many connections, 3 address rate
ADMIT: Final = (
    NOW
    + TOKEN_BUCKET
    + """
if KEYS[1] ~= '' and take(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), now) == 0 then
  return 3
end
if redis.call('EXISTS', KEYS[2]) == 1 then return 1 end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
if redis.call('ZCARD', KEYS[3]) >= tonumber(ARGV[4]) then return 2 end
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[5]), ARGV[3])
redis.call('PEXPIRE', KEYS[3], ARGV[5])
return 0
"""
)

# KEYS: user's connections...   ARGV: ttl ms, then per key the conn id
REFRESH: Final = """
local t = redis.call('TIME')
local expires = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[1])
for i = 1, #KEYS do
  redis.call('ZADD', KEYS[i], 'XX', expires, ARGV[i + 1])
  redis.call('PEXPIRE', KEYS[i], ARGV[1])
end
return #KEYS
"""

_REFUSALS: Final = {1: Refusal.BANNED, 2: Refusal.TOO_MANY_CONNECTIONS, 3: Refusal.IP_RATE}
_REFRESH_BATCH: Final = 500
# Connections a call of the counts' upkeep refreshes (keep_counts): a few hundred commands for
# Redis at a time, the calls spread over half the interval.
COUNTS_CHUNK: Final = 100
_ERRORS: Final = REDIS_ERRORS


class RedisQuotas:
    """:class:`Quotas` in Redis, shared by every worker and pod of a deployment."""

    def __init__(self, settings: Settings) -> None:
        assert settings.uses_redis
        self._settings = settings
        self._prefix = settings.redis_prefix
        self._redis: Redis = command_client(settings)
        self._take = self._redis.register_script(TAKE)
        # Redis Cluster: a user's ban and connections share a hash tag (one slot for ADMIT),
        # the address bucket is taken apart, and calls are routed by slot.
        self._cluster = bool(settings.redis_cluster_nodes)
        self._pipeline: AutoPipeline | ClusterPipelines = pipelines_for(self._redis, settings)
        self._admit = self._redis.register_script(sharded(ADMIT, self._cluster))
        self._refresh = self._redis.register_script(REFRESH)
        self._join_gate = self._redis.register_script(JOIN_GATE)
        self._rates = _rates(settings)
        self._ttl_ms = int(settings.presence_ttl_s * 1000)

    def _key(self, *parts: str) -> str:
        return ":".join((self._prefix, "q", *parts))

    def _bucket_key(self, rate: str, who: str) -> str:
        """A token bucket (see app.broker.redis_scripts.TOKEN_BUCKET: a string since the
        buckets became GCRA; the hashes of before were under ``q:``, which old workers of a
        rolling deploy still read)."""
        return f"{self._prefix}:rate:{rate}:{who}"

    def _user_key(self, kind: str, user: str) -> str:
        """A user's ``ban`` or ``conns`` key (on Redis Cluster, in the user's slot)."""
        return f"{self._prefix}:q:{{u:{user}}}:{kind}" if self._cluster else self._key(kind, user)

    async def admit_address(self, ip: str | None) -> bool:
        if ip is None:
            return True
        rate, burst = self._rates["ip"]
        try:
            key = self._bucket_key("ip", ip)
            return bool(await self._pipeline.call(self._take, [key], [rate, burst]))
        except _ERRORS as exc:
            logger.warning("quotas unavailable, admitting address %s: %r", ip, exc)
            return True

    async def admit(self, user: str, conn_id: str, ip: str | None) -> Refusal | None:
        rate, burst = self._rates["ip"]
        ip_key = "" if ip is None else self._bucket_key("ip", ip)
        keys = [ip_key, self._user_key("ban", user), self._user_key("conns", user)]
        args: list[str | float] = [
            rate, burst, conn_id, self._settings.max_connections_per_user, self._ttl_ms,
        ]  # fmt: skip
        try:
            if self._cluster:  # the address's bucket is in another slot: taken apart
                if ip_key and not await self._pipeline.call(self._take, [ip_key], [rate, burst]):
                    return Refusal.IP_RATE
                keys[0] = f"{self._prefix}:q:{{u:{user}}}{ABSENT}"  # none, in the user's slot
            code = int(await self._pipeline.call(self._admit, keys, args))
        except _ERRORS as exc:
            logger.warning("quotas unavailable, admitting %s: %r", user, exc)
            return None
        return _REFUSALS.get(code)

    async def release(self, user: str, conn_id: str) -> None:
        with contextlib.suppress(*_ERRORS):  # else the entry expires by itself
            key = self._user_key("conns", user)
            await self._pipeline.command(key, "ZREM", key, conn_id)

    async def refresh(self, conns: Iterable[tuple[str, str]]) -> None:
        """Push back the expiry of each (user, connection id) of ``conns`` (up to
        ``_REFRESH_BATCH`` a script call); raises Redis' error."""
        pairs = list(conns)
        for start in range(0, len(pairs), _REFRESH_BATCH):
            batch = pairs[start : start + _REFRESH_BATCH]
            keys = [self._user_key("conns", user) for user, _ in batch]
            if self._cluster:  # one call per user's slot, pipelined per master
                await asyncio.gather(
                    *(
                        self._pipeline.call(self._refresh, [key], [self._ttl_ms, conn])
                        for key, (_, conn) in zip(keys, batch, strict=True)
                    )
                )
            else:
                await self._pipeline.call(
                    self._refresh, keys, [self._ttl_ms, *(c for _, c in batch)]
                )

    async def allow(self, rate: Rate, user: str) -> bool:
        per_s, burst = self._rates[rate]
        try:
            taken = await self._pipeline.call(
                self._take, [self._bucket_key(rate, user)], [per_s, burst]
            )
            return bool(taken)
        except _ERRORS:
            return True

    async def allow_join(self, user: str, room_key: str | None) -> JoinVerdict:
        if self._cluster:  # the buckets and the room are in different slots: asked apart
            return await self._allow_join_apart(user, room_key)
        join_rate, join_burst = self._rates["join"]
        new_rate, new_burst = self._rates["new_room"]
        keys = [self._bucket_key("join", user), self._bucket_key("new_room", user), room_key or ""]
        try:
            code = await self._pipeline.call(
                self._join_gate, keys, [join_rate, join_burst, new_rate, new_burst]
            )
        except _ERRORS:
            return JoinVerdict.ADMITTED
        return _JOIN_VERDICTS[int(code)]

    async def _allow_join_apart(self, user: str, room_key: str | None) -> JoinVerdict:
        if not await self.allow("join", user):
            return JoinVerdict.JOIN_RATE
        if room_key is None:
            return JoinVerdict.ADMITTED
        try:
            if await self._pipeline.command(room_key, "EXISTS", room_key):
                return JoinVerdict.ADMITTED
        except _ERRORS:
            return JoinVerdict.ADMITTED
        if not await self.allow("new_room", user):
            return JoinVerdict.NEW_ROOM_RATE
        return JoinVerdict.NEW_ROOM

    async def ban(self, user: str, duration_s: float, reason: str) -> None:
        key = self._user_key("ban", user)
        await self._redis.set(key, reason, px=max(1, int(duration_s * 1000)))

    async def unban(self, user: str) -> bool:
        return bool(await self._redis.delete(self._user_key("ban", user)))

    async def ban_of(self, user: str) -> Ban | None:
        key = self._user_key("ban", user)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.get(key)
            pipe.pttl(key)
            reason, ttl_ms = await pipe.execute()
        if reason is None:
            return None
        return Ban(reason.decode(), max(0.0, ttl_ms / 1000))

    async def prepare(self) -> None:
        await preload(self._redis, self._refresh)

    async def close(self) -> None:
        await self._pipeline.close()
        await close_client(self._redis)


# -- one process --------------------------------------------------------------------------


class MemoryQuotas:
    """:class:`Quotas` for one process (with the memory broker)."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._buckets = TokenBuckets(_rates(settings))
        self._conns: dict[str, set[str]] = {}
        self._bans: dict[str, tuple[str, float]] = {}

    async def admit_address(self, ip: str | None) -> bool:
        return ip is None or self._buckets.take("ip", ip)

    async def admit(self, user: str, conn_id: str, ip: str | None) -> Refusal | None:
        if ip is not None and not self._buckets.take("ip", ip):
            return Refusal.IP_RATE
        if await self.ban_of(user) is not None:
            return Refusal.BANNED
        conns = self._conns.setdefault(user, set())
        if len(conns) >= self._settings.max_connections_per_user:
            return Refusal.TOO_MANY_CONNECTIONS
        conns.add(conn_id)
        return None

    async def release(self, user: str, conn_id: str) -> None:
        conns = self._conns.get(user)
        if conns is not None:
            conns.discard(conn_id)
            if not conns:
                del self._conns[user]

    async def refresh(self, conns: Iterable[tuple[str, str]]) -> None:
        return None  # nothing here can outlive its process

    async def allow(self, rate: Rate, user: str) -> bool:
        return self._buckets.take(rate, user)

    async def allow_join(self, user: str, room_key: str | None) -> JoinVerdict:
        # No Redis to ask about a room_key: the memory broker names none (its existence_key).
        assert room_key is None, "one process' quotas cannot tell whether a room exists"
        return JoinVerdict.ADMITTED if self._buckets.take("join", user) else JoinVerdict.JOIN_RATE

    async def ban(self, user: str, duration_s: float, reason: str) -> None:
        self._bans[user] = (reason, time.monotonic() + duration_s)

    async def unban(self, user: str) -> bool:
        return self._bans.pop(user, None) is not None

    async def ban_of(self, user: str) -> Ban | None:
        found = self._bans.get(user)
        if found is None:
            return None
        left = found[1] - time.monotonic()
        if left <= 0:
            del self._bans[user]
            return None
        return Ban(found[0], left)

    async def prepare(self) -> None:
        return None

    async def close(self) -> None:
        return None


class _Counted(Protocol):
    """A connection, as its count knows it."""

    user: str
    id: str


async def refresh_counts(quotas: Quotas, conns: Sequence[_Counted], spread_s: float = 0.0) -> None:
    """One pass of :func:`keep_counts`: the counts of ``conns`` refreshed ``COUNTS_CHUNK``
    connections a call, the calls spread over ``spread_s``
    (:func:`~app.redisio.spread.spread`); a connection with no user yet is left out.
    Raises the first error (the pass stops there)."""
    chunks = range(0, len(conns), COUNTS_CHUNK)
    async for k in spread(len(chunks), spread_s):
        chunk = conns[chunks[k] : chunks[k] + COUNTS_CHUNK]
        await quotas.refresh([(conn.user, conn.id) for conn in chunk if conn.user])


async def keep_counts(quotas: Quotas, hub: Hub, interval_s: float) -> None:
    """Refresh this worker's connection counts (so those of a worker that died expire) until
    cancelled: a pass every ``interval_s`` after the last one ended, spread over half of
    that, so that a count is refreshed at most 1.5 ``interval_s`` after the last time."""
    await quotas.prepare()
    while True:
        await asyncio.sleep(interval_s)
        try:
            await refresh_counts(quotas, list(hub.connections), interval_s / 2)
        except _ERRORS as exc:
            logger.warning("could not refresh connection counts: %r", exc)


def create_quotas(settings: Settings) -> Quotas:
    return RedisQuotas(settings) if settings.uses_redis else MemoryQuotas(settings)
