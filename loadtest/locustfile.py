"""Locust, for people who prefer it: ``pip install locust websocket-client``, then
``locust -f loadtest/locustfile.py --host ws://127.0.0.1:8000 --headless -u 100 -r 20 -t 30s``.

Each user joins a room (one of ``HUBBUB_ROOMS``, default 10), answers the server's pings, and
sends a message every 1-5 s, reporting the time until its own message comes back as a
"ws send" request. Not run by the test suite (Locust is not a dependency); ``python -m
loadtest`` is the measured harness behind docs/benchmarks.md.
"""

from __future__ import annotations

import json
import os
import random
import time
from typing import Any

import websocket  # websocket-client
from locust import User, between, events, task


class ChatUser(User):
    wait_time = between(1, 5)

    def on_start(self) -> None:
        self.name = f"locust{random.randrange(10**9)}"
        self.room = f"room{random.randrange(int(os.environ.get('HUBBUB_ROOMS', '10')))}"
        self.ws = websocket.create_connection(f"{self.host}/ws?name={self.name}", timeout=10)
        self._until("hello")
        self.ws.send(json.dumps({"type": "join", "room": self.room}))
        self._until("joined")

    def on_stop(self) -> None:
        self.ws.close()

    def _until(self, kind: str, marker: str | None = None) -> dict[str, Any]:
        while True:
            for line in self.ws.recv().split("\n"):
                frame: dict[str, Any] = json.loads(line)
                if frame["type"] == "ping":
                    self.ws.send('{"type":"pong"}')
                elif frame["type"] == kind and (marker is None or frame.get("text") == marker):
                    return frame

    @task
    def send(self) -> None:
        text = f"{self.name}:{time.time()}"
        started = time.perf_counter()
        error: Exception | None = None
        try:
            self.ws.send(json.dumps({"type": "send", "room": self.room, "text": text}))
            self._until("message", text)
        except Exception as exc:
            error = exc
        events.request.fire(
            request_type="ws", name="send", response_time=(time.perf_counter() - started) * 1000,
            response_length=len(text), exception=error,
        )  # fmt: skip
