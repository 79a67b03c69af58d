"""A real moderation endpoint, as an operator would run one (docs/backend.md, "Moderation
hook"): it checks every request's signature, records the batches, and decides each message
by its words — ``spam`` is rejected, ``darn`` replaced — or misbehaves on demand (an error
status, a slow answer, a malformed one)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.types import Receive, Scope, Send

from app.webhooks.signing import BadSignature, verify
from tests.helpers import free_port, serving


class ModerationServer:
    def __init__(self, secret: str) -> None:
        self.secret = secret.encode()
        self.batches: list[list[dict[str, Any]]] = []
        self.refused_signatures = 0
        self.status = 200  # answer this status (anything but 200: a failure)
        self.delay_s = 0.0
        self.malformed = False  # answer results that are not results
        self.port = free_port()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/moderate"

    @property
    def items(self) -> list[dict[str, Any]]:
        return [item for batch in self.batches for item in batch]

    @staticmethod
    def decide(item: dict[str, Any]) -> dict[str, Any]:
        text: str = item["text"]
        if "spam" in text:
            return {"id": item["id"], "action": "reject", "reason": "no spam here"}
        if "darn" in text:
            return {"id": item["id"], "action": "replace", "text": text.replace("darn", "d**n")}
        return {"id": item["id"], "action": "accept"}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        answer = b""
        try:
            verify(self.secret, headers, body, time.time())
        except BadSignature:
            self.refused_signatures += 1
            status = 401
        else:
            items = orjson.loads(body)["messages"]
            self.batches.append(items)
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            status = self.status
            results: Any = [self.decide(item) for item in items]
            if self.malformed:
                results = [{"id": item["id"], "action": "maybe"} for item in items]
            answer = orjson.dumps({"results": results})
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json")]})  # fmt: skip
        await send({"type": "http.response.body", "body": answer})


@contextlib.asynccontextmanager
async def running_moderation(secret: str) -> AsyncIterator[ModerationServer]:
    server = ModerationServer(secret)
    async with serving(server, server.port, log_level="warning", lifespan="off"):
        yield server
