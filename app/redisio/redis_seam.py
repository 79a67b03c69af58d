"""The seam to redis-py's internals: the only module that reaches below its public API.

What it relies on, and why:

- **Handover** (:func:`hand_over`). redis-py knows how to reach a Redis: TCP, TLS or a Unix
  socket, ``AUTH`` with a user name or not, ``SELECT``, ``CLIENT SETNAME``, the timeouts of the
  URL. Our hot paths (:mod:`app.redisio.autopipeline` and :mod:`app.redisio.subscription`) only
  need to write commands packed by hiredis and parse replies with hiredis as they arrive,
  without redis-py's per-command coroutines and timeouts. So redis-py opens the connection
  (``ConnectionPool.make_connection``, ``Connection.connect``), and a protocol of ours takes its
  transport over (``Connection._writer``, ``_reader``).
- **Packing with hiredis** (:func:`pack_with_hiredis`). redis-py packs commands with hiredis
  in its sync client but not in its asyncio one (redis/redis-py#4176): there, every argument
  of every command goes through a pure-Python encoder, which was a sixth of a worker's CPU in
  the Redis rtt benchmark. This swaps a client's connection class for a subclass whose
  ``pack_command`` uses the sync client's hiredis serializer; the bytes on the wire are the
  same.
- **Failures it does not translate** (:func:`closed_under_redis_py`): a write on a connection
  closed under redis-py raises ``AttributeError`` or ``RuntimeError`` from its connection
  module instead of its ``ConnectionError``; recognized by that module in the traceback, and
  raised as its ``ConnectionError`` by the connections :func:`adapt_connections` and
  :func:`adapt_cluster_connections` give a client — so every caller's ``except`` of redis-py's
  errors sees a lost connection, and redis-py's retry on a fresh connection (or a Cluster's
  new look at its slots) applies.

:data:`CHECKED_AGAINST` is the version this was checked against (``pyproject.toml`` bounds
redis to it); :func:`fast_paths` says whether each works with what is installed, which every
worker logs and exports (``hubbub_fast_path_live``) at start.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any, Final, TypeVar, cast

import redis.asyncio.connection as redis_connection_module
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.connection import AbstractConnection, Connection, ConnectionPool
from redis.connection import HiredisRespSerializer
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.utils import HIREDIS_AVAILABLE

CHECKED_AGAINST: Final = {"redis": "8.1."}
C = TypeVar("C", bound=AbstractConnection)


async def hand_over(
    redis: Redis, protocol: asyncio.BaseProtocol, first: tuple[Any, ...] | None = None
) -> tuple[asyncio.StreamWriter, Any]:
    """Open a connection the way ``redis``'s pool would, then make ``protocol`` its owner.

    ``first``: a command run on the connection before it is handed over; its reply (as
    redis-py's parser reads it, no response callback) is returned with the writer (None
    without one). From then on ``protocol`` gets every byte that arrives and the connection's
    loss; redis-py forgets the connection. The caller keeps the returned writer for as long
    as it uses the transport (``writer.transport``; a StreamWriter closes its transport when
    collected) and closes the transport when done.
    """
    pool = redis.connection_pool
    connection = pool.make_connection()  # type: ignore[no-untyped-call]
    answer = None
    try:
        # Cancelled during its handshake (HELLO, AUTH), redis-py leaves the socket open.
        await connection.connect()
        if first is not None:
            await connection.send_command(*first)
            answer = await connection.read_response()
    except BaseException:
        await connection.disconnect()
        raise
    writer: asyncio.StreamWriter | None = connection._writer
    if writer is None:  # pragma: no cover - redis-py sets it on connect
        raise ConnectionError("redis-py did not open a stream")
    connection._reader = connection._writer = None  # redis-py must not close it later
    writer.transport.set_protocol(protocol)
    return writer, answer


# redis-py's module that writes to the socket (as its tracebacks name it).
_CONNECTION_MODULE: Final = redis_connection_module.__file__


def closed_under_redis_py(exc: BaseException) -> bool:
    """Whether ``exc`` is redis-py's asyncio connection writing to a socket that was closed
    under it, which it does not turn into its ``ConnectionError``: an ``AttributeError``
    (its ``_writer`` set to None by a disconnect in another task) or uvloop's
    ``RuntimeError`` ("unable to perform operation on <TCPTransport closed=True>"), raised in
    or below ``redis.asyncio.connection``. Seen on Redis Cluster while a master fails over
    (redis-py 8.1): the connection is lost, as a ``ConnectionError`` would say."""
    if not isinstance(exc, AttributeError | RuntimeError):
        return False
    frames = exc.__traceback__
    while frames is not None:
        if frames.tb_frame.f_code.co_filename == _CONNECTION_MODULE:
            return True
        frames = frames.tb_next
    return False


_SERIALIZER = HiredisRespSerializer()


class _HiredisPacking(AbstractConnection):
    """Packs each command in one C call instead of one Python call per argument."""

    def pack_command(self, *args: Any) -> list[bytes]:
        packed: list[bytes] = _SERIALIZER.pack(*args)
        return packed


class _LossesAsConnectionError(AbstractConnection):
    """Raises redis-py's ``ConnectionError`` for a write on a connection closed under it
    (:func:`closed_under_redis_py`), as it does for the other ways a connection is lost."""

    async def send_packed_command(
        self, command: bytes | str | Iterable[bytes], check_health: bool = True
    ) -> None:
        try:
            await super().send_packed_command(command, check_health)
        except (AttributeError, RuntimeError) as exc:
            if not closed_under_redis_py(exc):
                raise
            # redis-py disconnected it already (its handler of any exception does).
            raise RedisConnectionError(
                f"connection closed under redis-py: {type(exc).__name__}: {exc}"
            ) from exc


# Each connection class adapted once (a Cluster's nodes then share one class).
_ADAPTED: Final[dict[type, type]] = {}


def _adapted(base: type[C]) -> type[C]:
    """``base`` with the mixins above (hiredis packing only where hiredis is installed)."""
    if issubclass(base, _LossesAsConnectionError):
        return base
    if base not in _ADAPTED:
        mixins: tuple[type, ...] = (_LossesAsConnectionError,)
        if HIREDIS_AVAILABLE:
            mixins = (_HiredisPacking, *mixins)
        _ADAPTED[base] = type(f"Adapted{base.__name__}", (*mixins, base), {})
    return cast("type[C]", _ADAPTED[base])


def adapt_connections(client: Redis) -> Redis:
    """Make ``client``'s new connections pack commands with hiredis (where it is installed)
    and raise ``ConnectionError`` for a write on a connection closed under redis-py.

    Call it before the client opens its first connection. It keeps the connection class the
    URL chose (TCP, TLS or Unix socket, Sentinel-managed) and changes only those two things.
    """
    pool = client.connection_pool
    pool.connection_class = _adapted(pool.connection_class)
    return client


def adapt_cluster_connections(cluster: RedisCluster) -> RedisCluster:
    """What :func:`adapt_connections` does, for every node ``cluster`` knows now (its seeds)
    or learns later (the node options it makes them with). Call it before its first command."""
    options = cluster.connection_kwargs
    options["connection_class"] = _adapted(options.get("connection_class", Connection))
    for node in cluster.nodes_manager.startup_nodes.values():
        node.connection_class = _adapted(node.connection_class)
    return cluster


def fast_paths() -> dict[str, bool]:
    """Whether each fast path works with the installed redis-py (the internals it uses exist);
    a path that does not raises or falls back where it is used."""
    connect = Connection._connect.__code__.co_names
    return {
        "redis_handover": callable(getattr(ConnectionPool, "make_connection", None))
        and "_writer" in connect
        and "_reader" in connect,
        "hiredis_packing": HIREDIS_AVAILABLE
        and callable(getattr(AbstractConnection, "pack_command", None)),
    }
