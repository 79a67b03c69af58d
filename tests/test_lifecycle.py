"""Heartbeats, cleanup after disconnects, shutdown: what happens to connections over time."""

from __future__ import annotations

import asyncio
import contextlib
import gc

from websockets.asyncio.client import connect

from app.errors import CloseCode
from app.hub import Hub
from tests.helpers import ChatClient, make_settings, run_server, wait_until

HEARTBEAT = {"heartbeat_interval_s": 0.6, "heartbeat_timeout_s": 0.3}


async def test_silent_client_closed_for_heartbeat_timeout() -> None:
    """A client that never answers the server's pings is closed with 4009."""
    async with run_server(make_settings(**HEARTBEAT)) as live:
        async with ChatClient.connect(live.ws_url("silent")) as silent:
            ping = await silent.next_frame(timeout=2, skip=())
            assert ping == {"type": "ping"}
            assert await silent.closed_with(timeout=3) == CloseCode.HEARTBEAT_TIMEOUT
            assert silent.ws.close_reason == "heartbeat timeout"
        await wait_until(lambda: not live.state.hub.connections)


async def test_client_answering_pings_stays() -> None:
    """A client that answers every ping with a pong stays connected across many intervals."""
    async with run_server(make_settings(**HEARTBEAT)) as live:
        async with ChatClient.connect(live.ws_url("alive")) as alive:
            for _ in range(5):  # five full intervals, i.e. five ping/pong rounds
                assert await alive.next_frame(timeout=2, skip=()) == {"type": "ping"}
                await alive.send({"type": "pong"})
            assert await alive.is_responsive()
            assert alive.ws.close_code is None


async def test_protocol_ping_is_answered() -> None:
    """WebSocket protocol pings get protocol pongs (clients that use them keep working)."""
    async with run_server(make_settings()) as live:
        async with ChatClient.connect(live.ws_url("p")) as client:
            pong_waiter = await client.ws.ping(b"are you there")
            async with asyncio.timeout(2):
                await pong_waiter


def _pending_tasks() -> set[asyncio.Task[object]]:
    return {t for t in asyncio.all_tasks() if not t.done()}


async def test_connect_disconnect_cycles_leave_nothing_behind() -> None:
    """1,000 connect/join/send/disconnect cycles leave no connection, room, outbox or task."""
    async with run_server(make_settings()) as live:
        hub: Hub = live.state.hub
        async with ChatClient.connect(live.ws_url("warmup")) as warm:
            await warm.join("warm")
        await wait_until(lambda: not hub.connections)
        baseline = len(_pending_tasks())

        async def cycle(n: int) -> None:
            async with ChatClient.connect(live.ws_url(f"u{n}")) as client:
                await client.join(f"room{n % 7}")
                if n % 3 == 0:
                    await client.say(f"room{n % 7}", "bye")
                if n % 5 == 0:
                    await client.send({"type": "not-a-frame"})

        for start in range(0, 1000, 50):
            await asyncio.gather(*(cycle(n) for n in range(start, start + 50)))
        await wait_until(lambda: not hub.connections and hub.room_count == 0)
        # Only the server's own long-lived tasks remain: no writer, closer or session task.
        await wait_until(lambda: len(_pending_tasks()) <= baseline)
        gc.collect()
        from app.connection import Connection

        assert not [o for o in gc.get_objects() if isinstance(o, Connection)]


async def test_shutdown_closes_sockets_with_1012() -> None:
    """Stopping the server closes every socket with 1012 (reconnect elsewhere)."""
    ready = asyncio.Event()
    codes: list[int] = []

    async def hold(url: str) -> None:
        async with connect(url) as ws:
            ready.set()
            with contextlib.suppress(Exception):
                await ws.wait_closed()
            assert ws.close_code is not None
            codes.append(ws.close_code)

    async with run_server(make_settings()) as live:
        holder = asyncio.create_task(hold(live.ws_url("h")))
        async with asyncio.timeout(5):
            await ready.wait()
    async with asyncio.timeout(5):
        await holder
    assert codes == [CloseCode.SERVICE_RESTART]
