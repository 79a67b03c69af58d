"""``python -m tests.chat_cycles PORT CYCLES TAG``: a client process that runs CYCLES times
through a connection's whole life (connect two users, join, chat, ack, typing, leave, close),
for tests that watch the server's process while it serves (tests/test_garbage.py)."""

from __future__ import annotations

import asyncio
import sys

import orjson
from websockets.asyncio.client import ClientConnection, connect


async def _until(ws: ClientConnection, kind: str) -> None:
    async with asyncio.timeout(10):
        while True:
            data = await ws.recv()
            assert isinstance(data, str)
            if any(orjson.loads(line)["type"] == kind for line in data.split("\n")):
                return


async def _send(ws: ClientConnection, frame: dict[str, object]) -> None:
    await ws.send(orjson.dumps(frame).decode())


async def run(port: int, cycles: int, tag: str) -> None:
    url = f"ws://127.0.0.1:{port}/ws?name="
    for n in range(cycles):
        async with connect(f"{url}a{n % 5}") as a, connect(f"{url}b{n % 5}") as b:
            for ws in (a, b):
                await _until(ws, "hello")
                await _send(ws, {"type": "join", "room": "r"})
                await _until(ws, "joined")
            await _send(a, {"type": "send", "room": "r", "text": "hi", "cid": f"{tag}-{n}"})
            await _until(b, "message")
            await _until(a, "ack")
            await _send(b, {"type": "typing", "room": "r"})
            await _until(a, "typing")
            await _send(a, {"type": "leave", "room": "r"})
            await _until(a, "left")


if __name__ == "__main__":
    asyncio.run(run(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]))
