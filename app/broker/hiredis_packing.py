"""Command packing in C for redis-py's asyncio client.

redis-py packs commands with hiredis in its sync client but not in its asyncio one
(redis/redis-py#4176): there, every argument of every command goes through a pure-Python
encoder, which was a sixth of a worker's CPU in the Redis rtt benchmark. This swaps a client's
connection class for a subclass that packs with the sync client's hiredis serializer; the bytes
on the wire are the same.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection
from redis.connection import HiredisRespSerializer
from redis.utils import HIREDIS_AVAILABLE

_SERIALIZER = HiredisRespSerializer()


class _HiredisPacking(AbstractConnection):
    """Packs each command in one C call instead of one Python call per argument."""

    def pack_command(self, *args: Any) -> list[bytes]:
        packed: list[bytes] = _SERIALIZER.pack(*args)
        return packed


def pack_with_hiredis(client: Redis) -> Redis:
    """Make ``client``'s new connections pack commands with hiredis (a no-op without it).

    Call it before the client opens its first connection. It keeps the connection class the
    URL chose (TCP, TLS or Unix socket) and only replaces how commands are packed.
    """
    pool = client.connection_pool
    base = pool.connection_class
    if HIREDIS_AVAILABLE and not issubclass(base, _HiredisPacking):
        pool.connection_class = type(f"Hiredis{base.__name__}", (_HiredisPacking, base), {})
    return client
