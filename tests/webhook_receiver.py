"""A real HTTP receiver for webhooks, as a backend would run one: it checks every request's
signature (app.webhooks.signing, the documented scheme), records the events, and can fail
(HTTP 500) or answer slowly on demand."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
from starlette.types import Receive, Scope, Send

from app.webhooks.signing import BadSignature, verify
from tests.helpers import free_port, serving


class Receiver:
    def __init__(self, secret: str) -> None:
        self.secret = secret.encode()
        self.events: list[dict[str, Any]] = []  # every accepted request, duplicates included
        self.refused_signatures = 0
        self.fail_next = 0  # answer 500 to this many more requests
        self.delay_s = 0.0
        self.attempts = 0
        self.batches = 0  # requests that carried several events
        self.headers: list[dict[str, str]] = []  # of every accepted request, lower-case names
        self.port = free_port()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks"

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == kind]

    def counts(self) -> Counter[str]:
        """How many times each event id arrived."""
        return Counter(e["id"] for e in self.events)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the sender gave up (its timeout, its shutdown): not a request
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        self.attempts += 1
        status = 204
        try:
            verify(self.secret, headers, body, time.time())
        except BadSignature:
            self.refused_signatures += 1
            status = 401
        else:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            if self.fail_next > 0:
                self.fail_next -= 1
                status = 500
            else:
                decoded = orjson.loads(body)
                self.headers.append(headers)
                if isinstance(decoded, list):  # a batch (CHAT_WEBHOOK_BATCH_MAX > 1)
                    assert headers["hubbub-event"] == "batch"
                    assert headers["hubbub-delivery"] == decoded[0]["id"]
                    self.batches += 1
                    self.events.extend(decoded)
                else:
                    assert headers["hubbub-event"] == decoded["type"]
                    assert headers["hubbub-delivery"] == decoded["id"]
                    self.events.append(decoded)
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def wait_for(self, condition: Callable[[], object], timeout: float = 30.0) -> None:
        async with asyncio.timeout(timeout):
            while not condition():
                await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def running_receiver(secret: str) -> AsyncIterator[Receiver]:
    receiver = Receiver(secret)
    async with serving(receiver, receiver.port, log_level="warning", lifespan="off"):
        yield receiver
