"""``python -m loadtest.peer_cost``: what a chat message costs, end to end, Hubbub beside
Centrifugo: Redis' CPU per published message, the server's CPU per delivery, and the
server's CPU per client to connect and join.

One target at a time (``--target``): ``hubbub-redis`` (one Hubbub process, ``python -m
app``, on Redis), ``hubbub`` (the same on its embedded broker: the yardstick for the cost of
going through Redis), ``centrifugo`` (its anchor, :mod:`loadtest.centrifugo`, Redis engine,
history on, GOMAXPROCS=1), ``tutorial`` (:mod:`loadtest.baselines.tutorial`: FastAPI's
tutorial on the same uvicorn, what the framework costs with none of Hubbub's features). The
server runs on ``--server-core``; Redis and this generator on ``--redis-core``. ``--rooms``
rooms of ``--room-size`` clients each connect, authenticate and join (their server CPU,
divided by the clients, is the join cost; Hubbub's clients authenticate in a first ``auth``
frame as the SDKs do, Centrifugo's with ``connect``, the tutorial's by a name in the URL);
then one client of each room sends ``--rate`` messages a second in all, for ``--seconds``,
after a warm-up; every member receives each (the sender too); then, for ``--idle-seconds``,
every client is held and nothing sent: what the server does by the clock for its clients
(heartbeats, presence upkeep) a second and a client, ``server_us_per_client_s_idle``. That
work also runs while the clients join, for those in by then, and is in the join's figure;
``server_us_per_join_net`` leaves it out (the idle rate a client times the clients
connected, integrated over the joins' time: work by the clock that does not grow with the
clients is left out only in part, so the net figure is if anything too high). Hubbub runs
with its production heartbeat (a ping every 25 s), as Centrifugo pings (every 25 s). Redis'
and the server's CPU are read from /proc. Prints JSON.

``--callgrind``: the server runs under valgrind's callgrind, which counts only while the
clients connect and join (after ``WARM_CLIENTS`` have, in rooms of their own):
``server_instructions_per_join`` is the server's user-space instructions per client, a figure
that, unlike CPU time on a shared machine, is the same from run to run within a few per cent.
Then it counts again while ``--seconds`` of messages are sent at ``--rate`` and delivered
(after a warm-up of 2 s, all delivered): ``server_instructions_per_message`` (the send, its
ack and its deliveries) and ``_per_delivery``. Keep the rate to a few hundred a second: the
server runs some 50 times slower. That figure moves more from run to run (a garbage collection,
or the presence upkeep every 10 s, lands in the window or not): count 10 s or more, and compare
medians. Then as long again with no message: ``server_instructions_idle_per_s`` is what the
server does by the clock (heartbeats, presence upkeep, canaries): as many instructions a second
under valgrind as without, but shared among the few messages a second valgrind allows (some
125,000 each at 200 a second, where thousands a second would spread it thin);
``_per_message_net`` and ``_per_delivery_net`` leave it out. The kernel's work for the
sockets (accepting, reading, writing: about the same for every server) is not in it, so a
ratio of instructions is larger than the ratio of CPU time; and a C function's instructions
(hiredis formatting a command with ``sprintf``, say) weigh more than its time does.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import orjson
from redis.asyncio import Redis
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from loadtest.bench import OPEN_LIMITS, free_port
from loadtest.centrifugo import Centrifugo, terminate
from loadtest.redis_cost import TEXT, callgrind, cpu_s, per_message, valgrind
from tests.processes import ROOT, RedisServer

TARGETS = ("hubbub-redis", "hubbub", "centrifugo", "tutorial")
# The bench's open limits, with Hubbub's production heartbeat (a ping every 25 s), as
# Centrifugo pings its clients (every 25 s, its default): not the bench's 15 s, which puts
# pings within its connection holds.
PEER_LIMITS = {key: value for key, value in OPEN_LIMITS.items() if "HEARTBEAT" not in key}
# Seconds with every client held and no message, after the messages (see measure).
IDLE_S = 3.0
# Clients that connect and join before callgrind counts (--callgrind): imports, caches and
# the scripts in Redis are warm by then, as in a server that has been up a while.
WARM_CLIENTS = 50


def tree_cpu_s(pid: int) -> float:
    """CPU time of ``pid`` and its children (gunicorn's workers), in seconds."""
    total = cpu_s(pid)
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if children.exists():
        total += sum(cpu_s(int(child)) for child in children.read_text().split())
    return total


async def connect_as(url: str, name: str) -> ClientConnection:
    """A Hubbub client connected and authenticated as the SDKs and the chat page do it:
    ``?auth=frame``, then an ``auth`` frame first (as Centrifugo's clients send ``connect``).
    Its ``hello`` is not waited for: what the client sends next is read after it."""
    ws = await connect(f"{url}?auth=frame", compression=None)
    await ws.send(orjson.dumps({"type": "auth", "name": name}).decode())
    return ws


class Member:
    """One client: counts the messages it receives; answers its server's pings."""

    def __init__(self, ws: ClientConnection, centrifugo: bool, spaced: bool = False) -> None:
        self.ws, self.centrifugo, self.spaced = ws, centrifugo, spaced
        self.received = 0
        self.arrived = asyncio.Event()  # set at each message received (loadtest.scale's writers)
        self.next_id = 0
        self.answers: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.sending: set[asyncio.Future[None]] = set()
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        with contextlib.suppress(ConnectionClosed):
            async for frame in self.ws:
                data = frame.encode() if isinstance(frame, str) else frame
                if self.centrifugo:
                    self._centrifugo(data)
                    continue
                for line in data.split(b"\n"):  # one frame may hold several
                    if self.spaced:  # the tutorial's json.dumps puts a space after ':'
                        line = line.replace(b'": "', b'":"')
                    if b'"type":"message"' in line:
                        self.received += 1
                        self.arrived.set()
                    elif b'"type":"ping"' in line:
                        await self.ws.send('{"type":"pong"}')
                    elif b'"type":"joined"' in line or b'"type":"error"' in line:
                        self._answer(0, orjson.loads(line))

    def _centrifugo(self, data: bytes) -> None:
        for line in data.split(b"\n"):
            if line == b"{}":
                pong = asyncio.ensure_future(self.ws.send("{}"))  # its ping
                self.sending.add(pong)
                pong.add_done_callback(self.sending.discard)
            elif b'"push"' in line:
                self.received += 1
                self.arrived.set()
            elif line:
                reply = orjson.loads(line)
                self._answer(reply.get("id", 0), reply)

    def _answer(self, key: int, reply: dict[str, Any]) -> None:
        future = self.answers.pop(key, None)
        if future is not None and not future.done():
            future.set_result(reply)

    async def ask(self, command: dict[str, Any]) -> dict[str, Any]:
        """Send ``command`` and wait for its answer (Hubbub: the next joined or error)."""
        key = 0
        if self.centrifugo:
            self.next_id += 1
            key = self.next_id
            command = {"id": key, **command}
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.answers[key] = future
        await self.ws.send(orjson.dumps(command).decode())
        async with asyncio.timeout(30):
            reply = await future
        if "error" in reply or reply.get("type") == "error":
            raise RuntimeError(f"{command} refused: {reply}")
        return reply

    async def close(self) -> None:
        self.reader.cancel()
        with contextlib.suppress(Exception):
            await self.ws.close()


class Target:
    """The server under test, and how its clients speak."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.kind: str = args.target
        self.redis: RedisServer | None = None
        self.centrifugo: Centrifugo | None = None
        self.proc: asyncio.subprocess.Process | None = None
        self.url = ""
        self.dumps: tempfile.TemporaryDirectory[str] | None = None  # --callgrind's

    async def start(self) -> None:
        if self.kind in ("hubbub-redis", "centrifugo"):
            self.redis = RedisServer()
            await self.redis.start()
            assert self.redis.proc is not None
            os.sched_setaffinity(self.redis.proc.pid, {self.args.redis_core})
        under: tuple[str, ...] = ()
        if getattr(self.args, "callgrind", False):
            self.dumps = tempfile.TemporaryDirectory(prefix="hubbub-callgrind-")
            under = valgrind(Path(self.dumps.name), "--instr-atstart=no")
        if self.kind == "centrifugo":
            assert self.redis is not None
            self.centrifugo = Centrifugo(self.redis.url, {self.args.server_core}, under=under)
            await self.centrifugo.start()
            self.url = self.centrifugo.ws_url
            return
        port = free_port()
        env = {**os.environ, **PEER_LIMITS, "CHAT_PORT": str(port), "TMPDIR": tempfile.gettempdir()}
        if self.redis is not None:
            env["CHAT_REDIS_URL"] = self.redis.url
        server: tuple[str, ...] = ("-m", "app")
        if self.kind == "tutorial":
            server = ("-m", "loadtest.baselines.tutorial", "--port", str(port))
        self.proc = await asyncio.create_subprocess_exec(
            "taskset", "-c", str(self.args.server_core), *under, sys.executable, *server,
            cwd=ROOT, env=env, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        self.url = f"ws://127.0.0.1:{port}/ws"
        async with asyncio.timeout(300 if under else 30):  # Python starts slowly under valgrind
            while True:
                try:
                    _, writer = await asyncio.open_connection("127.0.0.1", port)
                    writer.close()
                    break
                except OSError:
                    if self.proc.returncode is not None:
                        raise RuntimeError("the server exited") from None
                    await asyncio.sleep(0.05)

    @property
    def server_pid(self) -> int:
        if self.centrifugo is not None:
            return self.centrifugo.pid
        assert self.proc is not None
        return self.proc.pid

    async def redis_commands(self, reset: bool = False) -> dict[str, Any]:
        """Redis' INFO commandstats (``reset``: start counting anew); {} without Redis."""
        if self.redis is None:
            return {}
        admin = Redis.from_url(self.redis.url)
        try:
            if reset:
                await admin.config_resetstat()
                return {}
            return dict(await admin.info("commandstats"))
        finally:
            await admin.aclose()

    def redis_cpu_s(self) -> float:
        if self.redis is None or self.redis.proc is None:
            return 0.0
        return cpu_s(self.redis.proc.pid)

    async def member(self, name: str, room: str) -> Member:
        """A client connected and in ``room``."""
        if self.centrifugo is not None:
            member = Member(await connect(self.url, compression=None), centrifugo=True)
            await member.ask({"connect": {}})
            await member.ask({"subscribe": {"channel": f"chat:{room}"}})
            return member
        if self.kind == "tutorial":  # it has no authentication: the name is its user's
            ws = await connect(f"{self.url}?name={name}", compression=None)
        else:
            ws = await connect_as(self.url, name)
        member = Member(ws, centrifugo=False, spaced=self.kind == "tutorial")
        await member.ask({"type": "join", "room": room})
        return member

    def send(self, member: Member, room: str, n: int) -> Awaitable[None]:
        if self.centrifugo is not None:
            data = {"text": TEXT}
            frame = {"id": 10**9 + n, "publish": {"channel": f"chat:{room}", "data": data}}
        else:
            frame = {"type": "send", "room": room, "text": TEXT}
            if self.args.cid:  # as the chat page and the SDKs send (deduplicated)
                frame["cid"] = n
        return member.ws.send(orjson.dumps(frame).decode())

    async def instructions(self, command: str) -> int:
        """A callgrind command to the server (``--callgrind``, see :func:`callgrind`): ``-i on``
        counts from now, ``-i off`` stops; ``-d`` dumps -> the instructions counted."""
        assert self.dumps is not None
        # Centrifugo is not interrupted with ptrace to take the command (see callgrind).
        interrupt = self.centrifugo is None
        return await callgrind(self.server_pid, command, Path(self.dumps.name), interrupt)

    async def stop(self) -> None:
        if self.proc is not None:
            await terminate(self.proc)
        if self.dumps is not None:
            self.dumps.cleanup()
        if self.centrifugo is not None:
            await self.centrifugo.stop()
        if self.redis is not None:
            await self.redis.stop()


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    target = Target(args)
    await target.start()
    members: list[Member] = []  # in the measured rooms
    warm_clients: list[Member] = []  # --callgrind's, in rooms of their own
    try:
        rooms = [f"room-{r}" for r in range(args.rooms)]
        if getattr(args, "callgrind", False):
            warm_clients += await asyncio.gather(
                *(target.member(f"w{n}", f"warm-{n}") for n in range(WARM_CLIENTS))
            )
            await target.instructions("-i on")
        await target.redis_commands(reset=True)
        server_before = tree_cpu_s(target.server_pid)
        began = time.monotonic()
        client_s = 0.0  # the clients connected, integrated over the joins' time
        for start in range(0, args.rooms * args.room_size, 100):  # 100 connecting at a time
            joined = [
                target.member(f"u{n}", rooms[n // args.room_size])
                for n in range(start, min(start + 100, args.rooms * args.room_size))
            ]
            batch_began = time.monotonic()
            members += await asyncio.gather(*joined)
            # in for the whole batch: those before it; half of it, on average: its own
            client_s += (time.monotonic() - batch_began) * (start + len(joined) / 2)
        join_s = time.monotonic() - began
        join_cpu = tree_cpu_s(target.server_pid) - server_before
        clients = args.rooms * args.room_size
        writers = members[:: args.room_size]

        async def offer(seconds: float, first: int) -> int:
            """Send ``rate`` a second round the rooms; -> how many were sent."""
            sent, begin = 0, time.monotonic()
            while (elapsed := time.monotonic() - begin) < seconds:
                owed = int(args.rate * elapsed) - sent
                await asyncio.gather(
                    *(target.send(writers[(first + sent + i) % len(writers)],
                                  rooms[(first + sent + i) % len(rooms)], first + sent + i)
                      for i in range(owed))
                )  # fmt: skip
                sent += owed
                await asyncio.sleep(0.005)
            return sent

        def received() -> int:
            return sum(member.received for member in members)

        async def until_delivered(count: int, timeout_s: float) -> None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    while received() < count:
                        await asyncio.sleep(0.02)

        if getattr(args, "callgrind", False):
            await target.instructions("-i off")
            per_join = round(await target.instructions("-d") / clients)
            # Then the messages: counted from the first sent after a warm-up all delivered
            # until the last one is (the server is some 50 times slower under valgrind).
            warm = await offer(2.0, 0)
            await until_delivered(warm * args.room_size, 60)
            before = received()
            await target.instructions("-i on")
            began = time.monotonic()
            sent = await offer(args.seconds, warm)
            await until_delivered(before + sent * args.room_size, 60)
            await target.instructions("-i off")
            window_s = time.monotonic() - began
            counted = await target.instructions("-d")
            each = counted / max(1, sent)
            # Then as long with no message: what the server does by the clock (heartbeats,
            # presence upkeep, canaries) whatever the load: shared among the few messages
            # valgrind allows, it weighs far more on each than at a real rate. The net figure
            # leaves it out.
            await target.instructions("-i on")
            idle_began = time.monotonic()
            await asyncio.sleep(window_s)
            await target.instructions("-i off")
            idle_per_s = await target.instructions("-d") / (time.monotonic() - idle_began)
            net = max(0.0, counted - idle_per_s * window_s) / max(1, sent)
            return {
                "target": args.target,
                "rooms": args.rooms,
                "room_size": args.room_size,
                "clients": clients,
                "server_instructions_per_join": per_join,
                "sent": sent,
                "missing": max(0, before + sent * args.room_size - received()),
                "server_instructions_per_message": round(each),
                "server_instructions_per_delivery": round(each / args.room_size),
                "window_s": round(window_s, 2),
                "server_instructions_idle_per_s": round(idle_per_s),
                "server_instructions_per_message_net": round(net),
                "server_instructions_per_delivery_net": round(net / args.room_size),
            }
        join_commands = per_message(await target.redis_commands(), len(members))
        warm = await offer(2.0, 0)
        await target.redis_commands(reset=True)
        server_before, redis_before = tree_cpu_s(target.server_pid), target.redis_cpu_s()
        delivered_before, began = received(), time.monotonic()
        sent = await offer(args.seconds, warm)
        expected = delivered_before + sent * args.room_size
        await until_delivered(expected, 10)
        took = time.monotonic() - began
        server_cpu = tree_cpu_s(target.server_pid) - server_before
        redis_cpu = target.redis_cpu_s() - redis_before
        delivered = received() - delivered_before
        commands = per_message(await target.redis_commands(), max(1, sent))
        # Then every client held, no message: what the server does by the clock for them
        # (heartbeats, presence upkeep), a second and a client. It also ran while the clients
        # joined, for those in by then: the join's net figure leaves that out.
        idle_s = getattr(args, "idle_seconds", IDLE_S)
        idle_before, idle_began = tree_cpu_s(target.server_pid), time.monotonic()
        await asyncio.sleep(idle_s)
        idle_cpu = tree_cpu_s(target.server_pid) - idle_before
        idle_per_client_s = idle_cpu / (time.monotonic() - idle_began) / clients
        return {
            "target": args.target,
            "rooms": args.rooms,
            "room_size": args.room_size,
            "clients": clients,
            "join_s": round(join_s, 2),
            "server_us_per_join": round(join_cpu / clients * 1e6),
            "server_us_per_join_net": round(
                max(0.0, join_cpu - idle_per_client_s * client_s) / clients * 1e6
            ),
            "server_us_per_client_s_idle": round(idle_per_client_s * 1e6, 2),
            "server_core_share_idle": round(idle_per_client_s * clients, 4),
            "sent_per_s": round(sent / took),
            "delivered_per_s": round(delivered / took),
            "missing": max(0, expected - received()),
            "redis_us_per_message": round(redis_cpu / max(1, sent) * 1e6, 1),
            "server_us_per_delivery": round(server_cpu / max(1, delivered) * 1e6, 2),
            "redis_core_share": round(redis_cpu / took, 3),
            "server_core_share": round(server_cpu / took, 3),
            "redis_commands_per_message": commands,
            "redis_commands_per_join": join_commands,
        }
    except BaseException:
        if target.centrifugo is not None:  # what it said, before its folder goes
            sys.stderr.write(f"centrifugo: {target.centrifugo.log_tail()}\n")
        raise
    finally:
        await asyncio.gather(*(member.close() for member in [*warm_clients, *members]))
        await target.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", choices=TARGETS, default="hubbub-redis")
    parser.add_argument("--rooms", type=int, default=100)
    parser.add_argument("--room-size", type=int, default=10)
    parser.add_argument("--rate", type=float, default=1000.0, help="messages a second in all")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument(
        "--no-cid", dest="cid", action="store_false",
        help="Hubbub's sends without a client id (not deduplicated), as Centrifugo's publishes",
    )  # fmt: skip
    parser.add_argument(
        "--callgrind", action="store_true",
        help="run the server under valgrind's callgrind: its instructions per connect and "
        "join, then per message at --rate (keep it low)",
    )  # fmt: skip
    parser.add_argument(
        "--idle-seconds", type=float, default=IDLE_S,
        help="then as long with every client held and no message: the server's CPU a second "
        "and a client by the clock (heartbeats, upkeep), which the join's net figure leaves out",
    )  # fmt: skip
    parser.add_argument("--server-core", type=int, default=0)
    parser.add_argument("--redis-core", type=int, default=1)
    args = parser.parse_args(argv)
    os.sched_setaffinity(0, {args.redis_core})
    result = asyncio.run(measure(args))
    sys.stdout.write(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode() + "\n")
    return 1 if result.get("missing") else 0


if __name__ == "__main__":
    raise SystemExit(main())
