"""``python -m loadtest.archive``: how many messages a second archiving stores, on this machine.

What runs (loopback only, all started and ended here, by PID):

- ``redis-server`` and PostgreSQL (``initdb`` + ``postgres``, as ``nobody`` when run as root,
  with ``fsync`` on, as in production) on free ports, on core 1;
- this process on core 0: it fills the archive stream with ``--messages`` frames in
  ``--rooms`` rooms (as the PUBLISH script appends them; the rooms' meta hashes exist, so the
  ``archived`` marks are raised as in production), then runs the Redis broker's archiver
  (:class:`app.store.stream_archiver.StreamArchiver`) until the stream is empty, and times it;
- then the embedded path: the in-process :class:`app.store.archiver.Archiver` into SQLite,
  offered as many messages at once, timed until all are stored.

Reported: messages stored per second by each, and that the database holds every message
exactly once. The backlog is drained from a standing start (as after a store outage): the
rate is what archiving sustains, the budget is 20,000 messages a second (issue 20).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from app.broker.redis_scripts import archive_keys, room_key
from app.protocol import message_frame, message_frame_parts
from app.redisio.clients import command_client
from app.settings import Settings
from app.store.archiver import Archiver
from app.store.database import engine_for, migrate
from app.store.messages import MessageStore, StoredMessage
from app.store.stream_archiver import StreamArchiver
from loadtest.bench import CLIENT_CPU, SERVER_CPU
from tests.processes import PostgresServer, RedisServer

PREFIX = "hubbub"
TEXT = "a chat message of about the usual length, sixty characters or so"


def _pin(pid: int, cpu: str) -> None:
    with contextlib.suppress(OSError):
        os.sched_setaffinity(pid, {int(cpu)})


def _messages(count: int, rooms: int) -> list[StoredMessage]:
    base = int(time.time() * 1000)
    return [
        StoredMessage(f"room-{n % rooms}", (base + n) * 1000, f"user{n % 97}", TEXT, base + n)
        for n in range(count)
    ]


async def _fill(redis: Redis, messages: list[StoredMessage]) -> None:
    """The archive stream as the PUBLISH script leaves it, and each room's meta hash."""
    stream, _ = archive_keys(PREFIX)
    for start in range(0, len(messages), 2_000):
        async with redis.pipeline(transaction=False) as pipe:
            for m in messages[start : start + 2_000]:
                parts = message_frame_parts("room", m.conversation, m.user, m.text)
                frame = message_frame(parts, m.id, m.ts_ms)
                pipe.xadd(stream, {"c": m.conversation, "f": frame})
                pipe.hset(room_key(PREFIX, m.conversation, "meta"), "last", m.id)
            await pipe.execute()


async def _stream_archiving(messages: list[StoredMessage], batch: int) -> dict[str, Any]:
    redis_server, postgres = RedisServer(), PostgresServer(fsync=True)
    await redis_server.start()
    await postgres.start()
    assert redis_server.proc is not None
    _pin(redis_server.proc.pid, CLIENT_CPU)
    _pin(postgres.pid, CLIENT_CPU)  # its backends, forked later, inherit it
    try:
        url = await postgres.create_database("archive")
        engine = engine_for(url)
        await migrate(engine)
        settings = Settings(  # type: ignore[call-arg]
            redis_url=redis_server.url, database_url=url, archive_batch_max=batch,
            archive_interval_s=0.05, auth_mode="names",
        )  # fmt: skip
        redis = command_client(settings)  # as a worker's: commands packed by hiredis
        await _fill(redis, messages)
        archiver = StreamArchiver(redis, MessageStore(engine), settings)
        started, cpu = time.perf_counter(), time.process_time()
        task = asyncio.create_task(archiver.run())
        async with asyncio.timeout(600):
            while archiver.stats.stored < len(messages):
                await asyncio.sleep(0.01)
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await redis.aclose()
        return await _result("postgresql", engine, messages, seconds, cpu)
    finally:
        await postgres.stop()
        await redis_server.stop()


async def _result(
    store_name: str, engine: AsyncEngine, messages: list[StoredMessage], seconds: float, cpu: float
) -> dict[str, Any]:
    """What a run measured, and how many rows the database holds (then closes ``engine``)."""
    store = MessageStore(engine)
    conversations = sorted({m.conversation for m in messages})
    stored = sum([await store.count(conversation) for conversation in conversations])
    await engine.dispose()
    return {
        "store": store_name,
        "messages": len(messages),
        "stored_rows": stored,
        "seconds": round(seconds, 2),
        "messages_per_s": round(len(messages) / seconds),
        # What archiving costs the process that does it, per message (with SQLite, the
        # writes in aiosqlite's thread count too).
        "archiver_cpu_us_per_message": round(cpu / len(messages) * 1e6, 1),
    }


async def _embedded_archiving(messages: list[StoredMessage], batch: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="hubbub-archive-") as tmp:
        engine = engine_for(f"sqlite:///{tmp}/archive.db")
        await migrate(engine)
        archiver = Archiver(MessageStore(engine), batch_max=batch, interval_s=0.05)
        task = asyncio.create_task(archiver.run())
        started, cpu = time.perf_counter(), time.process_time()
        for message in messages:
            archiver.offer(message)
        async with asyncio.timeout(600):
            while archiver.lag:
                await asyncio.sleep(0.01)
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
        await archiver.close()
        await asyncio.gather(task, return_exceptions=True)
        return await _result("sqlite (embedded)", engine, messages, seconds, cpu)


async def run(count: int, rooms: int, batch: int) -> list[dict[str, Any]]:
    _pin(0, SERVER_CPU)
    messages = _messages(count, rooms)
    return [
        await _stream_archiving(messages, batch),
        await _embedded_archiving(messages, batch),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--rooms", type=int, default=1_000)
    parser.add_argument(
        "--batch", type=int, default=Settings.model_fields["archive_batch_max"].default
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    results = asyncio.run(run(args.messages, args.rooms, args.batch))
    for result in results:
        print(json.dumps(result), file=sys.stdout)
        if result["stored_rows"] != result["messages"]:
            print(f"{result['store']}: {result['stored_rows']} rows stored", file=sys.stderr)
            return 1
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
