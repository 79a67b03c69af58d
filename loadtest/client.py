"""A lean protocol client for load tests: websockets' asyncio client, frames split on ``\\n``,
server pings answered, everything else handed to a callback."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection, connect

Frame = dict[str, Any]
PONG = b'{"type":"pong"}'


async def open_client(
    url: str, name: str, timeout_s: float = 30.0
) -> tuple[ClientConnection, Frame]:
    """Connect as ``name`` and read the ``hello`` frame."""
    separator = "&" if "?" in url else "?"
    ws = await connect(
        f"{url}{separator}name={name}", open_timeout=timeout_s, max_size=None, compression=None
    )
    async with asyncio.timeout(timeout_s):
        hello = orjson.loads(str(await ws.recv()).split("\n")[0])
    return ws, hello


async def send(ws: ClientConnection, frame: Frame) -> None:
    await ws.send(orjson.dumps(frame).decode())


async def read_frames(ws: ClientConnection, on_frame: Callable[[Frame, float], None]) -> int | None:
    """Hand every frame (with its arrival time, ``loop.time()``) to ``on_frame`` until the
    socket closes; answer pings. Returns the close code."""
    loop = asyncio.get_running_loop()
    try:
        async for data in ws:
            now = loop.time()
            for line in str(data).split("\n"):
                frame = orjson.loads(line)
                if frame["type"] == "ping":
                    await ws.send(PONG.decode())
                else:
                    on_frame(frame, now)
    except Exception:
        pass
    return ws.close_code


async def until(ws: ClientConnection, kind: str, timeout_s: float = 30.0) -> Frame:
    """Read frames (answering pings) until one of type ``kind``."""
    async with asyncio.timeout(timeout_s):
        while True:
            for line in str(await ws.recv()).split("\n"):
                frame: Frame = orjson.loads(line)
                if frame["type"] == "ping":
                    await ws.send(PONG.decode())
                elif frame["type"] == kind:
                    return frame
