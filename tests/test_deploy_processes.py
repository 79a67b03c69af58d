"""The service as ops run it: gunicorn with deploy/gunicorn.conf.py, and drain on SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

import httpx2 as httpx
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from app.errors import CloseCode
from tests.helpers import ChatClient
from tests.processes import AppProcess, RedisServer
from tests.prom import scrape_until


async def test_gunicorn_two_workers_fan_out(redis_server: RedisServer) -> None:
    """Gunicorn with 2 workers on one Redis: a message sent through one worker reaches sockets
    on the other, in the same order for everyone."""
    app = AppProcess({"CHAT_REDIS_URL": redis_server.url}, gunicorn_workers=2)
    await app.start()
    try:
        async with contextlib.AsyncExitStack() as stack:
            by_node: dict[str, ChatClient] = {}
            opened = 0
            # An idle worker wins every accept, so open connections in concurrent bursts until
            # both workers hold one (both may still be booting at first).
            async with asyncio.timeout(20):
                while len(by_node) < 2:
                    burst = [ChatClient.connect(app.ws_url(f"u{n}")) for n in range(20)]
                    clients = await asyncio.gather(*map(stack.enter_async_context, burst))
                    opened += len(clients)
                    for client in clients:
                        by_node.setdefault(client.hello["node"], client)
                    await asyncio.sleep(0.2)
            assert len(by_node) == 2, "every connection landed on one worker"
            first, second = by_node.values()
            await first.join("g")
            await second.join("g")
            for k in range(10):
                await (first if k % 2 else second).say("g", str(k))
            seen = [await client.messages(10) for client in (first, second)]
            assert [m["id"] for m in seen[0]] == [m["id"] for m in seen[1]]
            assert sorted(int(m["text"]) for m in seen[0]) == list(range(10))
            # The metrics on the main port (the default) add both workers up.
            await scrape_until(
                f"{app.http_url}/metrics", lambda s: s.value("hubbub_connections") == opened
            )
    finally:
        await app.stop()


async def test_gunicorn_refuses_two_workers_with_memory_broker() -> None:
    """Several workers without a shared Redis refuse to start, saying how to give them one."""
    app = AppProcess({"CHAT_REDIS_URL": ""}, gunicorn_workers=2)
    await app.start(wait_ready=False)
    try:
        code = await app.wait(timeout=30)
        assert code != 0
        for setting in ("CHAT_REDIS_URL", "CHAT_REDIS_SENTINELS", "CHAT_REDIS_CLUSTER_NODES"):
            assert setting in app.output()
    finally:
        await app.stop()


async def test_drain_spreads_closes_and_clients_recover_elsewhere(
    redis_server: RedisServer,
) -> None:
    """SIGTERM on an instance with N clients: readiness fails at once, the clients are closed
    with 1012 spread over the drain window, each reconnects to the other instance and recovers
    with `since`: no message is missed or duplicated."""
    env = {
        "CHAT_REDIS_URL": redis_server.url,
        "CHAT_DRAIN_WINDOW_S": "2",
        "CHAT_RATE_LIMIT_FRAMES_PER_S": "1000",  # the publisher sends 100/s
    }
    doomed, survivor = AppProcess(env), AppProcess(env)
    await asyncio.gather(doomed.start(), survivor.start())
    clients = 12
    closes: list[float] = []
    try:
        async with ChatClient.connect(survivor.ws_url("pub")) as pub:
            await pub.join("d")
            stop = asyncio.Event()

            async def member(n: int) -> list[int]:
                """Reads the room on `doomed`; on 1012 rejoins on `survivor` with since."""
                got: list[int] = []
                last_id = 0
                async with ChatClient.connect(doomed.ws_url(f"m{n}")) as client:
                    await client.join("d")
                    try:
                        while True:
                            frame = await client.expect("message", timeout=10)
                            got.append(int(frame["text"]))
                            last_id = frame["id"]
                    except ConnectionClosed:
                        assert client.ws.close_code == CloseCode.SERVICE_RESTART
                        closes.append(time.monotonic())
                async with ChatClient.connect(survivor.ws_url(f"m{n}")) as again:
                    await again.send({"type": "join", "room": "d", "since": last_id})
                    assert (await again.expect("joined"))["recovered"] is True
                    for frame in await again.messages_until("end", timeout=30):
                        if frame["text"] != "end":
                            got.append(int(frame["text"]))
                return got

            members = [asyncio.create_task(member(n)) for n in range(clients)]
            await asyncio.sleep(0.5)
            sent = 0

            async def publish() -> None:
                nonlocal sent
                while not stop.is_set():
                    await pub.say("d", str(sent))
                    sent += 1
                    await asyncio.sleep(0.01)

            publisher = asyncio.create_task(publish())
            await asyncio.sleep(0.3)
            signalled = time.monotonic()
            doomed.signal(signal.SIGTERM)
            async with asyncio.timeout(1):
                while await doomed.readyz() != 503:
                    await asyncio.sleep(0.02)
            assert time.monotonic() - signalled < 1.0
            assert await doomed.wait(timeout=20) in (0, -signal.SIGTERM)
            await asyncio.sleep(0.3)
            stop.set()
            await publisher
            await pub.say("d", "end")
            results = await asyncio.gather(*members)
        assert len(closes) == clients
        assert max(closes) - min(closes) >= 1.0, "closes were not spread over the window"
        for got in results:
            assert got == list(range(got[0], sent)), "gap or duplicate"
    finally:
        await doomed.stop()
        await survivor.stop()


async def test_history_over_http(redis_server: RedisServer) -> None:
    """GET /rooms/{room}/messages pages history backwards, oldest first within a page."""
    app = AppProcess({"CHAT_REDIS_URL": redis_server.url})
    await app.start()
    try:
        async with ChatClient.connect(app.ws_url("h")) as client:
            await client.join("hist")
            for k in range(7):
                await client.say("hist", f"m{k}")
            await client.messages_until("m6")
        async with httpx.AsyncClient(base_url=app.http_url) as http:
            page = (await http.get("/rooms/hist/messages", params={"limit": 3})).json()
            assert page["room"] == "hist"
            assert [m["text"] for m in page["messages"]] == ["m4", "m5", "m6"]
            before = page["messages"][0]["id"]
            older = (await http.get(f"/rooms/hist/messages?before={before}&limit=10")).json()
            assert [m["text"] for m in older["messages"]] == ["m0", "m1", "m2", "m3"]
            assert (await http.get("/rooms/bad%20room/messages")).status_code == 422
            assert (await http.get("/rooms/hist/messages?limit=0")).status_code == 422
    finally:
        await app.stop()


async def test_drain_refuses_new_connections(redis_server: RedisServer) -> None:
    """During the drain window new upgrades are closed with 1012 (reconnect elsewhere)."""
    app = AppProcess({"CHAT_REDIS_URL": redis_server.url, "CHAT_DRAIN_WINDOW_S": "3"})
    await app.start()
    try:
        async with contextlib.AsyncExitStack() as holders:
            # Ten holders: their closes are paced over the 3 s window (one would be closed at
            # once, and the process could exit before the checks below).
            for i in range(10):
                await holders.enter_async_context(ChatClient.connect(app.ws_url(f"holder{i}")))
            app.signal(signal.SIGTERM)
            await app.wait_status(503, timeout=2)
            async with connect(app.ws_url("late")) as late:
                assert await ChatClient(late).closed_with() == CloseCode.SERVICE_RESTART
    finally:
        await app.stop()


async def test_workers_stop_when_the_master_dies(redis_server: RedisServer) -> None:
    """A SIGKILLed gunicorn master (OOM killer) must not leave workers serving forever: each
    notices at its next heartbeat (half of gunicorn's timeout, 2 s here) and shuts down."""
    app = AppProcess(
        {"CHAT_REDIS_URL": redis_server.url, "GUNICORN_CMD_ARGS": "--timeout 4"},
        gunicorn_workers=2,
    )
    await app.start()
    try:
        async with ChatClient.connect(app.ws_url("orphan")) as client:
            worker = int(client.hello["node"].rsplit(":", 1)[1])
            assert app.proc is not None
            os.kill(app.proc.pid, signal.SIGKILL)  # the master only
            assert await client.closed_with(timeout=15) == CloseCode.SERVICE_RESTART
        async with asyncio.timeout(10):
            while _state(worker) not in ("gone",) and "zombie" not in _state(worker):
                await asyncio.sleep(0.1)
    finally:
        await app.stop()


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/status") as status:
            return next(line for line in status if line.startswith("State:")).lower()
    except (OSError, StopIteration):
        return "gone"
