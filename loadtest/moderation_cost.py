"""``make bench-moderation`` (``python -m loadtest.moderation_cost``): what the moderation
hook costs the message path (docs/benchmarks.md, "Moderation hook").

Closed-loop throughput (``python -m loadtest rtt``: ``--clients`` clients, each sending its
next message as soon as its previous one came back) of a fresh ``python -m app`` (one uvicorn
worker, the memory broker) on core 0, with the generator on core 1 (``taskset``), in three
settings, alternating over ``--rounds`` rounds:

- ``off``: no ``CHAT_MODERATION_HOOK_URL`` (the default);
- ``on``: every message decided by a real endpoint (``loadtest.moderation_endpoint``: a
  uvicorn on core 1, like the generator; it checks each signature and accepts everything),
  with the default batching and concurrency;
- ``on, 1 request at a time``: the same with ``CHAT_MODERATION_HOOK_CONCURRENCY=1`` (larger
  batches, fewer requests).

Reports the medians, the range and, per round, each setting's ratio to ``off`` of the same
round (the median of those ratios is the figure: the machine is shared and noisy).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from loadtest.bench import (
    CLIENT_CPU,
    _pin,
    _wait_port,
    free_port,
    loadtest,
    running,
)
from loadtest.tracing_cost import cpu_s, report

SECRET = "bench-moderation-secret-of-32-characters"
# The hook's settings in each run (None: off).
SETTINGS: dict[str, dict[str, str] | None] = {
    "off": None,
    "on": {},
    "on, 1 request at a time": {"CHAT_MODERATION_HOOK_CONCURRENCY": "1"},
}


@contextlib.contextmanager
def endpoint() -> Iterator[str]:
    """The moderation endpoint, on the generator's core; its URL."""
    port = free_port()
    proc = subprocess.Popen(
        [*_pin(CLIENT_CPU), sys.executable, "-m", "uvicorn", "loadtest.moderation_endpoint:app",
         "--port", str(port), "--log-level", "warning", "--no-access-log"],
        env=os.environ | {"HOOK_SECRET": SECRET},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        _wait_port(port, proc, "moderation endpoint")
        yield f"http://127.0.0.1:{port}/moderate"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def measure(args: argparse.Namespace, url: str) -> dict[str, list[dict[str, Any]]]:
    """Each setting's rtt results, one per round, the settings alternating in each round."""
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in SETTINGS}
    for round_ in range(args.rounds):
        for name, on in SETTINGS.items():
            print(f"round {round_ + 1}/{args.rounds}: moderation hook {name}", flush=True)
            extra = (
                {"CHAT_MODERATION_HOOK_URL": url, "CHAT_MODERATION_HOOK_SECRET": SECRET} | on
                if on is not None
                else {}
            )
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.moderation_cost", description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setaffinity(0, {int(CLIENT_CPU)})
    started = time.time()
    with endpoint() as url:
        results = measure(args, url)
    text = report(results, args, "Moderation hook cost", "hook")
    print(text)
    if args.json is not None:
        args.json.write_text(json.dumps({
            "args": vars(args) | {"json": None}, "started": started, "results": results,
            "report": text,
        }, indent=1) + "\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
