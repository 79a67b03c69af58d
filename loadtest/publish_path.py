"""``python -m loadtest.publish_path``: what a message costs a worker on its way through Redis.

In one process: a ``redis-server`` (no persistence), a :class:`~app.broker.redis.RedisBroker`
subscribed to ``--rooms`` rooms, and ``--messages`` sends handed to its ``publish_soon`` (the
path of a pipelined send) ``--together`` at a time, as the sends of one loop iteration, each in
its own room, from a thousand senders with a client message id each. Every group is answered
and delivered back to this broker (to a handler that counts) before the next: the send's
packing, the script call, its reply, the ack's outcome, the pushed frame and its delivery.

Prints, as JSON, the process' CPU time a message (user and system, after ``--warm`` messages):
noisy on a shared machine. With ``--callgrind`` it runs itself under valgrind's callgrind and
prints the instructions it executes a message over the measured messages only (the warm-up,
imports and shutdown not counted), the same from run to run: the figure to compare two
versions of the publish path by. Redis itself is not counted (see :mod:`loadtest.redis_cost`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import uvloop

from app.broker import Published
from app.broker.redis import RedisBroker
from app.settings import Settings
from loadtest.redis_cost import Counter, callgrind, valgrind
from tests.processes import RedisServer

TEXT = "hello there, how are you"


class _Deliveries(Counter):
    """Counts room deliveries, and wakes whoever waits for a count."""

    def __init__(self) -> None:
        super().__init__()
        self._wanted = 0
        self._reached: asyncio.Future[None] | None = None

    def deliver_room(self, room: str, message_id: int | None, payload: bytes) -> None:
        super().deliver_room(room, message_id, payload)
        if self._reached is not None and self.delivered >= self._wanted:
            self._reached.set_result(None)
            self._reached = None

    async def until(self, count: int) -> None:
        """Return once ``count`` deliveries have been made (within 10 s, or TimeoutError)."""
        if self.delivered >= count:
            return
        self._wanted, self._reached = count, asyncio.get_running_loop().create_future()
        async with asyncio.timeout(10):
            await self._reached


async def _wait_for(path: Path) -> None:
    while not await asyncio.to_thread(path.exists):
        await asyncio.sleep(0.05)


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Publish and measure (see the module); with ``args.marker``, hand the measured messages
    to a parent counting instructions: write this process' pid to it after the warm-up, wait
    for ``<marker>.go``; write ``<marker>.end`` after them, wait for ``<marker>.dumped``."""
    server = RedisServer()
    await server.start()
    settings = Settings(  # type: ignore[call-arg]
        redis_url=server.url, auth_mode="guest",
        user_messages_per_s=100_000.0, user_message_burst=100_000,
    )  # fmt: skip
    broker = RedisBroker(settings)
    counter = _Deliveries()
    try:
        await broker.start(counter)
        while not broker.ready:
            await asyncio.sleep(0.05)
        rooms = [f"room-{n}" for n in range(args.rooms)]
        for room in rooms:
            await broker.subscribe_room(room)
        loop = asyncio.get_running_loop()
        sent = 0

        async def group() -> None:
            nonlocal sent
            answers: list[asyncio.Future[Published | Exception]] = []
            for _ in range(args.together):
                answer: asyncio.Future[Published | Exception] = loop.create_future()
                answers.append(answer)
                broker.publish_soon(
                    rooms[sent % len(rooms)], None, f"u{sent % 1000}", TEXT, str(sent), None,
                    answer.set_result,
                )  # fmt: skip
                sent += 1
            for outcome in await asyncio.gather(*answers):
                if isinstance(outcome, Exception):
                    raise outcome
            await counter.until(sent)

        for _ in range(max(1, args.warm // args.together)):
            await group()
        warm = sent
        marker = Path(args.marker) if args.marker else None
        if marker is not None:
            marker.write_text(str(os.getpid()))
            await _wait_for(marker.with_suffix(".go"))
        began = time.process_time()
        for _ in range(max(1, args.messages // args.together)):
            await group()
        cpu_s = time.process_time() - began
        if marker is not None:
            marker.with_suffix(".end").write_text("")
            await _wait_for(marker.with_suffix(".dumped"))
        measured = sent - warm
        return {
            "messages": measured,
            "together": args.together,
            "rooms": args.rooms,
            "delivered": counter.delivered - warm,
            "worker_us_per_message": round(cpu_s / measured * 1e6, 1),
        }
    finally:
        await broker.stop()
        await server.stop()


async def under_callgrind(argv: list[str]) -> dict[str, Any]:
    """This command run under callgrind, counting the measured messages only."""
    with tempfile.TemporaryDirectory(prefix="hubbub-publish-path-") as folder:
        dumps = Path(folder)
        marker = dumps / "marker"
        child = await asyncio.create_subprocess_exec(
            *valgrind(dumps, "--instr-atstart=no"),
            sys.executable, "-m", "loadtest.publish_path", *argv, "--marker", str(marker),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        try:
            async with asyncio.timeout(1800):
                while not marker.exists() or not marker.read_text():
                    if child.returncode is not None:
                        raise RuntimeError("publish_path under callgrind ended early")
                    await asyncio.sleep(0.2)
                pid = int(marker.read_text())
                await callgrind(pid, "-i on", dumps)
                marker.with_suffix(".go").write_text("")
                await _wait_for(marker.with_suffix(".end"))
                instructions = await callgrind(pid, "-d", dumps)
                marker.with_suffix(".dumped").write_text("")
                out, _ = await child.communicate()
        finally:
            if child.returncode is None:
                child.kill()
                await child.wait()
        if child.returncode != 0:
            raise RuntimeError(f"publish_path under callgrind exited {child.returncode}")
        result: dict[str, Any] = json.loads(out)
        result.pop("worker_us_per_message")  # valgrind's, not the worker's
        result["worker_instructions_per_message"] = round(instructions / result["messages"])
        return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--warm", type=int, default=1000, help="messages before measuring")
    parser.add_argument("--together", type=int, default=2, help="sends in one loop iteration")
    parser.add_argument("--rooms", type=int, default=500)
    parser.add_argument("--callgrind", action="store_true", help="count instructions instead")
    parser.add_argument("--marker", help=argparse.SUPPRESS)  # set for the run under callgrind
    args = parser.parse_args(argv)
    own = [arg for arg in (argv if argv is not None else sys.argv[1:]) if arg != "--callgrind"]
    result = asyncio.run(under_callgrind(own)) if args.callgrind else uvloop.run(measure(args))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
