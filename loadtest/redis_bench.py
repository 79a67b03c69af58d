"""``python -m loadtest.redis_bench`` (``make bench-redis``): what a message and a join cost
through Redis, Hubbub beside Centrifugo, side by side in one run.

For each shape (rooms of 10: 9 readers and a writer; rooms of 2: pairs), each target of
:mod:`loadtest.peer_cost` (``hubbub-redis``, ``centrifugo``, and ``hubbub`` on its embedded
broker as the yardstick for the worker's cost of going through Redis) runs ``--rounds``
times, the targets alternating within each round (this machine is shared and noisy).
Printed and written (``--json``): the median of each figure, with its range, and the ratios
the goals are stated in: Redis CPU per message (Hubbub / Centrifugo), server CPU per join
(Hubbub / Centrifugo), and the worker's CPU per delivery with Redis over the embedded
broker's. Centrifugo's side is skipped, and said so, where its anchor is not on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from loadtest import centrifugo, peer_cost

SHAPES = {"rooms of 10": (100, 10), "rooms of 2": (500, 2)}
FIGURES = ("redis_us_per_message", "server_us_per_delivery", "server_us_per_join", "missing")


def _run(target: str, rooms: int, size: int, args: argparse.Namespace) -> dict[str, Any]:
    options = argparse.Namespace(
        target=target, rooms=rooms, room_size=size, rate=args.rate, seconds=args.seconds,
        server_core=args.server_core, redis_core=args.redis_core, cid=True,
    )  # fmt: skip
    return asyncio.run(peer_cost.measure(options))


def _median(runs: list[dict[str, Any]], figure: str) -> dict[str, float]:
    values = [float(run[figure]) for run in runs]
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def versions() -> dict[str, str]:
    """Python's, Redis' and Centrifugo's versions, and the CPU's model."""
    redis = subprocess.run(["redis-server", "--version"], capture_output=True, text=True)
    return {
        "python": platform.python_version(),
        "redis": redis.stdout.split()[2] if redis.returncode == 0 else "?",
        "centrifugo": "v6.9.1" if centrifugo.available() else "not on this machine",
        "cpu": _cpu_model(),
    }


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=float, default=1000.0, help="messages a second")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--server-core", type=int, default=0)
    parser.add_argument("--redis-core", type=int, default=min(1, (os.cpu_count() or 1) - 1))
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    targets = ["hubbub-redis", "hubbub"] + (["centrifugo"] if centrifugo.available() else [])
    if "centrifugo" not in targets:
        sys.stderr.write("redis_bench: Centrifugo's anchor is not here: Hubbub only\n")
    began = time.time()
    results: dict[str, Any] = {}
    for shape, (rooms, size) in SHAPES.items():
        runs: dict[str, list[dict[str, Any]]] = {target: [] for target in targets}
        for round_ in range(args.rounds):
            for target in targets:
                sys.stderr.write(f"{shape}, round {round_ + 1}: {target}\n")
                runs[target].append(_run(target, rooms, size, args))
        medians = {
            target: {figure: _median(target_runs, figure) for figure in FIGURES}
            for target, target_runs in runs.items()
        }
        results[shape] = {"rooms": rooms, "room_size": size, "medians": medians, "runs": runs}
    report = {
        "command": "python -m loadtest.redis_bench " + " ".join(argv or sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d", time.gmtime(began)),
        "machine": f"{os.cpu_count()} cores, {versions()['cpu']}",
        "versions": versions(),
        "rate_per_s": args.rate,
        "seconds": args.seconds,
        "shapes": results,
    }
    sys.stdout.write(table(report) + "\n")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 1 if any(
        m["missing"]["max"] for s in results.values() for m in s["medians"].values()
    ) else 0  # fmt: skip


def table(report: dict[str, Any]) -> str:
    """The report as a Markdown table: medians [min-max] per shape and target."""
    lines = [
        "| shape | server | Redis CPU / message | server CPU / delivery | server CPU / join |",
        "|---|---|---|---|---|",
    ]
    for shape, result in report["shapes"].items():
        for target, figures in result["medians"].items():
            cells = [
                _cell(figures["redis_us_per_message"], " µs") if target != "hubbub" else "-",
                _cell(figures["server_us_per_delivery"], " µs"),
                _cell(figures["server_us_per_join"], " µs"),
            ]
            lines.append(f"| {shape} | {target} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(figure: dict[str, float], unit: str) -> str:
    return f"**{figure['median']:,.1f}{unit}** [{figure['min']:,.1f} to {figure['max']:,.1f}]"


if __name__ == "__main__":
    raise SystemExit(main())
