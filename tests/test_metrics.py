"""Metrics: what a scrape reports matches what happened, in one process and across gunicorn
workers; the metrics port; the JSON logs."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile

import httpx2 as httpx
import orjson
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.helpers import ChatClient, LiveServer, free_port
from tests.processes import AppProcess, RedisServer
from tests.prom import run_promtool, scrape, scrape_until


async def test_metrics_count_connections_frames_and_messages(server: LiveServer) -> None:
    url = f"{server.http_url}/metrics"
    before = await scrape(url)
    assert before.value("hubbub_connections") == 0
    assert before.value("hubbub_ready") == 1
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(ChatClient.connect(server.ws_url(f"m{n}")))
            for n in range(3)
        ]
        for client in clients:
            await client.join("metrics")
        for k in range(5):
            await clients[0].say("metrics", str(k))
        for client in clients:
            await client.messages(5)
        await clients[1].ws.send("{not json")
        assert (await clients[1].expect("error"))["code"] == "bad_json"
        await clients[1].ws.send(b"\x00binary")
        assert (await clients[1].expect("error"))["code"] == "binary_unsupported"

        live = await scrape_until(url, lambda s: s.value("hubbub_messages_delivered_total") >= 15)
        assert live.value("hubbub_connections") == 3
        assert live.value("hubbub_connections_opened_total") == 3
        assert live.value("hubbub_messages_published_total") == 5
        assert live.value("hubbub_messages_delivered_total") == 15  # 5 messages x 3 members
        assert live.value("hubbub_frames_received_total", type="send") == 5
        assert live.value("hubbub_frames_received_total", type="join") == 3
        assert live.value("hubbub_frames_received_total", type="invalid") == 1
        assert live.value("hubbub_frames_received_total", type="binary") == 1
        assert live.value("hubbub_error_frames_total", code="bad_json") == 1
        assert live.value("hubbub_error_frames_total", code="binary_unsupported") == 1
        assert live.value("hubbub_rooms") == 1
        assert live.value("hubbub_room_memberships") == 3
        assert live.value("hubbub_join_room_size_count") == 3
        assert live.value("hubbub_fanout_latency_seconds_count") >= 1
        assert live.value("hubbub_broker_publish_duration_seconds_count") >= 1
        assert live.value("hubbub_frames_sent_total") >= 1
        assert live.value("hubbub_worker_resident_memory_bytes") > 10_000_000
        await clients[2].ws.close(1001)

    after = await scrape_until(url, lambda s: s.value("hubbub_connections") == 0)
    assert after.value("hubbub_connections_closed_total", code="1001") == 1
    assert after.value("hubbub_connections_closed_total", code="1000") == 2
    assert after.value("hubbub_connections_closed_total") == 3
    assert after.value("hubbub_connection_duration_seconds_count") == 3
    assert after.value("hubbub_rooms") == 0


async def test_metrics_count_server_closes_by_code(server: LiveServer) -> None:
    """A policy close (invalid name) and a heartbeat-style server close show up by code; an
    unknown client code counts as ``other`` (label values stay a fixed set)."""
    async with connect(server.ws_url("bad!name")) as ws:
        with pytest.raises(ConnectionClosed):
            await ws.recv()
        assert ws.close_code == 1008
    async with ChatClient.connect(server.ws_url("odd")) as client:
        await client.ws.close(4321)
    result = await scrape_until(
        f"{server.http_url}/metrics",
        lambda s: s.value("hubbub_connections_closed_total", code="other") == 1,
    )
    assert result.value("hubbub_connections_closed_total", code="1008") == 1
    assert {labels["code"] for labels in result.series("hubbub_connections_closed_total")} >= {
        "1000", "1008", "1012", "4008", "4009", "other",
    }  # fmt: skip


async def test_http_requests_are_instrumented(server: LiveServer) -> None:
    # An unused room's history is 404 for anyone (issue 33): say something in it first.
    async with ChatClient.connect(server.ws_url("writer")) as client:
        await client.join("r1")
        await client.say("r1", "hello")
        await client.messages_until("hello")
    async with httpx.AsyncClient() as http:
        assert (await http.get(f"{server.http_url}/rooms/r1/messages")).status_code == 200
    result = await scrape(f"{server.http_url}/metrics")
    assert result.value("http_requests_total", handler="/rooms/{room}/messages") == 1
    assert not result.series("hubbub_messages_published_total")[0]  # no labels at all


async def test_metrics_port_serves_only_metrics_and_logs_are_json() -> None:
    """With CHAT_METRICS_PORT the scrape is on that port only; the main port has no
    /metrics. Each connection logs one JSON line when it opens and one when it closes, and
    no more: uvicorn's and websockets' own lines for it are dropped."""
    metrics_port = free_port()
    app = AppProcess({"CHAT_METRICS_PORT": str(metrics_port), "CHAT_LOG_FORMAT": "json"})
    await app.start()
    try:
        metrics_url = f"http://127.0.0.1:{metrics_port}"
        async with ChatClient.connect(app.ws_url("logged")) as client:
            await client.join("lobby")
            await client.join("hall")
        result = await scrape_until(
            f"{metrics_url}/metrics", lambda s: s.value("hubbub_connections_closed_total") == 1
        )
        async with httpx.AsyncClient() as http:
            assert (await http.get(f"{app.http_url}/metrics")).status_code == 404
            assert (await http.get(f"{metrics_url}/readyz")).status_code == 404
            assert (await http.post(f"{metrics_url}/metrics")).status_code == 405
        with pytest.raises(InvalidStatus) as refused:
            async with connect(f"ws://127.0.0.1:{metrics_port}/ws?name=x", open_timeout=5):
                pass
        assert refused.value.response.status_code == 403

        # The exposition follows Prometheus' naming rules.
        await run_promtool("check", "metrics", stdin=result.text)

        lines = [orjson.loads(line) for line in app.output().splitlines() if line.strip()]
        events = [line for line in lines if line.get("logger") == "app.sockets.session"]
        opened = [e for e in events if e["msg"] == "connection opened"]
        closed = [e for e in events if e["msg"] == "connection closed"]
        assert len(opened) == len(closed) == 1, events
        assert closed[0]["conn"] == opened[0]["conn"]
        assert closed[0] | {"ts": "", "duration_s": 0} == {
            "ts": "", "level": "info", "logger": "app.sockets.session", "msg": "connection closed",
            "conn": opened[0]["conn"], "user": "logged", "rooms": 2, "code": 1000,
            "by": "client", "duration_s": 0,
        }  # fmt: skip
        assert not any("lobby" in str(line) and "text" in line for line in lines)
        echoes = [
            line["msg"]
            for line in lines
            if line.get("logger") == "uvicorn.error"
            and (
                "name=logged" in line["msg"]
                or line["msg"] in ("connection open", "connection closed")
            )
        ]
        assert echoes == []
    finally:
        await app.stop()


def _stale_metrics(directory: str) -> None:
    """Leave a counter file behind, as a previous gunicorn would."""
    code = (
        "from prometheus_client import Counter\n"
        "Counter('hubbub_messages_published_total', 'x').inc(1000)\n"
    )
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": directory}
    subprocess.run([sys.executable, "-c", code], env=env, check=True)


async def test_gunicorn_metrics_add_up_over_workers(redis_server: RedisServer) -> None:
    """Gunicorn, 2 workers, real Redis: a scrape (whichever worker answers it) counts every
    worker's connections and messages; a SIGKILLed worker's connections leave the gauge; the
    metrics of an earlier run are wiped at start."""
    metrics_dir = tempfile.mkdtemp(prefix="hubbub-test-metrics-")
    _stale_metrics(metrics_dir)
    metrics_port = free_port()
    app = AppProcess(
        {
            "CHAT_REDIS_URL": redis_server.url,
            "CHAT_METRICS_PORT": str(metrics_port),
            "PROMETHEUS_MULTIPROC_DIR": metrics_dir,
        },
        gunicorn_workers=2,
    )
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    await app.start()
    try:
        assert (await scrape(url)).value("hubbub_messages_published_total") == 0
        async with contextlib.AsyncExitStack() as stack:
            clients: list[ChatClient] = []
            # Open in concurrent bursts until both workers hold connections.
            async with asyncio.timeout(20):
                while len({c.hello["node"] for c in clients}) < 2:
                    burst = [
                        ChatClient.connect(app.ws_url(f"w{len(clients) + n}")) for n in range(10)
                    ]
                    clients += await asyncio.gather(*map(stack.enter_async_context, burst))
            total = len(clients)
            for client in clients:
                await client.join("all")
            for k in range(4):
                await clients[k % 2].say("all", str(k))
            for client in clients:
                await client.messages(4)
            result = await scrape_until(
                url, lambda s: s.value("hubbub_messages_delivered_total") == 4 * total
            )
            assert result.value("hubbub_connections") == total
            assert result.value("hubbub_messages_published_total") == 4
            assert result.value("hubbub_connections_opened_total") == total
            pids = {labels["pid"] for labels in result.series("hubbub_worker_cpu_seconds")}
            assert len(pids) == 2  # one series per live worker
            assert result.value("hubbub_broker_connected") == 2

            victim = clients[0].hello["node"]
            survivors = sum(1 for c in clients if c.hello["node"] != victim)
            os.kill(int(victim.rsplit(":", 1)[1]), signal.SIGKILL)
            result = await scrape_until(
                url, lambda s: s.value("hubbub_connections") == survivors, timeout=15
            )
            # Counters keep the dead worker's share: they never go backwards.
            assert result.value("hubbub_messages_published_total") == 4
            assert victim.rsplit(":", 1)[1] not in {
                labels["pid"] for labels in result.series("hubbub_worker_cpu_seconds")
            }
        await scrape_until(url, lambda s: s.value("hubbub_connections") == 0)
    finally:
        await app.stop()
        shutil.rmtree(metrics_dir, ignore_errors=True)
