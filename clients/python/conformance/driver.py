"""The Python SDK's conformance driver: ``tests/test_conformance.py`` runs the same scenarios
against every SDK through a driver like this one (the TypeScript one is
``clients/js/conformance/driver.mjs``; the protocol is described there). One JSON command a
line on stdin; on stdout, each command's answer (``{"seq", "result"}`` or ``{"seq",
"error": {"code", "message"}}``) and every event of every client (``{"client", "event",
"detail"}``: the server's frame as it came, or the client's own event's fields).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from hubbub_client import HubbubClient, HubbubError
from hubbub_client.events import Event, StateChange

clients: dict[str, HubbubClient] = {}
last_close: dict[str, int | None] = {}


def out(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def detail_of(event: Event) -> dict[str, Any]:
    """The event as the TypeScript SDK's driver says it: the frame, else the fields set."""
    if event.raw:
        return dict(event.raw)
    fields = {f.name: getattr(event, f.name) for f in dataclasses.fields(event) if f.name != "raw"}
    return {name: value for name, value in fields.items() if value is not None}


async def forward(name: str, client: HubbubClient) -> None:
    async for event in client.events():
        out({"client": name, "event": event.kind, "detail": detail_of(event)})


async def connect(name: str, command: dict[str, Any]) -> dict[str, Any]:
    tokens: list[str] = command.get("tokens") or []
    asked = 0

    def get_token() -> str:
        nonlocal asked
        token = tokens[min(asked, len(tokens) - 1)]
        asked += 1
        return token

    options = {
        key: value for key, value in (command.get("options") or {}).items() if key.endswith("_s")
    }
    client = HubbubClient(
        command["url"], name=command.get("name"), get_token=get_token if tokens else None, **options
    )
    clients[name] = client

    def closed_with(change: StateChange) -> None:
        last_close[name] = change.code

    client.on(StateChange, closed_with)
    asyncio.get_running_loop().create_task(forward(name, client))
    client.connect()
    try:
        hello = await client.wait_open()
    except Exception as exc:
        raise HubbubError(f"close_{last_close.get(name)}", str(exc)) from exc
    return {"user": hello.user}


async def run(command: dict[str, Any]) -> Any:
    op, name = command["op"], command["client"]
    if op == "connect":
        return await connect(name, command)
    if op == "exit":
        for client in clients.values():
            await client.close()
        asyncio.get_running_loop().call_later(0.01, sys.exit, 0)
        return None
    client, c = clients[name], command
    if op == "leave":
        client.leave(c["room"])
        return None
    if op == "typing":
        client.typing(c["room"])
        return None
    if op == "mark_read":
        client.read(c["room"], c["id"])
        return None
    if op == "state":
        return client.state
    if op == "close":
        await client.close()
        return None
    ops: dict[str, Callable[[], Awaitable[Any]]] = {
        "join": lambda: _raw(client.join(c["room"])),
        "send": lambda: _ack(client.send(c["room"], c["text"], cid=c.get("cid"))),
        "send_to": lambda: _ack(client.send_to(c["user"], c["text"], cid=c.get("cid"))),
        "edit": lambda: _ack(client.edit(c["room"], c["id"], c["text"])),
        "react": lambda: _ack(client.react(c["room"], c["id"], c["emoji"])),
        "delete": lambda: _ack(client.delete(c["room"], c["id"])),
        "history": lambda: _raws(client.history(c["room"])),
        "direct_history": lambda: _page(client.direct_history(c["user"])),
        "create_room": lambda: _raw(client.create_room(c["room"], private=c.get("private", False))),
        "invite": lambda: _raw(client.invite(c["room"], c["user"])),
    }
    if op not in ops:
        raise HubbubError("unknown_op", op)
    return await ops[op]()


async def _raw(awaitable: Awaitable[Any]) -> Any:
    return dict((await awaitable).raw)


async def _raws(awaitable: Awaitable[Any]) -> Any:
    return [dict(item.raw) for item in await awaitable]


async def _page(awaitable: Awaitable[Any]) -> Any:
    return [dict(item.raw) for item in (await awaitable).messages]


async def _ack(awaitable: Awaitable[Any]) -> Any:
    ack = await awaitable
    return {"cid": ack.cid, "id": ack.id, "duplicate": ack.duplicate}


async def answer(command: dict[str, Any]) -> None:
    try:
        out({"seq": command["seq"], "result": await run(command)})
    except Exception as exc:
        code = getattr(exc, "code", None) or type(exc).__name__
        out({"seq": command["seq"], "error": {"code": str(code), "message": str(exc)}})


async def main() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    tasks: set[asyncio.Task[None]] = set()
    while line := await reader.readline():
        if line.strip():
            task = loop.create_task(answer(json.loads(line)))
            tasks.add(task)
            task.add_done_callback(tasks.discard)


if __name__ == "__main__":
    asyncio.run(main())
