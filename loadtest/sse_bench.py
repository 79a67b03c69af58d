"""``make bench-sse`` (``python -m loadtest.sse_bench``): the HTTP fallback transport against
WebSockets, side by side on one worker (docs/benchmarks.md, "The HTTP fallback").

For each transport, alternating over ``--rounds`` rounds, a fresh ``python -m app`` (one
uvicorn worker, the memory broker) on core 0 and this generator on core 1 (``taskset``):

- **fan-out**: ``--subscribers`` clients on the transport in one room, one WebSocket publisher
  sending ``--rate`` messages/s for ``--seconds`` (each text its send time): deliveries/s, the
  latency of each delivery (p50, p99, from the send), and the server's CPU;
  at ``--rate`` and at ``--saturate`` messages/s (more than one core delivers);
- **held**: ``--hold`` connections on the transport, opened and held: the server's resident
  memory per connection, and how many are alive at the end.

The generator reads both transports as lean protocols (picows for WebSockets, a raw
``asyncio.Protocol`` for the event stream), so it is not what limits either. Prints a table
and (``--json``) the figures. Medians of the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import statistics
import time
from pathlib import Path
from typing import Any

import orjson
import uvloop

from loadtest.bench import CLIENT_CPU, _machine, running
from loadtest.client import Client, open_client

_EVENT_END = b"\n\n"
_STREAM = re.compile(rb'"stream":"([^"]+)"')
_LINE_PREFIX = b"data: "


def _proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


class Latencies:
    """Every delivery's latency, and how many there were."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self.count = 0
        self.measuring = False

    def message(self, text: str, now: float) -> None:
        if self.measuring:
            self.count += 1
            self.samples.append(now - float(text))


class SseReader(asyncio.Protocol):
    """One stream, read raw: the response's head skipped, every ``data:`` line of every event
    parsed as a frame (chunked encoding's size lines are never ``data:`` lines)."""

    def __init__(self, host: str, name: str, latencies: Latencies) -> None:
        self.request = (
            f"GET /sse?name={name} HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\n\r\n"
        ).encode()
        self.latencies = latencies
        self.buffer = b""
        self.stream = ""
        self.hello = asyncio.get_running_loop().create_future()
        self.transport: asyncio.BaseTransport | None = None
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        transport.write(self.request)  # type: ignore[attr-defined]  # uvloop's TCPTransport

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer + data
        end = buffer.rfind(_EVENT_END)
        if end < 0:
            self.buffer = buffer
            return
        self.buffer = buffer[end + 2 :]
        now = time.time()
        for line in buffer[:end].split(b"\n"):
            if not line.startswith(_LINE_PREFIX):
                continue
            frame = orjson.loads(line[6:])
            kind = frame.get("type")
            if kind == "message":
                self.latencies.message(frame["text"], now)
            elif kind == "hello" and not self.hello.done():
                self.hello.set_result(None)
            elif kind is None and not self.stream:
                self.stream = frame["stream"]

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True


class SseClients:
    """``count`` streams, and POSTs for them (joins) over a keep-alive connection each."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.readers: list[SseReader] = []

    async def open(self, count: int, latencies: Latencies, prefix: str) -> None:
        loop = asyncio.get_running_loop()
        host = f"127.0.0.1:{self.port}"

        async def one(n: int) -> None:
            _, reader = await loop.create_connection(
                lambda: SseReader(host, f"{prefix}{n}", latencies), "127.0.0.1", self.port
            )
            async with asyncio.timeout(30):
                await reader.hello
            self.readers.append(reader)

        for start in range(0, count, 100):
            await asyncio.gather(*(one(n) for n in range(start, min(count, start + 100))))

    async def join(self, room: str) -> None:
        """Every stream joins ``room`` (one POST each, on one keep-alive connection)."""
        reader_, writer = await asyncio.open_connection("127.0.0.1", self.port)
        body = orjson.dumps({"type": "join", "room": room})
        try:
            for reader in self.readers:
                writer.write(
                    f"POST /sse HTTP/1.1\r\nHost: 127.0.0.1\r\nHubbub-Stream: {reader.stream}\r\n"
                    f"Hubbub-Seq: 0\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                status = await reader_.readline()
                assert b" 202 " in status, status
                while (await reader_.readline()) not in (b"\r\n", b""):
                    pass
        finally:
            writer.close()

    def close(self) -> None:
        for reader in self.readers:
            if reader.transport is not None:
                reader.transport.close()


async def _ws_clients(port: int, count: int, latencies: Latencies, prefix: str) -> list[Client]:
    url = f"ws://127.0.0.1:{port}/ws"
    clients: list[Client] = []
    for start in range(0, count, 100):
        opened = await asyncio.gather(
            *(open_client(url, f"{prefix}{n}") for n in range(start, min(count, start + 100)))
        )
        for client, _ in opened:
            client.on_frame = lambda frame, now: (
                latencies.message(frame["text"], now) if frame["type"] == "message" else None
            )
            clients.append(client)
    return clients


async def fanout(port: int, pid: int, transport: str, subscribers: int, rate: float,
                 seconds: float) -> dict[str, Any]:  # fmt: skip
    """One room of ``subscribers`` on ``transport``, a WebSocket publisher at ``rate``."""
    latencies = Latencies()
    sse = SseClients(port)
    ws: list[Client] = []
    if transport == "sse":
        await sse.open(subscribers, latencies, "s")
        await sse.join("bench")
    else:
        ws = await _ws_clients(port, subscribers, latencies, "s")
        for client in ws:
            client.send({"type": "join", "room": "bench"})
    publisher, _ = await open_client(f"ws://127.0.0.1:{port}/ws", "publisher")
    publisher.send({"type": "join", "room": "bench"})
    await asyncio.sleep(1.0)  # every join answered
    try:
        loop = asyncio.get_running_loop()
        interval, sent = 1.0 / rate, 0
        warm_until = loop.time() + 1.0
        end = warm_until + seconds
        cpu_before = wall_before = 0.0
        while (now := loop.time()) < end:
            if not latencies.measuring and now >= warm_until:
                latencies.measuring = True
                cpu_before, wall_before = _proc_cpu_s(pid), time.time()
            publisher.send({"type": "send", "room": "bench", "text": f"{time.time():.6f}"})
            sent += 1
            await asyncio.sleep(max(0.0, warm_until - 1.0 + sent * interval - loop.time()))
        window = time.time() - wall_before
        await asyncio.sleep(1.0)  # what is in flight arrives (counted: it was sent in time)
        latencies.measuring = False
        wall = time.time() - wall_before
        cpu = _proc_cpu_s(pid) - cpu_before
        samples = sorted(latencies.samples)
        return {
            "deliveries_per_s": round(latencies.count / window),
            "p50_ms": round(1000 * samples[len(samples) // 2], 2) if samples else None,
            "p99_ms": round(1000 * samples[int(len(samples) * 0.99)], 2) if samples else None,
            "server_cpu_percent": round(100 * cpu / wall, 1),
            "server_cpu_us_per_delivery": round(1e6 * cpu / max(1, latencies.count), 2),
        }
    finally:
        sse.close()
        for client in (*ws, publisher):
            client.abort()


async def held(port: int, pid: int, transport: str, count: int) -> dict[str, Any]:
    """``count`` connections on ``transport``, opened and held for 3 s."""
    latencies = Latencies()
    before = _rss_kib(pid)
    sse = SseClients(port)
    ws: list[Client] = []
    try:
        if transport == "sse":
            await sse.open(count, latencies, "h")
        else:
            ws = await _ws_clients(port, count, latencies, "h")
        await asyncio.sleep(3.0)
        alive = sum(not r.lost for r in sse.readers) + sum(not c.closed.done() for c in ws)
        return {
            "alive": alive,
            "rss_kib_per_connection": round((_rss_kib(pid) - before) / count, 2),
        }
    finally:
        sse.close()
        for client in ws:
            client.abort()


async def _case(
    case: str, args: argparse.Namespace, port: int, pid: int, transport: str
) -> dict[str, Any]:
    if case == "held":
        return await held(port, pid, transport, args.hold)
    rate = args.rate if case == "fanout" else args.saturate
    return await fanout(port, pid, transport, args.subscribers, rate, args.seconds)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    rows: dict[str, dict[str, list[dict[str, Any]]]] = {}
    order = ["websocket", "sse"]
    # No pings to answer during a measurement: a slice is pinged every 84 s.
    env = {"CHAT_HEARTBEAT_INTERVAL_S": "86400"}
    for round_ in range(args.rounds):
        for transport in order if round_ % 2 == 0 else order[::-1]:
            for case in args.cases:
                with running("hubbub", env) as server:
                    result = uvloop.run(_case(case, args, server.port, server.pid, transport))
                rows.setdefault(case, {}).setdefault(transport, []).append(result)
                print(f"round {round_ + 1} {case} {transport}: {result}", flush=True)
    return rows


def _median(results: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in results if r.get(key) is not None]
    return round(statistics.median(values), 2) if values else None


def report(rows: dict[str, dict[str, list[dict[str, Any]]]], args: argparse.Namespace) -> str:
    lines = [
        f"`make bench-sse` ({args.rounds} alternating rounds, medians; {_machine()}): one "
        f"worker (`python -m app`) on core 0, the generator on core 1. Fan-out: one room of "
        f"{args.subscribers} subscribers on the transport, a WebSocket publisher at the rate "
        f"given; held: {args.hold} connections.",
        "",
        "| case | figure | WebSocket | HTTP fallback (SSE) | SSE / WebSocket |",
        "|---|---|---|---|---|",
    ]
    cases = {
        "fanout": (f"fan-out at {args.rate:g} msg/s", ("deliveries_per_s", "p50_ms", "p99_ms",
                   "server_cpu_percent", "server_cpu_us_per_delivery")),
        "saturation": (f"fan-out at {args.saturate:g} msg/s offered", ("deliveries_per_s",
                       "p50_ms", "p99_ms", "server_cpu_percent", "server_cpu_us_per_delivery")),
        "held": ("connections held", ("alive", "rss_kib_per_connection")),
    }  # fmt: skip
    for case, (title, keys) in cases.items():
        if case not in rows:
            continue
        for key in keys:
            ws = _median(rows[case]["websocket"], key)
            sse = _median(rows[case]["sse"], key)
            ratio = f"{sse / ws:.2f}" if ws and sse is not None else "-"
            lines.append(f"| {title} | {key} | {ws:,} | {sse:,} | {ratio} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.sse_bench", description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--subscribers", type=int, default=500)
    parser.add_argument("--rate", type=float, default=40.0, help="msg/s of the fan-out")
    parser.add_argument("--saturate", type=float, default=400.0, help="msg/s offered")
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--hold", type=int, default=2000)
    parser.add_argument(
        "--cases", type=lambda text: text.split(","), default=["fanout", "saturation", "held"],
        help="comma-separated: fanout, saturation, held (default all)",
    )  # fmt: skip
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setaffinity(0, {int(CLIENT_CPU)})
    rows = measure(args)
    text = report(rows, args)
    print(text)
    if args.json is not None:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": None}, "rows": rows,
                                         "report": text}, indent=1) + "\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
