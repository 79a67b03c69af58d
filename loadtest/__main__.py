"""``python -m loadtest SCENARIO [options]``: load Hubbub (or the baseline) and measure it.

Scenarios (docs/benchmarks.md has the figures):

- ``connections``: open ``--connections`` sockets at ``--ramp`` per second (from
  ``--source-addresses`` loopback addresses, each joining a room of ``--room-size``), hold
  them for ``--seconds`` answering pings, count the ones still open and probe each (a ping,
  and a message in its room); connect-time percentiles.
- ``rtt``: ``--clients`` clients, each in its own room, send and wait for their own message:
  closed loop, or ``--rate`` sends/s in total; messages/s and round-trip percentiles.
- ``fanout``: ``--subscribers`` over ``--rooms`` rooms, ``--publishers`` sending ``--rate``
  messages/s in total; deliveries/s, delivery latency, missing / duplicated / out-of-order.
  With ``--sample-every N`` only every Nth subscriber checks each delivery (latency,
  duplicates, order) while the others count theirs unparsed, so that one generator core can
  take a million deliveries a second; missing is still counted over all.
- ``churn``: connect, join, leave, disconnect at ``--churn`` cycles/s; cycle percentiles.

The work is split over ``--procs`` processes (uvloop each); the run is bounded by the
scenario's size and ``--seconds`` plus a grace period, and talks to ``--url`` only (loopback by
default). It prints a progress bar and a summary table (with the load generator's own CPU, so
a saturated generator is visible), and writes ``--json`` and a ``--plot`` PNG (throughput and
latency percentiles over time).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import sys
import time
from pathlib import Path
from typing import Any

from loadtest.scenarios import PROBE_TIMEOUT_S, SCENARIOS, Plan, run_part
from loadtest.stats import Stats


def run(plan: Plan, progress: bool = True) -> Stats:
    """Run ``plan`` over ``plan.parts`` processes and merge what they measured."""
    if plan.parts == 1 and not progress:
        return run_part(plan, 0)
    context = multiprocessing.get_context("spawn")
    with context.Pool(plan.parts) as pool:
        pending = pool.starmap_async(run_part, [(plan, part) for part in range(plan.parts)])
        begin = time.time()
        total = max(1.0, plan.start_at - begin) + plan.seconds + plan.grace_s
        if plan.scenario == "connections":
            total += plan.connections / plan.ramp_per_s + PROBE_TIMEOUT_S
        while not pending.ready():
            pending.wait(0.5)
            elapsed = time.time() - begin
            if elapsed > total + 120:
                pool.terminate()
                raise TimeoutError(f"the load generator did not finish in {elapsed:.0f} s")
            if progress:
                _bar(min(1.0, elapsed / total), elapsed)
        if progress:
            sys.stderr.write("\n")
        merged = Stats()
        for stats in pending.get():
            merged.merge(stats)
    return merged


def _bar(done: float, elapsed: float) -> None:
    if not sys.stderr.isatty() and int(elapsed * 2) % 10:
        return  # a log, not a terminal: a line every 5 s
    width = 30
    filled = int(done * width)
    end = "\r" if sys.stderr.isatty() else "\n"
    sys.stderr.write(f"[{'#' * filled}{'.' * (width - filled)}] {done:4.0%} {elapsed:5.1f} s{end}")
    sys.stderr.flush()


def summarize(plan: Plan, stats: Stats) -> dict[str, Any]:
    """The figures of a run, as one flat dict."""
    c = stats.counters
    failures = {k.split(":", 1)[1]: v for k, v in c.items() if k.startswith("failed:")}
    result: dict[str, Any] = {"scenario": plan.scenario, "url": plan.url, "procs": plan.parts}
    if plan.scenario == "fanout":
        expected = sum(
            published * c.get(f"subscribers:{key.split(':', 1)[1]}", 0)
            for key, published in c.items()
            if key.startswith("published:")
        )
        result |= {
            "subscribers": plan.subscribers, "rooms": plan.rooms, "publishers": plan.publishers,
            "offered_deliveries_per_s": plan.rate * plan.subscribers / plan.rooms,
            # Over the sending phase, or until the last delivery if that came later.
            "deliveries_per_s": c["delivered"] / max(plan.seconds, stats.last_at - plan.start_at),
            "delivered": c["delivered"], "expected": expected,
            "missing": expected - c["delivered"],
            "duplicates": c["duplicates"], "out_of_order": c["out_of_order"],
            # Subscribers that checked each delivery for latency, duplicates and order.
            "checked_subscribers": c["checked_subscribers"],
            # Frames other than messages (errors, presence), by type.
            "other_frames": {k.split(":", 1)[1]: v for k, v in c.items() if k.startswith("other:")},
        }  # fmt: skip
    elif plan.scenario == "rtt":
        result |= {
            "clients": plan.clients, "offered_per_s": plan.rate or None,
            "messages_per_s": c["delivered"] / plan.seconds, "timeouts": c["timeouts"],
        }  # fmt: skip
    elif plan.scenario == "connections":
        connect_s = stats.last_at - plan.start_at
        result |= {
            "target": plan.connections, "connected": c["connected"], "alive": c["alive"],
            "closed": {k.split(":", 1)[1]: v for k, v in c.items() if k.startswith("closed:")},
            "retried_1013": c["retried_1013"], "retried_join": c["retried_join"],
            # From the first connect to the last socket's hello (and join).
            "connect_s": connect_s, "connects_per_s": c["connected"] / max(connect_s, 1e-9),
            "probe_answered": c["probe_answered"],
        }  # fmt: skip
        if plan.room_size:
            result |= {"room_size": plan.room_size, "probe_received": c["probe_received"]}
    elif plan.scenario == "churn":
        result |= {"offered_per_s": plan.churn_per_s, "cycles_per_s": c["cycles"] / plan.seconds}
    result |= {"failed": failures, **stats.latency.summary()}
    # Of one core, summed over the generator's processes: near 100 per process means the
    # generator, not the server, may be the limit.
    result["generator_cpu_percent"] = 100 * stats.cpu_s / stats.wall_s if stats.wall_s else None
    return result


def table(result: dict[str, Any]) -> str:
    width = max(len(k) for k in result)
    lines = []
    for key, value in result.items():
        shown = f"{value:,.2f}" if isinstance(value, float) and not math.isnan(value) else value
        lines.append(f"{key:<{width}}  {shown}")
    return "\n".join(lines)


def plot(plan: Plan, stats: Stats, path: Path) -> None:
    """Throughput and latency percentiles over time, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in stats.series.rows() if r["second"] >= 0]
    seconds = [r["second"] for r in rows]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True)
    top.plot(seconds, [r["count"] for r in rows], color="#2d5bd7")
    top.set_ylabel("per second")
    top.set_title(f"{plan.scenario} — {plan.url}")
    for key, color in (("p50_ms", "#1f8a4c"), ("p90_ms", "#b26b00"), ("p99_ms", "#b42318")):
        bottom.plot(seconds, [r.get(key, math.nan) for r in rows], label=key[:-3], color=color)
    bottom.set_ylabel("latency (ms)")
    bottom.set_xlabel("seconds")
    bottom.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument("--url", default="ws://127.0.0.1:8000/ws")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured phase (or hold)")
    parser.add_argument("--procs", type=int, default=1, help="load-generator processes")
    parser.add_argument("--subscribers", type=int, default=1000)
    parser.add_argument("--rooms", type=int, default=1)
    parser.add_argument("--publishers", type=int, default=1)
    parser.add_argument("--rate", type=float, default=None, help="fanout: msgs/s; rtt: sends/s")
    parser.add_argument(
        "--sample-every", type=int, default=1,
        help="fanout: every Nth subscriber checks each delivery, the rest count theirs",
    )  # fmt: skip
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--ramp", type=float, default=1000.0, help="connections: opens per s")
    parser.add_argument(
        "--room-size",
        type=int,
        default=0,
        help="connections: each socket joins a room of this many",
    )
    parser.add_argument(
        "--source-addresses",
        type=int,
        default=1,
        help="connections: connect from 127.0.0.1 .. 127.0.0.N",
    )
    parser.add_argument("--churn", type=float, default=50.0, help="churn: cycles per s")
    parser.add_argument("--setup", type=float, default=None, help="seconds before measuring")
    parser.add_argument("--grace", type=float, default=5.0, help="fanout: wait for stragglers")
    parser.add_argument("--json", type=Path, help="write the result (and series) here")
    parser.add_argument("--plot", type=Path, help="write a PNG plot here")
    parser.add_argument("--quiet", action="store_true", help="no progress bar, no table")
    return parser.parse_args(argv)


def plan_from(args: argparse.Namespace) -> Plan:
    setup = args.setup
    if setup is None:
        setup = 2.0 + (args.subscribers if args.scenario == "fanout" else args.clients) / 400
    rate = args.rate if args.rate is not None else (100.0 if args.scenario == "fanout" else 0.0)
    return Plan(
        scenario=args.scenario, url=args.url, seconds=args.seconds, parts=args.procs,
        subscribers=args.subscribers, rooms=args.rooms, publishers=args.publishers, rate=rate,
        clients=args.clients, connections=args.connections, ramp_per_s=args.ramp,
        room_size=args.room_size, source_addresses=args.source_addresses,
        sample_every=args.sample_every,
        churn_per_s=args.churn, start_at=time.time() + setup, grace_s=args.grace,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = plan_from(args)
    stats = run(plan, progress=not args.quiet)
    result = summarize(plan, stats)
    if not args.quiet:
        print(table(result))
    else:
        print(json.dumps(result, default=str))
    if args.json:
        args.json.write_text(json.dumps({**result, "series": stats.series.rows()}, indent=1))
    if args.plot:
        plot(plan, stats, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
