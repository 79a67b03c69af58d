"""adapt_connections against a real redis-server: same replies, same bytes on the wire, the
URL's connection class (TCP, Unix socket) kept, and a write on a connection closed under
redis-py a lost connection (its ConnectionError, retried on a fresh one)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from redis.asyncio import Redis
from redis.asyncio.connection import (
    AbstractConnection,
    Connection,
    ConnectionPool,
    UnixDomainSocketConnection,
)
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError

from app.errors import BrokerUnavailable
from app.redisio.clients import call_redis, cluster_client
from app.redisio.redis_seam import adapt_connections
from tests.helpers import make_settings
from tests.processes import RedisServer


def test_packs_the_same_bytes_as_redis_py() -> None:
    args = ("EVALSHA", "abc", 2, "k", "ké", b"\x00raw", 1.5, 1e20, 10**15)
    python = b"".join(Connection().pack_command(*args))
    client = adapt_connections(Redis())
    hiredis = client.connection_pool.connection_class()
    assert type(hiredis).pack_command is not Connection.pack_command  # hiredis packs
    assert b"".join(hiredis.pack_command(*args)) == python
    assert b"".join(hiredis.pack_command("CONFIG GET", "x")) == b"".join(
        Connection().pack_command("CONFIG GET", "x")
    )
    with pytest.raises(DataError):
        hiredis.pack_command("SET", "k", None)  # type: ignore[arg-type]


def test_keeps_the_connection_class_of_the_url() -> None:
    tcp = adapt_connections(Redis.from_url("redis://127.0.0.1:1/0"))
    unix = adapt_connections(Redis.from_url("unix:///tmp/nowhere.sock"))
    assert issubclass(tcp.connection_pool.connection_class, Connection)
    assert issubclass(unix.connection_pool.connection_class, UnixDomainSocketConnection)
    again = adapt_connections(tcp).connection_pool.connection_class
    assert again is tcp.connection_pool.connection_class  # applied once


async def test_commands_and_pipelines_round_trip(redis_server: RedisServer) -> None:
    client = adapt_connections(Redis.from_url(redis_server.url, socket_timeout=2))
    try:
        assert await client.set("ké", "välue")
        assert await client.get("ké") == "välue".encode()
        async with client.pipeline(transaction=False) as pipe:
            pipe.rpush("l", b"\xff", 2, 2.5)
            pipe.lrange("l", 0, -1)
            assert await pipe.execute() == [3, [b"\xff", b"2", b"2.5"]]
        script = client.register_script("return {KEYS[1], ARGV[1]}")
        assert await script(keys=["k"], args=["ü"]) == [b"k", "ü".encode()]
    finally:
        await client.aclose()


class _ClosingPool(ConnectionPool):
    """A pool whose next ``closing`` connections are closed under redis-py right after it
    hands them out, as a disconnect in another task closed them during a Cluster failover
    (redis-py 8.1 on uvloop): the transport closed (a write raises uvloop's RuntimeError), or
    also the writer gone (an AttributeError)."""

    closing = 0
    writer_gone = False

    async def get_connection(self, *args: Any, **options: Any) -> AbstractConnection:
        connection: AbstractConnection = await super().get_connection()  # type: ignore[no-untyped-call]
        if self.closing:
            self.closing -= 1
            assert connection._writer is not None
            connection._writer.transport.abort()
            await connection._writer.wait_closed()
            if self.writer_gone:  # by another task, once this one waits (its socket_timeout)
                asyncio.get_running_loop().call_soon(setattr, connection, "_writer", None)
        return connection


@pytest.mark.parametrize("writer_gone", [False, True])
async def test_a_write_on_a_connection_closed_under_redis_py_is_a_lost_connection(
    redis_server: RedisServer, writer_gone: bool
) -> None:
    """redis-py raises AttributeError or RuntimeError there, which closed clients' sockets
    with 1011 wherever a caller expected its errors; the adapted connection raises its
    ConnectionError: a call without retries fails as on any lost connection (call_redis:
    BrokerUnavailable), and with redis-py's retry it succeeds on a fresh connection."""
    lost = "AttributeError" if writer_gone else "RuntimeError"
    clients = []
    for retries in (0, 1):
        pool = _ClosingPool.from_url(
            redis_server.url, socket_timeout=2, retry=Retry(NoBackoff(), retries)
        )
        pool.writer_gone = writer_gone
        clients.append(adapt_connections(Redis.from_pool(pool)))
    bare, retried = clients
    bare_pool = cast(_ClosingPool, bare.connection_pool)
    try:
        bare_pool.closing = 1
        with pytest.raises(BrokerUnavailable, match=f"closed under redis-py: {lost}"):
            await call_redis(bare.ping)
        assert await bare.ping()  # the lost connection was dropped: a new one works
        bare_pool.closing = 1
        async with bare.pipeline(transaction=False) as pipe:
            pipe.ping()
            with pytest.raises(RedisConnectionError, match=lost):
                await pipe.execute()
        cast(_ClosingPool, retried.connection_pool).closing = 1
        assert await retried.ping()
    finally:
        for client in clients:
            await client.aclose()


def test_a_clusters_nodes_get_the_adapted_connections() -> None:
    """The seeds a Cluster client starts from and the nodes it learns later (made with its
    connection options) use the adapted connection class."""
    cluster = cluster_client(make_settings(redis_cluster_nodes=["127.0.0.1:1", "127.0.0.1:2"]))
    learned = cluster.connection_kwargs["connection_class"]
    assert issubclass(learned, Connection) and learned is not Connection
    assert learned.send_packed_command is not Connection.send_packed_command
    for node in cluster.nodes_manager.startup_nodes.values():
        assert node.connection_class is learned


async def test_errors_of_our_own_code_are_not_taken_for_a_lost_connection() -> None:
    async def broken() -> None:
        raise AttributeError("a bug of ours")

    async def also_broken() -> None:
        raise RuntimeError("another")

    with pytest.raises(AttributeError, match="a bug of ours"):
        await call_redis(broken)
    with pytest.raises(RuntimeError, match="another"):
        await call_redis(also_broken)
