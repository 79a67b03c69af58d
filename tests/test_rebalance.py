"""Rebalancing (app.sockets.rebalance): the decision, and a worker shedding through a real
census in Redis. The end-to-end run (two servers behind nginx, 2,000 connections) is in
tests/test_rebalance_e2e.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import resource
import time
from typing import Any

import pytest
import websockets
from redis.asyncio import Redis

from app.broker.redis import RedisBroker
from app.errors import CloseCode
from app.ops.metrics import Metrics
from app.sockets.rebalance import SHED_REASON, Rebalancer, WorkerLoad, excess_connections
from tests.helpers import ChatClient, make_settings, send_until_acked, wait_until
from tests.processes import AppProcess, NginxServer, RedisServer
from tests.test_broker_contract import Recorder

pytestmark = pytest.mark.timeout(60)


def load(worker: str, connections: int, ready: bool = True, draining: bool = False) -> WorkerLoad:
    return WorkerLoad(worker, connections, ready, draining, 0)


def test_a_worker_over_the_average_sheds_down_to_it() -> None:
    old, new = load("old", 2000), load("new", 0)
    assert excess_connections(old, [old, new], margin=0.25, min_excess=100) == 1000
    assert excess_connections(new, [old, new], margin=0.25, min_excess=100) == 0


def test_within_the_margin_or_the_minimum_nothing_is_shed() -> None:
    a, b = load("a", 1200), load("b", 800)  # 1,200 against an average of 1,000: 20 %
    assert excess_connections(a, [a, b], margin=0.25, min_excess=100) == 0
    assert excess_connections(a, [a, b], margin=0.1, min_excess=100) == 200
    small, empty = load("s", 150), load("e", 0)  # 75 over the average of 75: under 100
    assert excess_connections(small, [small, empty], margin=0.25, min_excess=100) == 0


def test_once_shedding_a_worker_goes_on_down_to_the_average() -> None:
    a, b = load("a", 1200), load("b", 800)  # within the margin: it would not start
    assert excess_connections(a, [a, b], 0.25, 100, shedding=True) == 200
    near = load("near", 1040)  # within half the minimum: done
    assert excess_connections(near, [near, load("b", 960)], 0.25, 100, shedding=True) == 0


def test_nobody_sheds_during_a_drain_or_while_a_worker_is_not_ready() -> None:
    old = load("old", 2000)
    assert excess_connections(old, [old, load("new", 0, draining=True)], 0.25, 100) == 0
    assert excess_connections(old, [old, load("new", 0, ready=False)], 0.25, 100) == 0
    alone = load("alone", 5000)
    assert excess_connections(alone, [alone], 0.25, 100) == 0


def test_a_census_record_round_trips_and_garbage_is_ignored() -> None:
    record = WorkerLoad("w", 12, True, False, 1_700_000_000_000, "pod-1", 42)
    assert WorkerLoad.decode("w", record.encode()) == record
    assert WorkerLoad.decode("w", b"not json") is None
    assert WorkerLoad.decode("w", b'{"connections": "many"}') is None


class _Conn:
    """What the shedding touches of a connection: close(), which takes it out of its hub and,
    as a client reconnecting through a least-connections balancer would, opens one on the
    other hub (the hubs' members are real connections elsewhere; here only who was closed,
    how, and where they went matter)."""

    def __init__(self, hub: _Hub) -> None:
        self.hub = hub
        self.closed: tuple[int, str] | None = None

    def close(self, code: int, reason: str) -> None:
        self.closed = (code, reason)
        self.hub.connections.discard(self)
        if self.hub.elsewhere is not None:
            self.hub.elsewhere.open()


class _Hub:
    def __init__(self, connections: int) -> None:
        self.all: list[_Conn] = []
        self.connections: set[_Conn] = set()
        self.draining = False
        self.elsewhere: _Hub | None = None
        for _ in range(connections):
            self.open()

    def open(self) -> None:
        conn = _Conn(self)
        self.all.append(conn)
        self.connections.add(conn)

    def closed(self) -> list[tuple[int, str]]:
        return [conn.closed for conn in self.all if conn.closed is not None]


async def test_the_loaded_worker_sheds_its_excess_paced_and_the_empty_one_nothing(
    redis_server: RedisServer,
) -> None:
    """Two workers on one Redis: 400 connections on one, none on the other (each closed one
    reconnects there). The loaded one closes 200 (down to the average of 200) with 1012 and
    the rebalancing reason, at most 100 a round (200/s over rounds of 0.5 s) with a round to
    settle after each, then stops; the other closes nothing; the metrics say so."""
    settings = make_settings(
        redis_url=redis_server.url, rebalance_interval_s=0.5, rebalance_shed_per_s=200,
        rebalance_min_excess=50,
    )  # fmt: skip
    brokers = [RedisBroker(settings), RedisBroker(settings)]
    hubs = [_Hub(400), _Hub(0)]
    hubs[0].elsewhere = hubs[1]
    metrics = [Metrics(), Metrics()]
    for broker in brokers:
        await broker.start(Recorder())
    tasks: list[asyncio.Task[None]] = []
    try:
        await wait_until(lambda: all(b.ready for b in brokers))
        started = time.monotonic()
        for broker, hub, metric in zip(brokers, hubs, metrics, strict=True):
            rebalancer = Rebalancer(hub, broker, settings, metric)  # type: ignore[arg-type]
            tasks.append(asyncio.create_task(rebalancer.run()))
        await wait_until(lambda: len(hubs[0].closed()) >= 200, timeout=10)
        assert time.monotonic() - started >= 1.0  # shed, settle, shed: three rounds at least
        await asyncio.sleep(1.5)  # three more rounds: balanced now, nothing more
        assert len(hubs[0].closed()) == 200
        assert set(hubs[0].closed()) == {(CloseCode.SERVICE_RESTART, SHED_REASON)}
        assert hubs[1].closed() == []
        sample = metrics[0].registry.get_sample_value
        assert sample("hubbub_rebalance_shed_total") == 200
        assert sample("hubbub_rebalance_average_connections") == 200
        assert len(hubs[0].connections) == len(hubs[1].connections) == 200
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for broker in brokers:
            await broker.stop()


class _Holder:
    """A client that holds a connection and, closed with 1012, reconnects through the load
    balancer after a jittered pause (as the SDKs do). In ``room`` (when given) it reads the
    messages, rejoining with ``since`` after a reconnect, and records their ids."""

    def __init__(self, name: str, first_url: str, balancer_url: str, room: str | None) -> None:
        self.name = name
        self.urls = (first_url, balancer_url)
        self.room = room
        self.ids: list[int] = []
        self.position: int | None = None  # the room's newest id it knows of
        self.recovered: list[bool] = []
        self.reconnects = 0
        self.joined = asyncio.Event()

    async def run(self) -> None:
        url = self.urls[0]
        while True:
            try:
                async with websockets.connect(f"{url}?name={self.name}", open_timeout=10) as ws:
                    await self._serve(ws)
            except websockets.ConnectionClosed as closed:
                assert closed.rcvd is not None and closed.rcvd.code == 1012, closed
            url = self.urls[1]
            self.reconnects += 1
            await asyncio.sleep(random.uniform(0, 0.5))

    async def _serve(self, ws: websockets.ClientConnection) -> None:
        if self.room is not None:
            join: dict[str, object] = {"type": "join", "room": self.room}
            if self.position is not None:
                join["since"] = self.position
            await ws.send(json.dumps(join))
        async for data in ws:
            for line in str(data).splitlines():  # frames may come several to a message
                await self._take(ws, json.loads(line))

    async def _take(self, ws: websockets.ClientConnection, frame: dict[str, Any]) -> None:
        if frame["type"] == "ping":
            await ws.send('{"type":"pong"}')
        elif frame["type"] == "joined":
            if "recovered" in frame:
                self.recovered.append(frame["recovered"])
            else:  # the first join: every message after "last" reaches it
                self.position = frame["last"]
            self.joined.set()
        elif frame["type"] == "message" and frame.get("room") == self.room:
            self.ids.append(frame["id"])
            self.position = frame["id"]


async def _census(redis: RedisServer) -> list[int]:
    async with Redis(port=redis.port) as client:
        records = await client.hgetall("hubbub:workers")
    return sorted(json.loads(record)["connections"] for record in records.values())


@pytest.mark.timeout(240)
async def test_after_a_scale_out_the_connections_even_out_and_no_message_is_lost(
    redis_server: RedisServer,
) -> None:
    """2,000 connections on one server; a second one joins behind nginx (least_conn, the
    repository's nginx.conf). Within a minute each holds about half (the census in Redis
    says so), the shed clients having reconnected through nginx; ten of them read a room
    throughout while messages are sent in it, and each got every acked message exactly once,
    in order, recovering with ``since`` after being moved."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 16384)), hard))
    env = {
        "CHAT_REDIS_URL": redis_server.url, "CHAT_REBALANCE_INTERVAL_S": "1",
        "CHAT_REBALANCE_SHED_PER_S": "300",
    }  # fmt: skip
    first, second = AppProcess(env, descriptor_limit=8192), AppProcess(env, descriptor_limit=8192)
    nginx = NginxServer(
        f"127.0.0.1:{first.port} max_fails=3 fail_timeout=10s; server 127.0.0.1:{second.port}"
    )
    holders: list[_Holder] = []
    tasks: list[asyncio.Task[None]] = []
    try:
        await first.start()
        direct = f"ws://127.0.0.1:{first.port}/ws"
        balanced = f"ws://127.0.0.1:{nginx.port}/ws"
        for n in range(2000):
            holder = _Holder(f"h{n}", direct, balanced, "r" if n < 10 else None)
            holders.append(holder)
            tasks.append(asyncio.create_task(holder.run()))
            if n % 100 == 99:
                await asyncio.sleep(0.05)  # not all 2,000 handshakes in one go
        readers = holders[:10]
        await wait_until(lambda: all(r.joined.is_set() for r in readers), timeout=60)
        async with asyncio.timeout(60):
            while await _census(redis_server) != [2000]:
                await asyncio.sleep(0.2)
        await second.start()
        await nginx.start()
        acks: dict[str, int] = {}
        sending = asyncio.create_task(_send_all(balanced, acks, stop_after=60))
        async with asyncio.timeout(90):
            while True:
                counts = await _census(redis_server)
                if len(counts) == 2 and sum(counts) == 2000 and counts[0] >= 850:
                    break
                await asyncio.sleep(0.2)
        sending.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sending
        failed = [task.exception() for task in tasks if task.done()]
        assert not failed, failed[:3]  # every client held on, or was moved with 1012
        assert sum(h.reconnects > 0 for h in holders) >= 850, "the clients moved"
        # Every acked message reached every reader once, in order, moved or not.
        expected = sorted(acks.values())
        assert len(expected) >= 20
        await wait_until(lambda: all(r.ids[-1:] >= expected[-1:] for r in readers), timeout=10)
        for reader in readers:
            mine = [i for i in reader.ids if expected[0] <= i <= expected[-1]]
            assert mine == sorted(set(mine)), reader.name  # in order, no duplicate
            assert set(expected) <= set(mine), (reader.name, set(expected) - set(mine))
            assert all(reader.recovered), reader.name  # every rejoin with since recovered
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await nginx.stop()
        await second.stop()
        await first.stop()


async def _send_all(url: str, acks: dict[str, int], stop_after: float) -> None:
    """Send a message a tenth of a second in room "r" (through nginx) until cancelled,
    each until acked (again after an error or a reconnect: its cid makes a retry safe)."""
    deadline = time.monotonic() + stop_after
    n = 0
    while time.monotonic() < deadline:
        try:
            async with ChatClient.connect(f"{url}?name=sender") as sender:
                await sender.join("r")
                while time.monotonic() < deadline:
                    await send_until_acked(sender, "r", f"m{n}", acks)
                    n += 1
                    await asyncio.sleep(0.1)
        except websockets.ConnectionClosed:
            await asyncio.sleep(random.uniform(0, 0.5))
