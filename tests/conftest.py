"""Shared fixtures. Every server in these tests is real and listens on 127.0.0.1 only."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import uvloop
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store.database import engine_for, migrate
from tests.helpers import LiveServer, make_settings, run_server
from tests.processes import PostgresServer, RedisServer, S3Server


def pytest_asyncio_loop_factories(config: Any, item: Any) -> Mapping[str, Callable[[], Any]]:
    """Run every async test on uvloop, the loop production uses."""
    return {"uvloop": uvloop.new_event_loop}


@pytest.fixture
async def server() -> AsyncIterator[LiveServer]:
    async with run_server(make_settings()) as live:
        yield live


@pytest.fixture
async def redis_server() -> AsyncIterator[RedisServer]:
    """A real redis-server on a free port, for this test only (it may kill and restart it)."""
    server = RedisServer()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def redis(redis_server: RedisServer) -> AsyncIterator[Redis]:
    """A redis-py client of ``redis_server`` (2 s timeouts)."""
    client = Redis.from_url(redis_server.url, socket_timeout=2, socket_connect_timeout=2)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
async def postgres_server() -> AsyncIterator[PostgresServer]:
    """A real PostgreSQL cluster on a free port, for this test only (it may kill it)."""
    server = PostgresServer()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def s3_server(tmp_path: Path) -> AsyncIterator[S3Server]:
    """A real S3 store (SeaweedFS) on free ports, its bucket created, authentication on, for
    this test only (it may pause, kill and restart it); its data and log in ``tmp_path``."""
    server = S3Server(tmp_path / "s3")
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
async def engine(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    """A migrated store on each database."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/data/chat.db"
        server = None
    else:
        server = PostgresServer()
        await server.start()
        url = await server.create_database("hubbub")
    engine = engine_for(url)
    try:
        await migrate(engine)
        yield engine
    finally:
        await engine.dispose()
        if server is not None:
            await server.stop()
