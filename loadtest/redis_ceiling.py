"""``python -m loadtest.redis_ceiling``: how many messages a second one Redis core carries.

The workers of a deployment share one Redis; past a few workers its one core is the ceiling
(issue 34: "one Redis core carries ≥ 80,000 msg/s in rooms of 10 before it saturates"). On a
machine with few cores the workers cannot drive Redis that hard: each message costs a worker
several times what it costs Redis. So this measures Redis alone, on the very commands the
target sends it, in two steps:

1. **Record.** The target (Hubbub's :class:`~app.broker.redis.RedisBroker`, or Centrifugo
   nodes, as :mod:`loadtest.redis_cost` runs them) publishes ``--messages`` messages over
   ``--rooms`` rooms through a recording proxy in front of a first ``redis-server``, with
   ``--workers`` listeners, each a worker or node subscribed to the rooms its clients are in
   when each room's ``--room-size`` members land on workers at random (:func:`placement`).
   Hubbub's sends come ``together`` per loop pass, each with a client message id
   (deduplication) and its sender's quota; Centrifugo's publisher keeps ``together``
   publishes in flight. Everything each connection sent is kept.
2. **Replay.** A fresh ``redis-server`` pinned to ``--redis-core`` gets the recorded script
   calls that publish (the script called most often; each ``FUNCTION LOAD`` / ``SCRIPT LOAD``
   first), as they were grouped in the recorded writes, from ``--connections`` connections
   of this process (pinned to ``--generator-core``) with ``--depth`` writes in flight each,
   as fast as Redis answers (``per_write`` recorded writes as one: a client that pipelines
   its calls at saturation, as Centrifugo's does, sends many in one write). As many
   subscribers as each recorded channel had read everything Redis pushes them. Between a
   tenth and nine tenths of the replay, Redis' CPU time (``/proc``), the messages answered
   and the wall time give: messages a second carried, Redis' busy share, Redis' CPU per
   message, and the ceiling (a second of Redis' CPU over its CPU per message: what one core
   carries when busy all the time).

A replayed call is the recorded call: the same keys, arguments and batching, with nothing
that was refused (every Hubbub message's outcome is checked to be "published", not a
duplicate nor over its quota). What it leaves out: whatever else a deployment asks Redis
(joins, presence, heartbeats), and how the batching grows with the load (``together`` sets
it). ``--cases`` lists ``target:together:per_write``; each case replays on a fresh server,
the cases in turn, ``--rounds`` times. ``--callgrind`` counts Redis' instructions a message
under callgrind instead of its time.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import hiredis
import uvloop
from redis.asyncio import Redis

from app.broker import Published
from app.broker.redis import RedisBroker
from app.settings import Settings
from loadtest.centrifugo import available as centrifugo_available
from loadtest.redis_bench import versions
from loadtest.redis_cost import (
    Counter,
    callgrind,
    centrifugo_publishing,
    cpu_s,
    per_message,
    valgrind,
)
from tests.processes import RedisServer

TEXT = "x" * 40
Command = list[bytes]
_LOADS = {b"FUNCTION", b"SCRIPT"}
_CALLS = {b"FCALL", b"EVALSHA", b"EVAL"}
# How Redis starts a pub/sub message push: "*3 $7 message" and sharded "*3 $8 smessage".
_PUSHES = (b"$7\r\nmessage\r\n", b"$8\r\nsmessage\r\n")
_CONFIRMS = (b"$9\r\nsubscribe\r\n", b"$10\r\nssubscribe\r\n")


class Recorder:
    """A TCP proxy on loopback in front of ``upstream``'s port that keeps, per connection
    made through it, the chunks the client sent, in order."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.sent: list[list[bytes]] = []
        self._server: asyncio.Server | None = None
        self._pumps: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        """Start listening; -> the Redis URL to give the target."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"redis://127.0.0.1:{port}/0"

    async def _serve(
        self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter
    ) -> None:
        server_in, server_out = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        kept: list[bytes] = []
        self.sent.append(kept)
        for pump in (self._pump(client_in, server_out, kept), self._pump(server_in, client_out)):
            task = asyncio.create_task(pump)
            self._pumps.add(task)
            task.add_done_callback(self._pumps.discard)

    @staticmethod
    async def _pump(
        source: asyncio.StreamReader, sink: asyncio.StreamWriter, kept: list[bytes] | None = None
    ) -> None:
        try:
            while chunk := await source.read(1 << 20):
                if kept is not None:
                    kept.append(chunk)
                sink.write(chunk)
                await sink.drain()
        except OSError:
            pass
        finally:
            sink.close()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._pumps):
            task.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)


def writes_of(chunks: list[bytes]) -> list[list[Command]]:
    """The commands of one recorded connection, grouped as they arrived: a command belongs
    to the chunk that completes it."""
    reader = hiredis.Reader()
    writes = []
    for chunk in chunks:
        reader.feed(chunk)
        write = []
        while (command := reader.gets()) is not False:
            write.append(command)
        if write:
            writes.append(write)
    return writes


def script_of(command: Command) -> bytes | None:
    """The script or function a call runs (its sha, name or body), else None."""
    if command and command[0].upper() in _CALLS and len(command) > 1:
        return command[1]
    return None


@dataclass
class Recording:
    """What the target sent, ready to replay."""

    loads: list[Command]  # FUNCTION LOAD / SCRIPT LOAD, each once
    writes: list[tuple[bytes, int]]  # each recorded write's publishing calls: packed, how many
    channels: dict[bytes, tuple[bool, int]]  # channel -> (sharded, subscribers)
    left_out: dict[str, int] = field(default_factory=dict)  # other commands, by name

    @property
    def calls(self) -> int:
        """The publishing calls recorded."""
        return sum(calls for _, calls in self.writes)


def recording_of(sent: list[list[bytes]], channels: dict[bytes, tuple[bool, int]]) -> Recording:
    """The publishing calls (the script called most often) of every recorded connection, and
    the loads they need; every other command is counted in ``left_out``, not replayed."""
    connections = [writes_of(chunks) for chunks in sent]
    scripts = collections.Counter(
        script
        for writes in connections
        for write in writes
        for command in write
        if (script := script_of(command)) is not None
    )
    if not scripts:
        raise RuntimeError("the target made no script call")
    publishing = scripts.most_common(1)[0][0]
    loads: list[Command] = []
    packed: list[tuple[bytes, int]] = []
    left_out: collections.Counter[str] = collections.Counter()
    for writes in connections:
        for write in writes:
            kept = []
            for command in write:
                name = command[0].upper()
                if name in _LOADS and len(command) > 1 and command[1].upper() == b"LOAD":
                    if command not in loads:
                        loads.append(command)
                elif name == b"EVAL" and [b"SCRIPT", b"LOAD", command[1]] not in loads:
                    loads.append([b"SCRIPT", b"LOAD", command[1]])  # for its EVALSHAs
                if script_of(command) == publishing:
                    kept.append(command)
                else:
                    left_out[name.decode()] += 1
            if kept:
                packed.append((b"".join(_pack(c) for c in kept), len(kept)))
    return Recording(loads, packed, channels, dict(left_out))


async def channels_of(admin: Redis) -> dict[bytes, tuple[bool, int]]:
    """Every channel with a subscriber on ``admin``'s server: (sharded, how many)."""
    out: dict[bytes, tuple[bool, int]] = {}
    names: list[Any] = await admin.pubsub_channels()
    for start in range(0, len(names), 1000):
        for name, count in await admin.pubsub_numsub(*names[start : start + 1000]):
            if count:
                out[_as_bytes(name)] = (False, int(count))
    names = await admin.pubsub_shardchannels()
    for start in range(0, len(names), 1000):
        counts = await admin.pubsub_shardnumsub(*names[start : start + 1000])
        pairs = counts.items() if isinstance(counts, dict) else counts
        for name, count in pairs:
            if count:
                out[_as_bytes(name)] = (True, int(count))
    return out


def _as_bytes(name: bytes | str) -> bytes:
    return name.encode() if isinstance(name, str) else name


def placement(args: argparse.Namespace) -> list[list[int]]:
    """The rooms each of the ``--workers`` listeners serves: those one of its clients is in,
    when each room's ``--room-size`` members land on workers at random (seeded: the same for
    both targets); ``--room-size 0``: every room. A worker's subscription to a room's channel
    is what Redis writes each of the room's messages to."""
    if args.room_size <= 0:
        return [list(range(args.rooms)) for _ in range(args.workers)]
    chance = random.Random(34)
    served: list[list[int]] = [[] for _ in range(args.workers)]
    for room in range(args.rooms):
        for worker in sorted({chance.randrange(args.workers) for _ in range(args.room_size)}):
            served[worker].append(room)
    return served


Look = Callable[[], Awaitable[None]]


async def record_hubbub(args: argparse.Namespace, together: int, url: str, look: Look) -> None:
    """Hubbub's publishes, as :mod:`loadtest.publish_path` makes them: ``together`` a loop
    pass, each in its own room, from its room's writer, with a client message id; each of
    ``--workers`` listeners subscribed to the rooms :func:`placement` gives it."""
    settings = Settings(  # type: ignore[call-arg]
        redis_url=url, auth_mode="guest", history_size=args.history,
        user_messages_per_s=1e9, user_message_burst=1_000_000_000,
    )  # fmt: skip
    publisher = RedisBroker(settings)
    listeners = [RedisBroker(settings) for _ in range(args.workers)]
    rooms = [f"room-{n}" for n in range(args.rooms)]
    await publisher.start(Counter())
    for listener in listeners:
        await listener.start(Counter())
    try:
        async with asyncio.timeout(30):
            while not all(b.ready for b in (publisher, *listeners)):
                await asyncio.sleep(0.05)
        for listener, served in zip(listeners, placement(args), strict=True):
            await asyncio.gather(*(listener.subscribe_room(rooms[n]) for n in served))
        loop = asyncio.get_running_loop()
        for first in range(0, args.messages, together):
            answers: list[asyncio.Future[Published | Exception]] = []
            for n in range(first, min(first + together, args.messages)):
                answer: asyncio.Future[Published | Exception] = loop.create_future()
                answers.append(answer)
                room = rooms[n % len(rooms)]
                publisher.publish_soon(room, None, f"w-{room}", TEXT, n, None, answer.set_result)
            for outcome in await asyncio.gather(*answers):
                if isinstance(outcome, Exception):
                    raise outcome
        await look()
    finally:
        for broker in (*listeners, publisher):
            await broker.stop()


async def record_centrifugo(args: argparse.Namespace, together: int, url: str, look: Look) -> None:
    """Centrifugo's publishes, as :mod:`loadtest.redis_cost` makes them, ``together`` in
    flight: ``--workers`` nodes, each with a client subscribed to the rooms :func:`placement`
    gives it."""
    async with centrifugo_publishing(args, url, placement(args)) as (publisher, _, rooms):
        for first in range(0, args.messages, together):
            await asyncio.gather(
                *(
                    publisher.command(
                        {"publish": {"channel": rooms[n % len(rooms)], "data": {"text": TEXT}}}
                    )
                    for n in range(first, min(first + together, args.messages))
                )
            )
        await look()


async def record(args: argparse.Namespace, target: str, together: int) -> Recording:
    """Run ``target``'s publishes through a recording proxy (step 1)."""
    server = RedisServer()
    await server.start()
    recorder = Recorder(server.port)
    admin = Redis.from_url(server.url)
    channels: dict[bytes, tuple[bool, int]] = {}

    async def look() -> None:  # the channels, while the listeners still listen
        channels.update(await channels_of(admin))

    try:
        url = await recorder.start()
        run = record_hubbub if target == "hubbub" else record_centrifugo
        await run(args, together, url, look)
        return recording_of(recorder.sent, channels)
    finally:
        await recorder.stop()
        await admin.aclose()
        await server.stop()


class _Listener(asyncio.Protocol):
    """A subscriber that counts the messages pushed to it, reading nothing else."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.pushes = self.confirmed = 0
        self._tail = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        seen = self._tail + data
        self.pushes += sum(seen.count(push) for push in _PUSHES)
        self.pushes -= sum(self._tail.count(push) for push in _PUSHES)
        self.confirmed += sum(seen.count(c) for c in _CONFIRMS)
        self.confirmed -= sum(self._tail.count(c) for c in _CONFIRMS)
        self._tail = seen[-16:]


class _Replayer(asyncio.Protocol):
    """Sends its writes, ``depth`` in flight, the next as soon as one is answered whole."""

    def __init__(self, writes: list[tuple[bytes, int]], depth: int, tally: _Tally) -> None:
        self._writes = collections.deque(writes)
        self._waiting: collections.deque[int] = collections.deque()  # replies each still owes
        self._depth = depth
        self._tally = tally
        self._reader = hiredis.Reader()
        self.transport: asyncio.Transport | None = None
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        for _ in range(self._depth):
            self._next()
        if not self._waiting and not self.done.done():
            self.done.set_result(None)

    def _next(self) -> None:
        if self._writes and self.transport is not None:
            packed, calls = self._writes.popleft()
            self._waiting.append(calls)
            self.transport.write(packed)

    def data_received(self, data: bytes) -> None:
        self._reader.feed(data)
        while (reply := self._reader.gets()) is not False:
            self._tally.reply(reply)
            self._waiting[0] -= 1
            if self._waiting[0] == 0:
                self._waiting.popleft()
                self._tally.write_done()
                self._next()
        if not self._waiting and not self.done.done():
            self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(ConnectionError(f"Redis closed the connection: {exc!r}"))


class _Tally:
    """Counts what the replay's replies say, and reads Redis' CPU time at the window's ends."""

    def __init__(self, count: Callable[[Any], tuple[int, int]], writes: int, pid: int) -> None:
        self._count = count  # reply -> (messages published, messages refused or failed)
        self.messages = self.refused = self.errors = 0
        self._answered = 0
        if writes < 2:
            raise ValueError("a replay measures between two of its writes: record more messages")
        first = max(1, writes // 10)
        self._marks = [first, max(first + 1, writes * 9 // 10)]  # two ends, both reached
        self._pid = pid
        self.window: list[tuple[float, float, int, float]] = []  # (wall, redis cpu, messages, own)
        loop = asyncio.get_running_loop()
        self.marked = [loop.create_future(), loop.create_future()]  # each end, once reached

    def reply(self, reply: Any) -> None:
        if isinstance(reply, hiredis.ReplyError):
            self.errors += 1
            return
        published, refused = self._count(reply)
        self.messages += published
        self.refused += refused

    def write_done(self) -> None:
        self._answered += 1
        if self._marks and self._answered >= self._marks[0]:
            self._marks.pop(0)
            self.window.append(
                (time.monotonic(), cpu_s(self._pid), self.messages, time.process_time())
            )
            self.marked[len(self.window) - 1].set_result(None)


async def _instructions(tally: _Tally, pid: int, dumps: Path) -> tuple[int, int]:
    """Under callgrind: Redis' instructions between the window's ends, and the messages
    answered meanwhile (each count read once callgrind has done as asked, at both ends)."""
    await tally.marked[0]
    await callgrind(pid, "-z", dumps)
    first = tally.messages
    await tally.marked[1]
    instructions = await callgrind(pid, "-d", dumps)
    return instructions, tally.messages - first


def _hubbub_count(reply: Any) -> tuple[int, int]:
    """A publish's flat {id, outcome, ts} per message: published (0), anything else."""
    outcomes = reply[1::3]
    published = sum(1 for outcome in outcomes if outcome == 0)
    return published, len(outcomes) - published


def _one_each(reply: Any) -> tuple[int, int]:
    return 1, 0


async def replay(args: argparse.Namespace, case: Case, recording: Recording) -> dict[str, Any]:
    """Replay ``recording`` on a fresh server pinned to ``--redis-core`` (step 2); under
    callgrind with ``--callgrind``, which counts its instructions instead of its time."""
    dumps = Path(tempfile.mkdtemp(prefix="hubbub-ceiling-"))
    under: tuple[str, ...] = ()
    if args.callgrind:
        under = valgrind(dumps, f"--log-file={dumps}/valgrind.log")
    server = RedisServer(under=under)
    await server.start()
    assert server.proc is not None
    os.sched_setaffinity(server.proc.pid, {args.redis_core})
    admin = Redis.from_url(server.url)
    loop = asyncio.get_running_loop()
    opened: list[asyncio.Transport] = []
    try:
        for load in recording.loads:  # (FUNCTION | SCRIPT) LOAD [REPLACE] code
            if load[0].upper() == b"FUNCTION":
                await admin.function_load(load[-1].decode(), replace=True)
            else:
                await admin.script_load(load[-1])
        listeners = [_Listener() for _ in range(max((n for _, n in recording.channels.values()),
                                                     default=0))]  # fmt: skip
        for rank, listener in enumerate(listeners):
            transport, _ = await loop.create_connection(
                _factory(listener), "127.0.0.1", server.port
            )
            opened.append(transport)
            mine = [(c, s) for c, (s, n) in recording.channels.items() if n > rank]
            for sharded in (False, True):
                names = [c for c, s in mine if s == sharded]
                if names:
                    command = (b"SSUBSCRIBE" if sharded else b"SUBSCRIBE", *names)
                    transport.write(_pack(command))
            async with asyncio.timeout(30):
                while listener.confirmed < len(mine):
                    await asyncio.sleep(0.01)
        recorded = recording.writes
        writes = [  # per_write recorded writes in one, as a client pipelines at saturation
            (b"".join(w[0] for w in recorded[at : at + case.per_write]),
             sum(w[1] for w in recorded[at : at + case.per_write]))
            for at in range(0, len(recorded), case.per_write)
        ]  # fmt: skip
        count = _hubbub_count if case.target == "hubbub" else _one_each
        tally = _Tally(count, len(writes), server.proc.pid)
        replayers = [
            _Replayer(writes[rank :: args.connections], args.depth, tally)
            for rank in range(args.connections)
        ]
        await admin.config_resetstat()
        counting = (
            asyncio.ensure_future(_instructions(tally, server.proc.pid, dumps))
            if args.callgrind
            else None
        )
        began = time.monotonic()
        for replayer in replayers:
            transport, _ = await loop.create_connection(
                _factory(replayer), "127.0.0.1", server.port
            )
            opened.append(transport)
        async with asyncio.timeout(600):
            await asyncio.gather(*(r.done for r in replayers))
        took = time.monotonic() - began
        # Let the last pushes arrive (every subscriber reads all Redis sent it).
        delivered = sum(listener.pushes for listener in listeners)
        async with asyncio.timeout(30):
            while True:
                await asyncio.sleep(0.05)
                now = sum(listener.pushes for listener in listeners)
                if now == delivered:
                    break
                delivered = now
        commandstats = await admin.info("commandstats")
        counted = await counting if counting is not None else None
        (wall0, cpu0, msg0, own0), (wall1, cpu1, msg1, own1) = tally.window
        window_s, redis_cpu, messages = wall1 - wall0, cpu1 - cpu0, max(1, msg1 - msg0)
        us_per_message = redis_cpu / messages * 1e6
        if counted is not None:  # valgrind's time says nothing of Redis': its count does
            instructions, counted_messages = counted
            return {
                "messages": tally.messages, "refused": tally.refused, "errors": tally.errors,
                "deliveries_per_message": round(delivered / max(1, tally.messages), 2),
                "redis_instructions_per_message": round(instructions / max(1, counted_messages)),
                "commands_per_message": per_message(commandstats, max(1, tally.messages)),
            }  # fmt: skip
        return {
            "messages": tally.messages,
            "refused": tally.refused,
            "errors": tally.errors,
            "replay_s": round(took, 2),
            "deliveries_per_message": round(delivered / max(1, tally.messages), 2),
            "messages_per_s": round(messages / window_s),
            "redis_core_share": round(redis_cpu / window_s, 3),
            "generator_core_share": round((own1 - own0) / window_s, 3),
            "redis_us_per_message": round(us_per_message, 2),
            "ceiling_messages_per_s": round(1e6 / us_per_message),
            "commands_per_message": per_message(commandstats, max(1, tally.messages)),
        }
    finally:
        for transport in opened:
            transport.abort()
        await admin.aclose()
        await server.stop()
        shutil.rmtree(dumps, ignore_errors=True)


def _pack(command: Sequence[bytes]) -> bytes:
    packed: bytes = hiredis.pack_command(tuple[Any, ...](command))
    return packed


def _factory(protocol: asyncio.Protocol) -> Callable[[], asyncio.Protocol]:
    return lambda: protocol


@dataclass(frozen=True)
class Case:
    """One replay: ``target``'s recording made ``together`` a loop pass (Hubbub) or in flight
    (Centrifugo), replayed ``per_write`` recorded writes to a write."""

    target: str
    together: int
    per_write: int

    @classmethod
    def parse(cls, text: str) -> Case:
        target, together, per_write = text.split(":")
        if target not in ("hubbub", "centrifugo"):
            raise argparse.ArgumentTypeError(f"no target {target!r}")
        return cls(target, int(together), int(per_write))

    def __str__(self) -> str:
        return f"{self.target}:{self.together}:{self.per_write}"


# Hubbub at 1, 8 and 32 sends a loop pass; Centrifugo (each publish its own call) as its
# client wrote them, and 8 and 32 to a write, as it pipelines at saturation.
CASES = "hubbub:1:1,hubbub:8:1,hubbub:32:1,centrifugo:32:1,centrifugo:32:8,centrifugo:32:32"
FIGURES = ("messages_per_s", "redis_core_share", "redis_us_per_message", "ceiling_messages_per_s",
           "generator_core_share")  # fmt: skip
CALLGRIND_FIGURES = ("redis_instructions_per_message",)


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Record each case's target once (per ``together``), then replay every case in turn,
    ``--rounds`` times (the cases alternate within a round: this machine is noisy); -> each
    case's recording, rounds and medians."""
    os.sched_setaffinity(0, {args.generator_core})
    cases: list[Case] = args.cases
    skipped = [str(c) for c in cases if c.target == "centrifugo" and not centrifugo_available()]
    cases = [case for case in cases if str(case) not in skipped]
    recordings: dict[tuple[str, int], Recording] = {}
    for case in cases:
        if (case.target, case.together) not in recordings:
            recordings[case.target, case.together] = await record(args, case.target, case.together)
    rounds: dict[Case, list[dict[str, Any]]] = {case: [] for case in cases}
    for _ in range(args.rounds):
        for case in cases:
            recording = recordings[case.target, case.together]
            rounds[case].append(await replay(args, case, recording))
    out = []
    for case in cases:
        recording = recordings[case.target, case.together]
        subscribers = [n for _, n in recording.channels.values()]
        out.append({
            "case": str(case), "target": case.target, "together": case.together,
            "per_write": case.per_write, "recorded_calls": recording.calls,
            "recorded_writes": len(recording.writes),
            "calls_per_write": round(recording.calls / max(1, len(recording.writes)), 2),
            "channels": len(recording.channels),
            "subscribers_per_channel": round(statistics.mean(subscribers), 2) if subscribers else 0,
            "left_out": recording.left_out, "rounds": rounds[case],
            "median": {
                f: statistics.median(r[f] for r in rounds[case])
                for f in (CALLGRIND_FIGURES if args.callgrind else FIGURES)
            },
        })  # fmt: skip
    return {
        "command": "python -m loadtest.redis_ceiling " + " ".join(args.argv),
        "rooms": args.rooms, "room_size": args.room_size, "workers": args.workers,
        "subscribers_per_room": round(sum(map(len, placement(args))) / args.rooms, 2),
        "messages": args.messages,
        "history": args.history, "connections": args.connections, "depth": args.depth,
        "redis_core": args.redis_core, "generator_core": args.generator_core,
        "callgrind": args.callgrind,
        "machine": f"{os.cpu_count()} cores, {versions()['cpu']}", "versions": versions(),
        "cases": out, "skipped_for_want_of_the_anchor": skipped,
    }  # fmt: skip


def table(result: dict[str, Any]) -> str:
    """The medians as a Markdown table."""
    lines = [
        "| target | sends a call | calls a write | messages/s carried | Redis busy "
        "| Redis µs a message | ceiling, msg/s |",
        "|---|---|---|---|---|---|---|",
    ]
    if result["callgrind"]:
        lines = ["| target | sends a call | calls a write | Redis instructions a message |",
                 "|---|---|---|---|"]  # fmt: skip
    for case in result["cases"]:
        m = case["median"]
        calls_per_write = case["calls_per_write"] * case["per_write"]
        sends = case["together"] if case["target"] == "hubbub" else 1
        if result["callgrind"]:
            instructions = m["redis_instructions_per_message"]
            lines.append(
                f"| {case['target']} | {sends} | {calls_per_write:g} | {instructions:,.0f} |"
            )
            continue
        lines.append(
            f"| {case['target']} | {sends} | {calls_per_write:g} | {m['messages_per_s']:,.0f} "
            f"| {m['redis_core_share']:.0%} | {m['redis_us_per_message']:.2f} "
            f"| **{m['ceiling_messages_per_s']:,.0f}** |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cases", default=CASES,
        type=lambda text: [Case.parse(part) for part in text.split(",")],
        help=f"target:together:per_write, comma-separated (default {CASES})",
    )  # fmt: skip
    parser.add_argument("--rooms", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=8, help="listeners (workers or nodes)")
    parser.add_argument(
        "--room-size", type=int, default=10,
        help="members a room, placed on workers at random (0: every worker in every room)",
    )  # fmt: skip
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--history", type=int, default=100, help="messages each room keeps")
    parser.add_argument("--connections", type=int, default=8, help="replaying connections")
    parser.add_argument("--depth", type=int, default=2, help="writes in flight a connection")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--redis-core", type=int, default=0)
    parser.add_argument("--generator-core", type=int, default=1)
    parser.add_argument(
        "--callgrind", action="store_true",
        help="count Redis' instructions a message under callgrind instead (one round will do)",
    )  # fmt: skip
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args(argv)
    args.argv = argv if argv is not None else sys.argv[1:]
    result = uvloop.run(measure(args))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    print(table(result))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
