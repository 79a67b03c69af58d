"""A moderation endpoint for ``make bench-moderation`` (``loadtest.moderation_cost``): it
checks each request's signature, as an operator's must, and accepts every message. Run with
``uvicorn loadtest.moderation_endpoint:app``; the key is ``HOOK_SECRET``."""

from __future__ import annotations

import os
import time

import orjson
from starlette.types import Receive, Scope, Send

from app.webhooks.signing import BadSignature, verify

_SECRET = os.environ.get("HOOK_SECRET", "").encode()


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
    try:
        verify(_SECRET, headers, body, time.time())
    except BadSignature:
        await send({"type": "http.response.start", "status": 401, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    items = orjson.loads(body)["messages"]
    answer = orjson.dumps({"results": [{"id": i["id"], "action": "accept"} for i in items]})
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})  # fmt: skip
    await send({"type": "http.response.body", "body": answer})
