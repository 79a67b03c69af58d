"""The load-test scenarios. Each runs in one process over its share of the work (``part`` of
``parts``) and returns :class:`~loadtest.stats.Stats`; :mod:`loadtest.__main__` starts the
processes and merges their results. Every scenario is bounded in count and time.

Message texts carry what the receiver needs to measure: ``"<publisher>:<seq>:<send time>"``.
"""

from __future__ import annotations

import asyncio
import random
import resource
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import uvloop

from loadtest.client import Client, Closed, Frame, Refused, open_client, until
from loadtest.stats import Stats, bucket_of

CONNECT_CONCURRENCY = 200
PROBE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Plan:
    """What the whole run does; each process takes its part."""

    scenario: str
    url: str
    seconds: float
    parts: int = 1
    # fanout
    subscribers: int = 1000
    rooms: int = 1
    publishers: int = 1
    rate: float = 100.0  # fanout: messages/s into all rooms; rtt: sends/s (0: closed loop)
    sample_every: int = 1  # fanout: subscribers that check every delivery (the rest count)
    # rtt
    clients: int = 100
    # connections
    connections: int = 1000
    ramp_per_s: float = 1000.0
    room_size: int = 0  # each socket joins a room of this many (0: no rooms)
    source_addresses: int = 1  # connect from 127.0.0.1 .. 127.0.0.N
    # churn
    churn_per_s: float = 50.0
    # every run
    start_at: float = 0.0  # time.time() when the load starts, same for all parts
    warmup_s: float = 1.0  # latencies of the first second of load are not recorded
    grace_s: float = 5.0

    def measured(self, now: float) -> bool:
        return now >= self.start_at + self.warmup_s

    @property
    def probe_at(self) -> float:
        """connections: when the hold ends and every socket is probed (all parts at once),
        unless connecting took longer than the ramp."""
        return self.start_at + self.connections / self.ramp_per_s + self.seconds

    def share(self, total: int, part: int) -> range:
        """Indices 0..total-1 that process ``part`` handles."""
        return range(part, total, self.parts)


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class _Meter:
    """CPU and wall time of a measured phase."""

    def __init__(self) -> None:
        self.cpu = _cpu_s()
        self.wall = time.monotonic()

    def stop(self, stats: Stats) -> None:
        stats.cpu_s = _cpu_s() - self.cpu
        stats.wall_s = time.monotonic() - self.wall


def _record(plan: Plan, stats: Stats, counter: str, began: float, now: float) -> None:
    """One completed operation: counted, in the per-second series, and (after the warm-up)
    in the latency histogram."""
    ms = (now - began) * 1000
    bucket = bucket_of(ms)
    if plan.measured(began):
        stats.latency.add(ms, bucket)
    stats.series.add(int(now - plan.start_at), ms, bucket)
    stats.counters[counter] += 1
    stats.last_at = now


async def _close_all(clients: list[Client]) -> None:
    await asyncio.gather(*(client.close() for client in clients), return_exceptions=True)


async def _wait_start(plan: Plan) -> None:
    await asyncio.sleep(max(0.0, plan.start_at - time.time()))


async def _open_many(plan: Plan, names: list[str], stats: Stats) -> list[tuple[Client, Frame]]:
    """Open sockets for ``names``, ``CONNECT_CONCURRENCY`` at a time; failures are counted."""
    gate = asyncio.Semaphore(CONNECT_CONCURRENCY)

    async def one(name: str) -> tuple[Client, Frame] | None:
        async with gate:
            try:
                return await open_client(plan.url, name)
            except Exception as exc:
                stats.counters[f"failed:{_failure(exc)}"] += 1
                return None

    opened = await asyncio.gather(*(one(n) for n in names))
    return [o for o in opened if o is not None]


# -- fanout -------------------------------------------------------------------------------


async def fanout(plan: Plan, part: int) -> Stats:
    """Subscribers over rooms; publishers at a total rate; per-message delivery latency and
    missing / duplicated / out-of-order counts."""
    stats = Stats()
    subscribers = plan.share(plan.subscribers, part)
    opened = await _open_many(plan, [f"s{i}" for i in subscribers], stats)
    per_publisher = plan.rate / plan.publishers
    sent_per_publisher = int(per_publisher * plan.seconds)
    last_seq: dict[tuple[int, str], int] = {}
    # One byte per message a subscriber may get from a publisher: duplicates are told apart
    # from reordering without keeping a set of every message.
    got: dict[tuple[int, str], bytearray] = {}

    def on_frame(index: int) -> Any:
        def handle(frame: Frame, now: float) -> None:
            if frame["type"] != "message":
                stats.counters["other:" + str(frame.get("type"))] += 1
                return
            publisher, seq_text, sent = frame["text"].split(":")
            seq = int(seq_text)
            key = (index, publisher)
            marks = got.get(key)
            if marks is None:
                marks = got[key] = bytearray(sent_per_publisher + 1)
            if seq < len(marks):
                if marks[seq]:
                    stats.counters["duplicates"] += 1
                    return
                marks[seq] = 1
            if seq < last_seq.get(key, -1):
                stats.counters["out_of_order"] += 1
            else:
                last_seq[key] = seq
            _record(plan, stats, "delivered", float(sent), now)

        return handle

    for (ws, _), index in zip(opened, subscribers, strict=False):
        ws.send({"type": "join", "room": f"room{index % plan.rooms}"})
        await until(ws, "joined")
        stats.counters[f"subscribers:room{index % plan.rooms}"] += 1
    # Every ``sample_every``-th subscriber checks each delivery (latency, duplicates, order);
    # the others count theirs.
    counted = [ws for (ws, _), i in zip(opened, subscribers, strict=False) if i % plan.sample_every]
    for ws in counted:
        ws.count_messages()
    readers = [
        asyncio.create_task(ws.stream(on_frame(index)))
        for (ws, _), index in zip(opened, subscribers, strict=False)
        if not ws.counting
    ]
    publishers = []
    for p in plan.share(plan.publishers, part):
        ws, _ = await open_client(plan.url, f"p{p}")
        ws.send({"type": "join", "room": f"room{p % plan.rooms}"})
        await until(ws, "joined")
        publishers.append((p, ws))
    drains = [asyncio.create_task(ws.stream(lambda f, t: None)) for _, ws in publishers]
    await _wait_start(plan)
    meter = _Meter()

    async def publish(p: int, ws: Client) -> None:
        room = f"room{p % plan.rooms}"
        # Publishers are spread evenly over each interval, as independent users would be:
        # in step, 1,000 publishers would offer their messages in one burst a second.
        offset = p / plan.publishers
        for seq in range(sent_per_publisher):
            delay = plan.start_at + (seq + offset) / per_publisher - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            ws.send({"type": "send", "room": room, "text": f"p{p}:{seq}:{time.time()}"})
            stats.counters[f"published:{room}"] += 1

    await asyncio.gather(*(publish(p, ws) for p, ws in publishers))
    # Until every message this process's subscribers should get has come, or the grace ends.
    publishers_in = Counter(f"room{p % plan.rooms}" for p in range(plan.publishers))
    expected = sent_per_publisher * sum(
        publishers_in[f"room{i % plan.rooms}"] for _, i in zip(opened, subscribers, strict=False)
    )
    deadline = max(time.time(), plan.start_at + plan.seconds) + plan.grace_s

    def received() -> int:
        return stats.counters["delivered"] + sum(ws.messages_counted for ws in counted)

    while received() + stats.counters["duplicates"] < expected:
        if time.time() >= deadline:
            break
        await asyncio.sleep(0.05)
    meter.stop(stats)
    stats.counters["delivered"] = received()
    stats.counters["checked_subscribers"] = len(readers)
    stats.last_at = max([stats.last_at, *(ws.last_counted_at for ws in counted)])
    await _close_all([ws for ws, _ in opened] + [ws for _, ws in publishers])
    for task in [*readers, *drains]:
        task.cancel()
    return stats


# -- rtt ----------------------------------------------------------------------------------


async def rtt(plan: Plan, part: int) -> Stats:
    """Clients each in a room of their own send and wait for their own message: closed loop
    (``rate`` 0) or paced at ``rate`` sends/s over all clients."""
    stats = Stats()
    indices = list(plan.share(plan.clients, part))
    opened = await _open_many(plan, [f"c{i}" for i in indices], stats)
    for (ws, _), i in zip(opened, indices, strict=False):
        ws.send({"type": "join", "room": f"rtt{i}"})
        await until(ws, "joined")
    await _wait_start(plan)
    meter = _Meter()
    end = plan.start_at + plan.seconds
    interval = plan.clients / plan.rate if plan.rate > 0 else 0.0

    async def loop(ws: Client, i: int) -> None:
        room = f"rtt{i}"
        next_send = plan.start_at + random.random() * interval
        seq = 0
        while time.time() < end:
            if interval:
                delay = next_send - time.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                next_send += interval
            sent = time.time()
            ws.send({"type": "send", "room": room, "text": f"c{i}:{seq}:{sent}"})
            try:
                await until(ws, "message", timeout_s=10)
            except TimeoutError:
                stats.counters["timeouts"] += 1
                return
            except Refused as refused:
                stats.counters[f"failed:{refused.code}"] += 1
                return
            _record(plan, stats, "delivered", sent, time.time())
            seq += 1

    await asyncio.gather(*(loop(ws, i) for (ws, _), i in zip(opened, indices, strict=False)))
    meter.stop(stats)
    await _close_all([ws for ws, _ in opened])
    return stats


# -- connections --------------------------------------------------------------------------

# An upgrade a full worker closes with 1013 (try again later), or a join refused for now
# (which did not happen: docs/protocol.md), is tried again this many times, as clients do.
RETRIES = 5
T = TypeVar("T")


def _retryable(exc: Exception) -> bool:
    if isinstance(exc, Closed):
        return exc.code == 1013
    return isinstance(exc, Refused) and exc.code in ("broker_unavailable", "rate_limited")


async def _retried(attempt: Callable[[], Awaitable[T]], stats: Stats, counter: str) -> T:
    """``await attempt()``, again after a jittered pause while it fails in a way the server
    asks to retry (counted in ``counter``), at most :data:`RETRIES` times."""
    for _ in range(RETRIES):
        try:
            return await attempt()
        except (Closed, Refused) as exc:
            if not _retryable(exc):
                raise
        stats.counters[counter] += 1
        await asyncio.sleep(0.5 + random.random())
    return await attempt()


def source_address(plan: Plan, index: int) -> str | None:
    """The local address client ``index`` connects from: spread over 127.0.0.1 ..
    127.0.0.N (``source_addresses``): connecting slows down past ~14k sockets per address
    (loadtest/hold.py)."""
    if plan.source_addresses <= 1:
        return None
    return f"127.0.0.{1 + index % plan.source_addresses}"


def _failure(exc: BaseException) -> str:
    """How a failed operation is counted: the server's error code, or the exception's type."""
    if isinstance(exc, Refused):
        return exc.code
    if isinstance(exc, Closed):
        return f"closed {exc.code}"
    return type(exc).__name__


async def connections(plan: Plan, part: int) -> Stats:
    """Open sockets at a ramp rate (each joins its room of ``room_size`` when that is set),
    keep them (answering pings) for ``seconds``, then probe every socket still open: a
    ``ping`` that must be answered ``pong``, and a message from each room's first member that
    every member must receive. Connect times (TCP + upgrade + hello) are the latency."""
    stats = Stats()
    indices = list(plan.share(plan.connections, part))
    ramp = plan.ramp_per_s / plan.parts
    loop = asyncio.get_running_loop()
    held: dict[int, tuple[Client, asyncio.Task[int | None]]] = {}
    answered: set[int] = set()
    probed: set[int] = set()
    gate = asyncio.Semaphore(CONNECT_CONCURRENCY)
    meter = _Meter()

    def listener(n: int) -> Any:
        def on_frame(frame: Frame, now: float) -> None:
            kind = frame["type"]
            if kind == "pong":
                answered.add(n)
            elif kind == "message" and frame.get("text") == "probe":
                probed.add(n)

        return on_frame

    async def connect(i: int) -> Client:
        ws, _ = await open_client(plan.url, f"k{i}", source=source_address(plan, i))
        return ws

    async def join(ws: Client, room: str) -> None:
        ws.send({"type": "join", "room": room})
        await until(ws, "joined")

    def room_of(n: int) -> str:
        # A room's members are all in this process, so that it knows who should get a probe.
        return f"hold{part}-{n // plan.room_size}"

    async def one(n: int, i: int) -> None:
        delay = plan.start_at + n / ramp - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        async with gate:
            begin = loop.time()
            try:
                ws = await _retried(lambda: connect(i), stats, "retried_1013")
            except Exception as exc:
                stats.counters[f"failed:{_failure(exc)}"] += 1
                return
            if plan.room_size:
                try:
                    await _retried(lambda: join(ws, room_of(n)), stats, "retried_join")
                except Exception as exc:
                    stats.counters[f"failed:join {_failure(exc)}"] += 1
                    ws.abort()
                    return
            now = time.time()
            ms = (loop.time() - begin) * 1000
            stats.latency.add(ms)
            stats.series.add(int(now - plan.start_at), ms)
            stats.counters["connected"] += 1
            stats.last_at = now
            held[n] = (ws, asyncio.create_task(ws.stream(listener(n))))

    await asyncio.gather(*(one(n, i) for n, i in enumerate(indices)))
    # Every socket is held ``seconds`` at least, also when connecting took longer than planned.
    await asyncio.sleep(max(plan.probe_at, time.time() + plan.seconds) - time.time())
    alive = {i: ws for i, (ws, task) in held.items() if not task.done()}
    stats.counters["alive"] = len(alive)
    for _, task in held.values():
        if task.done():
            stats.counters[f"closed:{task.result()}"] += 1
    senders: dict[str, Client] = {}
    for n, ws in sorted(alive.items()):
        ws.send({"type": "ping"})
        if plan.room_size:
            senders.setdefault(room_of(n), ws)  # each room's first member still there
    for room, ws in senders.items():
        ws.send({"type": "send", "room": room, "text": "probe"})
    deadline = time.time() + PROBE_TIMEOUT_S
    while time.time() < deadline and (
        len(answered) < len(alive) or (plan.room_size and len(probed) < len(alive))
    ):
        await asyncio.sleep(0.1)
    stats.counters["probe_answered"] = len(answered)
    if plan.room_size:
        stats.counters["probe_received"] = len(probed)
    meter.stop(stats)
    await _close_all([ws for ws, _ in held.values()])
    for _, task in held.values():
        task.cancel()
    return stats


# -- churn --------------------------------------------------------------------------------


async def churn(plan: Plan, part: int) -> Stats:
    """Connect, join, leave, disconnect, at ``churn_per_s`` cycles/s; cycle time as latency."""
    stats = Stats()
    rate = plan.churn_per_s / plan.parts
    total = int(rate * plan.seconds)
    gate = asyncio.Semaphore(CONNECT_CONCURRENCY)
    await _wait_start(plan)
    meter = _Meter()

    async def cycle(n: int) -> None:
        delay = plan.start_at + n / rate - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        async with gate:
            begin = time.time()
            try:
                ws, _ = await open_client(plan.url, f"churn{part}x{n}")
                room = f"churn{n % 50}"
                ws.send({"type": "join", "room": room})
                await until(ws, "joined")
                ws.send({"type": "leave", "room": room})
                await until(ws, "left")
                await ws.close()
            except Exception as exc:
                stats.counters[f"failed:{_failure(exc)}"] += 1
                return
            _record(plan, stats, "cycles", begin, time.time())

    await asyncio.gather(*(cycle(n) for n in range(total)))
    meter.stop(stats)
    return stats


SCENARIOS = {"fanout": fanout, "rtt": rtt, "connections": connections, "churn": churn}


def run_part(plan: Plan, part: int) -> Stats:
    """Process ``part``'s share of ``plan`` (on uvloop); the entry point of each process."""
    return uvloop.run(SCENARIOS[plan.scenario](plan, part))
