"""pack_with_hiredis against a real redis-server: same replies, same bytes on the wire, and
the URL's connection class (TCP, Unix socket) kept."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis
from redis.asyncio.connection import Connection, UnixDomainSocketConnection
from redis.exceptions import DataError

from app.errors import BrokerUnavailable
from app.redisio.clients import call_redis
from app.redisio.redis_seam import pack_with_hiredis
from tests.processes import RedisServer


def test_packs_the_same_bytes_as_redis_py() -> None:
    args = ("EVALSHA", "abc", 2, "k", "ké", b"\x00raw", 1.5, 1e20, 10**15)
    python = b"".join(Connection().pack_command(*args))
    client = pack_with_hiredis(Redis())
    hiredis = client.connection_pool.connection_class()
    assert type(hiredis).pack_command is not Connection.pack_command  # hiredis packs
    assert b"".join(hiredis.pack_command(*args)) == python
    assert b"".join(hiredis.pack_command("CONFIG GET", "x")) == b"".join(
        Connection().pack_command("CONFIG GET", "x")
    )
    with pytest.raises(DataError):
        hiredis.pack_command("SET", "k", None)  # type: ignore[arg-type]


def test_keeps_the_connection_class_of_the_url() -> None:
    tcp = pack_with_hiredis(Redis.from_url("redis://127.0.0.1:1/0"))
    unix = pack_with_hiredis(Redis.from_url("unix:///tmp/nowhere.sock"))
    assert issubclass(tcp.connection_pool.connection_class, Connection)
    assert issubclass(unix.connection_pool.connection_class, UnixDomainSocketConnection)
    again = pack_with_hiredis(tcp).connection_pool.connection_class
    assert again is tcp.connection_pool.connection_class  # applied once


async def test_commands_and_pipelines_round_trip(redis_server: RedisServer) -> None:
    client = pack_with_hiredis(Redis.from_url(redis_server.url, socket_timeout=2))
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


async def test_a_write_on_a_connection_closed_under_redis_py_is_a_lost_connection(
    redis_server: RedisServer,
) -> None:
    """What a Cluster failover did (redis-py 8.1 on uvloop): a connection closed under
    redis-py raises AttributeError (its writer gone) or uvloop's RuntimeError (the transport
    closed) from redis-py's connection module; call_redis answers BrokerUnavailable, as for
    its ConnectionError, instead of letting it close a client's socket with 1011."""
    client = Redis.from_url(redis_server.url, socket_timeout=2)
    try:
        connection = await client.connection_pool.get_connection()  # type: ignore[no-untyped-call]
        await connection.connect()
        assert connection._writer is not None
        connection._writer.transport.abort()  # closed under it
        await connection._writer.wait_closed()
        with pytest.raises(BrokerUnavailable, match="RuntimeError"):
            await call_redis(lambda: connection._send_packed_command([b"PING\r\n"]))
        connection._writer = None  # as a disconnect in another task leaves it
        with pytest.raises(BrokerUnavailable, match="AttributeError"):
            await call_redis(lambda: connection._send_packed_command([b"PING\r\n"]))
        await connection.disconnect()
    finally:
        await client.aclose()


async def test_errors_of_our_own_code_are_not_taken_for_a_lost_connection() -> None:
    async def broken() -> None:
        raise AttributeError("a bug of ours")

    async def also_broken() -> None:
        raise RuntimeError("another")

    with pytest.raises(AttributeError, match="a bug of ours"):
        await call_redis(broken)
    with pytest.raises(RuntimeError, match="another"):
        await call_redis(also_broken)
