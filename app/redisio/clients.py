"""The Redis clients a worker opens, configured one way: from ``CHAT_REDIS_URL`` or through
the Sentinels (``CHAT_REDIS_SENTINELS``), with the settings' timeouts, commands packed by
hiredis and redis-py's untranslated losses raised as its ``ConnectionError``
(:mod:`~app.redisio.redis_seam`), and one retry on a fresh connection; and how their failures
read.

With Sentinels, every new connection asks them where the master is (redis-py's
``SentinelConnectionPool``): after a failover, the connections the old master dropped (a
SIGKILL, or the Sentinels' ``CLIENT KILL`` when they demote it) are reopened on the new one, and
a connection still on a demoted master is dropped at its first ``READONLY`` reply
(:mod:`~app.redisio.autopipeline`, redis-py's own commands).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar, cast

from redis.asyncio import BlockingConnectionPool, ConnectionPool, Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool, SentinelManagedConnection
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, RedisError

from app.errors import BrokerUnavailable
from app.redisio.redis_seam import adapt_cluster_connections, adapt_connections
from app.settings import Settings

T = TypeVar("T")
# What a call to Redis raises when Redis cannot be reached or does not answer in time (on
# Redis Cluster also when no master is known for a slot: failing over).
REDIS_ERRORS: Final = (RedisError, RedisClusterException, OSError, asyncio.TimeoutError)


def describe(exc: BaseException) -> str:
    """``exc`` for a log or an error's message: its type and text (redis-py's ``repr`` of its
    errors gives only their category, as ``network:ConnectionError``)."""
    return f"{type(exc).__name__}: {exc}"


async def call_redis(call: Callable[[], Awaitable[T]]) -> T:
    """``await call()``, raising :class:`~app.errors.BrokerUnavailable` for a
    :data:`REDIS_ERRORS` (the broker's and presence's contract). The clients below raise one
    for a write on a connection closed under redis-py too (a ``ConnectionError``:
    :func:`~app.redisio.redis_seam.adapt_connections`), a lost connection rather than a bug
    to close the client's socket with 1011."""
    try:
        return await call()
    except REDIS_ERRORS as exc:
        raise BrokerUnavailable(f"redis: {describe(exc)}") from exc


def command_client(settings: Settings) -> Redis:
    """A client for commands and scripts: every call times out after ``redis_timeout_s``
    and is retried once, on a fresh connection (a pooled one may be stale after Redis
    restarted or failed over). The retry is redis-py's asyncio ``Retry``: the client awaits
    it (the sync one it used to be given never retried).

    It holds at most ``redis_pool_size`` connections; a call that finds them all busy waits
    for one, up to ``redis_timeout_s``. (redis-py's default pool refuses it at once with
    ``MaxConnectionsError``: a burst of joins, say every client reconnecting after a deploy,
    was refused with ``broker_unavailable`` while Redis was fine.)"""
    options: dict[str, Any] = {
        "max_connections": settings.redis_pool_size,
        "timeout": settings.redis_timeout_s,
        "socket_timeout": settings.redis_timeout_s,
        "socket_connect_timeout": settings.redis_timeout_s,
        "retry": Retry(NoBackoff(), 1),
    }
    if settings.redis_cluster_nodes:
        return cast(Redis, cluster_client(settings))
    if settings.redis_sentinels:
        pool: ConnectionPool = _BlockingSentinelPool(
            settings.redis_sentinel_master, _sentinel(settings), **_master_auth(settings), **options
        )
    else:
        assert settings.redis_url is not None
        pool = BlockingConnectionPool.from_url(settings.redis_url, **options)
    return adapt_connections(Redis.from_pool(pool))


def cluster_client(settings: Settings) -> RedisCluster:
    """A Redis Cluster client from the seed nodes ``CHAT_REDIS_CLUSTER_NODES``: it reads the
    slots' masters, routes each command by its key's slot, and reads the slots again on
    ``MOVED`` and after a failover. ``command_client`` returns it (typed as a ``Redis``:
    the commands Hubbub uses on it are the same, each on keys of one slot)."""
    addresses = [address.rpartition(":") for address in settings.redis_cluster_nodes]
    return adapt_cluster_connections(
        RedisCluster(
            startup_nodes=[ClusterNode(host, int(port)) for host, _, port in addresses],
            socket_timeout=settings.redis_timeout_s,
            socket_connect_timeout=settings.redis_timeout_s,
            max_connections=settings.redis_pool_size,
            **_master_auth(settings),
        )
    )


async def close_client(redis: Redis | RedisCluster) -> None:
    """Close every connection ``redis`` holds (a :func:`command_client` or a
    :func:`node_client`); what was closing in the background is done when this returns.

    A ``RedisCluster``'s own ``aclose()`` closes nothing once a command failed on a lost
    connection (a master down): redis-py then only marks the client for initializing again
    (redis/redis-py#3846), and every node's connections stayed open. Here each node it knows
    is disconnected whatever that state, and the disconnections redis-py started in tasks
    of its own (nodes that left the topology) are awaited."""
    await redis.aclose()
    if not isinstance(redis, RedisCluster):
        return
    manager = redis.nodes_manager
    # By identity: a seed node and the node of the same address in the topology are two
    # objects (equal, by name), each with connections of its own.
    nodes = list(
        {
            id(node): node
            for node in [*manager.nodes_cache.values(), *manager.startup_nodes.values()]
        }.values()
    )
    await asyncio.gather(*(node.disconnect() for node in nodes), return_exceptions=True)
    background = [
        task
        for owner in (manager, *nodes)
        for task in getattr(owner, "_background_tasks", ())  # redis-py's own, see above
    ]
    if background:
        await asyncio.wait(background, timeout=1)


def node_client(settings: Settings, node: ClusterNode, subscriber: bool = False) -> Redis:
    """A client of one cluster node, for a hot path that takes a connection over (a node's
    pipeline; with ``subscriber``, a pub/sub connection: no socket timeout)."""
    timeout = None if subscriber else settings.redis_timeout_s
    return adapt_connections(
        Redis(
            host=node.host,
            port=int(node.port),
            socket_timeout=timeout,
            socket_connect_timeout=settings.redis_timeout_s,
            retry=Retry(NoBackoff(), 0),
            **_master_auth(settings),
        )
    )


def subscriber_client(settings: Settings) -> Redis:
    """A client for the pub/sub subscription: no socket timeout (it blocks until a message
    comes; the broker's canary finds out when none can any more) and no retry."""
    options: dict[str, Any] = {
        "socket_connect_timeout": settings.redis_timeout_s,
        "retry": Retry(NoBackoff(), 0),
    }
    if settings.redis_sentinels:
        pool = _SentinelPool(
            settings.redis_sentinel_master, _sentinel(settings), **_master_auth(settings), **options
        )
        return adapt_connections(Redis.from_pool(pool))
    assert settings.redis_url is not None
    return adapt_connections(Redis.from_url(settings.redis_url, **options))


class _MasterOnlyConnection(SentinelManagedConnection):
    """A connection to the server the Sentinels name as master, refused (``ConnectionError``,
    the next attempt asks them again) when that server says it is a replica: for a second or
    two after a failover a Sentinel not yet told of it names the old master, back by then as
    a replica of the new one, whose reads are stale and whose subscriptions miss publishes
    (see :class:`~app.redisio.subscription.Subscription`)."""

    async def connect_to(self, address: Any) -> None:
        await super().connect_to(address)  # type: ignore[no-untyped-call]
        await self.send_command("ROLE")
        role = await self.read_response()
        if not (isinstance(role, list) and role and role[0] in (b"master", "master")):
            await self.disconnect()
            raise RedisConnectionError(f"{address} is not the master (ROLE: {role!r:.60})")


class _SentinelPool(SentinelConnectionPool):
    """A Sentinel-managed pool of :class:`_MasterOnlyConnection` that also closes its clients
    of the Sentinels when it is closed (its client's ``aclose``); a master change only drops
    its idle connections."""

    def __init__(self, service_name: str, sentinel_manager: Sentinel, **kwargs: Any) -> None:
        kwargs.setdefault("connection_class", _MasterOnlyConnection)
        super().__init__(service_name, sentinel_manager, **kwargs)  # type: ignore[no-untyped-call]

    async def disconnect(self, inuse_connections: bool = True) -> None:
        await super().disconnect(inuse_connections)
        if inuse_connections:
            await self.sentinel_manager.aclose()


class _BlockingSentinelPool(_SentinelPool, BlockingConnectionPool):
    """A Sentinel-managed pool that waits for a free connection, as ``command_client``'s
    does without Sentinels."""


def _sentinel(settings: Settings) -> Sentinel:
    """Clients of the Sentinels (one per pool: they are closed with the process)."""
    password = settings.redis_sentinel_password
    addresses = [address.rpartition(":") for address in settings.redis_sentinels]
    return Sentinel(  # type: ignore[no-untyped-call]
        [(host, int(port)) for host, _, port in addresses],
        sentinel_kwargs={
            "socket_timeout": settings.redis_timeout_s,
            "socket_connect_timeout": settings.redis_timeout_s,
            "password": password.get_secret_value() if password is not None else None,
        },
    )


def _master_auth(settings: Settings) -> dict[str, Any]:
    password = settings.redis_password
    return {"password": password.get_secret_value()} if password is not None else {}


async def preload(redis: Redis, *scripts: AsyncScript) -> None:
    """Load ``scripts`` into Redis' script cache now, so that their first call (often a
    periodic one, long after start) runs at once instead of failing with NOSCRIPT and being
    retried. Best effort: a script missing later (Redis restarted) is loaded on first use."""
    with contextlib.suppress(*REDIS_ERRORS):
        for script in scripts:
            await redis.script_load(script.script)
