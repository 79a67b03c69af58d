"""Fan-out probe: S subscribers in one room, one publisher at a fixed rate.

``python -m loadtest.fanout --url ws://127.0.0.1:8000/ws --subscribers 1000 --rate 100
--seconds 10`` reports deliveries/s, delivery latency percentiles (publisher send time to
subscriber receipt, same clock) and missing/duplicated/out-of-order counts. It talks to the
given URL only (loopback by default) and stops after ``--seconds`` plus a drain grace period.
This is the quick probe behind the figures in issue notes; the full benchmark suite grows
around it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import dataclass, field

import orjson
from websockets.asyncio.client import ClientConnection, connect


@dataclass
class Tally:
    expected: int = 0
    received: int = 0
    duplicates: int = 0
    out_of_order: int = 0
    latencies_ms: list[float] = field(default_factory=list)


async def _subscriber(ws: ClientConnection, tally: Tally, done: asyncio.Event) -> None:
    last = -1
    seen: set[int] = set()
    while not done.is_set():
        try:
            data = await ws.recv()
        except Exception:
            return
        now = time.time()
        assert isinstance(data, str)
        for line in data.split("\n"):
            frame = orjson.loads(line)
            if frame["type"] == "ping":
                await ws.send('{"type":"pong"}')
                continue
            if frame["type"] != "message":
                continue
            seq_text, sent = frame["text"].split(":")
            seq = int(seq_text)
            if seq in seen:
                tally.duplicates += 1
                continue
            seen.add(seq)
            if seq < last:
                tally.out_of_order += 1
            last = seq
            tally.received += 1
            tally.latencies_ms.append((now - float(sent)) * 1000)


async def run(url: str, subscribers: int, rate: float, seconds: float) -> dict[str, float]:
    room = "fanout"
    sockets: list[ClientConnection] = []
    for start in range(0, subscribers, 200):
        batch = await asyncio.gather(
            *(
                connect(f"{url}?name=s{n}", max_size=None, open_timeout=30)
                for n in range(start, min(start + 200, subscribers))
            )
        )
        sockets.extend(batch)
    for ws in sockets:
        await ws.recv()  # hello
        await ws.send(json.dumps({"type": "join", "room": room}))
        while '"joined"' not in str(await ws.recv()):
            pass
    publisher = await connect(f"{url}?name=pub", open_timeout=30)
    await publisher.recv()
    await publisher.send(json.dumps({"type": "join", "room": room}))
    tally = Tally()
    done = asyncio.Event()
    readers = [asyncio.create_task(_subscriber(ws, tally, done)) for ws in sockets]
    drain_pub = asyncio.create_task(_subscriber(publisher, Tally(), done))
    total = int(rate * seconds)
    started = time.perf_counter()
    for seq in range(total):
        target = started + seq / rate
        delay = target - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        await publisher.send(
            json.dumps({"type": "send", "room": room, "text": f"{seq}:{time.time()}"})
        )
    tally.expected = total * subscribers
    deadline = time.perf_counter() + max(5.0, seconds)
    while tally.received < tally.expected and time.perf_counter() < deadline:
        await asyncio.sleep(0.05)
    elapsed = time.perf_counter() - started
    done.set()
    for ws in [*sockets, publisher]:
        await ws.close()
    for task in [*readers, drain_pub]:
        task.cancel()
    lat = sorted(tally.latencies_ms) or [float("nan")]

    def pct(p: float) -> float:
        return lat[min(len(lat) - 1, int(p / 100 * len(lat)))]

    return {
        "offered_deliveries_per_s": rate * subscribers,
        "deliveries_per_s": tally.received / elapsed,
        "p50_ms": pct(50),
        "p99_ms": pct(99),
        "max_ms": lat[-1],
        "missing": tally.expected - tally.received,
        "duplicates": tally.duplicates,
        "out_of_order": tally.out_of_order,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="ws://127.0.0.1:8000/ws")
    parser.add_argument("--subscribers", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=100.0, help="messages/s into the room")
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    result = asyncio.run(run(args.url, args.subscribers, args.rate, args.seconds))
    print(json.dumps({"url": args.url, **{k: round(v, 2) for k, v in result.items()}}))


if __name__ == "__main__":
    main()
