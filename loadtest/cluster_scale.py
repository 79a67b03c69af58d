"""``python -m loadtest.cluster_scale``: what spreading rooms over more Redis masters buys.

Starts a Redis Cluster of ``--masters`` masters (no replicas: every core the machine has goes
to serving), pinned to ``--redis-cores``, then, in this process (pinned to
``--generator-core``), a :class:`~app.broker.redis.RedisBroker` that publishes ``--rate``
messages a second from ``--users`` senders over ``--rooms`` rooms (the real publish script:
numbering, history, sharded pub/sub; each sender's quota in its own slot) and another broker
subscribed to every room that counts what it receives (fan-out). Over ``--seconds`` it reads
each master's CPU time from /proc, and prints, as JSON: messages published and delivered per
second, and each master's share of a core. The busiest master is the deployment's bound:
``rate / busiest share`` is roughly how many messages a second the cluster takes before one
master's core is full.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from typing import Any

from app.broker.redis import RedisBroker
from app.settings import Settings
from loadtest.redis_cost import Counter, cpu_s
from tests.processes import ClusterDeployment

_TICKS = os.sysconf("SC_CLK_TCK")


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    cluster = ClusterDeployment(masters=args.masters, replicas=0)
    await cluster.start()
    pids = [server.proc.pid for server in cluster.servers if server.proc is not None]
    for pid in pids:
        os.sched_setaffinity(pid, args.redis_cores)
    settings = Settings(  # type: ignore[call-arg]
        redis_cluster_nodes=cluster.addresses.split(","), auth_mode="guest", history_size=100,
        user_messages_per_s=1e9, user_message_burst=10**9,
    )  # fmt: skip
    publisher, listener = RedisBroker(settings), RedisBroker(settings)
    counter = Counter()
    await publisher.start(Counter())
    await listener.start(counter)
    rooms = [f"room-{n}" for n in range(args.rooms)]
    try:
        async with asyncio.timeout(30):
            while not (publisher.ready and listener.ready):
                await asyncio.sleep(0.05)
        for room in rooms:
            await listener.subscribe_room(room)
        published = 0
        failed = 0

        async def publish(room: str, n: int) -> None:
            nonlocal published, failed
            try:
                await publisher.publish(room, f"user{n % args.users}", "x" * 40, None)
                published += 1
            except Exception:  # counted: a refused publish is a result too
                failed += 1

        tick = 0.01
        began = time.monotonic()
        cpu_before = [cpu_s(pid) for pid in pids]
        delivered_before = counter.delivered
        n = 0
        tasks: set[asyncio.Task[None]] = set()
        while (elapsed := time.monotonic() - began) < args.seconds:
            owed = args.rate * elapsed - n
            for _ in range(int(owed)):
                task = asyncio.ensure_future(publish(rooms[n % len(rooms)], n))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                n += 1
            await asyncio.sleep(tick)
        took = time.monotonic() - began
        cpu = [(cpu_s(pid) - before) / took for pid, before in zip(pids, cpu_before, strict=True)]
        delivered = counter.delivered - delivered_before
        await asyncio.gather(*tasks, return_exceptions=True)
        return {
            "masters": args.masters,
            "rooms": args.rooms,
            "offered_per_s": args.rate,
            "published_per_s": round(published / took),
            "delivered_per_s": round(delivered / took),
            "failed": failed,
            "master_core_share": [round(share, 3) for share in cpu],
            "busiest_master_core_share": round(max(cpu), 3),
            "all_masters_core_share": round(sum(cpu), 3),
        }
    finally:
        await listener.stop()
        await publisher.stop()
        await cluster.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--masters", type=int, default=3)
    parser.add_argument("--rooms", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=10_000.0)
    parser.add_argument("--users", type=int, default=100, help="senders (their quotas' slots)")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--generator-core", type=int, default=0)
    parser.add_argument("--redis-cores", type=lambda v: {int(c) for c in v.split(",")}, default={1})
    args = parser.parse_args(argv)
    os.sched_setaffinity(0, {args.generator_core})
    print(json.dumps(asyncio.run(measure(args))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
