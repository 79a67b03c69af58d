"""``python -m loadtest.sdk_soak``: many clients of the Python SDK (``clients/python``), as an
application would run them, against a server: ``--clients`` clients in ``--rooms`` rooms each
send ``--rate`` messages a second in all for ``--seconds``, every send awaited as its ack.
It prints, as JSON: sends acked and refused, the ack time p50/p99, deliveries, and what the
SDK promises each client: no message twice and none out of order in a room (``duplicates``,
``out_of_order``), every acked message delivered to every member (``missing``). Run it across
a restart or a drain of the server to see the SDK come back (``reconnects``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from typing import Any

from hubbub_client import HubbubClient, HubbubError, Message, StateChange


class Member:
    """One SDK client and what it saw."""

    def __init__(self, url: str, name: str, room: str) -> None:
        self.client = HubbubClient(url, name=name, base_delay_s=0.2, max_delay_s=2.0)
        self.room = room
        self.seen: list[int] = []
        self.reconnects = 0
        self.client.on(Message, self._message)
        self.client.on(StateChange, self._state)

    def _message(self, message: Message) -> None:
        if message.room == self.room:
            self.seen.append(message.id)

    def _state(self, change: StateChange) -> None:
        self.reconnects += change.state == "reconnecting"


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))] if ordered else 0.0


async def soak(args: argparse.Namespace) -> dict[str, Any]:
    rooms = [f"soak-{n}" for n in range(args.rooms)]
    members = [Member(args.url, f"soak{n}", rooms[n % len(rooms)]) for n in range(args.clients)]
    for member in members:
        member.client.connect()
        await member.client.wait_open()
        await member.client.join(member.room)
    acked: dict[str, list[int]] = {room: [] for room in rooms}
    ack_ms: list[float] = []
    refused: dict[str, int] = {}
    sending: set[asyncio.Task[None]] = set()

    async def send(member: Member, n: int) -> None:
        began = time.monotonic()
        try:
            ack = await member.client.send(member.room, f"m{n}")
        except (HubbubError, TimeoutError) as exc:
            code = getattr(exc, "code", type(exc).__name__)
            refused[code] = refused.get(code, 0) + 1
            return
        ack_ms.append((time.monotonic() - began) * 1000)
        acked[member.room].append(ack.id)

    began, sent = time.monotonic(), 0
    while (elapsed := time.monotonic() - began) < args.seconds:
        for _ in range(int(args.rate * elapsed) - sent):
            task = asyncio.create_task(send(members[sent % len(members)], sent))
            sending.add(task)
            task.add_done_callback(sending.discard)
            sent += 1
        await asyncio.sleep(0.005)
    await asyncio.gather(*sending)
    expected = {room: set(ids) for room, ids in acked.items()}
    with contextlib.suppress(TimeoutError):  # the last deliveries may follow their acks
        async with asyncio.timeout(10):
            while any(not expected[m.room] <= set(m.seen) for m in members):
                await asyncio.sleep(0.05)
    result = {
        "clients": len(members), "rooms": len(rooms), "sent": sent,
        "acked": sum(len(ids) for ids in acked.values()), "refused": refused,
        "ack_p50_ms": round(_percentile(ack_ms, 0.5), 1),
        "ack_p99_ms": round(_percentile(ack_ms, 0.99), 1),
        "delivered": sum(len(m.seen) for m in members),
        "missing": sum(len(expected[m.room] - set(m.seen)) for m in members),
        "duplicates": sum(len(m.seen) - len(set(m.seen)) for m in members),
        "out_of_order": sum(
            sum(1 for a, b in zip(m.seen, m.seen[1:], strict=False) if b <= a) for m in members
        ),
        "reconnects": sum(m.reconnects for m in members),
    }  # fmt: skip
    await asyncio.gather(*(member.client.close() for member in members))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="ws://127.0.0.1:8000/ws")
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--rooms", type=int, default=10)
    parser.add_argument("--rate", type=float, default=100.0, help="sends a second in all")
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args(argv)
    result = asyncio.run(soak(args))
    sys.stdout.write(json.dumps(result) + "\n")
    broken = result["missing"] or result["duplicates"] or result["out_of_order"]
    return 1 if broken else 0


if __name__ == "__main__":
    raise SystemExit(main())
