"""pack_with_hiredis against a real redis-server: same replies, same bytes on the wire, and
the URL's connection class (TCP, Unix socket) kept."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis
from redis.asyncio.connection import Connection, UnixDomainSocketConnection
from redis.exceptions import DataError

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
