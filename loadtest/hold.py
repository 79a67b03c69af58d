"""``make bench-100k`` (``python -m loadtest.hold``): 100,000 WebSockets held on this machine
by gunicorn's workers, with heartbeats on, then every one probed.

What runs (all on loopback, all started and ended here, by PID):

- ``redis-server`` on a free port, on core 1 (not the server under test);
- gunicorn with ``deploy/gunicorn.conf.py``, the Redis broker, and as many workers as a
  20,000-descriptor limit per process needs (``--per-worker``, 15,000 by default: gunicorn's
  workers share one listening socket and do not split connections evenly), on core 0; the
  production heartbeat (a ping every 25 s, 10 s to answer);
- the load generator (``python -m loadtest connections``) on core 1, in as many processes as
  its own descriptor limit needs, connecting from 127.0.0.1 .. 127.0.0.N (10,000 sockets
  per address: see ``PORTS_PER_ADDRESS``). Each socket joins a room of ``--room-size`` (10:
  chat is small rooms), stays for ``--seconds`` answering the server's pings, and is then
  probed: a ``ping`` that must be answered, and a message from its room's first member that
  it must receive.

Reported: sockets connected, alive after the hold, answering the probe; the time to connect
them all and the rate; connect-time percentiles; the workers' resident memory per socket
(their RSS at the end of the hold minus before the first connect) and how the sockets spread
over the workers. ``--json`` writes it all; ``docs/benchmarks.md`` quotes a run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from loadtest.bench import CLIENT_CPU, OPEN_LIMITS, ROOT, SERVER_CPU, free_port
from loadtest.scrape import samples, wait_http

# Sockets per source address. Linux gives connect() the even half of the ephemeral ports
# (32768-60999) first: past ~14,000 sockets from one address to one server, each connect scans
# the used ports, 0.7 ms instead of 20 us (measured here).
PORTS_PER_ADDRESS = 10_000
SOCKETS_PER_GENERATOR = 15_000


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _sockets(pid: int) -> int:
    """Open sockets of process ``pid`` (descriptors that are sockets)."""
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            count += os.readlink(fd).startswith("socket:")
        except OSError:
            continue  # closed meanwhile
    return count


def _metric(port: int, name: str) -> float:
    return sum(samples(port, name).values())


def _log_summary(server_log: Path, redis_log: Path) -> dict[str, Any]:
    """The server's warnings and errors, counted by message, and what Redis said about its
    clients (output buffer limits, disconnections): what went wrong, if anything did."""
    warnings: Counter[str] = Counter()
    for line in server_log.read_text(errors="replace").splitlines():
        try:  # JSON lines (app.ops.logs), else text: "<time> <LEVEL> <logger>: <message>"
            record = json.loads(line)
            level, message = str(record["level"]).upper(), str(record["msg"])
        except (ValueError, TypeError, KeyError):
            level, _, message = line[24:].partition(" ")
        if level in ("WARNING", "ERROR", "CRITICAL"):
            warnings[f"{level}: {message.strip()[:120]}"] += 1
    redis = [
        line[:200]
        for line in redis_log.read_text(errors="replace").splitlines()
        if "client" in line.lower() or "buffer" in line.lower()
    ]
    return {"server_warnings": dict(warnings.most_common(10)), "redis": redis[:10]}


def hold(
    connections: int,
    seconds: float,
    ramp_per_s: float,
    room_size: int,
    per_worker: int,
    per_generator: int = SOCKETS_PER_GENERATOR,
    per_address: int = PORTS_PER_ADDRESS,
) -> dict[str, Any]:
    """One run; returns the generator's figures and the server's, as a dict."""
    workers = math.ceil(connections / per_worker)
    procs = math.ceil(connections / per_generator)
    addresses = min(254, math.ceil(connections / per_address))
    tmp = Path(tempfile.mkdtemp(prefix="hubbub-hold-"))
    port, metrics_port, redis_port = free_port(), free_port(), free_port()
    started: list[subprocess.Popen[bytes]] = []
    python = sys.executable
    try:
        redis = subprocess.Popen(
            ["taskset", "-c", CLIENT_CPU, "redis-server", "--port", str(redis_port),
             "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(tmp)],
            stdout=(tmp / "redis.log").open("wb"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        started.append(redis)
        limits = {k: v for k, v in OPEN_LIMITS.items() if "HEARTBEAT" not in k}
        env = os.environ | limits | {
            "CHAT_REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
            "CHAT_WORKERS": str(workers),
            "CHAT_METRICS_PORT": str(metrics_port),
            "TMPDIR": str(tmp),
        }  # fmt: skip
        gunicorn = str(Path(python).parent / "gunicorn")
        server = subprocess.Popen(
            ["taskset", "-c", SERVER_CPU, gunicorn, "-c", "deploy/gunicorn.conf.py",
             "--bind", f"127.0.0.1:{port}"],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=(tmp / "server.log").open("wb"),
        )  # fmt: skip
        started.append(server)
        wait_http(f"http://127.0.0.1:{metrics_port}/metrics", server)
        deadline = time.monotonic() + 60
        while len(_children(server.pid)) < workers:
            if time.monotonic() > deadline:
                raise RuntimeError("the workers did not start")
            time.sleep(0.2)
        time.sleep(2)  # the workers' startup (imports, Redis) settles
        pids = _children(server.pid)
        rss_before = {pid: _rss_kib(pid) for pid in pids}

        setup_s = 3.0
        generator = subprocess.Popen(
            ["taskset", "-c", CLIENT_CPU, python, "-m", "loadtest", "connections",
             "--url", f"ws://127.0.0.1:{port}/ws", "--connections", str(connections),
             "--ramp", str(ramp_per_s), "--seconds", str(seconds),
             "--room-size", str(room_size), "--source-addresses", str(addresses),
             "--procs", str(procs), "--setup", str(setup_s), "--quiet"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        started.append(generator)
        # Connected when the workers hold every socket (or the count stops growing); then
        # every socket is open and idle (but for heartbeats) until the hold ends.
        connect_began = time.time() + setup_s
        time.sleep(setup_s)
        open_sockets, grew_at = 0.0, time.time()
        while open_sockets < connections and time.time() - grew_at < 10:
            time.sleep(1)
            now_open = _metric(metrics_port, "hubbub_connections")
            if now_open > open_sockets:
                grew_at = time.time()
            open_sockets = now_open
        connected_after_s = grew_at - connect_began
        # The generator holds its sockets ``seconds`` from its last connect: measure before it
        # probes and closes them.
        time.sleep(max(0.0, grew_at + seconds - 15 - time.time()))
        rss_after = {pid: _rss_kib(pid) for pid in pids}
        sockets = {pid: _sockets(pid) for pid in pids}
        open_sockets = _metric(metrics_port, "hubbub_connections")
        errors = samples(metrics_port, "hubbub_error_frames_total")
        refused = samples(metrics_port, "hubbub_upgrades_refused_total")
        out, err = generator.communicate(timeout=seconds + connections / ramp_per_s + 600)
        if generator.returncode != 0:
            raise RuntimeError(f"the load generator failed: {err.decode()[-2000:]}")
        generated = json.loads(out.decode().strip().splitlines()[-1])
        alive_workers = sum(1 for pid in pids if Path(f"/proc/{pid}").exists())
        reconnects = _metric(metrics_port, "hubbub_broker_reconnects_total")
        logged = _log_summary(tmp / "server.log", tmp / "redis.log")
    finally:
        for proc in reversed(started):
            if proc.poll() is None:
                proc.terminate()
        for proc in reversed(started):
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    grown = sum(rss_after.values()) - sum(rss_before.values())
    return {
        "connections": connections,
        "workers": workers,
        "workers_alive_at_the_end": alive_workers,
        "generator_processes": procs,
        "source_addresses": addresses,
        "hold_s": seconds,
        "ramp_per_s": ramp_per_s,
        "all_open_after_s": round(connected_after_s, 1),
        "open_sockets_at_the_end_of_the_hold": open_sockets,
        "sockets_per_worker": sorted(sockets.values()),
        "worker_rss_mib_before": round(sum(rss_before.values()) / 1024, 1),
        "worker_rss_mib_held": round(sum(rss_after.values()) / 1024, 1),
        "rss_kib_per_connection": round(grown / max(open_sockets, 1), 1),
        # What the server refused meanwhile (error frames by code, upgrades refused).
        "server_error_frames": {k: v for k, v in errors.items() if v},
        "server_upgrades_refused": {k: v for k, v in refused.items() if v},
        "broker_reconnects": reconnects,
        "logged": logged,
        "generator": generated,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=300.0, help="the hold")
    parser.add_argument("--ramp", type=float, default=500.0, help="connects per second")
    parser.add_argument("--room-size", type=int, default=10)
    parser.add_argument("--per-worker", type=int, default=15_000, help="sockets per worker")
    parser.add_argument(
        "--generator-sockets",
        type=int,
        default=SOCKETS_PER_GENERATOR,
        help="sockets per load-generator process",
    )
    parser.add_argument(
        "--address-sockets", type=int, default=PORTS_PER_ADDRESS, help="sockets per source address"
    )
    parser.add_argument("--json", type=Path, help="write the result here too")
    args = parser.parse_args(argv)
    result = hold(
        args.connections, args.seconds, args.ramp, args.room_size, args.per_worker,
        args.generator_sockets, args.address_sockets,
    )  # fmt: skip
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
