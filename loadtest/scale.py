"""``python -m loadtest.scale`` (``make bench-scale``): how delivery grows with the workers
added on one Redis, Hubbub beside Centrifugo.

For each worker count W (``--workers``, default 1, 2, 4, 8… as far as the machine allows):
one redis-server on a core of its own, the server on W cores (gunicorn with W workers and
the repo's config; Centrifugo with GOMAXPROCS=W, its Redis engine, history on), and the load
generator in ``--generators`` processes on the cores left. ``--clients`` clients in rooms of
``--room-size`` connect and join (the join phase: wall time and the server's CPU per client);
then each room's one writer keeps ``--window`` messages in flight (closed loop: it sends again
as its own messages come back), so the server runs at saturation; every member counts what
it receives. Over ``--seconds`` after a warm-up: deliveries a second, the writers' round
trip p50/p99, and the share of a core that Redis and the server used. With ``--rate`` the
writers send at that many messages a second in all instead (open loop, each writer at its
share of the rate, whatever comes back): the round trips at a given load, as in "50,000
messages a second at p99 under 5 ms".

The layout is printed with the figures: which cores each part had, and how many the machine
offered. A machine without the cores for a W skips it and says so; with fewer than W + 2
cores, Redis and the generators share the cores after the server's (``--shared``), which
this reports, as its figures then say less.

Prints JSON (``--json`` also writes it). The generator processes are this module run with
``--part``: they connect their share of the rooms, report, wait for ``go`` on stdin, run,
and print their counts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from loadtest.bench import OPEN_LIMITS, free_port
from loadtest.centrifugo import Centrifugo, available, terminate, wait_healthy
from loadtest.peer_cost import Member, connect_as, tree_cpu_s
from loadtest.redis_cost import TEXT, cpu_s
from tests.processes import ROOT, RedisServer

TARGETS = ("hubbub", "centrifugo")


# --- the generator's side (one process per generator core) ---------------------------------


class Writer:
    """A room's one writer: keeps ``window`` messages in flight; times each round trip."""

    def __init__(self, member: Member, room: str, centrifugo: bool, window: int) -> None:
        self.member, self.room, self.centrifugo, self.window = member, room, centrifugo, window
        self.sent_at: list[float] = []  # send times of the messages not back yet, oldest first
        self.round_trips_ms: list[float] = []
        self.echoed = 0
        self.sent = 0

    def _frame(self) -> str:
        if self.centrifugo:
            publish = {"channel": f"chat:{self.room}", "data": {"text": TEXT}}
            return orjson.dumps({"id": 10**9 + self.sent, "publish": publish}).decode()
        return orjson.dumps({"type": "send", "room": self.room, "text": TEXT}).decode()

    def _count_echoes(self) -> None:
        """Time the round trips of the messages back since the last call (oldest first)."""
        back = self.member.received - self.echoed
        if back:
            now = time.monotonic()
            for sent_at in self.sent_at[:back]:
                self.round_trips_ms.append((now - sent_at) * 1000)
            del self.sent_at[:back]
            self.echoed = self.member.received

    async def run(self, until: float, interval_s: float | None = None) -> None:
        """Send until ``until``: ``window`` in flight (closed loop), or one every
        ``interval_s`` (open loop)."""
        if interval_s is not None:
            await self._run_paced(until, interval_s)
            return
        member = self.member
        while time.monotonic() < until:
            self._count_echoes()
            if len(self.sent_at) < self.window:
                self.sent_at.append(time.monotonic())
                self.sent += 1
                await member.ws.send(self._frame())
                continue
            member.arrived.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, until - time.monotonic())):
                    await member.arrived.wait()

    async def _run_paced(self, until: float, interval_s: float) -> None:
        """One message every ``interval_s`` from a random phase, the echoes timed as they
        come: the writer does not wait for them (a slow server piles them up)."""
        member = self.member
        due = time.monotonic() + random.uniform(0, interval_s)
        while (now := time.monotonic()) < until:
            self._count_echoes()
            if now >= due:
                self.sent_at.append(now)
                self.sent += 1
                await member.ws.send(self._frame())
                due += interval_s
                continue
            member.arrived.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(due, until) - now):
                    await member.arrived.wait()
        self._count_echoes()


async def _join(url: str, centrifugo: bool, name: str, room: str) -> Member:
    from websockets.asyncio.client import connect

    if centrifugo:
        member = Member(await connect(url, compression=None), centrifugo=True)
        await member.ask({"connect": {}})
        await member.ask({"subscribe": {"channel": f"chat:{room}"}})
        return member
    member = Member(await connect_as(url, name), centrifugo=False)
    await member.ask({"type": "join", "room": room})
    return member


async def part(args: argparse.Namespace) -> dict[str, Any]:
    """Connect rooms ``args.first``.. of ``args.rooms``, report, wait for go, run, count."""
    centrifugo = args.target == "centrifugo"
    rooms = [f"room-{n}" for n in range(args.first, args.first + args.rooms)]
    members: list[Member] = []
    began = time.monotonic()
    wanted = [(f"u{r}-{i}", room) for r, room in enumerate(rooms) for i in range(args.room_size)]
    for start in range(0, len(wanted), 100):  # 100 connecting at a time
        batch = wanted[start : start + 100]
        members += await asyncio.gather(
            *(_join(args.url, centrifugo, f"{room}-{name}", room) for name, room in batch)
        )
    print(orjson.dumps({"joined": len(members), "join_s": time.monotonic() - began}).decode())
    sys.stdout.flush()
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.readline)  # "go"
    writers = [
        Writer(members[r * args.room_size], room, centrifugo, args.window)
        for r, room in enumerate(rooms)
    ]
    # Open loop (--rate, this process' share of it): each writer at an equal share.
    interval_s = len(writers) / args.rate if args.rate else None
    warm_until = time.monotonic() + args.warm
    await asyncio.gather(*(writer.run(warm_until, interval_s) for writer in writers))
    for writer in writers:
        writer.round_trips_ms.clear()
    received_before = sum(member.received for member in members)
    sent_before = sum(writer.sent for writer in writers)
    began, cpu_before = time.monotonic(), time.process_time()
    await asyncio.gather(*(writer.run(began + args.seconds, interval_s) for writer in writers))
    took = time.monotonic() - began
    sent = sum(writer.sent for writer in writers) - sent_before
    cpu = time.process_time() - cpu_before
    received = sum(member.received for member in members) - received_before
    round_trips = sorted(ms for writer in writers for ms in writer.round_trips_ms)
    await asyncio.gather(*(member.close() for member in members))
    step = max(1, len(round_trips) // 20_000)  # a sample is enough for percentiles
    sample = [round(ms, 2) for ms in round_trips[::step]]
    return {
        "received": received, "sent": sent, "took_s": took, "cpu_s": cpu,
        "round_trips_ms": sample,
    }  # fmt: skip


# --- the coordinator's side ------------------------------------------------------------------


def layout(cores: list[int], workers: int, generators: int, shared: bool) -> dict[str, Any] | None:
    """Which cores the server, Redis and the generators get for ``workers``; None if it
    cannot be laid out on ``cores``."""
    if len(cores) >= workers + 2:
        rest = cores[workers + 1 :]
        return {
            "server": cores[:workers], "redis": [cores[workers]],
            "generators": rest[: max(1, generators)], "shared": False,
        }  # fmt: skip
    if shared and len(cores) >= workers + 1:
        return {
            "server": cores[:workers], "redis": [cores[workers]],
            "generators": [cores[workers]], "shared": True,
        }  # fmt: skip
    return None


async def _start_server(
    target: str, workers: int, cores: list[int], redis_url: str, tmp: str
) -> tuple[asyncio.subprocess.Process | Centrifugo, str, int]:
    """The server under test -> (its handle, its WebSocket URL, its pid)."""
    if target == "centrifugo":
        peer = Centrifugo(redis_url, set(cores))
        await peer.start()
        return peer, peer.ws_url, peer.pid
    port = free_port()
    env = {
        **os.environ, **OPEN_LIMITS, "TMPDIR": tmp, "CHAT_REDIS_URL": redis_url,
        "CHAT_MAX_CONNECTIONS": "1000000",
    }  # fmt: skip
    # Through the interpreter, not the gunicorn script: where the packages were installed
    # with pip's --target (a lent machine, see scripts/device-scale.sh) there is none beside it.
    proc = await asyncio.create_subprocess_exec(
        "taskset", "-c", ",".join(map(str, cores)), sys.executable, "-m", "gunicorn",
        "-c", "deploy/gunicorn.conf.py",
        "--bind", f"127.0.0.1:{port}", "--workers", str(workers),
        cwd=ROOT, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    await wait_healthy(proc, port, "/readyz", "gunicorn", 60)
    # Every worker forked: gunicorn's children, as /proc lists them.
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    async with asyncio.timeout(60):
        while len(children.read_text().split()) < workers:  # noqa: ASYNC240 (procfs)
            await asyncio.sleep(0.1)
    return proc, f"ws://127.0.0.1:{port}/ws", proc.pid


def _percentile(sorted_values: list[float], fraction: float) -> float:
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * fraction))]


async def run_one(
    args: argparse.Namespace, target: str, workers: int, cores: dict[str, Any]
) -> dict[str, Any]:
    """One target at ``workers``: start, join, saturate, measure, stop."""
    redis = RedisServer()
    await redis.start()
    assert redis.proc is not None
    os.sched_setaffinity(redis.proc.pid, set(cores["redis"]))
    tmp = tempfile.mkdtemp(prefix="hubbub-scale-")
    server, url, pid = await _start_server(target, workers, cores["server"], redis.url, tmp)
    parts: list[asyncio.subprocess.Process] = []
    try:
        rooms = max(1, args.clients // args.room_size)
        generators = cores["generators"]
        count = len(generators) if not args.generators else args.generators
        share = [rooms // count + (1 if n < rooms % count else 0) for n in range(count)]
        server_before = tree_cpu_s(pid)
        began = time.monotonic()
        first = 0
        for n, rooms_here in enumerate(share):
            if not rooms_here:
                continue
            parts.append(await asyncio.create_subprocess_exec(
                "taskset", "-c", str(generators[n % len(generators)]), sys.executable, "-m",
                "loadtest.scale", "--part", "--target", target, "--url", url,
                "--first", str(first), "--rooms", str(rooms_here),
                "--room-size", str(args.room_size), "--window", str(args.window),
                "--warm", str(args.warm), "--seconds", str(args.seconds),
                "--rate", str(args.rate * rooms_here / rooms),
                cwd=ROOT, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                limit=2**24,  # its report's line holds up to 20,000 round trips
            ))  # fmt: skip
            first += rooms_here
        for proc in parts:
            assert proc.stdout is not None
            async with asyncio.timeout(300):
                line = await proc.stdout.readline()
            if not line:
                raise RuntimeError(f"a generator of {target} exited while joining")
        join_s = time.monotonic() - began
        join_cpu = tree_cpu_s(pid) - server_before
        clients = rooms * args.room_size
        for proc in parts:
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")
            await proc.stdin.drain()
        await asyncio.sleep(args.warm)
        server_before, redis_before = tree_cpu_s(pid), cpu_s(redis.proc.pid)
        began = time.monotonic()
        outputs = []
        for proc in parts:
            assert proc.stdout is not None
            async with asyncio.timeout(args.seconds + 120):
                outputs.append(orjson.loads(await proc.stdout.readline()))
        # CPU over the generators' measured window (they end it at the same moment, give or
        # take the time to read their output, which is small against --seconds).
        took = max(output["took_s"] for output in outputs)
        server_cpu = tree_cpu_s(pid) - server_before
        redis_cpu = cpu_s(redis.proc.pid) - redis_before
        received = sum(output["received"] for output in outputs)
        sent = sum(output["sent"] for output in outputs)
        round_trips = sorted(ms for output in outputs for ms in output["round_trips_ms"])
        return {
            "target": target, "workers": workers, "cores": cores, "clients": clients,
            "join_s": round(join_s, 2),
            "server_us_per_join": round(join_cpu / clients * 1e6),
            "deliveries_per_s": round(received / took),
            "messages_per_s": round(received / took / args.room_size),
            "sent_per_s": round(sent / took),
            # Open loop: what was offered; 0 for the closed loop (saturation).
            "offered_per_s": round(args.rate),
            "round_trip_p50_ms": round(_percentile(round_trips, 0.5), 1),
            "round_trip_p99_ms": round(_percentile(round_trips, 0.99), 1),
            "redis_core_share": round(redis_cpu / took, 3),
            "server_core_share": round(server_cpu / took, 3),
            # Near 1: that generator process, not the server, bounded the figures.
            "busiest_generator_core_share": round(
                max(output["cpu_s"] for output in outputs) / took, 3
            ),
        }  # fmt: skip
    finally:
        for proc in parts:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        if isinstance(server, Centrifugo):
            await server.stop()
        else:
            await terminate(server)
        await redis.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def _worker_counts(requested: str | None, cores: int, shared: bool) -> list[int]:
    if requested:
        return [int(w) for w in requested.split(",")]
    counts, w = [], 1
    while w + (1 if shared else 2) <= cores:
        counts.append(w)
        w *= 2
    return counts or [1]


async def coordinate(args: argparse.Namespace) -> dict[str, Any]:
    cores = sorted(os.sched_getaffinity(0))
    shared = args.shared or len(cores) < 3
    targets = [t for t in args.targets.split(",") if t != "centrifugo" or available()]
    report: dict[str, Any] = {
        "machine_cores": len(cores), "clients": args.clients, "room_size": args.room_size,
        "window": args.window, "rate": args.rate, "seconds": args.seconds, "targets": targets,
        "skipped": [], "runs": [],
    }  # fmt: skip
    if "centrifugo" in args.targets and "centrifugo" not in targets:
        report["skipped"].append("centrifugo: the anchor's binary is not on this machine")
    for workers in _worker_counts(args.workers, len(cores), shared):
        placed = layout(cores, workers, args.generator_cores, shared)
        if placed is None:
            report["skipped"].append(f"W={workers}: {len(cores)} cores are too few")
            continue
        for target in targets:
            result = await run_one(args, target, workers, placed)
            report["runs"].append(result)
            print(orjson.dumps(result).decode(), file=sys.stderr)
    for target in targets:
        runs = [run for run in report["runs"] if run["target"] == target]
        if runs and runs[0]["deliveries_per_s"]:
            for run in runs:
                run["speedup"] = round(run["deliveries_per_s"] / runs[0]["deliveries_per_s"], 2)
    return report


def table(report: dict[str, Any]) -> str:
    """The report as a Markdown table (docs/benchmarks.md)."""
    lines = [
        "| target | W | deliveries/s | messages/s (offered) | x W=1 | round trip p50 / p99 ms"
        " | Redis core | server cores | busiest generator | µs/join |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in report["runs"]:
        offered = f" ({run['offered_per_s']:,})" if run["offered_per_s"] else ""
        lines.append(
            f"| {run['target']} | {run['workers']} | {run['deliveries_per_s']:,} "
            f"| {run['messages_per_s']:,}{offered} "
            f"| {run.get('speedup', 0):.2f} | {run['round_trip_p50_ms']} / "
            f"{run['round_trip_p99_ms']} | {run['redis_core_share']:.0%} "
            f"| {run['server_core_share']:.2f} | {run['busiest_generator_core_share']:.0%} "
            f"| {run['server_us_per_join']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", help="worker counts, e.g. 1,2,4,8 (default: as cores allow)")
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--clients", type=int, default=10_000)
    parser.add_argument("--room-size", type=int, default=10)
    parser.add_argument("--window", type=int, default=4, help="messages in flight per writer")
    parser.add_argument(
        "--rate", type=float, default=0.0,
        help="messages a second in all, sent whatever comes back (open loop); 0: --window's "
        "closed loop, at saturation",
    )  # fmt: skip
    parser.add_argument("--warm", type=float, default=3.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--generator-cores", type=int, default=7)
    parser.add_argument(
        "--generators", type=int, default=0, help="processes (default: one per core)"
    )
    parser.add_argument("--shared", action="store_true", help="Redis and generators on one core")
    parser.add_argument("--json", type=Path, help="write the report here")
    # A generator process (internal).
    parser.add_argument("--part", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--target", default="hubbub", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--rooms", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.part:
        sys.stdout.write(orjson.dumps(asyncio.run(part(args))).decode() + "\n")
        return 0
    report = asyncio.run(coordinate(args))
    text = orjson.dumps(report, option=orjson.OPT_INDENT_2).decode()
    if args.json:
        args.json.write_text(text + "\n")
    sys.stdout.write(text + "\n\n" + table(report) + "\n")
    return 0 if report["runs"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
