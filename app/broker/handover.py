"""Connections that redis-py opens and sets up, then hands over to a protocol of ours.

redis-py knows how to reach a Redis: TCP, TLS or a Unix socket, ``AUTH`` with a user name or
not, ``SELECT``, ``CLIENT SETNAME``, the timeouts of the URL. Our hot paths (the auto-pipeline
and the pub/sub subscription) only need to write commands packed by hiredis and parse replies
with hiredis as they arrive, without redis-py's per-command coroutines and timeouts. So
redis-py opens the connection, and the protocol takes its transport over.
"""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis


async def hand_over(redis: Redis, protocol: asyncio.BaseProtocol) -> asyncio.StreamWriter:
    """Open a connection the way ``redis``'s pool would, then make ``protocol`` its owner.

    From then on ``protocol`` gets every byte that arrives and the connection's loss; redis-py
    forgets the connection. The caller keeps the returned writer for as long as it uses the
    transport (``writer.transport``; a StreamWriter closes its transport when collected) and
    closes the transport when done.
    """
    pool = redis.connection_pool
    connection = pool.make_connection()  # type: ignore[no-untyped-call]
    await connection.connect()
    writer: asyncio.StreamWriter | None = connection._writer
    if writer is None:  # pragma: no cover - redis-py sets it on connect
        raise ConnectionError("redis-py did not open a stream")
    connection._reader = connection._writer = None  # redis-py must not close it later
    writer.transport.set_protocol(protocol)
    return writer
