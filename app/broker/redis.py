"""RedisBroker: fan-out across Gunicorn workers and pods through Redis.

One pub/sub connection per worker, subscribed to the rooms and users its clients need, plus a
control channel of its own that carries a periodic canary. Publishing runs one Lua script that
assigns the id, appends to the room's bounded stream and publishes the frame atomically, so id
order is delivery order on every worker. Frames are built once, in Redis, and forwarded to
sockets as they arrive. See :mod:`app.broker.redis_scripts` and :mod:`app.broker.keys` for the
key layout.

On one Redis, or through Sentinels, that is one master. On Redis Cluster each room's keys and
channel are in its partition's slot: publishes go to that slot's master
(:class:`~app.redisio.cluster.ClusterPipelines`, a pipeline per master), rooms are heard on one
sharded pub/sub connection per master (:class:`~app.redisio.shards.Shards`, ``SSUBSCRIBE``,
each with a canary), users and control channels on one classic connection; any of them lost
is handled as the one connection is below, on the topology as it is then.

Self-healing: if the pub/sub connection fails, or the canary stops coming back (a deaf
subscription), the broker is not ready (``/readyz`` fails), reconnects with capped, jittered
exponential backoff, and resubscribes everything before it is ready again. Publishes meanwhile
raise :class:`~app.errors.BrokerUnavailable`, so clients get an error frame, never a silent
drop; what they missed live they recover from history with ``join`` + ``since``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

import orjson
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.sentinel import SentinelConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError

from app.broker import BrokerHandler, BrokerStats, History, Message, PublishDone, Published
from app.broker import redis_scripts as scripts
from app.broker.keys import KeyLayout
from app.conversations.lifecycle import Change, Kind, Target, with_state
from app.conversations.names import addressed, direct, is_direct
from app.errors import BrokerUnavailable, MessageGone, QuotaExceeded
from app.protocol import event_frame_parts, is_message_frame, message_frame_parts, message_id_of
from app.redisio.autopipeline import SERVER_RUN_ID, AutoPipeline, Merge, NotReplicated, Script
from app.redisio.clients import (
    REDIS_ERRORS,
    call_redis,
    close_client,
    command_client,
    describe,
    node_client,
    subscriber_client,
)
from app.redisio.cluster import ClusterPipelines
from app.redisio.shards import Shards
from app.redisio.subscription import Subscription
from app.settings import Settings
from app.transport.eager import start_eagerly
from app.webhooks import webhook_keys

logger = logging.getLogger(__name__)

_MEMORY_READ_INTERVAL_S = 5.0
_PUBLISHED = 0  # the publishing scripts' second reply: published (1: a duplicate of the first)
_REFUSED_BY_QUOTA = 2  # the PUBLISH script's second reply, as published (0) or duplicate (1)
_GONE = 3  # the EVENT script's second reply: the message is deleted
_FAILED = 4  # the PUBLISH script's second reply: Redis refused this message (the first says why)
_FROM_THE_STORE = 2  # HISTORY_SINCE's first reply: the page is the store's
_HEADERS_KEPT = 16  # publishing headers kept per quota (a deployment has one or two quotas)
_CONVERSATIONS_KEPT = 8192  # conversations whose publishing keys are kept (~300 bytes each)


class RedisBroker:
    """A :class:`~app.broker.Broker` backed by Redis (7.0 or later)."""

    def __init__(self, settings: Settings, on_reply: Callable[[], None] = lambda: None) -> None:
        """``on_reply``: called each time Redis' replies have been handed to the calls that
        wait for them (see :class:`~app.redisio.autopipeline.AutoPipeline`)."""
        assert settings.uses_redis
        self._settings = settings
        self._prefix = settings.redis_prefix
        self.worker_id = secrets.token_hex(6)
        self._keys = KeyLayout.of(settings)
        self._redis: Redis = command_client(settings)
        # Redis Cluster: sharded pub/sub, scripts routed by slot (see _listen, ClusterPipelines).
        self._cluster: RedisCluster | None = None
        self._shards: Shards | None = None
        self._pipeline: AutoPipeline | ClusterPipelines
        wait = (settings.redis_wait_replicas, settings.redis_wait_timeout_s)
        if settings.redis_cluster_nodes:
            self._cluster = cast(RedisCluster, self._redis)
            self._sub_redis = self._redis  # unused: Shards opens one connection per master
            self._pipeline = ClusterPipelines(
                self._cluster,
                functools.partial(node_client, settings),
                *wait,
                max_merged=settings.redis_merge_max,
                wait_required=settings.redis_wait_policy == "required",
                on_reply=on_reply,
            )
        else:
            self._sub_redis = subscriber_client(settings)
            self._pipeline = AutoPipeline(
                self._redis,
                wait_replicas=wait[0],
                wait_timeout_s=wait[1],
                max_merged=settings.redis_merge_max,
                wait_required=settings.redis_wait_policy == "required",
                on_reply=on_reply,
            )
        cluster = self._cluster is not None
        publish, event = scripts.publishing_library(cluster)
        self._scripts: dict[str, Script] = {"PUBLISH": publish, "EVENT": event}
        for name in ("HISTORY_SINCE", "LAST_ID"):
            script = scripts.sharded(getattr(scripts, name), cluster)
            self._scripts[name] = self._redis.register_script(script)
        self._take = self._redis.register_script(scripts.TAKE)
        self._archiving = settings.database_url is not None
        # The PUBLISH script's webhook keys: none unless message.created goes to a webhook
        # (never on Redis Cluster: the settings refuse it).
        queue, not_queued, _ = webhook_keys(self._prefix)
        wanted = settings.webhook_url is not None and "message.created" in settings.webhook_events
        self._webhook_keys = (queue, not_queued) if wanted else ("", "")
        # The publishing calls' shared keys: none when they would all be '' (see redis_scripts).
        self._shared_keys = scripts.SHARED_KEYS if self._archiving or wanted else 0
        # The publishing scripts' header (see redis_scripts.HEADER_ARGS): the same objects for
        # every publish with the user quota, so that their calls can merge.
        self._headers: dict[tuple[float, int], tuple[Any, ...]] = {}
        self._quota = (settings.user_messages_per_s, settings.user_message_burst)
        self._header = self._publish_header(self._quota)
        self._merge = Merge(0, 3, scripts.HEADER_ARGS, self._shared_keys)  # one Redis: one group
        # The keys of the conversations published in lately, made once each (see _keys_of).
        self._conversation_keys = functools.lru_cache(maxsize=_CONVERSATIONS_KEPT)(self._keys_of)
        self._handler: BrokerHandler | None = None
        self._rooms: set[str] = set()
        self._users: set[str] = set()
        self._subscription: Subscription | None = None
        self._room_prefix = f"{self._prefix}:r:".encode()
        self._user_prefix = f"{self._prefix}:u:".encode()
        self._moderation_bytes = self._moderation_channel.encode()
        self._rooms_bytes = self._rooms_channel.encode()
        self._control_bytes = self._control_channel.encode()
        self._confirmations: dict[bytes, asyncio.Future[None]] = {}
        # The canary channels (this worker's control channel, and on Redis Cluster one shard
        # channel per master) -> when each was last heard; and those not confirmed yet since
        # the last (re)subscription: the broker is ready once none is left.
        self._canaries: dict[bytes, float] = {}
        self._unconfirmed: set[bytes] = set()
        self._ready = False
        self._tasks: list[asyncio.Task[None]] = []
        self._publishing: set[asyncio.Task[None]] = set()  # publish_soon's on Redis Cluster
        self._listener: asyncio.Task[None] | None = None
        self._stopping = False
        self._pubsub_lag_s = 0.0
        self._reconnects = 0
        self._deaf_reconnects = 0
        self._memory_used = self._memory_max = 0
        self._master: Any = None  # with Sentinels: the master the subscription is on
        self._master_moved = False
        self._failovers = self._not_replicated = 0
        # Redis Cluster: the master each subscribed room's channel is on, each shard canary's
        # master, and the rooms of lost masters being subscribed again (see _shard_lost).
        self._room_masters: dict[str, str] = {}
        self._canary_masters: dict[bytes, str] = {}
        self._recovering: dict[str, set[str]] = {}
        self._recoveries: dict[str, asyncio.Task[None]] = {}
        self._shard_losses = 0

    # -- channels and keys --------------------------------------------------------------------

    def _room_channel(self, room: str) -> str:
        if self._cluster is not None:  # a shard channel, in the room's slot
            return f"{self._prefix}:{self._keys.tag(room)}:c:{room}"
        return f"{self._prefix}:r:{room}"

    def _user_channel(self, user: str) -> str:
        return f"{self._prefix}:u:{user}"

    @property
    def _moderation_channel(self) -> str:
        return f"{self._prefix}:mod"

    @property
    def _rooms_channel(self) -> str:
        return f"{self._prefix}:rooms"

    @property
    def _control_channel(self) -> str:
        return f"{self._prefix}:w:{self.worker_id}"

    def _room_key(self, room: str, part: str) -> str:
        return self._keys.room(room, part)

    def _quota_key(self, user: str) -> str:
        return f"{self._prefix}:rate:message:{user}"

    # -- lifecycle ----------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self._ready

    @property
    def stats(self) -> BrokerStats:
        return BrokerStats(
            self._reconnects,
            self._deaf_reconnects,
            self._failovers,
            self._not_replicated,
            self._pipeline.acked_without_replicas,
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
            asyncio.create_task(self._watch_memory(), name="redis-memory"),
        ]

    async def stop(self) -> None:
        self._stopping = True
        self._ready = False
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
        await self._pipeline.close()
        await close_client(self._redis)
        if self._sub_redis is not self._redis:
            await close_client(self._sub_redis)

    async def _supervise(self) -> None:
        """Keep one listener running; back off (capped, jittered) between attempts."""
        delay = 0.1
        while not self._stopping:
            self._listener = asyncio.create_task(self._listen())
            await asyncio.wait({self._listener})
            deaf = self._listener.cancelled() and not self._master_moved
            failure = (
                "deaf subscription" if deaf else "master moved" if self._master_moved else None
            )
            self._master_moved = False
            if failure is None:
                exc = self._listener.exception()
                failure = repr(exc) if exc is not None else "listener stopped"
            if self._ready:
                delay = 0.1  # it had been working: start the backoff over
            self._set_unready()
            self._reconnects += 1
            if deaf:
                self._deaf_reconnects += 1
            elif failure == "master moved":
                self._failovers += 1
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
        if self._cluster is not None:
            await self._listen_to_shards(self._cluster)
            return
        subscription = await Subscription.open(self._sub_redis, self._on_push)
        self._subscription = subscription
        # With Sentinels: the master it was opened on (see _follow_master).
        self._master = getattr(self._sub_redis.connection_pool, "master_address", None)
        try:
            channels = [self._room_channel(r) for r in self._rooms]
            channels += [self._user_channel(u) for u in self._users]
            self._expect_canaries([self._control_channel])
            # The control channel goes last: its confirmation means all the others are done.
            control = self._control_channel.encode()
            confirmed = self._confirmations[control] = asyncio.get_running_loop().create_future()
            subscription.subscribe(
                *channels, self._moderation_channel, self._rooms_channel, self._control_channel
            )
            await self._confirmed_in_time(subscription, confirmed)
            raise await subscription.lost
        finally:
            self._subscription = None
            subscription.close()

    async def _confirmed_in_time(
        self, subscription: Subscription, confirmed: asyncio.Future[None]
    ) -> None:
        """Until Redis confirms the subscription (``confirmed``); raises when it has not within
        the canary timeout (the canaries watch only a confirmed one: one never confirmed
        would leave the worker unready for good). Returns at once if it is lost first."""
        timeout_s = self._settings.canary_timeout_s
        watched: set[asyncio.Future[Any]] = {confirmed, subscription.lost}
        try:
            await asyncio.wait(watched, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not confirmed.done():
                confirmed.cancel()
                self._confirmations.pop(self._control_channel.encode(), None)
        if not confirmed.cancelled() and confirmed.exception() is None:
            return
        if not subscription.lost.done():
            raise RedisConnectionError(f"the subscription was not confirmed in {timeout_s} s")

    async def _listen_to_shards(self, cluster: RedisCluster) -> None:
        """Redis Cluster: the rooms' shard channels on a connection per master (each with a
        canary of its own, last), users' and control channels on a classic one."""
        shards = await Shards.open(
            cluster, functools.partial(node_client, self._settings, subscriber=True), self._on_push
        )
        self._shards = shards
        try:
            canaries = shards.canary_channels(self._control_channel)
            self._expect_canaries([self._control_channel, *canaries.values()])
            by_master: dict[Subscription, list[str]] = {}
            for room in self._rooms:
                channel = self._room_channel(room)
                subscription = shards.for_channel(channel)
                if subscription is None:
                    raise BrokerUnavailable(f"no master serves {channel}'s slot")
                by_master.setdefault(subscription, []).append(channel)
            for name, subscription in shards.by_master.items():
                # One SSUBSCRIBE per channel: Redis takes several only within one slot. The
                # canary goes last: its confirmation means the others are done.
                for channel in [*by_master.get(subscription, []), canaries[name]]:
                    subscription.ssubscribe(channel)
            assert shards.classic is not None
            shards.classic.subscribe(
                *[self._user_channel(u) for u in self._users],
                self._moderation_channel, self._rooms_channel, self._control_channel,
            )  # fmt: skip
            self._room_masters = {
                room: shards.master_of(self._room_channel(room)).name for room in self._rooms
            }
            self._canary_masters = {channel.encode(): name for name, channel in canaries.items()}
            while True:
                master, exc = await shards.lost_one()
                if master is None:
                    await self._replace_classic(shards, exc)
                else:
                    self._shard_lost(shards, master, exc)
        finally:
            recoveries = list(self._recoveries.values())
            self._recoveries.clear()
            for task in recoveries:
                task.cancel()
            if recoveries:  # so that none opens a connection after the shards are closed
                done, _ = await asyncio.wait(recoveries, timeout=self._settings.redis_timeout_s)
                for task in done:
                    if not task.cancelled():
                        task.exception()  # logged by the recovery (or moot on stopping)
            self._shards = None
            shards.close()

    async def _replace_classic(self, shards: Shards, exc: Exception) -> None:
        """Redis Cluster: the classic connection (users' and control channels) ended, its
        master perhaps down: open it again on a master that answers, the rooms going on
        meanwhile. Direct messages, kicks and room notices sent in between may have been
        missed: the handler is told (``notices_missed``) and missed kicks are applied.
        Raises (everything is subscribed again) when no master answers within the canary
        timeout."""
        assert self._cluster is not None
        logger.warning("redis cluster: lost the classic pub/sub connection (%r)", exc)
        deadline = time.monotonic() + self._settings.canary_timeout_s
        client_for = functools.partial(node_client, self._settings, subscriber=True)
        delay = 0.05
        while True:
            try:
                await self._cluster.nodes_manager.initialize()
                for node in self._cluster.get_primaries():
                    try:
                        classic = await Subscription.open(client_for(node), self._on_push)
                        break
                    except REDIS_ERRORS:
                        continue
                else:
                    raise BrokerUnavailable("no master answers")
            except (*REDIS_ERRORS, BrokerUnavailable):
                if time.monotonic() > deadline:
                    raise exc from None
                await asyncio.sleep(random.uniform(delay / 2, delay))
                delay = min(delay * 2, self._settings.redis_reconnect_max_s)
                continue
            if shards.classic is not None:
                shards.classic.close()
            shards.classic = classic
            control = self._control_channel
            future = asyncio.get_running_loop().create_future()
            self._confirmations[control.encode()] = future
            classic.subscribe(
                *[self._user_channel(u) for u in self._users],
                self._moderation_channel, self._rooms_channel, control,
            )  # fmt: skip
            async with asyncio.timeout(self._settings.redis_timeout_s):
                await future  # the last: the others are confirmed too
            self._canaries[control.encode()] = time.monotonic()
            if self._handler is not None:
                self._handler.notices_missed()
            self._tasks = [task for task in self._tasks if not task.done()]
            self._tasks.append(asyncio.create_task(self._missed_kicks(), name="redis-missed-kicks"))
            logger.info("redis cluster: the classic pub/sub connection is back")
            return

    def _shard_lost(self, shards: Shards, master: str, exc: Exception) -> None:
        """Redis Cluster: one master's sharded subscription ended. Its rooms fall behind
        (the others go on live, and the worker stays ready); they are subscribed again on
        whichever master serves their slots once the cluster says (a failover takes a
        second or two), then catch up from history (:meth:`_recover_shard`)."""
        rooms = [room for room, name in self._room_masters.items() if name == master]
        for channel, name in list(self._canary_masters.items()):
            if name == master:
                del self._canary_masters[channel]
                self._canaries.pop(channel, None)
        logger.warning(
            "redis cluster: lost the subscription on %s (%r): %d rooms catch up once it is "
            "back or replaced", master, exc, len(rooms),
        )  # fmt: skip
        self._shard_losses += 1
        if self._handler is not None and rooms:
            self._handler.rooms_lost(rooms)
        self._recover(shards, master, rooms)

    def _recover(self, shards: Shards, master: str, rooms: list[str]) -> None:
        """Start (or extend) the recovery of ``master``'s ``rooms``."""
        pending = self._recovering.setdefault(master, set())
        pending.update(rooms)
        if master not in self._recoveries or self._recoveries[master].done():
            self._recoveries[master] = asyncio.create_task(
                self._recover_shard(shards, master), name=f"redis-shard-{master}"
            )

    async def _recover_shard(self, shards: Shards, master: str) -> None:
        """Subscribe the rooms that were on ``master`` again, on the masters serving their
        slots now (the topology read again each attempt), with capped, jittered backoff."""
        delay = 0.1
        assert self._cluster is not None
        while not self._stopping:
            await asyncio.sleep(random.uniform(delay / 2, delay))
            delay = min(delay * 2, self._settings.redis_reconnect_max_s)
            pending = self._recovering.setdefault(master, set())
            pending.intersection_update(self._rooms)  # not those left meanwhile
            rooms = sorted(pending)
            try:
                await self._cluster.nodes_manager.initialize()
                for node in self._cluster.get_primaries():  # every master heard, as at start
                    if node.name not in shards.by_master:
                        await self._open_shard(shards, node)
                by_master: dict[str, list[str]] = {}
                nodes = {}
                for room in rooms:
                    node = shards.master_of(self._room_channel(room))
                    by_master.setdefault(node.name, []).append(room)
                    nodes[node.name] = node
                for name, its_rooms in by_master.items():
                    subscription = shards.by_master.get(name)
                    if subscription is None:
                        subscription = await self._open_shard(shards, nodes[name])
                    await self._ssubscribe_confirmed(subscription, its_rooms, name)
            except (*REDIS_ERRORS, BrokerUnavailable) as exc:
                logger.info(
                    "redis cluster: %d rooms of %s not back yet: %r", len(rooms), master, exc
                )
                continue
            pending = self._recovering.get(master, set())
            pending.difference_update(rooms)
            if self._handler is not None and rooms:
                self._handler.rooms_back(rooms)
            logger.info(
                "redis cluster: the %d rooms of %s are subscribed again", len(rooms), master
            )
            if not pending:  # else rooms joined meanwhile: another round for them
                self._recovering.pop(master, None)
                self._recoveries.pop(master, None)
                return

    async def _open_shard(self, shards: Shards, node: Any) -> Subscription:
        """A sharded subscription on ``node`` with its canary (confirmed)."""
        client_for = functools.partial(node_client, self._settings, subscriber=True)
        subscription = await shards.open_master(node, client_for, self._on_push)
        canary = shards.canary_channel(self._control_channel, node.name)
        if canary is not None:
            await self._ssubscribe_confirmed(subscription, [], node.name, canary)
            self._canary_masters[canary.encode()] = node.name
            self._canaries[canary.encode()] = time.monotonic()
        return subscription

    async def _ssubscribe_confirmed(
        self, subscription: Subscription, rooms: list[str], master: str, *channels: str
    ) -> None:
        """SSUBSCRIBE ``rooms``' channels (and ``channels``) on ``subscription``; return once
        Redis confirmed them all (``redis_timeout_s`` at most)."""
        wanted = [*(self._room_channel(room) for room in rooms), *channels]
        loop = asyncio.get_running_loop()
        futures = []
        for channel in wanted:
            future = loop.create_future()
            self._confirmations[channel.encode()] = future
            futures.append(future)
            subscription.ssubscribe(channel)
        for room in rooms:
            self._room_masters[room] = master
        async with asyncio.timeout(self._settings.redis_timeout_s):
            await asyncio.gather(*futures)

    def _expect_canaries(self, channels: list[str]) -> None:
        """A (re)subscription begins: ready once each canary channel is confirmed."""
        self._canaries = {channel.encode(): 0.0 for channel in channels}
        self._unconfirmed = set(self._canaries)

    def _on_push(self, push: list[Any]) -> None:
        """Handle one push of the subscription (called from its ``data_received``)."""
        kind, channel = push[0], push[1]
        handler = self._handler
        assert handler is not None
        if kind == b"message":
            data = push[2]
            if channel.startswith(self._room_prefix):
                room = channel[len(self._room_prefix) :].decode()
                handler.deliver_room(room, message_id_of(data), data)
            elif channel.startswith(self._user_prefix):
                user = channel[len(self._user_prefix) :].decode()
                handler.deliver_user(user, message_id_of(data), data)
            elif channel == self._rooms_bytes:
                handler.room_changed(data.decode())
            elif channel == self._moderation_bytes:
                order = orjson.loads(data)
                handler.kick(order["user"], order["reason"])
            elif channel == self._control_bytes and data[:1] == b"{":  # not a canary's time
                handler.deliver_routed(data)
            elif channel in self._canaries:
                self._heard_canary(channel, data)
        elif kind == b"smessage":  # Redis Cluster: a room's shard channel, or a canary
            data = push[2]
            if channel in self._canaries:
                self._heard_canary(channel, data)
            else:
                handler.deliver_room(_room_of(channel), message_id_of(data), data)
        elif kind == b"sunsubscribe":
            # Redis Cluster drops the shard channels of a slot that moved to another master:
            # for a room still wanted, every subscription is made again, on today's topology.
            room = _room_of(channel) if _SHARD_ROOM in channel else None
            if room in self._rooms and self._ready and self._listener is not None:
                logger.warning("redis cluster: %r moved to another master; resubscribing", channel)
                self._listener.cancel()
        elif kind in (b"subscribe", b"ssubscribe"):
            self._unconfirmed.discard(channel)
            if not self._unconfirmed and not self._ready:
                now = time.monotonic()
                self._canaries = dict.fromkeys(self._canaries, now)
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

    def _heard_canary(self, channel: bytes, data: bytes) -> None:
        self._canaries[channel] = time.monotonic()
        self._pubsub_lag_s = max(0.0, time.time() - float(data))

    async def _canary(self) -> None:
        """Publish to each canary channel; one not heard within the timeout means deaf."""
        interval = self._settings.canary_interval_s
        while not self._stopping:
            await asyncio.sleep(interval)
            if not self._ready:
                continue
            for channel in list(self._canaries):  # each alone: one master down is one
                with contextlib.suppress(*REDIS_ERRORS):
                    sent, name = repr(time.time()), channel.decode()
                    if self._cluster is None:
                        await self._redis.publish(name, sent)
                    elif channel != self._control_bytes:  # a shard's, to its master
                        await self._pipeline.command(name, "SPUBLISH", name, sent)
                    else:
                        await self._publish_anywhere(name, sent)
            with contextlib.suppress(*REDIS_ERRORS):
                await self._follow_master()
            now, timeout = time.monotonic(), self._settings.canary_timeout_s
            for channel, heard in list(self._canaries.items()):
                master = self._canary_masters.get(channel)
                if now - heard <= timeout or master is None or self._shards is None:
                    continue
                # Redis Cluster: that master's subscription is deaf: it alone is replaced.
                logger.warning(
                    "no canary from %s for %.1f s: resubscribing it", master, now - heard
                )
                subscription = self._shards.by_master.get(master)
                if subscription is not None:
                    subscription.close()  # _listen_to_shards hears it as lost
                self._canaries[channel] = now  # once
            silent_for = now - self._canaries.get(self._control_bytes, now)
            if silent_for > timeout and self._listener is not None:
                logger.warning("no canary for %.1f s: resubscribing", silent_for)
                self._listener.cancel()

    async def _publish_anywhere(self, channel: str, payload: str | bytes) -> None:
        """Redis Cluster: ``PUBLISH`` (which every node hears) on the first master that
        answers: the one of ``channel``'s slot, else each shard canary's in turn (through
        the pipelines: redis-py's cluster client, after an error, asks a node that may be
        down before every command)."""
        routes = [channel, *(c.decode() for c in self._canary_masters)]
        for route in routes:
            try:
                await self._pipeline.command(route, "PUBLISH", channel, payload)
                return
            except REDIS_ERRORS:
                if route == routes[-1]:
                    raise

    async def _follow_master(self) -> None:
        """With Sentinels: when they name another master (a planned failover leaves the old
        one up, taking writes, until they demote it), move the publishes and the subscription
        there now. Publishes waiting on the old master fail with ``broker_unavailable``."""
        pool = getattr(self._redis, "connection_pool", None)  # RedisCluster has none
        if not isinstance(pool, SentinelConnectionPool):
            return
        master = await pool.get_master_address()  # type: ignore[no-untyped-call]
        if self._ready and self._master is not None and master != self._master:
            logger.warning(
                "the Sentinels name a new master %s (was %s): moving", master, self._master
            )
            self._pipeline.reconnect()
            if self._listener is not None:
                self._master_moved = True
                self._listener.cancel()

    # -- subscriptions ------------------------------------------------------------------------

    def _subscription_for(self, channel: str, room: bool) -> Subscription | None:
        """The connection ``channel`` is subscribed on (a room's shard channel on Redis
        Cluster: its master's); None while there is none."""
        if self._cluster is None:
            return self._subscription
        if self._shards is None:
            return None
        return self._shards.for_channel(channel) if room else self._shards.classic

    async def _subscribe(self, channel: str, room: bool = False) -> None:
        if not self._ready:
            return  # remembered; the next connection subscribes it
        try:
            subscription = self._subscription_for(channel, room)
            if subscription is None:
                # Redis Cluster: the slot's master is failing over, or new to this worker: the
                # room is subscribed once it is there (the join is refused meanwhile; the
                # client tries again).
                if room and self._shards is not None:
                    master = self._shards.master_of(channel).name
                    self._recover(self._shards, master, [self._room_of_channel(channel)])
                raise BrokerUnavailable(f"no subscription serves {channel!r} yet")
            if room and self._shards is not None:
                self._room_masters[self._room_of_channel(channel)] = self._shards.master_of(
                    channel
                ).name
        except REDIS_ERRORS as exc:  # Redis Cluster: no master known for the slot yet
            raise BrokerUnavailable(f"cannot subscribe: {describe(exc)}") from exc
        future = asyncio.get_running_loop().create_future()
        self._confirmations[channel.encode()] = future
        try:
            if room and self._cluster is not None:
                subscription.ssubscribe(channel)
            else:
                subscription.subscribe(channel)
            async with asyncio.timeout(self._settings.redis_timeout_s):
                await future
        except REDIS_ERRORS as exc:
            self._confirmations.pop(channel.encode(), None)
            raise BrokerUnavailable(f"cannot subscribe: {describe(exc)}") from exc

    async def _unsubscribe(self, channel: str, room: bool = False) -> None:
        with contextlib.suppress(*REDIS_ERRORS):  # lost: the next connection leaves it out
            subscription = self._subscription_for(channel, room)
            if subscription is not None and self._ready:
                if room and self._cluster is not None:
                    subscription.sunsubscribe(channel)
                else:
                    subscription.unsubscribe(channel)

    async def subscribe_room(self, room: str) -> None:
        self._rooms.add(room)
        await self._subscribe(self._room_channel(room), room=True)

    def _room_of_channel(self, channel: str) -> str:
        return _room_of(channel.encode()) if self._cluster is not None else channel

    async def unsubscribe_room(self, room: str) -> None:
        self._rooms.discard(room)
        self._room_masters.pop(room, None)
        await self._unsubscribe(self._room_channel(room), room=True)

    async def subscribe_user(self, user: str) -> None:
        self._users.add(user)
        with contextlib.suppress(BrokerUnavailable):  # resubscribed on reconnect
            await self._subscribe(self._user_channel(user))

    async def unsubscribe_user(self, user: str) -> None:
        self._users.discard(user)
        await self._unsubscribe(self._user_channel(user))

    # -- publishing and history ---------------------------------------------------------------

    async def publish(
        self,
        room: str,
        user: str,
        text: str,
        cid: str | int | None,
        reply_to: int | None = None,
        quota: tuple[float, int] | None = None,
        attachments: str | None = None,
        mentions: str | None = None,
        traceparent: str | None = None,
    ) -> Published:
        head, body = message_frame_parts(
            "room", room, user, text, reply_to, attachments, mentions, traceparent
        )
        keys = self._publish_keys(room, user, cid)
        return await self._publish(
            keys, room, self._room_channel(room), head, body, "", quota=quota, user=user
        )

    async def publish_direct(
        self,
        sender: str,
        to: str,
        text: str,
        cid: str | int | None,
        reply_to: int | None = None,
        quota: tuple[float, int] | None = None,
        attachments: str | None = None,
        mentions: str | None = None,
        traceparent: str | None = None,
    ) -> Published:
        head, body = message_frame_parts(
            "to", to, sender, text, reply_to, attachments, mentions, traceparent
        )
        conversation = direct(sender, to)
        keys = self._publish_keys(conversation, sender, cid)
        channel, copy = self._user_channel(to), self._user_channel(sender)
        return await self._publish(
            keys, conversation, channel, head, body, copy, quota=quota, user=sender
        )

    def _channels(self, conversation: str, user: str) -> tuple[str, str, str, str]:
        """How frames of ``user`` in ``conversation`` are addressed: (target field, name,
        channel, second channel)."""
        field, name = addressed(conversation, user)
        if is_direct(conversation):
            return field, name, self._user_channel(name), self._user_channel(user)
        return field, name, self._room_channel(conversation), ""

    async def publish_event(
        self,
        conversation: str,
        change: Change,
        cid: str | int | None,
        known: dict[str, Any] | None = None,
    ) -> Published:
        target_field, name, channel, copy = self._channels(conversation, change.user)
        head, body = event_frame_parts(
            change.kind, target_field, name, change.target, change.user, change.text
        )
        _, body_off = event_frame_parts(
            Kind.REACTION_OFF, target_field, name, change.target, change.user, change.text
        )
        keys = self._publish_keys(conversation, change.user, cid)
        keys.append(self._room_key(conversation, "state"))
        kind = Kind.REACTION_ON if change.kind is Kind.REACTION_OFF else change.kind
        extra = [change.target, int(kind), change.user, change.text, body_off,
                 b"" if known is None else orjson.dumps(known)]  # fmt: skip
        return await self._publish(
            keys, conversation, channel, head, body, copy, "EVENT", extra, user=change.user
        )

    def _publish_keys(self, conversation: str, user: str, cid: str | int | None) -> list[str]:
        """A message's own keys in the publishing scripts (see redis_scripts.PUBLISH)."""
        meta, log, dedup_prefix = self._conversation_keys(conversation)
        dedup = "" if cid is None else f"{dedup_prefix}{user}:{cid!r}"
        # On Redis Cluster the quota is taken before the script, in the user's slot (_publish).
        quota = "" if self._cluster is not None else self._quota_key(user)
        return [meta, log, dedup, quota]

    def _keys_of(self, conversation: str) -> tuple[str, str, str]:
        """``conversation``'s meta and log ('' without history), and what its dedup markers'
        keys start with (the marker of ``cid`` from ``user`` is ``<that>{user}:{cid!r}``)."""
        log = "" if self._settings.history_size == 0 else self._room_key(conversation, "log")
        return self._room_key(conversation, "meta"), log, self._room_key(conversation, "cid:")

    def _publish_header(self, quota: tuple[float, int]) -> tuple[Any, ...]:
        """The publishing scripts' first arguments (redis_scripts.HEADER_ARGS) for a sender
        with ``quota`` (rate per s, burst): the same objects for the same quota (calls merge
        only when their headers are, see Merge)."""
        header = self._headers.get(quota)
        if header is not None:
            return header
        settings = self._settings
        header = (
            SERVER_RUN_ID,  # the pipeline writes in the run_id of the server it talks to
            scripts.publishing_header(
                settings.history_size + 1,  # the log's length, see redis_scripts
                int(settings.history_ttl_s * 1000),
                int(settings.dedup_ttl_s * 1000),
                *quota,
                settings.archive_backlog_max,
                settings.webhook_backlog_max,
                self._shared_keys,
                settings.redis_publish_rooms_known,
                settings.redis_newest_id_in_meta,
            ),
        )
        assert len(header) == scripts.HEADER_ARGS
        if len(self._headers) < _HEADERS_KEPT:
            self._headers[quota] = header
        return header

    def publish_soon(
        self,
        room: str | None,
        to: str | None,
        user: str,
        text: str,
        cid: str | int | None,
        traceparent: str | None,
        done: PublishDone,
    ) -> None:
        """One script call, whose reply is mapped to ``done`` by the pipeline's callback."""
        if self._cluster is not None:  # the quota first, in the user's slot: two calls (_publish)
            if room is not None:
                publishing = self.publish(room, user, text, cid, traceparent=traceparent)
            else:
                publishing = self.publish_direct(user, to or "", text, cid, traceparent=traceparent)
            task = start_eagerly(self._publish_then(publishing, done))
            if task is not None:
                self._publishing.add(task)
                task.add_done_callback(self._publishing.discard)
            return
        if room is not None:
            target, name, conversation = "room", room, room
            channel, copy = self._room_channel(room), ""
        else:
            target, name, conversation = "to", to or "", direct(user, to or "")
            channel, copy = self._user_channel(name), self._user_channel(user)
        head, body = message_frame_parts(target, name, user, text, None, None, None, traceparent)
        keys = self._publish_keys(conversation, user, cid)
        try:
            answered = self._submit_publish(keys, conversation, channel, head, body, copy)
        except REDIS_ERRORS as exc:  # a batch written at once, on a connection just lost
            done(self._unavailable(exc))
            return
        answered.add_done_callback(functools.partial(self._answer, done, conversation, user))

    async def _publish_then(self, publishing: Awaitable[Published], done: PublishDone) -> None:
        """``publishing``'s outcome to ``done``, even when this task is cancelled (a worker
        shutting down): a send's slot is answered on every path."""
        try:
            outcome: Published | Exception = await publishing
        except asyncio.CancelledError:
            done(BrokerUnavailable("redis: the publish was cancelled"))
            raise
        except Exception as exc:
            outcome = exc
        done(outcome)

    def _answer(
        self, done: PublishDone, conversation: str, user: str, reply: asyncio.Future[Any]
    ) -> None:
        """publish_soon's callback: ``reply``'s outcome to ``done``; a message published
        (the common answer) goes straight, anything else through :meth:`_outcome`."""
        published: Published | None = None
        try:
            message_id, outcome, ts_ms = reply.result()
            if outcome == _PUBLISHED:
                published = Published(int(message_id), int(ts_ms), duplicate=False)
        except (Exception, asyncio.CancelledError):  # cancelled, failed, or not a reply to read
            pass
        done(published if published is not None else self._outcome(reply, conversation, user))

    def _outcome(
        self, reply: asyncio.Future[Any], conversation: str, user: str
    ) -> Published | Exception:
        """What a publish script's ``reply`` comes to (as :meth:`_publish` returns or raises)."""
        if reply.cancelled():
            return BrokerUnavailable("redis: the publish was cancelled")
        try:
            return self._published(reply.result(), conversation, user)
        except REDIS_ERRORS as exc:
            return self._unavailable(exc)
        except Exception as exc:  # refused (quota, gone, failed), or a bug
            return exc

    async def _publish(
        self,
        keys: list[str],
        conversation: str,
        channel: str,
        head: bytes,
        body: bytes,
        copy_channel: str,
        script: str = "PUBLISH",
        extra: list[Any] | None = None,
        quota: tuple[float, int] | None = None,
        user: str = "",
    ) -> Published:
        try:
            if self._cluster is not None:
                # The quota bucket is in the user's slot, not the conversation's. Calls on one
                # slot are answered in order and their callers resume in that order, so one
                # connection's pipelined sends still reach the script in the order they came.
                # Fails open, as every quota does (app.access.quotas): a user's sends to
                # rooms on healthy masters must not wait on the master of the user's slot.
                user_key = self._quota_key(user)
                with contextlib.suppress(*REDIS_ERRORS):
                    taken = await self._pipeline.submit(
                        self._take, [user_key], quota or self._quota
                    )
                    if not taken:
                        raise QuotaExceeded(user_key)
            reply = await self._submit_publish(
                keys, conversation, channel, head, body, copy_channel, script, extra, quota
            )
        except REDIS_ERRORS as exc:
            raise self._unavailable(exc) from exc
        return self._published(reply, conversation, user)

    def _submit_publish(
        self,
        keys: list[str],
        conversation: str,
        channel: str,
        head: bytes,
        body: bytes,
        copy_channel: str,
        script: str = "PUBLISH",
        extra: list[Any] | None = None,
        quota: tuple[float, int] | None = None,
    ) -> asyncio.Future[Any]:
        """Start a publishing script's call (see redis_scripts.PUBLISH); -> its reply."""
        header = self._header if quota is None else self._publish_header(quota)
        if self._shared_keys:  # the shared keys last, see redis_scripts
            archive = self._keys.archive(conversation) if self._archiving else ("", "")
            keys = [*keys, *archive, *self._webhook_keys]
        args: list[Any] = [*header, channel, head, body, copy_channel, conversation, *(extra or ())]
        # Messages of one loop iteration share a script run (redis_scripts.PUBLISH), on
        # Redis Cluster those of one slot.
        merge = self._merge
        if self._cluster is not None:  # every key in the conversation's slot, see sharded()
            absent = f"{self._prefix}:{self._keys.tag(conversation)}{scripts.ABSENT}"
            keys = [key or absent for key in keys]
            merge = Merge(self._keys.tag(conversation), 3, scripts.HEADER_ARGS, self._shared_keys)
        return self._pipeline.submit(
            self._scripts[script], keys, args, durable=True,
            merge=merge if script == "PUBLISH" else None,
        )  # fmt: skip

    def _unavailable(self, exc: Exception) -> BrokerUnavailable:
        if isinstance(exc, NotReplicated):
            self._not_replicated += 1
        return BrokerUnavailable(f"redis: {describe(exc)}")

    def _published(self, reply: list[Any], conversation: str, user: str) -> Published:
        """A publishing script's reply for one message: what was published, or raised as
        the refusal it says."""
        message_id, outcome, ts_ms = reply
        if outcome == _FAILED:
            raise BrokerUnavailable(f"redis: {message_id!r}")
        if outcome == _REFUSED_BY_QUOTA:
            raise QuotaExceeded(self._quota_key(user))
        if outcome == _GONE:
            raise MessageGone(conversation)
        return Published(int(message_id), int(ts_ms), duplicate=outcome == 1)

    async def history_since(self, room: str, since: int, limit: int) -> History:
        keys = [self._room_key(room, part) for part in ("meta", "log", "state")]
        settings = self._settings
        ttl_ms = int(settings.history_ttl_s * 1000)
        args = [SERVER_RUN_ID, since, limit, settings.recovery_max_messages, ttl_ms]
        script = self._scripts["HISTORY_SINCE"]
        result = await call_redis(lambda: self._pipeline.call(script, keys, args))
        if result[0] == _FROM_THE_STORE:
            return History(False, [], store_upto=int(result[1]))
        if not result[0]:
            return History(False, [])
        triples = result[2:]  # id, frame, state, id, frame, state...
        messages = [
            Message(int(triples[i]), _as_now(triples[i + 1], triples[i + 2]))
            for i in range(0, len(triples), 3)
        ]
        return History(True, messages, bool(result[1]))

    async def last_id(self, room: str) -> int:
        keys = [self._room_key(room, "meta"), self._room_key(room, "log")]
        args = [SERVER_RUN_ID, int(self._settings.history_ttl_s * 1000)]
        script = self._scripts["LAST_ID"]
        return int(await call_redis(lambda: self._pipeline.call(script, keys, args)))

    async def room_exists(self, room: str) -> bool:
        meta = self.existence_key(room)
        return bool(await call_redis(lambda: self._pipeline.command(meta, "EXISTS", meta)))

    def existence_key(self, room: str) -> str:
        return self._room_key(room, "meta")

    async def history_before(self, room: str, before: int | None, limit: int) -> list[Message]:
        """Messages only (the log's events are skipped), each as it is now (its state)."""
        upper = "+" if before is None else f"({before}-0"
        log = self._room_key(room, "log")

        async def read(upper: str, count: int) -> list[Any]:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.xrevrange(log, upper, "-", count=count)
                pipe.xrange(log, "-", "+", count=1)
                pipe.xlen(log)
                return await pipe.execute()

        found: list[Message] = []
        count = limit
        while len(found) < limit:
            entries, oldest, length = await call_redis(functools.partial(read, upper, count))
            # The log keeps one entry more than the history (the oldest marks where recovery
            # can start, see redis_scripts): it is not part of the history.
            marker = oldest[0][0] if oldest and length > self._settings.history_size else None
            for entry_id, fields in entries or ():
                payload = fields.get(b"f") if fields else None
                if entry_id != marker and payload is not None and is_message_frame(payload):
                    found.append(Message(int(cast(bytes, entry_id)[:-2]), payload))
                    if len(found) == limit:
                        break
            if len(entries or ()) < count:
                break  # the log holds no more
            upper = f"({cast(bytes, entries[-1][0]).decode()}"
            count = min(count * 2, self._settings.history_size + 1)
        found.reverse()
        states = await self.states(room, [message.id for message in found])
        return [Message(m.id, with_state(m.payload, states.get(m.id))) for m in found]

    async def find(self, conversation: str, message_id: int) -> Target | None:
        log, state = self._room_key(conversation, "log"), self._room_key(conversation, "state")
        entry_id = f"{message_id}-0"

        async def read() -> list[Any]:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.xrange(log, entry_id, entry_id)
                pipe.hget(state, str(message_id))
                return await pipe.execute()

        entries, raw = await call_redis(read)
        if not entries:
            return None
        payload = entries[0][1].get(b"f")
        if payload is None or not is_message_frame(payload):
            return None
        return Target(str(orjson.loads(payload)["user"]), orjson.loads(raw) if raw else None)

    async def states(self, conversation: str, ids: list[int]) -> dict[int, dict[str, Any]]:
        if not ids:
            return {}
        key = self._room_key(conversation, "state")
        raws = await call_redis(lambda: self._redis.hmget(key, ids))
        return {i: orjson.loads(raw) for i, raw in zip(ids, raws, strict=True) if raw}

    def _kick_key(self, user: str) -> str:
        return f"{self._prefix}:kick:{user}"

    async def kick(self, user: str, reason: str) -> None:
        """Remembered (as long as history is) for the workers that miss the publish."""
        order = orjson.dumps({"user": user, "reason": reason, "at": time.time()})
        ttl_ms = int(self._settings.history_ttl_s * 1000)
        await call_redis(lambda: self._redis.set(self._kick_key(user), order, px=ttl_ms))
        await call_redis(lambda: self._redis.publish(self._moderation_channel, order))

    async def route_to_worker(self, worker: str, payload: bytes) -> bool:
        """Through the worker's control channel (a canary's payload is a time, never JSON)."""
        channel = f"{self._prefix}:w:{worker}"
        if self._cluster is not None:
            # A PUBLISH's count is only of the subscribers on the node that took it.
            await call_redis(lambda: self._publish_anywhere(channel, payload))
            return True
        heard = await call_redis(
            lambda: self._pipeline.command(channel, "PUBLISH", channel, payload)
        )
        return bool(heard)

    @property
    def _census_key(self) -> str:
        return f"{self._prefix}:workers"

    async def census(self, record: bytes, ttl_ms: int) -> dict[str, bytes]:
        """One hash of every worker's record (one key: one slot on Redis Cluster); it expires
        ``ttl_ms`` after the last worker reported."""
        key = self._census_key

        async def report() -> dict[bytes, bytes]:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.hset(key, self.worker_id, record)
                pipe.pexpire(key, ttl_ms)
                pipe.hgetall(key)
                replies = await pipe.execute()
            return cast(dict[bytes, bytes], replies[2])

        records = await call_redis(report)
        return {worker.decode(): value for worker, value in records.items()}

    async def forget_workers(self, workers: list[str]) -> None:
        if workers:
            await call_redis(lambda: self._redis.hdel(self._census_key, *workers))

    async def room_changed(self, room: str) -> None:
        await call_redis(lambda: self._redis.publish(self._rooms_channel, room))

    async def mark_private(self, room: str, private: bool) -> None:
        key = f"{self._prefix}:private"
        call = self._redis.sadd if private else self._redis.srem
        await call_redis(lambda: call(key, room))

    async def is_private(self, room: str) -> bool:
        key = f"{self._prefix}:private"
        return bool(await call_redis(lambda: self._pipeline.command(key, "SISMEMBER", key, room)))

    async def _missed_kicks(self) -> None:
        """After an outage: apply the kicks of local users this worker may have missed."""
        users = sorted(self._users)
        if not users or self._handler is None:
            return
        keys = [self._kick_key(user) for user in users]
        try:
            if self._cluster is not None:  # the keys are in many slots
                orders = await call_redis(lambda: self._cluster.mget_nonatomic(keys))  # type: ignore[union-attr]
            else:
                orders = await call_redis(lambda: self._redis.mget(keys))
        except BrokerUnavailable as exc:
            logger.warning("cannot check for missed kicks: %s", exc)
            return
        for user, order in zip(users, orders, strict=True):
            if order is not None:
                kick = orjson.loads(order)
                self._handler.kick(user, kick["reason"], issued_at=kick["at"])

    async def notify_user(self, user: str, payload: bytes) -> None:
        await call_redis(lambda: self._redis.publish(self._user_channel(user), payload))

    async def broadcast(self, room: str, payload: bytes) -> None:
        channel = self._room_channel(room)
        command = "SPUBLISH" if self._cluster is not None else "PUBLISH"
        await call_redis(lambda: self._pipeline.command(channel, command, channel, payload))

    async def _watch_memory(self) -> None:
        """Read Redis' memory every few seconds (:meth:`_read_memory`)."""
        while not self._stopping:
            await asyncio.sleep(_MEMORY_READ_INTERVAL_S)
            if self._ready:
                try:
                    await self._read_memory()
                except REDIS_ERRORS as exc:
                    logger.warning("cannot read redis memory: %r", exc)

    async def _read_memory(self) -> None:
        """Redis' memory and its limit, for the metrics (a full Redis with `noeviction`
        refuses every publish: SREs must see it coming)."""
        if self._cluster is None:
            readings = [await self._redis.info("memory")]
        else:  # every master's; the fullest is the one that refuses first
            readings = [
                await self._cluster.info("memory", target_nodes=[node])
                for node in self._cluster.get_primaries()
            ]
        fullest = max(
            readings,
            key=lambda info: (
                int(info.get("used_memory", 0)) / max(1, int(info.get("maxmemory", 0)))
            ),
        )
        self._memory_used = int(fullest.get("used_memory", 0))
        self._memory_max = int(fullest.get("maxmemory", 0))


_SHARD_ROOM = b"}:c:"  # in a room's shard channel, between its hash tag and the room's name


def _room_of(shard_channel: bytes) -> str:
    """The room of a shard channel (``{prefix}:{tag}:c:{room}``, see ``_room_channel``)."""
    return shard_channel[shard_channel.index(_SHARD_ROOM) + len(_SHARD_ROOM) :].decode()


def _as_now(payload: bytes, state: bytes | str) -> bytes:
    """A logged frame as it is now: a message with its ``state`` (JSON, or empty: unchanged;
    see :mod:`app.conversations.lifecycle`); events as they are."""
    return with_state(payload, orjson.loads(state)) if state else payload
