"""RedisBroker: fan-out across Gunicorn workers and pods through Redis.

One pub/sub connection per worker, subscribed to the rooms and users its clients need, plus a
control channel of its own that carries a periodic canary. Publishing runs one Lua script that
assigns the id, appends to the room's bounded stream and publishes the frame atomically, so id
order is delivery order on every worker. Frames are built once, in Redis, and forwarded to
sockets as they arrive. See :mod:`app.broker.redis_scripts` for the key layout.

Self-healing: if the pub/sub connection fails, or the canary stops coming back (a deaf
subscription), the broker is not ready (``/readyz`` fails), reconnects with capped, jittered
exponential backoff, and resubscribes everything before it is ready again. Publishes meanwhile
raise :class:`~app.errors.BrokerUnavailable`, so clients get an error frame, never a silent
drop; what they missed live they recover from history with ``join`` + ``since``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

import orjson
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from app.broker import (
    BrokerHandler,
    BrokerStats,
    History,
    Published,
    QuotaBucket,
    RoomPresence,
)
from app.broker import redis_scripts as scripts
from app.errors import BrokerUnavailable, QuotaExceeded
from app.presence.announcer import PresenceAnnouncer
from app.redisio.autopipeline import AutoPipeline
from app.redisio.redis_seam import pack_with_hiredis
from app.redisio.subscription import Subscription
from app.settings import Settings

logger = logging.getLogger(__name__)
T = TypeVar("T")

_ERRORS = (RedisError, OSError, asyncio.TimeoutError)
_REFUSED_BY_QUOTA = 2  # the PUBLISH script's second reply, as published (0) or duplicate (1)


class RedisBroker:
    """A :class:`~app.broker.Broker` backed by Redis (7.0 or later)."""

    def __init__(self, settings: Settings) -> None:
        assert settings.redis_url is not None
        self._settings = settings
        self._prefix = settings.redis_prefix
        self.worker_id = secrets.token_hex(6)
        self._redis: Redis = pack_with_hiredis(
            Redis.from_url(
                settings.redis_url,
                socket_timeout=settings.redis_timeout_s,
                socket_connect_timeout=settings.redis_timeout_s,
                # Once, on a fresh connection: a pooled one may be stale (Redis restarted).
                # The asyncio Retry: the client awaits it (the sync one never retried).
                retry=Retry(NoBackoff(), 1),
            )
        )
        # The subscriber has no socket timeout: it blocks until a message comes. The canary
        # finds out when none can come any more.
        self._sub_redis: Redis = pack_with_hiredis(
            Redis.from_url(
                settings.redis_url,
                socket_connect_timeout=settings.redis_timeout_s,
                retry=Retry(NoBackoff(), 0),
            )
        )
        self._scripts = {
            name: self._redis.register_script(getattr(scripts, name))
            for name in (
                "PUBLISH",
                "HISTORY_SINCE",
                "LAST_ID",
                "PRESENCE_JOIN",
                "PRESENCE_LEAVE",
                "PRESENCE_REFRESH",
                "PRESENCE_SWEEP",
            )
        }
        self._pipeline = AutoPipeline(self._redis)
        self._handler: BrokerHandler | None = None
        self._rooms: set[str] = set()
        self._users: set[str] = set()
        self._present: dict[str, set[str]] = {}  # room -> users present through this worker
        self._subscription: Subscription | None = None
        self._room_prefix = f"{self._prefix}:r:".encode()
        self._user_prefix = f"{self._prefix}:u:".encode()
        self._moderation_bytes = self._moderation_channel.encode()
        self._control_bytes = self._control_channel.encode()
        self._confirmations: dict[bytes, asyncio.Future[None]] = {}
        self._ready = False
        self._tasks: list[asyncio.Task[None]] = []
        self._listener: asyncio.Task[None] | None = None
        self._canary_seen = 0.0
        self._stopping = False
        self._pubsub_lag_s = 0.0
        self._reconnects = 0
        self._deaf_reconnects = 0
        self._memory_used = self._memory_max = 0
        self._announcer = PresenceAnnouncer(
            self._publish_presence,
            self._count,
            settings.presence_max_members,
            settings.presence_count_interval_s,
        )

    # -- channels and keys --------------------------------------------------------------------

    def _room_channel(self, room: str) -> str:
        return f"{self._prefix}:r:{room}"

    def _user_channel(self, user: str) -> str:
        return f"{self._prefix}:u:{user}"

    @property
    def _moderation_channel(self) -> str:
        return f"{self._prefix}:mod"

    @property
    def _control_channel(self) -> str:
        return f"{self._prefix}:w:{self.worker_id}"

    def _room_key(self, room: str, part: str) -> str:
        return f"{self._prefix}:{{r:{room}}}:{part}"

    # -- lifecycle ----------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self._ready

    @property
    def stats(self) -> BrokerStats:
        return BrokerStats(
            self._reconnects,
            self._deaf_reconnects,
            self._pubsub_lag_s,
            self._memory_used,
            self._memory_max,
        )

    async def start(self, handler: BrokerHandler) -> None:
        """Start listening; returns at once. ``ready`` turns true once subscribed."""
        self._handler = handler
        self._tasks = [
            asyncio.create_task(self._supervise(), name="redis-listener"),
            asyncio.create_task(self._canary(), name="redis-canary"),
            asyncio.create_task(self._presence_upkeep(), name="redis-presence"),
        ]

    async def stop(self) -> None:
        self._stopping = True
        self._ready = False
        await self._announcer.close()
        tasks = [*self._tasks, *([self._listener] if self._listener else [])]
        for task in tasks:
            task.cancel()
        # redis-py may turn a cancellation into a timeout error; the loops also check
        # _stopping, and this wait is bounded whatever happens.
        done, pending = await asyncio.wait(tasks, timeout=self._settings.redis_timeout_s * 2)
        for task in done:
            if not task.cancelled():
                task.exception()  # retrieved: it was logged (or is moot) already
        if pending:
            logger.warning("redis broker: %d tasks did not stop in time", len(pending))
        try:
            await self._withdraw_presence()
        except (*_ERRORS, BrokerUnavailable) as exc:  # the entries expire by themselves
            logger.warning("could not withdraw presence on stop: %r", exc)
        await self._pipeline.close()
        await self._redis.aclose()
        await self._sub_redis.aclose()

    async def _supervise(self) -> None:
        """Keep one listener running; back off (capped, jittered) between attempts."""
        delay = 0.1
        while not self._stopping:
            self._listener = asyncio.create_task(self._listen())
            await asyncio.wait({self._listener})
            failure = "deaf subscription" if self._listener.cancelled() else None
            if failure is None:
                exc = self._listener.exception()
                failure = repr(exc) if exc is not None else "listener stopped"
            if self._ready:
                delay = 0.1  # it had been working: start the backoff over
            self._set_unready()
            self._reconnects += 1
            if self._listener.cancelled():
                self._deaf_reconnects += 1
            pause = random.uniform(delay / 2, delay)
            logger.warning("redis pub/sub lost (%s); reconnecting in %.2f s", failure, pause)
            await asyncio.sleep(pause)
            delay = min(delay * 2, self._settings.redis_reconnect_max_s)

    def _set_unready(self) -> None:
        self._ready = False
        for future in self._confirmations.values():
            if not future.done():
                future.set_exception(BrokerUnavailable("redis connection lost"))
        self._confirmations.clear()
        if self._handler is not None and not self._stopping:
            self._handler.link_lost()

    async def _listen(self) -> None:
        """Subscribe everything on a new connection; return only by raising what ended it."""
        subscription = await Subscription.open(self._sub_redis, self._on_push)
        self._subscription = subscription
        try:
            channels = [self._room_channel(r) for r in self._rooms]
            channels += [self._user_channel(u) for u in self._users]
            # The control channel goes last: its confirmation means all the others are done.
            subscription.subscribe(*channels, self._moderation_channel, self._control_channel)
            raise await subscription.lost
        finally:
            self._subscription = None
            subscription.close()

    def _on_push(self, push: list[Any]) -> None:
        """Handle one push of the subscription (called from its ``data_received``)."""
        kind, channel = push[0], push[1]
        handler = self._handler
        assert handler is not None
        if kind == b"message":
            data: bytes = push[2]
            if channel.startswith(self._room_prefix):
                handler.deliver_room(channel[len(self._room_prefix) :].decode(), data)
            elif channel.startswith(self._user_prefix):
                handler.deliver_user(channel[len(self._user_prefix) :].decode(), data)
            elif channel == self._moderation_bytes:
                order = orjson.loads(data)
                handler.kick(order["user"], order["reason"])
            elif channel == self._control_bytes:
                self._canary_seen = time.monotonic()
                self._pubsub_lag_s = max(0.0, time.time() - float(data))
        elif kind == b"subscribe":
            if channel == self._control_bytes and not self._ready:
                self._canary_seen = time.monotonic()
                self._ready = True
                if self._reconnects:
                    handler.resubscribed()
                    self._tasks = [task for task in self._tasks if not task.done()]
                    self._tasks.append(
                        asyncio.create_task(self._missed_kicks(), name="redis-missed-kicks")
                    )
                logger.info(
                    "redis pub/sub ready: %d rooms, %d users", len(self._rooms), len(self._users)
                )
            future = self._confirmations.pop(channel, None)
            if future is not None and not future.done():
                future.set_result(None)

    async def _canary(self) -> None:
        """Publish to our own control channel; no echo within the timeout means deaf."""
        interval = self._settings.canary_interval_s
        while not self._stopping:
            await asyncio.sleep(interval)
            if not self._ready:
                continue
            with contextlib.suppress(*_ERRORS):
                await self._redis.publish(self._control_channel, repr(time.time()))
            silent_for = time.monotonic() - self._canary_seen
            if silent_for > self._settings.canary_timeout_s and self._listener is not None:
                logger.warning("no canary for %.1f s: resubscribing", silent_for)
                self._listener.cancel()

    # -- subscriptions ------------------------------------------------------------------------

    async def _subscribe(self, channel: str) -> None:
        subscription = self._subscription
        if subscription is None or not self._ready:
            return  # remembered; the next connection subscribes it
        future = asyncio.get_running_loop().create_future()
        self._confirmations[channel.encode()] = future
        try:
            subscription.subscribe(channel)
            async with asyncio.timeout(self._settings.redis_timeout_s):
                await future
        except _ERRORS as exc:
            self._confirmations.pop(channel.encode(), None)
            raise BrokerUnavailable(f"cannot subscribe: {exc!r}") from exc

    async def _unsubscribe(self, channel: str) -> None:
        subscription = self._subscription
        if subscription is not None and self._ready:
            with contextlib.suppress(*_ERRORS):
                subscription.unsubscribe(channel)

    async def subscribe_room(self, room: str) -> None:
        self._rooms.add(room)
        await self._subscribe(self._room_channel(room))

    async def unsubscribe_room(self, room: str) -> None:
        self._rooms.discard(room)
        self._announcer.forget(room)
        await self._unsubscribe(self._room_channel(room))

    async def subscribe_user(self, user: str) -> None:
        self._users.add(user)
        with contextlib.suppress(BrokerUnavailable):  # resubscribed on reconnect
            await self._subscribe(self._user_channel(user))

    async def unsubscribe_user(self, user: str) -> None:
        self._users.discard(user)
        await self._unsubscribe(self._user_channel(user))

    # -- publishing and history ---------------------------------------------------------------

    async def _call(self, call: Callable[[], Awaitable[T]]) -> T:
        try:
            return await call()
        except _ERRORS as exc:
            raise BrokerUnavailable(f"redis: {exc!r}") from exc

    async def publish(
        self,
        room: str,
        user: str,
        text: str,
        cid: str | int | None,
        quota: QuotaBucket | None = None,
    ) -> Published:
        head = b'{"type":"message","room":' + orjson.dumps(room) + b',"id":'
        body = b',"user":' + orjson.dumps(user) + b',"text":' + orjson.dumps(text) + b',"ts":'
        dedup = "" if cid is None else self._room_key(room, f"cid:{user}:{cid!r}")
        keys = [self._room_key(room, "meta"), self._room_key(room, "log"), dedup]
        if self._settings.history_size == 0:
            keys[1] = ""
        return await self._publish(keys, self._room_channel(room), head, body, "", quota)

    async def publish_direct(
        self,
        sender: str,
        to: str,
        text: str,
        cid: str | int | None,
        quota: QuotaBucket | None = None,
    ) -> Published:
        head = b'{"type":"message","to":' + orjson.dumps(to) + b',"id":'
        body = b',"user":' + orjson.dumps(sender) + b',"text":' + orjson.dumps(text) + b',"ts":'
        tag = f"{self._prefix}:{{u:{to}}}"
        dedup = "" if cid is None else f"{tag}:cid:{sender}:{cid!r}"
        channel, copy = self._user_channel(to), self._user_channel(sender)
        keys = [f"{tag}:meta", "", dedup]
        return await self._publish(keys, channel, head, body, copy, quota)

    async def _publish(
        self,
        keys: list[str],
        channel: str,
        head: bytes,
        body: bytes,
        copy_channel: str,
        quota: QuotaBucket | None,
    ) -> Published:
        settings = self._settings
        args: list[Any] = [
            channel,
            head,
            body,
            settings.history_size + 1,  # the log's length, see redis_scripts
            int(settings.history_ttl_s * 1000),
            int(settings.dedup_ttl_s * 1000),
            copy_channel,
        ]
        if quota is None:
            keys.append("")
        else:
            keys.append(quota.key)
            args += [quota.per_s, quota.burst]
        try:
            reply = await self._pipeline.submit(self._scripts["PUBLISH"], keys, args)
        except _ERRORS as exc:
            raise BrokerUnavailable(f"redis: {exc!r}") from exc
        message_id, outcome = reply
        if outcome == _REFUSED_BY_QUOTA:
            raise QuotaExceeded(keys[3])
        return Published(int(message_id), duplicate=outcome == 1)

    async def history_since(self, room: str, since: int, limit: int) -> History:
        keys = [self._room_key(room, "meta"), self._room_key(room, "log")]
        settings = self._settings
        args = [since, limit, settings.recovery_max_messages, int(settings.history_ttl_s * 1000)]
        result = await self._call(lambda: self._scripts["HISTORY_SINCE"](keys=keys, args=args))
        recovered = bool(result[0])
        return History(recovered, list(result[2:]) if recovered else [], bool(result[1]))

    async def last_id(self, room: str) -> int:
        keys = [self._room_key(room, "meta"), self._room_key(room, "log")]
        ttl_ms = int(self._settings.history_ttl_s * 1000)
        return int(await self._call(lambda: self._scripts["LAST_ID"](keys=keys, args=[ttl_ms])))

    async def room_exists(self, room: str) -> bool:
        return bool(await self._call(lambda: self._redis.exists(self._room_key(room, "meta"))))

    async def history_before(self, room: str, before: int | None, limit: int) -> list[bytes]:
        upper = "+" if before is None else f"({before}-0"
        entries = await self._call(
            lambda: self._redis.xrevrange(self._room_key(room, "log"), upper, "-", count=limit)
        )
        return [cast(bytes, fields[b"f"]) for _, fields in reversed(entries or []) if fields]

    # -- presence -----------------------------------------------------------------------------

    def _presence_keys(self, room: str, user: str) -> list[str]:
        return [self._room_key(room, "present"), self._room_key(room, f"tabs:{user}")]

    async def presence_join(self, room: str, user: str) -> None:
        self._present.setdefault(room, set()).add(user)
        now = int(time.time() * 1000)
        ttl = int(self._settings.presence_ttl_s * 1000)
        changed = await self._call(
            lambda: self._scripts["PRESENCE_JOIN"](
                keys=self._presence_keys(room, user),
                args=[user, self.worker_id, now, now + ttl, ttl],
            )
        )
        if changed:
            await self._announcer.announce(room, "join", user)

    async def presence_leave(self, room: str, user: str) -> None:
        users = self._present.get(room)
        if users is not None:
            users.discard(user)
            if not users:
                del self._present[room]
        now = int(time.time() * 1000)
        changed = await self._call(
            lambda: self._scripts["PRESENCE_LEAVE"](
                keys=self._presence_keys(room, user), args=[user, self.worker_id, now]
            )
        )
        if changed:
            await self._announcer.announce(room, "leave", user)

    def _kick_key(self, user: str) -> str:
        return f"{self._prefix}:kick:{user}"

    async def kick(self, user: str, reason: str) -> None:
        """Remembered (as long as history is) for the workers that miss the publish."""
        order = orjson.dumps({"user": user, "reason": reason, "at": time.time()})
        ttl_ms = int(self._settings.history_ttl_s * 1000)
        await self._call(lambda: self._redis.set(self._kick_key(user), order, px=ttl_ms))
        await self._call(lambda: self._redis.publish(self._moderation_channel, order))

    async def _missed_kicks(self) -> None:
        """After an outage: apply the kicks of local users this worker may have missed."""
        users = sorted(self._users)
        if not users or self._handler is None:
            return
        try:
            orders = await self._call(
                lambda: self._redis.mget([self._kick_key(user) for user in users])
            )
        except BrokerUnavailable as exc:
            logger.warning("cannot check for missed kicks: %s", exc)
            return
        for user, order in zip(users, orders, strict=True):
            if order is not None:
                kick = orjson.loads(order)
                self._handler.kick(user, kick["reason"], issued_at=kick["at"])

    async def broadcast(self, room: str, payload: bytes) -> None:
        await self._call(lambda: self._redis.publish(self._room_channel(room), payload))

    async def _publish_presence(self, room: str, payload: bytes) -> None:
        await self.broadcast(room, payload)

    async def _count(self, room: str) -> int:
        key = self._room_key(room, "present")
        now = int(time.time() * 1000)
        return int(await self._call(lambda: self._redis.zcount(key, now, "+inf")))

    async def presence(self, room: str) -> RoomPresence:
        count = await self._count(room)
        if count > self._settings.presence_max_members:
            return RoomPresence(count, None)
        key, now = self._room_key(room, "present"), int(time.time() * 1000)
        users = await self._call(lambda: self._redis.zrangebyscore(key, now, "+inf"))
        return RoomPresence(count, sorted(cast(bytes, u).decode() for u in users))

    async def _presence_upkeep(self) -> None:
        """Refresh this worker's entries, sweep out users of dead workers and read Redis'
        memory, every ttl/3."""
        while not self._stopping:
            await asyncio.sleep(self._settings.presence_ttl_s / 3)
            if not self._ready:
                continue
            try:
                await self._refresh_presence()
                await self._sweep_presence()
                await self._read_memory()
            except (*_ERRORS, BrokerUnavailable) as exc:
                logger.warning("presence upkeep failed: %r", exc)

    async def _read_memory(self) -> None:
        """Redis' memory and its limit, for the metrics (a full Redis with `noeviction`
        refuses every publish: SREs must see it coming)."""
        info = await self._redis.info("memory")
        self._memory_used = int(info.get("used_memory", 0))
        self._memory_max = int(info.get("maxmemory", 0))

    async def _refresh_presence(self) -> None:
        now = int(time.time() * 1000)
        ttl = int(self._settings.presence_ttl_s * 1000)
        for room, users in list(self._present.items()):
            ordered = sorted(users)
            keys = [self._room_key(room, "present")]
            keys += [self._room_key(room, f"tabs:{u}") for u in ordered]
            await self._scripts["PRESENCE_REFRESH"](
                keys=keys, args=[self.worker_id, now + ttl, ttl, *ordered]
            )

    async def _sweep_presence(self) -> None:
        now = int(time.time() * 1000)
        for room in list(self._rooms):
            gone = await self._scripts["PRESENCE_SWEEP"](
                keys=[self._room_key(room, "present")],
                args=[now, self._room_key(room, "tabs:")],
            )
            for user in gone:
                await self._announcer.announce(room, "leave", user.decode())

    async def _withdraw_presence(self) -> None:
        """On a clean stop, leave every room at once instead of waiting for expiry."""
        for room, users in list(self._present.items()):
            for user in list(users):
                await self.presence_leave(room, user)
