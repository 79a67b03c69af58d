"""``python -m loadtest.redis_upkeep``: what a worker's periodic upkeep in Redis costs it, and
how long it holds the worker's loop at once, with ``--connections`` connections in rooms of
``--room-size``: every message arriving meanwhile waits, so a long hold is the tail of
delivery (docs/benchmarks.md, issue 34, "the presence upkeep").

In one process, on the app's own classes and a real ``redis-server`` (pinned to
``--redis-core``; this process to ``--worker-core``), each pass ``--repeat`` times:

- the presence upkeep (:meth:`app.presence.redis.RedisPresence.upkeep`, every third of
  ``CHAT_PRESENCE_TTL_S``): each room's entries of this worker refreshed and its dead
  workers' users swept out, for ``connections / room_size`` rooms of ``room_size`` users
  (with ``--visible``, every user also in the internal room of those whose chat page is
  visible, :data:`app.notify.VISIBLE_ROOM`, as the chat page's users are);
- the connection counts' refresh (:func:`app.access.quotas.refresh_counts`, as often), one
  entry a connection, each admitted first.

Each pass runs at once here (a worker spreads it over half its interval: the longest hold
is what one chunk of it costs). For each: its CPU time (``time.process_time``, median) and
Redis' (``/proc``), the longest the loop was held at once during it (median over the
passes, and the largest; a task that yields to the loop again and again measures it, so
that pass' CPU is not counted), Redis' script calls a pass and the longest of them (its
slow log: Redis runs one command at a time, so every worker's messages wait for it). Then
``present_users``: the users still present in all rooms (each pass refreshed them: none
swept out). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import uvloop
from redis.asyncio import Redis

from app.access.quotas import RedisQuotas, refresh_counts
from app.broker.redis import RedisBroker
from app.notify import VISIBLE_ROOM
from app.ops.gc_tuning import GcTuning, keep_freezing
from app.presence.redis import RedisPresence
from app.settings import Settings
from loadtest.redis_cost import cpu_s
from tests.processes import RedisServer

GC_FREEZE_INTERVAL_S = Settings.model_fields["gc_freeze_interval_s"].default
# Redis' slow log keeps the calls of a pass over this long (its longest is reported).
_SLOWLOG_FROM_US = 200
_SLOWLOG_LENGTH = 10_000


@dataclass
class _Conn:
    user: str
    id: str


async def _cpu_ms(run: Callable[[], Awaitable[None]]) -> float:
    began = time.process_time()
    await run()
    return (time.process_time() - began) * 1000


async def _longest_hold_ms(run: Callable[[], Awaitable[None]]) -> float:
    """The longest pass of the loop while ``run`` runs: a task beside it yields at every pass
    and notes the time between two of its turns."""
    longest, done = 0.0, False

    async def probe() -> None:
        nonlocal longest
        last = time.perf_counter()
        while not done:
            await asyncio.sleep(0)
            now = time.perf_counter()
            longest, last = max(longest, now - last), now

    prober = asyncio.create_task(probe())
    await asyncio.sleep(0)
    try:
        await run()
    finally:
        done = True
        await prober
    return longest * 1000


async def _script_calls(admin: Redis) -> int:
    stats = await admin.info("commandstats")
    return sum(
        int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("evalsha", "eval")
    )


async def _measure_pass(
    run: Callable[[], Awaitable[None]], admin: Redis, redis_pid: int, repeat: int
) -> dict[str, Any]:
    cpu, redis_cpu, holds, calls, longest_calls = [], [], [], [], []
    for _ in range(repeat):
        await admin.slowlog_reset()
        before, redis_before = await _script_calls(admin), cpu_s(redis_pid)
        cpu.append(await _cpu_ms(run))
        redis_cpu.append((cpu_s(redis_pid) - redis_before) * 1000)
        calls.append(await _script_calls(admin) - before)
        logged = await admin.slowlog_get(_SLOWLOG_LENGTH)
        longest_calls.append(max((entry["duration"] for entry in logged), default=0) / 1000)
        holds.append(await _longest_hold_ms(run))
    return {
        "cpu_ms": round(statistics.median(cpu), 3),
        "redis_cpu_ms": round(statistics.median(redis_cpu), 3),
        "longest_hold_ms": round(statistics.median(holds), 3),
        "longest_hold_ms_max": round(max(holds), 3),
        "script_calls": max(calls),
        # Redis runs one command at a time: every worker's messages wait for this one.
        "redis_longest_call_ms": round(statistics.median(longest_calls), 3),
    }


async def measure(
    connections: int,
    room_size: int,
    repeat: int,
    redis_core: int | None = None,
    visible: bool = False,
) -> dict[str, Any]:
    server = RedisServer()
    await server.start()
    assert server.proc is not None
    if redis_core is not None:
        os.sched_setaffinity(server.proc.pid, {redis_core})
    admin = Redis.from_url(server.url)
    await admin.config_set("slowlog-log-slower-than", _SLOWLOG_FROM_US)
    await admin.config_set("slowlog-max-len", _SLOWLOG_LENGTH)
    settings = Settings(redis_url=server.url, auth_mode="names")  # type: ignore[call-arg]
    broker = RedisBroker(settings)
    presence = RedisPresence(settings, broker)
    quotas = RedisQuotas(settings)
    try:
        rooms = connections // room_size
        users = [f"u{n}" for n in range(connections)]
        await asyncio.gather(
            *(presence.join(f"room{n // room_size}", user) for n, user in enumerate(users))
        )
        if visible:  # every user also in the worker's internal room of visible ones
            await asyncio.gather(*(presence.join(VISIBLE_ROOM, user) for user in users))
        conns = [_Conn(user, f"c{n}") for n, user in enumerate(users)]
        await asyncio.gather(*(quotas.admit(conn.user, conn.id, None) for conn in conns))
        await quotas.prepare()
        # What a worker does once its state is built (app.ops.gc_tuning, at the default
        # CHAT_GC_FREEZE_INTERVAL_S): without it, a full collection of the whole process
        # lands in some pass and is counted.
        gc_tuning = GcTuning([], freezing=True)
        gc_tuning.start()
        freezing = asyncio.create_task(keep_freezing(GC_FREEZE_INTERVAL_S))

        async def counts() -> None:
            await refresh_counts(quotas, conns)

        pid = server.proc.pid
        result = {
            "connections": connections,
            "rooms": rooms,
            "presence": await _measure_pass(presence.upkeep, admin, pid, repeat),
            "connection_counts": await _measure_pass(counts, admin, pid, repeat),
        }
        # Every user is still present after the passes: refreshed, none swept out.
        present = await asyncio.gather(*(presence.of(f"room{n}") for n in range(rooms)))
        result["present_users"] = sum(room.count for room in present)
        freezing.cancel()
        gc_tuning.stop()
        return result
    finally:
        await quotas.close()
        await presence.stop()
        await admin.aclose()
        await server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=10_000)
    parser.add_argument("--room-size", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--redis-core", type=int, default=None)
    parser.add_argument("--worker-core", type=int, default=None)
    parser.add_argument(
        "--visible", action="store_true",
        help="every user is also in the internal room of users with a visible chat page",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.worker_core is not None:
        os.sched_setaffinity(0, {args.worker_core})
    result = uvloop.run(
        measure(args.connections, args.room_size, args.repeat, args.redis_core, args.visible)
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
