"""``python -m loadtest.upkeep_cost``: how long a worker's periodic upkeep holds its loop, with
``--connections`` open connections in rooms of ``--room-size``: every message arriving
meanwhile waits, so these are the small rooms' tail (docs/benchmarks.md, issue 34,
"2026-12-07").

In one process, on the app's own classes (a memory broker; each socket a uvicorn transport
whose ``write`` does nothing, every connection greeted and holding a token), the CPU time
(``time.process_time``), median over ``--repeat`` runs, of:

- a heartbeat tick (:mod:`app.sockets.heartbeat`): ping one group, check the one pinged
  before, and write the pings (the loop's flush);
- the gauges' snapshot (:meth:`app.sockets.hub.Hub.snapshot`), once a second;
- the token check (:mod:`app.access.token_expiry`), once a second: a whole pass, and its
  largest chunk (what the loop is held for at once).

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import uvloop

from app.access import token_expiry
from app.access.auth import Identity
from app.access.ratelimit import RateLimiter
from app.broker.memory import MemoryBroker
from app.ops.metrics import Metrics
from app.presence.memory import MemoryPresence
from app.protocol import PING_FRAME
from app.settings import Settings
from app.sockets import heartbeat, slices
from app.sockets.connection import Connection
from app.sockets.hub import Hub
from app.sockets.replay import Pacing
from app.transport import uvicorn_seam
from app.transport.flusher import Flusher
from app.transport.outbox import Outbox
from loadtest.delivery_cost import _Protocol, _Transport

DEFAULT_INTERVAL_S = Settings.model_fields["heartbeat_interval_s"].default


class _PingCounter(_Transport):
    """Takes every write, counting the pings in them."""

    def __init__(self) -> None:
        super().__init__()
        self.pings = 0

    def write(self, data: bytes) -> None:
        super().write(data)
        self.pings += data.count(b'"ping"')


def _cpu_ms(run: Callable[[], Any]) -> float:
    began = time.process_time()
    run()
    return (time.process_time() - began) * 1000


async def _flushed() -> None:
    for _ in range(3):  # the Flusher writes in a later pass of the loop
        await asyncio.sleep(0)


async def measure(connections: int, room_size: int, repeat: int) -> dict[str, Any]:
    settings = Settings(auth_mode="names")  # type: ignore[call-arg]
    metrics, flusher = Metrics(), Flusher()
    broker = MemoryBroker(settings)
    hub = Hub(broker, MemoryPresence(settings, broker), connections, metrics, Pacing.of(settings))
    await broker.start(hub)
    protocols: list[Any] = []
    expires_at = time.time() + 86_400  # far off: every connection is looked at, none closed
    for n in range(connections):
        conn = Connection(
            None,  # type: ignore[arg-type]  # the ASGI socket: unused while direct writes work
            f"u{n}", Outbox(1 << 20, 65_536, hub.outbox_budget),
            RateLimiter(100, 100, 10, 10.0, 0.0), 1.0, time.monotonic(), metrics, flusher,
        )  # fmt: skip
        protocol = _Protocol()
        protocol.transport = _PingCounter()
        conn.write_directly(uvicorn_seam.DirectSocket(protocol))  # type: ignore[arg-type]
        protocols.append(protocol)
        conn.identity = Identity(conn.user, expires_at=expires_at)
        if not hub.add(conn):
            raise RuntimeError("the hub refused a connection")
        conn.greeted = True
        await hub.join(conn, f"room{n // room_size}", None)
    await _flushed()  # the `joined` frames

    def writes() -> int:  # the pings written
        return sum(protocol.transport.pings for protocol in protocols)

    nbytes = len(PING_FRAME)
    ticks, pings = [], []
    for n in range(repeat):
        part = n % slices.SLICES
        checked = (part + slices.SLICES // 2) % slices.SLICES
        before, began = writes(), time.process_time()
        heartbeat._tick(hub, [part], {checked: 0.0}, nbytes)  # every one heard from since
        await _flushed()
        ticks.append((time.process_time() - began) * 1000)
        pings.append(writes() - before)
    snapshots = [_cpu_ms(hub.snapshot) for _ in range(repeat)]
    passes, chunks = [], []
    for _ in range(repeat):
        conns = list(hub.connections)
        chunk = token_expiry.CHUNK
        took = [
            _cpu_ms(partial(token_expiry.check_tokens, conns[at : at + chunk], 60.0, time.time()))
            for at in range(0, len(conns), chunk)
        ]
        passes.append(sum(took))
        chunks.append(max(took))
    snapshot = hub.snapshot()
    tick_ms = statistics.median(ticks)
    ticks_per_s = slices.SLICES / DEFAULT_INTERVAL_S
    return {
        "connections": connections,
        "memberships": snapshot.memberships,
        "slices": slices.SLICES,
        "pings_per_tick": {"min": min(pings), "max": max(pings)},
        "closed": sum(conn.closing for conn in hub.connections),
        "tick_ms": round(tick_ms, 3),
        "heartbeat_ms_per_s": round(tick_ms * ticks_per_s, 3),  # at the default interval
        "snapshot_ms": round(statistics.median(snapshots), 3),
        "token_pass_ms": round(statistics.median(passes), 3),
        "token_chunk_ms": round(statistics.median(chunks), 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=10_000)
    parser.add_argument("--room-size", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args(argv)
    print(json.dumps(uvloop.run(measure(args.connections, args.room_size, args.repeat))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
