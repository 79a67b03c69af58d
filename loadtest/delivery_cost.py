"""``python -m loadtest.delivery_cost``: what our own code costs per delivery, without the
kernel: the path from a room's offer to the transport's ``write`` (Connection.offer, the
outbox, the Flusher, the frame cache, DirectSocket), with a transport whose ``write`` does
nothing.

``--rooms`` rooms of ``--room-size`` connections each get ``--rounds`` messages; the loop
runs its flush after every ``--per-iteration`` messages, as a busy worker's loop would.
Prints nanoseconds per delivery (docs/benchmarks.md, "Where the time goes in small rooms").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

import uvloop
from websockets.protocol import State

from app.access.ratelimit import RateLimiter
from app.ops.metrics import Metrics
from app.sockets.connection import Connection
from app.transport import uvicorn_seam
from app.transport.flusher import Flusher
from app.transport.outbox import Outbox

FRAME = (
    '{"type":"message","room":"room1","id":1795321410970000,"user":"p1",'
    '"text":"p1:1:1795321410.970000","ts":1795321410970}'
)


class _Transport:
    """A transport that takes every write and does nothing with it."""

    def __init__(self) -> None:
        self.writes = 0

    def write(self, data: bytes) -> None:
        self.writes += 1

    def is_closing(self) -> bool:
        return False


class _Writable:
    def is_set(self) -> bool:
        return True


class _OpenConnection:
    state = State.OPEN
    extensions: list[Any] = []  # noqa: RUF012 (read only)


class _Protocol:
    """The attributes of uvicorn's protocol that DirectSocket reads."""

    def __init__(self) -> None:
        self.transport = _Transport()
        self.writable = _Writable()
        self.close_sent = False
        self.disconnected = False
        self.conn = _OpenConnection()


async def measure(rooms: int, room_size: int, rounds: int, per_iteration: int) -> dict[str, Any]:
    metrics, flusher = Metrics(), Flusher()
    protocols, members = [], []
    for n in range(rooms * room_size):
        conn = Connection(
            None,  # type: ignore[arg-type]  # the ASGI socket: unused while direct writes work
            f"u{n}", Outbox(1 << 20, 65_536), RateLimiter(100, 100, 10, 10.0, 0.0), 1.0, 0.0,
            metrics, flusher,
        )  # fmt: skip
        protocol = _Protocol()
        conn.write_directly(uvicorn_seam.DirectSocket(protocol))  # type: ignore[arg-type]
        protocols.append(protocol)
        members.append(conn)
    by_room = [members[r * room_size : (r + 1) * room_size] for r in range(rooms)]
    nbytes = len(FRAME)
    messages = 0
    began = time.perf_counter()
    for _ in range(rounds):
        for room in by_room:
            for conn in room:
                conn.offer(FRAME, nbytes)
            messages += 1
            if messages % per_iteration == 0:
                await asyncio.sleep(0)  # the loop runs the Flusher's callback
    await asyncio.sleep(0)
    elapsed = time.perf_counter() - began
    deliveries = messages * room_size
    writes = sum(protocol.transport.writes for protocol in protocols)
    return {
        "deliveries": deliveries,
        "writes": writes,
        "ns_per_delivery": round(elapsed / deliveries * 1e9),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rooms", type=int, default=1000)
    parser.add_argument("--room-size", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--per-iteration", type=int, default=10)
    args = parser.parse_args(argv)
    result = uvloop.run(measure(args.rooms, args.room_size, args.rounds, args.per_iteration))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
