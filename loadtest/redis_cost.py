"""``python -m loadtest.redis_cost``: what one published message costs Redis.

Starts one ``redis-server`` (no persistence) pinned to ``--redis-core``; then, in this process
(pinned to ``--generator-core``), a :class:`~app.broker.redis.RedisBroker` that publishes
``--rate`` messages a second from ``--users`` senders over ``--rooms`` rooms, with a client
message id (deduplication) on each, as the chat page sends them, through the real publish
script (numbering, quota, history, pub/sub), and ``--workers`` other brokers, each subscribed
to every room, standing for the workers whose clients are in the rooms. Over ``--seconds`` it
reads Redis' CPU time from /proc and prints, as JSON: messages published a second, Redis' CPU
per message in microseconds, and Redis' own per-command statistics (calls and microseconds
per published message), so that a change to the scripts shows where it saved.

With ``--target centrifugo`` the same load goes through the peer instead (its anchor, see
:mod:`loadtest.centrifugo`), on the same kind of Redis: ``--workers`` Centrifugo nodes each
with a client subscribed to every room (so each node subscribes to every room's channel, as
each worker does), and a client on the first node publishing over its WebSocket (history on,
so its messages are recoverable, as Hubbub's are). Redis is measured the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import tempfile
import time
from collections.abc import AsyncIterator, Collection
from pathlib import Path
from typing import Any

import orjson
from redis.asyncio import Redis
from websockets.asyncio.client import ClientConnection, connect

from app.broker.redis import RedisBroker
from app.settings import Settings
from loadtest.centrifugo import Centrifugo
from tests.processes import RedisServer

_TICKS = os.sysconf("SC_CLK_TCK")
TEXT = "x" * 40


class Counter:
    """A BrokerHandler that counts room deliveries."""

    def __init__(self) -> None:
        self.delivered = 0

    def deliver_room(self, room: str, message_id: int | None, payload: bytes) -> None:
        self.delivered += 1

    def deliver_user(self, user: str, message_id: int | None, payload: bytes) -> None: ...
    def kick(self, user: str, reason: str, issued_at: float | None = None) -> None: ...
    def link_lost(self) -> None: ...
    def resubscribed(self) -> None: ...
    def rooms_lost(self, rooms: Collection[str]) -> None: ...
    def rooms_back(self, rooms: Collection[str]) -> None: ...
    def notices_missed(self) -> None: ...
    def room_changed(self, room: str) -> None: ...
    def deliver_routed(self, payload: bytes) -> None: ...


def cpu_s(pid: int) -> float:
    """The process' CPU time so far, in seconds: the sum over its threads of the time the
    scheduler ran them (``/proc/PID/task/*/schedstat``, in ns: the tick-based counts of
    ``/proc/PID/stat`` are 10 ms coarse, too coarse for short runs)."""
    total = 0
    tasks = Path(f"/proc/{pid}/task")
    for task in tasks.iterdir():
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):  # a thread that ended
            total += int((task / "schedstat").read_text().split()[0])
    if total == 0:  # no schedstat (a kernel without it): the ticks
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICKS
    return total / 1e9


def per_message(commandstats: dict[str, Any], published: int) -> dict[str, list[float]]:
    """Redis' ``INFO commandstats`` as {command: [calls, microseconds] per published message}."""
    out: dict[str, list[float]] = {}
    for name, stats in sorted(commandstats.items(), key=lambda kv: -kv[1]["usec"]):
        if stats["calls"]:
            command = name.removeprefix("cmdstat_")
            out[command] = [
                round(stats["calls"] / published, 2),
                round(stats["usec"] / published, 2),
            ]
    return out


async def _until_ready(*brokers: RedisBroker) -> None:
    async with asyncio.timeout(30):
        while not all(broker.ready for broker in brokers):
            await asyncio.sleep(0.05)


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Start Redis, run ``args.target``'s load on it, and say what Redis spent."""
    with tempfile.TemporaryDirectory(prefix="hubbub-callgrind-") as dumps:
        under: tuple[str, ...] = ()
        if args.callgrind:
            args.callgrind_dumps = Path(dumps)
            under = valgrind(Path(dumps))
        redis = RedisServer(under=under)
        await redis.start()
        assert redis.proc is not None
        os.sched_setaffinity(redis.proc.pid, {args.redis_core})
        admin = Redis.from_url(redis.url)
        try:
            run = _hubbub if args.target == "hubbub" else _centrifugo
            return await run(args, redis, admin)
        finally:
            await admin.aclose()
            await redis.stop()


class Load:
    """Offers ``publish`` at ``rate`` a second, and measures Redis while it does."""

    def __init__(self, args: argparse.Namespace, redis: RedisServer, admin: Redis) -> None:
        self.args, self.admin = args, admin
        assert redis.proc is not None
        self.pid = redis.proc.pid
        self.sent = self.published = self.failed = 0

    async def offer(self, publish: Any, seconds: float) -> float:
        """Call ``publish(n)`` (a coroutine function) ``rate`` times a second for ``seconds``;
        -> the seconds it took, until the last answer. Every ``n`` is new (no duplicate cid)."""
        tick, n = 0.005, 0
        tasks: set[asyncio.Task[None]] = set()
        began = time.monotonic()
        while (elapsed := time.monotonic() - began) < seconds:
            for _ in range(int(self.args.rate * elapsed - n)):
                task = asyncio.ensure_future(publish(self.sent))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                n += 1
                self.sent += 1
            await asyncio.sleep(tick)
        await asyncio.gather(*tasks, return_exceptions=True)
        return time.monotonic() - began

    async def measure(self, publish: Any, delivered: Any) -> dict[str, Any]:
        """Warm up for a second, then offer the load for ``--seconds`` and report."""
        await self.offer(publish, 1.0)  # every room's keys exist, scripts are loaded
        self.published = self.failed = 0
        delivered_before = delivered()
        await self.admin.config_resetstat()
        if self.args.callgrind:
            await callgrind(self.pid, "-z", self.args.callgrind_dumps)  # count from here
        cpu_before = cpu_s(self.pid)
        took = await self.offer(publish, self.args.seconds)
        redis_cpu = cpu_s(self.pid) - cpu_before
        instructions = (
            await callgrind(self.pid, "-d", self.args.callgrind_dumps)
            if self.args.callgrind
            else None
        )
        commandstats = await self.admin.info("commandstats")
        published = max(1, self.published)
        extra = {}
        if instructions is not None:
            extra["redis_instructions_per_message"] = round(instructions / published)
        return {
            "target": self.args.target,
            "rooms": self.args.rooms,
            "workers": self.args.workers,
            "offered_per_s": self.args.rate,
            "published_per_s": round(self.published / took),
            "delivered_to_workers_per_s": round((delivered() - delivered_before) / took),
            "failed": self.failed,
            "redis_core_share": round(redis_cpu / took, 3),
            "redis_us_per_message": round(redis_cpu / published * 1e6, 1),
            "commands_per_message": per_message(commandstats, published),
            **extra,
        }


def valgrind(dumps: Path, *options: str) -> tuple[str, ...]:
    """The command line to run a server under callgrind with: its dumps into ``dumps``
    (``callgrind.<pid>.<n>``), and its vgdb pipes there too, so that :func:`callgrind` talks
    to it alone (not through ``/tmp``, which others share)."""
    return (
        "valgrind", "--tool=callgrind", f"--callgrind-out-file={dumps}/callgrind.%p",
        f"--vgdb-prefix={dumps}/vgdb-pipe", "--dump-line=no", *options,
    )  # fmt: skip


# callgrind_control's options -> the monitor commands it would send through vgdb.
_MONITOR_COMMANDS = {
    "-z": "zero",
    "-d": "dump",
    "-i on": "instrumentation on",
    "-i off": "instrumentation off",
}


async def callgrind(pid: int, command: str, dumps: Path, interrupt: bool = True) -> int:
    """A monitor command to a server run under callgrind, its dumps into ``dumps``:
    ``-z`` zeroes its counts, ``-i on`` / ``-i off`` starts and stops counting, ``-d`` dumps
    them; -> for ``-d``, the instructions counted (user space only: the kernel's work for its
    sockets is not counted), from the dump.

    The server runs as :func:`valgrind` says. Sent with ``vgdb --pid`` itself, not
    ``callgrind_control``: that one first lists the valgrind processes and, where it does not
    find the one asked for, prints so on its standard output and exits 0, as it does when
    vgdb fails; a command not carried out is an error here, and so is one not answered in
    60 s. ``interrupt``: vgdb makes a process blocked in a system call take the command
    after 100 ms, attaching to its threads with ptrace; without, the process takes it when
    it next wakes. Redis' counts need the first (without, the counted windows of
    ``loadtest.redis_ceiling`` came out 129,000 to 313,000 instructions a message where they
    agree within a percent with it). An idle Centrifugo is better left alone: so
    interrupted, it closed a joining client's socket in one run and was gone in another
    (CI's), each just after a command sent while it was idle; left alone, it takes a command
    within about a second (its timers), and counts fewer instructions while idle (110,000 to
    122,000 a second against 131,000 to 166,000)."""
    done = await asyncio.create_subprocess_exec(
        "vgdb", f"--vgdb-prefix={dumps}/vgdb-pipe", f"--pid={pid}",
        f"--max-invoke-ms={100 if interrupt else 0}", "--cmd-time-out=60",
        *_MONITOR_COMMANDS[command].split(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    said, _ = await done.communicate()
    if done.returncode != 0:
        raise RuntimeError(f"vgdb {_MONITOR_COMMANDS[command]!r} to {pid} failed: {said.decode()}")
    return _dumped_instructions(pid, dumps) if command == "-d" else 0


def _dumped_instructions(pid: int, folder: Path) -> int:
    """The instructions counted in the server's newest callgrind dump (the dumps are removed):
    its ``totals:`` line, which ends a whole dump (its ``summary:`` says 0 when counting began
    with ``-i on``). ``callgrind.<pid>`` is the file of the counts at exit, not a dump."""
    dumps = sorted(
        folder.glob(f"callgrind.{pid}.*"),
        key=lambda path: path.stat().st_mtime,
    )
    if not dumps:
        raise RuntimeError(f"no callgrind dump of {pid} in {folder}")
    lines = dumps[-1].read_text().splitlines()
    for dump in dumps:
        dump.unlink()
    return int([line for line in lines if line.startswith("totals:")][-1].split()[1])


async def _hubbub(args: argparse.Namespace, redis: RedisServer, admin: Redis) -> dict[str, Any]:
    settings = Settings(  # type: ignore[call-arg]
        redis_url=redis.url, auth_mode="guest", history_size=args.history,
        user_messages_per_s=args.rate, user_message_burst=int(args.rate),
    )  # fmt: skip
    publisher = RedisBroker(settings)
    listeners = [RedisBroker(settings) for _ in range(args.workers)]
    counters = [Counter() for _ in listeners]
    await publisher.start(Counter())
    for listener, counter in zip(listeners, counters, strict=True):
        await listener.start(counter)
    rooms = [f"room-{n}" for n in range(args.rooms)]
    load = Load(args, redis, admin)
    try:
        await _until_ready(publisher, *listeners)
        for listener in listeners:
            for room in rooms:
                await listener.subscribe_room(room)

        async def publish(n: int) -> None:
            try:
                await publisher.publish(rooms[n % len(rooms)], f"user{n % args.users}", TEXT, n)
                load.published += 1
            except Exception:  # counted: a refused publish is a result too
                load.failed += 1

        return await load.measure(publish, lambda: sum(c.delivered for c in counters))
    finally:
        for listener in listeners:
            await listener.stop()
        await publisher.stop()


class CentrifugoClient:
    """A connection to a Centrifugo node speaking its JSON protocol: numbered commands,
    answers matched by ``id``, pushes counted."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.next_id = 0
        self.answers: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.pushes = 0
        self.sending: set[asyncio.Future[None]] = set()
        self.reader = asyncio.create_task(self._read())

    @classmethod
    async def open(cls, url: str) -> CentrifugoClient:
        client = cls(await connect(url, max_size=None, compression=None))
        await client.command({"connect": {}})
        return client

    def send(self, command: dict[str, Any]) -> asyncio.Future[dict[str, Any]]:
        self.next_id += 1
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.answers[self.next_id] = future
        sending = asyncio.ensure_future(self.ws.send(orjson.dumps({"id": self.next_id, **command})))
        self.sending.add(sending)
        sending.add_done_callback(self.sending.discard)
        return future

    async def command(self, command: dict[str, Any]) -> dict[str, Any]:
        answer = await self.send(command)
        if "error" in answer:
            raise RuntimeError(f"centrifugo refused {command}: {answer['error']}")
        return answer

    async def _read(self) -> None:
        async for frame in self.ws:
            for line in frame.splitlines() if isinstance(frame, str) else frame.split(b"\n"):
                if not line:
                    continue
                if line in ("{}", b"{}"):
                    await self.ws.send("{}")  # its ping
                    continue
                reply = orjson.loads(line)
                if "push" in reply:
                    self.pushes += 1
                elif (future := self.answers.pop(reply.get("id", 0), None)) and not future.done():
                    future.set_result(reply)

    async def close(self) -> None:
        self.reader.cancel()
        await self.ws.close()


@contextlib.asynccontextmanager
async def centrifugo_publishing(
    args: argparse.Namespace, redis_url: str, served: list[list[int]] | None = None
) -> AsyncIterator[tuple[CentrifugoClient, list[CentrifugoClient], list[str]]]:
    """``args.workers`` Centrifugo nodes on ``redis_url`` (pinned to ``args.generator_core``,
    history ``args.history``), each with a client subscribed to every one of ``args.rooms``
    rooms (or, with ``served``, node ``i`` to the rooms numbered in ``served[i]``), and a
    publishing client on the first node: (publisher, listeners, rooms)."""
    nodes = [
        Centrifugo(redis_url, {args.generator_core}, history_size=args.history)
        for _ in range(args.workers)
    ]
    clients: list[CentrifugoClient] = []
    try:
        for node in nodes:
            await node.start()
        rooms = [f"chat:room-{n}" for n in range(args.rooms)]
        listeners = [await CentrifugoClient.open(node.ws_url) for node in nodes]
        clients += listeners
        for rank, listener in enumerate(listeners):
            mine = rooms if served is None else [rooms[n] for n in served[rank]]
            await asyncio.gather(
                *(listener.command({"subscribe": {"channel": room}}) for room in mine)
            )
        publisher = await CentrifugoClient.open(nodes[0].ws_url)
        clients.append(publisher)
        yield publisher, listeners, rooms
    finally:
        for client in clients:
            await client.close()
        for node in nodes:
            await node.stop()


async def _centrifugo(args: argparse.Namespace, redis: RedisServer, admin: Redis) -> dict[str, Any]:
    async with centrifugo_publishing(args, redis.url) as (publisher, listeners, rooms):
        load = Load(args, redis, admin)

        async def publish(n: int) -> None:
            data = {"text": TEXT, "user": f"user{n % args.users}"}
            answer = await publisher.send(
                {"publish": {"channel": rooms[n % len(rooms)], "data": data}}
            )
            if "error" in answer:
                load.failed += 1
            else:
                load.published += 1

        return await load.measure(publish, lambda: sum(c.pushes for c in listeners))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", choices=("hubbub", "centrifugo"), default="hubbub")
    parser.add_argument("--rooms", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=5_000.0, help="messages a second")
    parser.add_argument("--users", type=int, default=1000, help="senders (their quotas)")
    parser.add_argument("--workers", type=int, default=2, help="subscribed brokers")
    parser.add_argument("--history", type=int, default=100, help="CHAT_HISTORY_SIZE")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--generator-core", type=int, default=0)
    parser.add_argument("--redis-core", type=int, default=1)
    parser.add_argument(
        "--callgrind",
        action="store_true",
        help="run Redis under valgrind's callgrind and count the instructions it executes per "
        "message (deterministic, where CPU time on a shared machine is not; ~50x slower: "
        "offer a few hundred messages a second)",
    )
    args = parser.parse_args(argv)
    os.sched_setaffinity(0, {args.generator_core})
    print(json.dumps(asyncio.run(measure(args)), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
