"""``make bench-tracing`` (``python -m loadtest.tracing_cost``): what OpenTelemetry tracing
costs the message path (docs/benchmarks.md, "Tracing cost").

Closed-loop throughput (``python -m loadtest rtt``: ``--clients`` clients, each sending its
next message as soon as its previous one came back) of a fresh ``python -m app`` (one uvicorn
worker, the memory broker) on core 0, with the generator on core 1 (``taskset``), in three
settings, alternating over ``--rounds`` rounds:

- ``off``: no ``CHAT_TRACING_ENDPOINT`` (the default);
- ``on-1%``: tracing to a real collector (Jaeger, ``.tools/bin/jaeger``, on core 1 like the
  generator: in production the collector has cores of its own), 1 % of messages traced;
- ``on-100%``: every message traced (the upper bound: each has a publish and a fan-out span).

Reports the medians, the range and, per round, each setting's ratio to ``off`` of the same
round (the median of those ratios is the figure: the machine is shared and noisy).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from loadtest.bench import (
    CLIENT_CPU,
    _machine,
    _pin,
    _wait_port,
    free_port,
    loadtest,
    running,
)
from loadtest.collector import JAEGER, jaeger_config

SETTINGS = {
    "off": {},
    "on-1%": {"CHAT_TRACING_SAMPLE_RATIO": "0.01"},
    "on-100%": {"CHAT_TRACING_SAMPLE_RATIO": "1"},
}


@contextlib.contextmanager
def collector() -> Iterator[str]:
    """A Jaeger (OTLP/HTTP in, memory storage) on the generator's core; its OTLP address."""
    if not JAEGER.exists():
        raise SystemExit(f"{JAEGER} is missing: `make otel-deps` builds it")
    otlp, query, grpc, health = (free_port() for _ in range(4))
    with tempfile.TemporaryDirectory(prefix="hubbub-jaeger-") as tmp:
        config = Path(tmp) / "config.yaml"
        config.write_text(jaeger_config(otlp, query, grpc, health))
        proc = subprocess.Popen(
            [*_pin(CLIENT_CPU), str(JAEGER), "--config", str(config)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            _wait_port(otlp, proc, "jaeger")
            yield f"http://127.0.0.1:{otlp}"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(
    args: argparse.Namespace, settings: dict[str, dict[str, str]], what: str
) -> dict[str, list[dict[str, Any]]]:
    """Each setting's rtt results (its environment for the server), one per round, the
    settings alternating in each round."""
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in settings}
    for round_ in range(args.rounds):
        for name, extra in settings.items():
            print(f"round {round_ + 1}/{args.rounds}: {what} {name}", flush=True)
            with running("hubbub", extra) as server:
                cpu_before = cpu_s(server.pid)
                result = loadtest([
                    "rtt", "--clients", str(args.clients), "--seconds", str(args.seconds),
                    "--url", server.url,
                ])  # fmt: skip
                cpu = cpu_s(server.pid) - cpu_before
                # The run's messages (it lasts --seconds, after its clients connected).
                messages = result["messages_per_s"] * args.seconds
                result["server_cpu_us_per_message"] = cpu * 1e6 / messages if messages else None
                results[name].append(result)
    return results


def report(
    results: dict[str, list[dict[str, Any]]],
    args: argparse.Namespace,
    title: str = "Tracing cost",
    setting: str = "tracing",
) -> str:
    """The table of ``results`` (each setting's rtt results, ``off`` among them), titled."""
    off = [r["messages_per_s"] for r in results["off"]]
    lines = [
        f"{title}, closed loop ({args.clients} clients, {args.seconds:g} s, "
        f"{args.rounds} rounds), {_machine()}",
        "",
        f"| {setting} | messages/s (median [range]) | vs off, same round (median [range]) "
        "| server CPU µs per message (median) |",
        "|---|---|---|---|",
    ]
    for name, rows in results.items():
        rates = [r["messages_per_s"] for r in rows]
        ratios = [rate / base for rate, base in zip(rates, off, strict=True)]
        cpu = [r["server_cpu_us_per_message"] for r in rows if r["server_cpu_us_per_message"]]
        lines.append(
            f"| {name} | {statistics.median(rates):,.0f} [{min(rates):,.0f}-{max(rates):,.0f}] "
            f"| {statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}] "
            f"| {statistics.median(cpu):.1f} |"
        )
    return "\n".join(lines)


def parse(argv: list[str] | None, prog: str, description: str | None) -> argparse.Namespace:
    """The arguments of a closed-loop cost benchmark; pins this process to the generator's
    core."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setaffinity(0, {int(CLIENT_CPU)})
    return args


def publish(
    args: argparse.Namespace, started: float, results: dict[str, list[dict[str, Any]]], text: str
) -> None:
    """Print the report; with ``--json``, write it with every run."""
    print(text)
    if args.json is not None:
        args.json.write_text(json.dumps({
            "args": vars(args) | {"json": None}, "started": started, "results": results,
            "report": text,
        }, indent=1) + "\n")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse(argv, "python -m loadtest.tracing_cost", __doc__)
    started = time.time()
    with collector() as endpoint:
        settings = {
            name: {"CHAT_TRACING_ENDPOINT": endpoint} | env if name != "off" else {}
            for name, env in SETTINGS.items()
        }
        results = measure(args, settings, "tracing")
    publish(args, started, results, report(results, args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
