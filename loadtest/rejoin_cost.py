"""``python -m loadtest.rejoin_cost``: what a reconnect storm costs, presence's grace on or off.

A deploy's drain, a network blip or a reloaded page drops connections whose clients come
straight back and rejoin their rooms. Without a grace (``CHAT_PRESENCE_LEAVE_GRACE_S=0``)
each such return is a departure and an arrival announced to every other member of each room;
with the default grace, a user back in time is announced neither. This starts one server per
case and round (``python -m app`` through a real ``redis-server``, the server pinned to
``--server-core``), the cases alternating, and:

1. connects ``--clients`` clients (named users, ``?auth=frame`` and an ``auth`` frame, as the
   SDKs do) in rooms of ``--room-size``;
2. **the storm** (measured): in a random order, ``--concurrency`` at a time, each client's
   socket is closed and the client reconnects at once and joins its room again; then the
   server is given ``--grace-s`` and a second to settle;
3. reports the server's CPU (``/proc``) over the storm and the settling, per reconnect (less
   what it spends by the clock, measured idle for as long just before), and the ``presence``
   frames every client received meanwhile, per reconnect.

The medians of the rounds are printed, and written as JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection, connect

from app.settings import Settings
from loadtest.bench import OPEN_LIMITS, free_port
from loadtest.redis_cost import cpu_s
from tests.processes import RedisServer, wait_for_port

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_GRACE_S: float = Settings.model_fields["presence_leave_grace_s"].default


class Client:
    """One user's connection, re-openable, counting the presence frames it receives."""

    def __init__(self, port: int, name: str, room: str, counts: dict[str, int]) -> None:
        self.port, self.name, self.room, self.counts = port, name, room, counts
        self.ws: ClientConnection | None = None
        self._reader: asyncio.Task[None] | None = None

    async def open(self) -> None:
        """Connect, authenticate, join the room; return once ``joined`` came."""
        ws = await connect(f"ws://127.0.0.1:{self.port}/ws?auth=frame", compression=None)
        await ws.send(orjson.dumps({"type": "auth", "name": self.name}).decode())
        await ws.send(orjson.dumps({"type": "join", "room": self.room}).decode())
        joined = asyncio.get_running_loop().create_future()
        self.ws = ws
        self._reader = asyncio.create_task(self._read(ws, joined))
        await joined

    async def _read(self, ws: ClientConnection, joined: asyncio.Future[None]) -> None:
        try:
            async for data in ws:
                for line in str(data).splitlines():
                    kind = orjson.loads(line).get("type")
                    if kind == "presence":
                        self.counts["presence"] += 1
                    elif kind == "joined" and not joined.done():
                        joined.set_result(None)
                    elif kind == "error" and not joined.done():
                        joined.set_exception(RuntimeError(f"{self.name}: {line}"))
        except Exception as exc:  # the socket ended badly: the storm is not what was measured
            if not joined.done():
                joined.set_exception(exc)

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()
        if self._reader is not None:
            await self._reader


async def storm_round(grace_s: float, args: argparse.Namespace) -> dict[str, float]:
    """One server with ``grace_s``: its CPU and the presence frames, per reconnect."""
    redis = RedisServer()
    await redis.start()
    port = free_port()
    env = {
        **os.environ, **OPEN_LIMITS, "CHAT_PORT": str(port), "CHAT_REDIS_URL": redis.url,
        "CHAT_PRESENCE_LEAVE_GRACE_S": str(grace_s), "TMPDIR": tempfile.gettempdir(),
    }  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        "taskset", "-c", str(args.server_core), sys.executable, "-m", "app", cwd=ROOT, env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    counts = {"presence": 0}
    clients = [
        Client(port, f"u{n}", f"room-{n // args.room_size}", counts) for n in range(args.clients)
    ]
    try:
        await wait_for_port(port, proc, "the server exited")
        for start in range(0, len(clients), 100):
            await asyncio.gather(*(c.open() for c in clients[start : start + 100]))
        settle_s = args.grace_s + 1.0  # past the longest grace of the cases
        await asyncio.sleep(1.0)  # the arrivals' announcements delivered before counting
        # What the server does by the clock (heartbeats, upkeep), left out of the storm's.
        idle_before = cpu_s(proc.pid)
        await asyncio.sleep(settle_s)
        idle_per_s = (cpu_s(proc.pid) - idle_before) / settle_s
        counts["presence"] = 0
        before = cpu_s(proc.pid)
        order = random.Random(args.seed).sample(clients, len(clients))

        async def come_back(client: Client) -> None:
            await client.close()
            await client.open()

        for start in range(0, len(order), args.concurrency):
            await asyncio.gather(*(come_back(c) for c in order[start : start + args.concurrency]))
        await asyncio.sleep(settle_s)  # the graces end, and what they announce
        cpu = cpu_s(proc.pid) - before - idle_per_s * settle_s
        return {
            "server_us_per_reconnect": cpu / len(clients) * 1e6,
            "presence_frames_per_reconnect": counts["presence"] / len(clients),
        }
    finally:
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()
        await redis.stop()


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    os.sched_setaffinity(0, {args.generator_core})
    cases = {"no grace": 0.0, f"grace {args.grace_s:g} s": args.grace_s}
    rounds: dict[str, list[dict[str, float]]] = {case: [] for case in cases}
    began = time.time()
    for _ in range(args.rounds):
        for case, grace in cases.items():
            rounds[case].append(await storm_round(grace, args))
    medians = {
        case: {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        for case, runs in rounds.items()
    }
    return {
        "clients": args.clients, "room_size": args.room_size, "concurrency": args.concurrency,
        "seconds": round(time.time() - began), "rounds": rounds, "medians": medians,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--room-size", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--grace-s", type=float, default=DEFAULT_GRACE_S)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--server-core", type=int, default=0)
    parser.add_argument("--generator-core", type=int, default=min(1, (os.cpu_count() or 1) - 1))
    parser.add_argument("--json", type=Path, help="write the result here as JSON")
    args = parser.parse_args(argv)
    result = asyncio.run(measure(args))
    print(f"a reconnect storm, {args.clients} clients in rooms of {args.room_size}, medians of "
          f"{args.rounds} rounds:")  # fmt: skip
    for case, figures in result["medians"].items():
        us, frames = figures["server_us_per_reconnect"], figures["presence_frames_per_reconnect"]
        print(f"  {case:12} server {us:7.1f} µs a reconnect, {frames:5.2f} presence frames")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
