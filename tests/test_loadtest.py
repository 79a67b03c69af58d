"""Smoke runs of the load generator (``python -m loadtest``) and of ``make bench``'s harness:
every scenario, briefly, against a real server; the figures must add up."""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from loadtest import centrifugo
from loadtest.redis_ceiling import placement
from tests.helpers import make_settings, run_server
from tests.processes import ROOT, AppProcess


async def _loadtest(*args: str) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "loadtest", *args, "--quiet", cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    async with asyncio.timeout(90):
        out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return result


async def _module_json(module: str, *args: str, timeout_s: float) -> dict[str, Any]:
    """Run ``python -m module args`` and return the JSON it prints."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", module, *args, cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await _finished(proc, timeout_s)
    assert proc.returncode == 0, err.decode()
    result: dict[str, Any] = json.loads(out)
    return result


async def _finished(proc: asyncio.subprocess.Process, timeout_s: float) -> tuple[bytes, bytes]:
    """``proc``'s output once it exits; past ``timeout_s`` it is killed (a hung benchmark must
    fail its test, not hold the suite: the event loop waits for its children at the end)."""
    try:
        async with asyncio.timeout(timeout_s):
            return await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise


@pytest.fixture
async def app() -> Any:
    server = AppProcess(
        {"CHAT_RATE_LIMIT_FRAMES_PER_S": "100000", "CHAT_RATE_LIMIT_BURST": "100000"}
    )
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.mark.timeout(120)
async def test_every_scenario_runs_and_adds_up(app: AppProcess, tmp_path: Path) -> None:
    url = f"ws://127.0.0.1:{app.port}/ws"
    fanout = await _loadtest(
        "fanout", "--url", url, "--subscribers", "60", "--rooms", "2", "--publishers", "2",
        "--rate", "40", "--seconds", "2", "--procs", "2", "--setup", "2",
        "--json", str(tmp_path / "fanout.json"), "--plot", str(tmp_path / "fanout.png"),
    )  # fmt: skip
    assert fanout["expected"] == 40 * 2 * 30  # 80 messages, each room has 30 subscribers
    assert (fanout["missing"], fanout["duplicates"], fanout["out_of_order"]) == (0, 0, 0)
    assert fanout["p99_ms"] > 0 and fanout["generator_cpu_percent"] > 0
    assert fanout["checked_subscribers"] == 60
    assert json.loads((tmp_path / "fanout.json").read_text())["series"]
    assert (tmp_path / "fanout.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Every 4th subscriber checks each delivery; the others count theirs, and all must add up.
    sampled = await _loadtest(
        "fanout", "--url", url, "--subscribers", "60", "--rooms", "2", "--publishers", "2",
        "--rate", "40", "--seconds", "2", "--procs", "2", "--setup", "2", "--sample-every", "4",
    )  # fmt: skip
    assert sampled["checked_subscribers"] == 15 and sampled["expected"] == 40 * 2 * 30
    assert (sampled["missing"], sampled["duplicates"], sampled["out_of_order"]) == (0, 0, 0)
    assert sampled["p99_ms"] > 0

    rtt = await _loadtest("rtt", "--url", url, "--clients", "10", "--seconds", "2")
    assert rtt["messages_per_s"] > 100 and rtt["timeouts"] == 0 and rtt["failed"] == {}
    paced = await _loadtest(
        "rtt", "--url", url, "--clients", "10", "--rate", "200", "--seconds", "2"
    )
    assert 150 < paced["messages_per_s"] < 250

    held = await _loadtest(
        "connections", "--url", url, "--connections", "200", "--ramp", "400", "--seconds", "1"
    )
    assert (held["connected"], held["alive"], held["failed"]) == (200, 200, {})

    churn = await _loadtest("churn", "--url", url, "--churn", "40", "--seconds", "2")
    assert churn["cycles_per_s"] == pytest.approx(40, rel=0.1) and churn["failed"] == {}


@pytest.mark.timeout(180)
async def test_bench_harness_writes_the_report(tmp_path: Path) -> None:
    """``make bench``'s harness, tiny: fresh servers (Hubbub and the baseline), interleaved,
    a generated section in the report with ratios."""
    out = tmp_path / "benchmarks.md"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "loadtest.bench", "--smoke", "--only", "rtt-closed", "churn",
        "small-rooms", "--out", str(out), cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    async with asyncio.timeout(170):
        stdout, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    # Nothing recorded before: every row is new, and the verdict says so.
    printed = stdout.decode()
    assert printed.rstrip().endswith("VERDICT: no regression"), printed
    assert "| `rtt-closed` | hubbub | messages_per_s | n/a → " in printed
    text = out.read_text()
    assert "<!-- bench:begin" in text and "<!-- bench:end -->" in text
    assert "VERDICT: no regression" in text  # the verdict, in the generated section
    rows = [
        line for line in text.splitlines() if line.startswith("| rtt") or line.startswith("| churn")
    ]
    assert len(rows) == 4 and "\u00d7" in rows[0]  # a ratio
    raw = json.loads(out.with_suffix(".json").read_text())
    assert set(raw) == {"rtt-closed", "churn", "small-rooms"}
    assert set(raw["rtt-closed"]["results"]) == {"hubbub", "baseline"}
    assert raw["rtt-closed"]["args"][0] == "rtt"  # what makes a later run comparable
    # The small-rooms row also reads Hubbub's collector pauses under its traffic.
    (small,) = raw["small-rooms"]["results"]["hubbub"]
    assert small["gc_passes"] >= small["gc_over_10ms"] >= small["gc_over_25ms"] >= 0
    assert "gc_passes" not in raw["small-rooms"]["results"]["baseline"][0]
    # Each measurement says how much of a pinned core the host took while it ran; a smoke
    # run never measures again for it.
    for row in raw.values():
        for runs in row["results"].values():
            assert all(0.0 <= run["steal_percent"] <= 100.0 for run in runs)
            assert all(run["steal_retries"] == 0 for run in runs)


@pytest.mark.timeout(240)
async def test_bench_has_the_redis_and_join_rows(tmp_path: Path) -> None:
    """``make bench``'s rows of issue 34, tiny: Redis' CPU a message beside Centrifugo's, the
    worker's CPU a delivery beside the embedded broker's, a storm of clients joining through
    Redis; the rows of one shape share each server's run (measured once a round)."""
    out = tmp_path / "benchmarks.md"
    keys = ("redis-per-message-2", "delivery-redis-vs-embedded-2", "delivery-vs-centrifugo-2",
            "join-through-redis")  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "loadtest.bench", "--smoke", "--only", *keys, "--out", str(out),
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    async with asyncio.timeout(230):
        _, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    raw = json.loads(out.with_suffix(".json").read_text())
    assert set(raw) == set(keys)
    peer = ["centrifugo"] if centrifugo.available() else []
    assert raw["redis-per-message-2"]["servers"] == ["hubbub-redis", *peer]
    assert raw["delivery-redis-vs-embedded-2"]["servers"] == ["hubbub-redis", "hubbub"]
    for key in keys:
        row = raw[key]
        assert row["tool"] == "loadtest.peer_cost"
        for server, (run,) in row["results"].items():
            assert run["missing"] == 0, (key, server, run)
            assert run[row["metric"]] > 0, (key, server, run)
    # One hubbub-redis run in rooms of 2 serves its three rows; the join row has its own.
    (shared,) = raw["redis-per-message-2"]["results"]["hubbub-redis"]
    assert raw["delivery-redis-vs-embedded-2"]["results"]["hubbub-redis"] == [shared]
    assert raw["delivery-vs-centrifugo-2"]["results"]["hubbub-redis"] == [shared]
    assert err.decode().count("on hubbub-redis") == 2
    assert shared["room_size"] == 2 and shared["clients"] == 100
    (joins,) = raw["join-through-redis"]["results"]["hubbub-redis"]
    assert joins["clients"] == 300 and joins["room_size"] == 10
    text = out.read_text()
    assert text.count("python -m loadtest.peer_cost --target TARGET") == 2
    assert "300 clients connect, authenticate and join rooms of 10 through Redis" in text


def test_bench_ratio_is_the_median_of_the_rounds_ratios() -> None:
    """Each round's ratio pairs the two servers measured back to back in it; a slow round
    slows both, so it must not be set against another round's figure."""
    from loadtest.bench import _paired_ratio

    # Round 2 ran on a slow machine for both servers: its pair still says 0.5.
    assert _paired_ratio([10.0, 5.0, 12.0], [20.0, 10.0, 20.0]) == "**0.50\u00d7** [0.50\u20130.60]"
    assert _paired_ratio([10.0], [0.0]) == "\u2013"


async def test_gc_pause_benchmark_runs(tmp_path: Path) -> None:
    """``python -m loadtest.gc_pauses``, tiny: a fresh server, traffic, and the collector's
    pauses under it read from the server's metrics."""
    result = await _module_json(
        "loadtest.gc_pauses", "--subscribers", "90", "--rooms", "10", "--rate", "50",
        "--seconds", "2", "--setup", "4", timeout_s=90,
    )  # fmt: skip
    assert result["connections"] == 100
    assert result["generator"]["missing"] == 0 and result["generator"]["delivered"] > 0
    pauses = result["pauses_under_traffic"]
    assert any(name.startswith("hubbub_gc_pause_seconds_bucket") for name in pauses)
    assert all(value >= 0 for value in pauses.values())


@pytest.mark.timeout(150)
async def test_the_connection_hold_smoke() -> None:
    """``python -m loadtest.hold`` (``make bench-100k``), tiny: gunicorn with two workers and
    Redis, 600 sockets from two source addresses in rooms of 10, each probed after the hold."""
    result = await _module_json(
        "loadtest.hold", "--connections", "600", "--seconds", "3", "--ramp", "600",
        "--per-worker", "300", "--generator-sockets", "300", "--address-sockets", "300",
        timeout_s=120,
    )  # fmt: skip
    assert result["workers"] == 2 and result["workers_alive_at_the_end"] == 2
    assert result["generator_processes"] == result["source_addresses"] == 2
    assert result["open_sockets_at_the_end_of_the_hold"] == 600
    generated = result["generator"]
    assert generated["connected"] == generated["alive"] == 600, generated
    assert generated["probe_answered"] == generated["probe_received"] == 600, generated
    assert result["rss_kib_per_connection"] > 0


async def test_the_delivery_cost_smoke() -> None:
    """``python -m loadtest.delivery_cost``, tiny: every offered message reaches every member's
    transport in one write each (one message per room per loop iteration), and a cost comes
    out."""
    result = await _module_json(
        "loadtest.delivery_cost", "--rooms", "20", "--room-size", "5", "--rounds", "3",
        "--per-iteration", "20", timeout_s=60,
    )  # fmt: skip
    assert result["deliveries"] == result["writes"] == 20 * 5 * 3
    assert result["ns_per_delivery"] > 0


async def test_the_upkeep_cost_smoke() -> None:
    """``python -m loadtest.upkeep_cost``, small: a heartbeat tick pings its slice's
    connections only (2,100 over 1,024 slices: 2 or 3) and closes none heard from, every
    membership is counted, and each cost comes out."""
    result = await _module_json(
        "loadtest.upkeep_cost", "--connections", "2100", "--room-size", "3", "--repeat", "100",
        timeout_s=60,
    )  # fmt: skip
    assert result["slices"] == 1024, result
    assert result["memberships"] == 2100 and result["closed"] == 0, result
    assert result["pings_per_tick"] == {"min": 2, "max": 3}, result
    for cost in ("tick_ms", "snapshot_ms", "token_pass_ms", "token_chunk_ms"):
        assert result[cost] > 0, result
    assert result["token_chunk_ms"] <= result["token_pass_ms"]


async def test_the_redis_upkeep_smoke() -> None:
    """``python -m loadtest.redis_upkeep``, small: the presence upkeep makes one script call a
    room (refresh and sweep in one), the connection counts one a chunk of 100, every user is
    still present after the passes, and each cost comes out."""
    result = await _module_json(
        "loadtest.redis_upkeep", "--connections", "600", "--room-size", "3", "--repeat", "2",
        timeout_s=90,
    )  # fmt: skip
    assert result["rooms"] == 200, result
    assert result["presence"]["script_calls"] == 200, result
    assert result["connection_counts"]["script_calls"] == 6, result
    assert result["present_users"] == 600, result
    for upkeep in ("presence", "connection_counts"):
        assert result[upkeep]["cpu_ms"] > 0 and result[upkeep]["longest_hold_ms"] > 0, result


@pytest.mark.timeout(150)
async def test_the_sse_benchmark_smoke(tmp_path: Path) -> None:
    """``python -m loadtest.sse_bench`` (``make bench-sse``), tiny: each transport's fan-out
    delivers every message to every subscriber, its connections are all held, and the report
    compares the two."""
    out = tmp_path / "sse.json"
    await run_module(
        "loadtest.sse_bench", "--rounds", "1", "--subscribers", "20", "--rate", "20",
        "--seconds", "1", "--hold", "30", "--cases", "fanout,held", "--json", str(out),
        timeout=120,
    )  # fmt: skip
    result = json.loads(out.read_text())
    for transport in ("websocket", "sse"):
        (fanout,) = result["rows"]["fanout"][transport]
        assert 300 <= fanout["deliveries_per_s"] <= 500, fanout  # 20 msg/s x 20, all of them
        assert fanout["p99_ms"] is not None and fanout["server_cpu_percent"] > 0
        (held,) = result["rows"]["held"][transport]
        assert held["alive"] == 30, held
    assert "| fan-out at 20 msg/s | deliveries_per_s |" in result["report"]


@pytest.mark.timeout(150)
async def test_the_tracing_cost_benchmark_smoke(tmp_path: Path) -> None:
    """``python -m loadtest.tracing_cost`` (``make bench-tracing``), tiny: each setting (off,
    1 %, 100 % to a real Jaeger) carries messages, and the report compares them to off."""
    out = tmp_path / "tracing.json"
    await run_module(
        "loadtest.tracing_cost", "--rounds", "1", "--clients", "5", "--seconds", "1",
        "--json", str(out), timeout=120,
    )  # fmt: skip
    result = json.loads(out.read_text())
    for setting in ("off", "on-1%", "on-100%"):
        (run,) = result["results"][setting]
        assert run["messages_per_s"] > 0, run
        assert f"| {setting} |" in result["report"]


async def test_the_token_cost_benchmark_smoke(tmp_path: Path) -> None:
    """``python -m loadtest.token_cost``, tiny: both cases (every token checked, tokens
    remembered) let every client in twice and answer every history read (the tool fails on
    any refusal), with ES256 tokens, and a cost comes out for each phase."""
    out = tmp_path / "tokens.json"
    await run_module(
        "loadtest.token_cost", "--algorithm", "ES256", "--rounds", "1", "--clients", "30",
        "--requests", "30", "--json", str(out), timeout=90,
    )  # fmt: skip
    result = json.loads(out.read_text())
    assert result["algorithm"] == "ES256" and result["clients"] == 30
    for case in ("unremembered", "remembered"):
        (run,) = result["rounds"][case]
        assert set(run) == {"first", "again", "http"}, run
        assert all(cost > 0 for cost in run.values()), run


async def test_the_rejoin_cost_benchmark_smoke(tmp_path: Path) -> None:
    """``python -m loadtest.rejoin_cost``, tiny: in a storm of reconnects through Redis, every
    return is announced to the room without a grace, and none is with one."""
    out = tmp_path / "rejoin.json"
    await run_module(
        "loadtest.rejoin_cost", "--clients", "20", "--room-size", "5", "--concurrency", "5",
        "--grace-s", "0.5", "--rounds", "1", "--json", str(out), timeout=90,
    )  # fmt: skip
    result = json.loads(out.read_text())
    ((without,), (within,)) = result["rounds"].values()
    assert without["presence_frames_per_reconnect"] >= 5 - 1, without
    assert within["presence_frames_per_reconnect"] == 0, within
    # (the CPU figures of 20 reconnects are within /proc's 10 ms ticks: not checked here)


@pytest.mark.timeout(150)
async def test_the_moderation_cost_benchmark_smoke(tmp_path: Path) -> None:
    """``python -m loadtest.moderation_cost`` (``make bench-moderation``), tiny: messages flow
    with the hook off and on (on, each was accepted by the real endpoint: a failed hook
    rejects them by default, and none would come back), and the report compares them."""
    out = tmp_path / "moderation.json"
    await run_module(
        "loadtest.moderation_cost", "--rounds", "1", "--clients", "5", "--seconds", "1",
        "--json", str(out), timeout=120,
    )  # fmt: skip
    result = json.loads(out.read_text())
    for setting in ("off", "on"):
        (run,) = result["results"][setting]
        assert run["messages_per_s"] > 0, run
        assert f"| {setting} |" in result["report"]


@pytest.mark.timeout(150)
async def run_module(module: str, *args: str, timeout: float) -> None:
    """``python -m module args`` from the project root; fails the test unless it exits 0 in
    ``timeout`` seconds (its stderr in the message)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", module, *args, cwd=ROOT,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await _finished(proc, timeout)
    assert proc.returncode == 0, err.decode()


@pytest.mark.timeout(180)  # about a minute on the 2-core CI machine
async def test_the_archiving_benchmarks_smoke(tmp_path: Path) -> None:
    """``python -m loadtest.archive``, tiny: both archivers store every message once and a
    rate comes out; and ``make bench``'s store row (a PostgreSQL per measurement) runs."""
    out = tmp_path / "archive.json"
    await run_module(
        "loadtest.archive", "--messages", "3000", "--rooms", "30", "--batch", "500",
        "--json", str(out), timeout=60,
    )  # fmt: skip
    results = json.loads(out.read_text())
    assert [r["store"] for r in results] == ["postgresql", "sqlite (embedded)"]
    for result in results:
        assert result["stored_rows"] == result["messages"] == 3000, result
        assert result["messages_per_s"] > 0 and result["archiver_cpu_us_per_message"] > 0

    report = tmp_path / "benchmarks.md"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "loadtest.bench", "--smoke", "--only", "store-redis-rtt",
        "--out", str(report), cwd=ROOT,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    async with asyncio.timeout(80):
        _, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    raw = json.loads(report.with_suffix(".json").read_text())
    rows = raw["store-redis-rtt"]["results"]
    assert set(rows) == {"hubbub-redis-store", "hubbub-redis"}
    assert all(run["messages_per_s"] > 0 for runs in rows.values() for run in runs)


async def test_the_search_benchmark_smoke(tmp_path: Path) -> None:
    """``python -m loadtest.search``, tiny, on both databases: archiving rates with and
    without the index and search latencies come out."""
    out = tmp_path / "search.json"
    await run_module(
        "loadtest.search", "--messages", "3000", "--compare", "2000", "--queries", "20",
        "--repeats", "2", "--json", str(out), timeout=80,
    )  # fmt: skip
    results = json.loads(out.read_text())
    assert [r["database"] for r in results] == ["sqlite", "postgresql"]
    for result in results:
        assert result["archive_per_s"]["with_index"] > 0, result
        assert result["archive_per_s"]["without_index"] > 0, result
        assert all(len(runs) == 2 for runs in result["archive_runs_per_s"].values()), result
        low, high = result["archive_ratio_range"]
        assert 0 < low <= result["archive_ratio"] <= high, result
        assert 0 < result["p50_ms"] <= result["p95_ms"] <= result["p99_ms"], result


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("script", "env", "label"),
    [
        ("loadtest/lone_publisher.sh", {"SUBSCRIBERS": "50", "RATE": "50"}, "in flight"),
        ("loadtest/wait_cost.sh", {"CLIENTS": "10"}, "wait"),
    ],
)
async def test_redis_benchmark_scripts_run(
    script: str, env: dict[str, str], label: str, tmp_path: Path
) -> None:
    """The smoke version of loadtest/lone_publisher.sh and loadtest/wait_cost.sh: one round of
    2 s each way; each prints its two measurements, both with traffic."""
    proc = await asyncio.create_subprocess_exec(
        "bash", script, cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "ROUNDS": "1", "SECONDS_RUN": "2", "OUT": str(tmp_path), **env},
    )  # fmt: skip
    out, _ = await proc.communicate()
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text
    rows = [line for line in text.splitlines() if line.startswith("round 1 ")]
    assert len(rows) == 2 and all(f" {label} " in row for row in rows), text
    for row in rows:
        measured = ast.literal_eval(row[row.index("{") :])
        rate = measured.get("deliveries_per_s") or measured.get("messages_per_s")
        assert rate and rate > 0, text
        assert not measured.get("missing") and not measured.get("out_of_order"), text


@pytest.mark.timeout(120)
async def test_cluster_scale_benchmark_runs() -> None:
    """``python -m loadtest.cluster_scale``, tiny: 3 masters, 300 messages a second for 2 s,
    all published and delivered, each master's share of a core measured."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "loadtest.cluster_scale", "--masters", "3", "--rooms", "60",
        "--rate", "300", "--seconds", "2", cwd=ROOT, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await proc.communicate()
    assert proc.returncode == 0
    result = json.loads(out.decode().splitlines()[-1])
    assert result["masters"] == 3 and len(result["master_core_share"]) == 3
    assert result["failed"] == 0 and result["published_per_s"] > 200
    assert result["delivered_per_s"] > 200
    assert all(share >= 0 for share in result["master_core_share"])


@pytest.mark.timeout(180)
async def test_scale_benchmark_runs(tmp_path: Path) -> None:
    """``make bench-scale``'s script, tiny: W=1, 40 clients in rooms of 10 for 1 s, Hubbub
    (gunicorn on Redis) and, where the anchor is on this machine, Centrifugo: every run
    delivers, round trips and CPU shares are measured, the layout and the cores are said."""
    report_path = tmp_path / "scale.json"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "loadtest.scale", "--workers", "1", "--clients", "40",
        "--warm", "0.5", "--seconds", "1", "--json", str(report_path), cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await proc.communicate()
    assert proc.returncode == 0, out.decode(errors="replace")
    report = json.loads(report_path.read_text())
    assert report["machine_cores"] == len(os.sched_getaffinity(0))
    targets = {run["target"] for run in report["runs"]}
    assert "hubbub" in targets and (targets == {"hubbub", "centrifugo"}) == centrifugo.available()
    for run in report["runs"]:
        assert run["workers"] == 1 and run["clients"] == 40 and run["speedup"] == 1.0
        assert run["deliveries_per_s"] > 100, run
        assert 0 < run["round_trip_p50_ms"] <= run["round_trip_p99_ms"], run
        assert run["redis_core_share"] > 0 and run["server_core_share"] > 0, run
        assert 0 < run["busiest_generator_core_share"] <= 1.5, run
        assert run["cores"]["server"] and run["cores"]["redis"] and run["cores"]["generators"]
    assert "| hubbub | 1 |" in out.decode()


@pytest.mark.timeout(120)
async def test_scale_benchmark_offers_a_rate(tmp_path: Path) -> None:
    """``loadtest.scale --rate``: the writers send that many messages a second in all, whatever
    comes back (open loop), and the report says what was offered, sent and delivered."""
    report_path = tmp_path / "scale.json"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "loadtest.scale", "--workers", "1", "--clients", "40",
        "--room-size", "2", "--rate", "200", "--targets", "hubbub", "--warm", "0.5",
        "--seconds", "2", "--json", str(report_path), cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await proc.communicate()
    assert proc.returncode == 0, out.decode(errors="replace")
    report = json.loads(report_path.read_text())
    assert report["rate"] == 200 and report["room_size"] == 2
    (run,) = report["runs"]
    assert run["offered_per_s"] == 200, run
    assert 150 <= run["sent_per_s"] <= 250, run  # 20 writers, each every 0.1 s
    # Each message reaches both members of its room (the writer's own copy is its echo).
    assert 1.8 * run["sent_per_s"] <= run["deliveries_per_s"] <= 2.2 * run["sent_per_s"], run
    assert 0 < run["round_trip_p50_ms"] <= run["round_trip_p99_ms"], run
    assert f"| {run['messages_per_s']:,} (200) |" in out.decode()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("target", ["hubbub", "centrifugo"])
async def test_redis_ceiling_benchmark_replays_what_was_recorded(target: str) -> None:
    """``python -m loadtest.redis_ceiling``, tiny: 2,000 messages in 20 rooms of 3 members on
    4 listeners, recorded and replayed once. Every message is replayed and published (none a
    duplicate or over its quota), each reaches every listener serving its room and no other,
    the calls are grouped as recorded (Hubbub's 4 sends a loop pass merged into one call),
    and Redis' CPU is measured. Centrifugo's side runs where its anchor is on this machine."""
    if target == "centrifugo" and not centrifugo.available():
        pytest.skip("the Centrifugo anchor is not on this machine")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "loadtest.redis_ceiling", "--cases", f"{target}:4:1",
        "--rooms", "20", "--room-size", "3", "--workers", "4", "--messages", "2000",
        "--rounds", "1", "--connections", "2", cwd=ROOT, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await _finished(proc, 200)
    assert proc.returncode == 0, err.decode()
    *table, last = out.decode().strip().splitlines()
    report = json.loads(last)
    (result,) = report["cases"]
    assert result["case"] == f"{target}:4:1" and f"| {target} |" in table[-1], table
    (run,) = result["rounds"]
    assert run["messages"] == 2000 and run["refused"] == 0 and run["errors"] == 0, run
    # Each room had 100 messages, each pushed to the listeners serving the room: 1 to 3.
    served = placement(argparse.Namespace(rooms=20, room_size=3, workers=4))
    per_room = [sum(room in rooms for rooms in served) for room in range(20)]
    assert min(per_room) >= 1 and max(per_room) <= 3 and len(set(per_room)) > 1, per_room
    assert report["subscribers_per_room"] == round(sum(per_room) / 20, 2)
    assert run["deliveries_per_message"] == report["subscribers_per_room"], run
    # Hubbub merges a loop pass's sends into one script call; Centrifugo calls once each.
    assert result["recorded_calls"] == (500 if target == "hubbub" else 2000), result
    assert result["channels"] >= 20 and result["left_out"], result
    assert 0 < run["redis_core_share"] <= 1.1, run
    assert run["redis_us_per_message"] > 0 and run["messages_per_s"] > 0, run
    assert abs(run["ceiling_messages_per_s"] * run["redis_us_per_message"] / 1e6 - 1) < 0.01, run
    assert result["median"]["ceiling_messages_per_s"] == run["ceiling_messages_per_s"]


@pytest.mark.timeout(240)
async def test_redis_ceiling_benchmark_counts_instructions_under_callgrind() -> None:
    """``loadtest.redis_ceiling --callgrind``: the replaying Redis runs under callgrind, and
    its instructions a message are counted between the window's ends, every message replayed
    and published all the same."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "loadtest.redis_ceiling", "--cases", "hubbub:4:1,hubbub:1:1",
        "--rooms", "20", "--workers", "2", "--messages", "2000", "--rounds", "1",
        "--connections", "2", "--callgrind", cwd=ROOT, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await _finished(proc, 200)
    assert proc.returncode == 0, err.decode()
    *table, last = out.decode().strip().splitlines()
    result = json.loads(last)
    assert result["callgrind"] and "Redis instructions a message" in table[0], table
    merged, alone = result["cases"]
    for case in (merged, alone):
        (run,) = case["rounds"]
        assert run["messages"] == 2000 and run["refused"] == 0 and run["errors"] == 0, run
        assert 10_000 < run["redis_instructions_per_message"] < 1_000_000, run
        assert (
            case["median"]["redis_instructions_per_message"]
            == run["redis_instructions_per_message"]
        )
    # Four sends in one script call share its run's fixed work: fewer instructions each.
    assert (
        merged["median"]["redis_instructions_per_message"]
        < alone["median"]["redis_instructions_per_message"]
    ), result


@pytest.mark.timeout(120)
async def test_the_sdk_soak_runs_and_keeps_the_sdks_promises() -> None:
    """``python -m loadtest.sdk_soak`` (40 Python SDK clients in 4 rooms, 100 sends a second
    for 2 s) against a live server: every send acked, delivered to every member once and in
    order."""
    async with run_server(make_settings()) as live:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "loadtest.sdk_soak", "--url", live.ws_url(), "--clients", "40",
            "--rooms", "4", "--rate", "100", "--seconds", "2", cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, _ = await proc.communicate()
    result = json.loads(out.decode().splitlines()[-1])
    assert proc.returncode == 0, result
    assert result["acked"] == result["sent"] >= 150 and not result["refused"], result
    assert result["delivered"] == result["acked"] * 10, result  # rooms of 10
    assert result["missing"] == result["duplicates"] == result["out_of_order"] == 0, result
