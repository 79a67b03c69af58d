"""The baseline: FastAPI's tutorial ``ConnectionManager`` pattern, with rooms.

A global registry, and a broadcast that ``asyncio.gather``-s ``send_text`` to every member of
the room from inside the publisher's handler. It speaks just enough of Hubbub's protocol
(``hello``, ``join``/``joined``, ``send``/``message``, ``ping``/``pong``) for the load tests.
Run it the way Hubbub runs: ``python -m loadtest.baselines.tutorial --port 8001`` (uvloop,
httptools, websockets-sansio, no compression).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import time

import uvicorn
from fastapi import FastAPI, WebSocket, WebSocketDisconnect


class ConnectionManager:
    def __init__(self) -> None:
        self.rooms: dict[str, list[WebSocket]] = {}
        self.ids = itertools.count(1)

    def join(self, room: str, ws: WebSocket) -> None:
        self.rooms.setdefault(room, []).append(ws)

    def disconnect(self, ws: WebSocket) -> None:
        for members in self.rooms.values():
            if ws in members:
                members.remove(ws)

    async def broadcast(self, room: str, message: str) -> None:
        await asyncio.gather(
            *(ws.send_text(message) for ws in self.rooms.get(room, [])), return_exceptions=True
        )


app = FastAPI()
manager = ConnectionManager()


@app.websocket("/ws")
async def websocket_endpoint(ws: WebSocket) -> None:
    await ws.accept()
    user = ws.query_params.get("name", "guest")
    await ws.send_text(json.dumps({"type": "hello", "user": user}))
    try:
        while True:
            frame = json.loads(await ws.receive_text())
            kind = frame.get("type")
            if kind == "join":
                manager.join(frame["room"], ws)
                await ws.send_text(json.dumps({"type": "joined", "room": frame["room"]}))
            elif kind == "send":
                message = {
                    "type": "message",
                    "room": frame["room"],
                    "id": next(manager.ids),
                    "user": user,
                    "text": frame["text"],
                    "ts": int(time.time() * 1000),
                }
                await manager.broadcast(frame["room"], json.dumps(message))
            elif kind == "leave":
                members = manager.rooms.get(frame["room"], [])
                if ws in members:
                    members.remove(ws)
                await ws.send_text(json.dumps({"type": "left", "room": frame["room"]}))
            elif kind == "ping":
                await ws.send_text(json.dumps({"type": "pong"}))
    except WebSocketDisconnect:
        manager.disconnect(ws)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    args = parser.parse_args()
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        ws="websockets-sansio",
        ws_per_message_deflate=False,
        ws_ping_interval=None,
        log_level="warning",
    )


if __name__ == "__main__":
    main()
