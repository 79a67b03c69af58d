"""`python -m app` (what `make run` starts) serves a chat two clients can use."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2 as httpx
import orjson
import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.ops.gc_tuning import GC_THRESHOLDS, GC_THRESHOLDS_FREEZING
from tests.helpers import ChatClient, free_port, make_settings

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[str]:
    port = free_port()
    # As `make run` starts it: guests (CHAT_AUTH_MODE=guest), memory broker, one worker, an
    # SQLite store.
    env = {
        **os.environ,
        "CHAT_PORT": str(port),
        "CHAT_LOG_LEVEL": "warning",
        "CHAT_AUTH_MODE": "guest",
        "CHAT_DATABASE_URL": f"sqlite:///{tmp_path}/data/hubbub.db",
    }
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "app", cwd=ROOT, env=env)
    base = f"127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient() as http, asyncio.timeout(20):
            while True:
                assert proc.returncode is None, "server exited"
                try:
                    if (await http.get(f"http://{base}/readyz")).status_code == 200:
                        break
                except httpx.TransportError:
                    await asyncio.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        async with asyncio.timeout(15):
            # uvicorn shuts down gracefully, then re-raises SIGTERM so the exit shows the signal.
            assert await proc.wait() in (0, -signal.SIGTERM)


async def test_make_run_serves_chat(served: str) -> None:
    """Two websockets clients chat through the standalone server; health endpoints answer."""
    async with (
        ChatClient.connect(f"ws://{served}/ws?name=ann") as ann,
        ChatClient.connect(f"ws://{served}/ws?name=ben") as ben,
    ):
        assert (await ann.expect("inbox"))["conversations"] == []  # the store is there
        await ben.expect("inbox")
        await ann.join("lobby")
        await ben.join("lobby")
        await ann.say("lobby", "hello ben")
        assert (await ben.expect("message"))["text"] == "hello ben"
        await ben.say("lobby", "hello ann")
        got = [m["text"] for m in await ann.messages(2)]
        assert got == ["hello ben", "hello ann"]
    async with httpx.AsyncClient() as http:
        assert (await http.get(f"http://{served}/healthz")).json() == {"status": "ok"}
        ready = (await http.get(f"http://{served}/readyz")).json()
        assert ready["status"] == "ready"


def test_in_process_client() -> None:
    """The app also works under Starlette's TestClient (no server), readiness included."""
    with TestClient(create_app(make_settings())) as client:
        assert client.get("/readyz").status_code == 200
        with client.websocket_connect("/ws?name=tc") as ws:
            frames: list[dict[str, object]] = []

            def until(kind: str) -> dict[str, object]:
                while not any(f["type"] == kind for f in frames):
                    frames.extend(orjson.loads(line) for line in ws.receive_text().split("\n"))
                return next(f for f in frames if f["type"] == kind)

            assert until("hello")["user"] == "tc"
            ws.send_json({"type": "join", "room": "r"})
            assert until("joined")["room"] == "r"
            ws.send_json({"type": "send", "room": "r", "text": "hi", "cid": 1})
            assert until("ack")["id"] == until("message")["id"]
            kinds = [f["type"] for f in frames]
            assert kinds.index("message") < kinds.index("ack")


async def _healthcheck(port: int) -> int:
    env = {**os.environ, "CHAT_HOST": "0.0.0.0", "CHAT_PORT": str(port), "CHAT_AUTH_MODE": "guest"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "app.ops.healthcheck", cwd=ROOT, env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    async with asyncio.timeout(15):
        return await proc.wait()


async def test_docker_healthcheck_command(served: str) -> None:
    """The image's HEALTHCHECK (``python -m app.ops.healthcheck``) passes against a live server
    (asking 127.0.0.1 when the server binds 0.0.0.0) and fails where nothing listens."""
    assert await _healthcheck(int(served.rsplit(":", 1)[1])) == 0
    assert await _healthcheck(free_port()) == 1


async def test_make_run_serves_the_chat_page(served: str) -> None:
    """``/`` is the chat page, with its script and a strict Content-Security-Policy."""
    async with httpx.AsyncClient() as http:
        page = await http.get(f"http://{served}/")
        script = await http.get(f"http://{served}/static/hubbub.js")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<script type="module" src="/static/chat.js">' in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    assert script.text.startswith("// hubbub-client ") and "as HubbubClient" in script.text


@pytest.mark.parametrize(
    ("freeze_interval_s", "thresholds"), [(1.0, GC_THRESHOLDS_FREEZING), (0.0, GC_THRESHOLDS)]
)
def test_collector_is_tuned_and_watched_while_serving(
    freeze_interval_s: float, thresholds: tuple[int, int, int]
) -> None:
    """Startup objects are out of the cyclic collector's sight while the app serves (shorter
    full pauses), young collections are rarer (fewer full ones), middle ones all but never
    while survivors are frozen every interval, and every pause is observed by generation; all
    undone once the app has stopped."""
    gc.unfreeze()
    before = gc.get_threshold()
    app = create_app(make_settings(gc_freeze_interval_s=freeze_interval_s))
    with TestClient(app) as client:
        assert client.get("/healthz").status_code == 200
        assert gc.get_freeze_count() > 10_000  # the imported framework and the app's state
        assert gc.get_threshold() == thresholds
        assert thresholds[0] > 700 and (thresholds[1] > 100) == (freeze_interval_s > 0)
        metrics = app.state.chat.metrics
        count = {"generation": "2"}

        def full_pauses() -> float:
            return metrics.registry.get_sample_value("hubbub_gc_pause_seconds_count", count) or 0

        seen = full_pauses()
        gc.collect()
        deadline = time.monotonic() + 5  # published by the once-a-second metrics sync
        while full_pauses() < seen + 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert full_pauses() >= seen + 1
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == before
    pending = len(metrics.gc_pauses_since_sync)
    gc.collect()  # no longer recorded: the callback is gone
    assert len(metrics.gc_pauses_since_sync) == pending
