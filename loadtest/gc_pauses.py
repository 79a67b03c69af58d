"""``python -m loadtest.gc_pauses``: the garbage collector's pauses in one worker holding
~19,000 sockets (the 20,000-descriptor limit) in rooms of 10, under traffic.

A fresh ``python -m app`` (memory broker, one worker) on core 0; the fan-out generator on core
1 (two processes: 17,100 subscribers + 1,900 publishers, 1,900 rooms, ``--rate`` messages/s).
The worker's ``hubbub_gc_pause_seconds`` (and ``hubbub_gc_collected_objects_total``) is read
when every socket is open and again as the measured phase ends, before the sockets close: the
difference is the collections made while serving traffic, by generation and bucket (and the
first reading, the collections made while the sockets connected). Run it with
``--freeze-interval 0`` and with the default to compare.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from loadtest.bench import OPEN_LIMITS, free_port
from loadtest.scrape import samples, wait_http

ROOT = Path(__file__).resolve().parent.parent


def _pauses(metrics_port: int) -> dict[str, float]:
    """The worker's collector figures and open sockets, by series (``name{labels}``)."""
    names = ("hubbub_gc_pause_seconds_bucket", "hubbub_gc_collected_objects_total",
             "hubbub_connections")  # fmt: skip
    return {
        name + labels: value
        for name in names
        for labels, value in samples(metrics_port, name).items()
    }


def measure(
    freeze_interval_s: float,
    rate: float,
    seconds: int,
    setup: int,
    subscribers: int = 17_100,
    rooms: int = 1_900,
) -> dict[str, object]:
    """Run one measurement (``rooms`` publishers, one per room); returns the generator's
    figures and the pauses under traffic."""
    port, metrics_port = free_port(), free_port()
    env = (
        os.environ
        | OPEN_LIMITS
        | {
            "CHAT_PORT": str(port),
            "CHAT_METRICS_PORT": str(metrics_port),
            "CHAT_GC_FREEZE_INTERVAL_S": str(freeze_interval_s),
            "CHAT_MAX_CONNECTIONS": "19990",
        }
    )
    python = sys.executable
    server = subprocess.Popen(
        ["taskset", "-c", "0", python, "-m", "app"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", server, timeout_s=20)
        generator = subprocess.Popen(
            ["taskset", "-c", "1", python, "-m", "loadtest", "fanout",
             "--url", f"ws://127.0.0.1:{port}/ws", "--subscribers", str(subscribers),
             "--rooms", str(rooms), "--publishers", str(rooms), "--rate", str(rate),
             "--seconds", str(seconds), "--procs", "2", "--setup", str(setup),
             "--quiet"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        # Read once every socket is open (before the traffic), and again as the traffic ends,
        # before the generator closes its 19,000 sockets (teardown is not serving).
        time.sleep(setup - 2)
        before = _pauses(metrics_port)
        time.sleep(seconds + 1)
        after = _pauses(metrics_port)
        out, err = generator.communicate(timeout=setup + seconds + 300)
    finally:
        server.terminate()
        server.wait(30)
    if generator.returncode != 0:
        raise RuntimeError(f"the load generator failed: {err[-2000:]}")
    under_traffic = {name: after[name] - before.get(name, 0.0) for name in after if "_gc_" in name}
    return {
        "freeze_interval_s": freeze_interval_s,
        "connections": before.get("hubbub_connections", 0.0),
        "generator": json.loads(out.strip().splitlines()[-1]),
        # From the worker's start until every socket is open: mostly the sockets connecting.
        "pauses_while_connecting": {name: v for name, v in before.items() if "_gc_" in name},
        "pauses_under_traffic": under_traffic,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--freeze-interval", type=float, default=1.0)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--seconds", type=int, default=30)
    parser.add_argument("--setup", type=int, default=45)
    parser.add_argument("--subscribers", type=int, default=17_100)
    parser.add_argument("--rooms", type=int, default=1_900)
    args = parser.parse_args(argv)
    result = measure(
        args.freeze_interval, args.rate, args.seconds, args.setup, args.subscribers, args.rooms
    )
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
