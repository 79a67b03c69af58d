"""nginx/nginx.conf, for real: ``nginx -t`` on the file as shipped, then nginx (this file, with
loopback addresses) in front of gunicorn (2 workers) and redis-server."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2 as httpx
import orjson
import pytest
from fastapi.routing import APIRoute
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from app.main import create_app
from app.settings import load_settings
from app.web import files, page
from app.web.page import STATIC_DIR
from tests.helpers import ChatClient
from tests.processes import NGINX_CONF, AppProcess, NginxServer, RedisServer, upstream_client_ports

# Short versions of the production timings, so the tests see them act within seconds.
# Pings every second (nginx's read timeout is cut to 3 s); a pong may take up to 0.9 s to come
# back through nginx on a loaded machine (0.5 s closed a socket with 4009 in a fresh-machine run).
HEARTBEAT = {"CHAT_HEARTBEAT_INTERVAL_S": "1", "CHAT_HEARTBEAT_TIMEOUT_S": "0.9"}
SHORT_READ_TIMEOUT = {"proxy_read_timeout 120s;": "proxy_read_timeout 3s;"}


@dataclass
class Stack:
    nginx: NginxServer
    app: AppProcess


@contextlib.asynccontextmanager
async def stack(redis: RedisServer, env: dict[str, str], workers: int = 2) -> AsyncIterator[Stack]:
    app = AppProcess({"CHAT_REDIS_URL": redis.url, **env}, gunicorn_workers=workers)
    await app.start()
    nginx = NginxServer(f"127.0.0.1:{app.port}", SHORT_READ_TIMEOUT)
    try:
        await nginx.start()
        yield Stack(nginx, app)
    finally:
        await nginx.stop()
        await app.stop()


async def test_nginx_accepts_the_shipped_config() -> None:
    """``nginx -t`` on nginx/nginx.conf as shipped, but for the compose service name "app",
    which nginx must resolve while parsing (it becomes 127.0.0.1): no error, no warning."""
    nginx = NginxServer("127.0.0.1:8000", {})
    try:
        output = nginx.dir / "output"  # a file: nginx opens /dev/stdout, which a pipe may not be
        with output.open("wb") as out:
            proc = await asyncio.create_subprocess_exec(
                *nginx.command("-t"), stdout=out, stderr=out
            )
        async with asyncio.timeout(20):
            await proc.wait()
        text = output.read_text() + nginx.output()
        assert proc.returncode == 0, text
        assert "test is successful" in text
        assert "[warn]" not in text and "[emerg]" not in text, text
        # Only the two addresses differ from the shipped file.
        shipped, tested = NGINX_CONF.read_text().splitlines(), nginx.conf.read_text().splitlines()
        changed = [(a.strip(), b.strip()) for a, b in zip(shipped, tested, strict=True) if a != b]
        assert sorted(line for line, _ in changed) == [
            "listen 8080 backlog=4096;",
            "server app:8000 max_fails=3 fail_timeout=10s;",
        ]
    finally:
        shutil.rmtree(nginx.dir, ignore_errors=True)


async def test_chat_through_nginx(redis_server: RedisServer) -> None:
    """WebSocket upgrade and chat through nginx; HTTP routes proxied; /metrics, /admin/ and
    /api/ not exposed (test_nginx_proxies_only_what_the_chat_page_uses has the whole list)."""
    async with stack(redis_server, {}) as s:
        async with (
            ChatClient.connect(s.nginx.ws_url("ann")) as ann,
            ChatClient.connect(s.nginx.ws_url("bob")) as bob,
        ):
            await ann.join("proxied")
            await bob.join("proxied")
            await ann.say("proxied", "through nginx", cid="c1")
            own = [await ann.next_frame() for _ in range(2)]  # its ack and its message
            assert sorted(frame["type"] for frame in own) == ["ack", "message"]
            assert (await bob.expect("message"))["text"] == "through nginx"
        async with httpx.AsyncClient() as http:
            history = await http.get(f"{s.nginx.http_url}/rooms/proxied/messages")
            assert [m["text"] for m in history.json()["messages"]] == ["through nginx"]
            assert (await http.get(f"{s.nginx.http_url}/metrics")).status_code == 404
            assert (await http.post(f"{s.nginx.http_url}/admin/users/x/kick")).status_code == 404
            assert (await http.post(f"{s.nginx.http_url}/api/v1/rooms")).status_code == 404
        # The app sees the browser's Host through the proxy: its own page may connect, a
        # foreign one may not.
        same_site = f"http://127.0.0.1:{s.nginx.port}"
        async with ChatClient.connect(s.nginx.ws_url("page"), origin=same_site) as page:
            assert await page.is_responsive()
        with pytest.raises(InvalidStatus) as refused:
            async with connect(s.nginx.ws_url("evil"), origin="https://evil.example"):  # type: ignore[arg-type]
                pass
        assert refused.value.response.status_code == 403
        statuses = {line["status"] for line in s.nginx.access_log()}
        assert 101 in statuses and 200 in statuses  # one JSON line per request and socket


async def _upstream_connections_for(nginx: NginxServer, upstream_port: int, requests: int) -> int:
    """TCP connections nginx opened to the app while serving ``requests`` HTTP requests, each
    arriving on a new client connection."""
    before = upstream_client_ports(upstream_port)
    for _ in range(requests):
        async with httpx.AsyncClient() as http:
            assert (await http.get(f"{nginx.http_url}/")).status_code == 200
    return len(upstream_client_ports(upstream_port) - before)


async def test_nginx_reuses_upstream_connections(redis_server: RedisServer) -> None:
    """200 HTTP requests through nginx reach the app over a handful of kept-alive upstream
    connections (counted in the kernel's socket table); the same config without its
    ``keepalive`` line opens one per request — the count is a real measurement."""
    async with stack(redis_server, {}) as s:
        assert 1 <= await _upstream_connections_for(s.nginx, s.app.port, 200) <= 8
        without = NginxServer(f"127.0.0.1:{s.app.port}", {"keepalive 64;": ""})
        await without.start()
        try:
            # One per request, less the few whose port was one still in TIME_WAIT (Linux
            # reuses those on loopback: tcp_tw_reuse=2), which the table already held.
            assert 40 <= await _upstream_connections_for(without, s.app.port, 50) <= 50
        finally:
            await without.stop()


async def _idle(client: ChatClient, seconds: float) -> int:
    """Stay idle for ``seconds``, answering the server's pings; returns the pings seen."""
    pings = 0
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while (left := deadline - loop.time()) > 0:
        try:
            frame = await client.next_frame(timeout=left, skip=())
        except TimeoutError:
            break
        if frame["type"] == "ping":
            pings += 1
            await client.send({"type": "pong"})
    return pings


async def test_idle_socket_outlives_the_proxy_read_timeout(redis_server: RedisServer) -> None:
    """With nginx's read timeout cut to 3 s, an idle chat socket stays open for 8 s: the
    server's heartbeats (every second here) keep traffic flowing through the proxy."""
    async with stack(redis_server, HEARTBEAT) as s:
        async with ChatClient.connect(s.nginx.ws_url("idle")) as client:
            await client.join("quiet")
            pings = await _idle(client, 8)
            assert pings >= 5
            assert await client.is_responsive()


async def test_without_heartbeats_the_proxy_cuts_idle_sockets(redis_server: RedisServer) -> None:
    """The control for the test above: with heartbeats far apart, nginx's 3 s read timeout
    does close an idle socket — so the timeout is real and the heartbeat is what saves it."""
    # Pings a slice of the sockets every interval / slices.SLICES: every 84 s, none here.
    slow = {"CHAT_HEARTBEAT_INTERVAL_S": "86400", "CHAT_HEARTBEAT_TIMEOUT_S": "10"}
    async with stack(redis_server, slow, workers=1) as s:
        async with connect(s.nginx.ws_url("idle"), open_timeout=5) as ws:
            await ws.recv()  # hello
            loop = asyncio.get_running_loop()
            started = loop.time()
            with pytest.raises(ConnectionClosed):
                async with asyncio.timeout(10):
                    while True:
                        await ws.recv()
            assert 2.5 < loop.time() - started < 6


async def test_client_address_comes_from_the_trusted_proxy_only(redis_server: RedisServer) -> None:
    """Through nginx (a trusted proxy) the app logs the real client's address; a client
    talking to the app directly cannot pretend to be someone else with X-Forwarded-For."""
    async with stack(redis_server, {"CHAT_TRUSTED_PROXIES": "127.0.0.1"}) as s:
        async with ChatClient.connect(s.nginx.ws_url("viaproxy"), local_addr=("127.0.0.2", 0)):
            pass
        headers = {"X-Forwarded-For": "203.0.113.7"}
        async with ChatClient.connect(
            s.app.ws_url("direct"), local_addr=("127.0.0.3", 0), additional_headers=headers
        ):
            pass

        def address_of(user: str) -> str | None:
            for line in s.app.output().splitlines():
                if line.startswith("{"):
                    event = orjson.loads(line)
                    if event.get("msg") == "connection opened" and event.get("user") == user:
                        return str(event["ip"])
            return None

        async with asyncio.timeout(5):
            while address_of("direct") is None:
                await asyncio.sleep(0.05)
        assert address_of("viaproxy") == "127.0.0.2"
        assert address_of("direct") == "127.0.0.3"


# What the chat page uses (app/static, app/web/page.py, app/web/api.py), proxied to the app; and the
# routes of operators and backends, on the app's port only. Every route of the app is one or
# the other (checked below): a new route fails here until nginx is decided for it.
PAGE_ROUTES = {
    "/", "/rooms/{room}/messages", "/dms/{peer}/messages", "/inbox", "/search", "/files/{key}",
    "/mentions", "/static/sw.js", "/me/hidden", "/me/muted/{user}", "/me/blocked/{user}",
}  # fmt: skip
INTERNAL_ROUTES = {"/healthz", "/readyz", "/openapi.json", "/redoc"}  # + /admin/, /api/v1/
# Through nginx: 404, whatever the app would answer.
REFUSED = [
    "/openapi.json", "/docs", "/docs/", "/redoc", "/docs/oauth2-redirect", "/healthz",
    "/readyz", "/metrics", "/admin", "/admin/", "/admin/users/troll/ban", "/api/",
    "/api/v1/rooms", "/api/v1/users/ada/messages", "/index.html", "/staticx", "/wsx",
    "/ws/x", "/roomsx", "/inbox/x", "/search/x", "/searchx", "/mentions/x", "/mentionsx",
    "/dmsx", "/HEALTHZ", "/openapi.json/", "/mex",
]  # fmt: skip
# Requests whose raw path an app could read differently from nginx: none reaches a route
# nginx refuses.
RAW_TRICKS = [
    "/rooms/../openapi.json", "/static/%2e%2e/openapi.json", "/rooms/..%2fhealthz",
    "/rooms/x/..%2F..%2Fopenapi.json", "//openapi.json", "/%2fopenapi.json",
    "/static/..;/readyz", "/rooms/%2e%2e/%2e%2e/admin/users/troll/ban", "/./healthz",
]  # fmt: skip


async def _raw_get(port: int, target: str) -> tuple[int, bytes]:
    """GET ``target`` exactly as written (an HTTP client would normalise it): the status and
    the body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {target} HTTP/1.1\r\nHost: chat\r\nConnection: close\r\n\r\n".encode())
        async with asyncio.timeout(5):
            response = await reader.read()
    finally:
        writer.close()
    head, _, body = response.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


async def test_nginx_proxies_only_what_the_chat_page_uses(redis_server: RedisServer) -> None:
    """Through nginx the page, its static files, the socket, room history, DM history and the
    inbox answer what the app answers; the API schema and its pages, the probes, the metrics,
    the moderation and backend APIs get nginx's 404, though the app serves them on its own
    port (where the orchestrator's probes and the operators go)."""
    tokens = {"CHAT_ADMIN_TOKEN": "ad" * 32, "CHAT_SERVICE_TOKEN": "5e" * 32}
    async with stack(redis_server, tokens, workers=1) as s:
        app = create_app(load_settings(auth_mode="guest"))
        routes = set(app.openapi()["paths"]) | {app.openapi_url, app.docs_url, app.redoc_url}
        routes |= {route.path for route in page.router.routes if isinstance(route, APIRoute)}
        routes |= {route.path for route in files.router.routes if isinstance(route, APIRoute)}
        routes = {r for r in routes if r is not None and not r.startswith("/api/v1/")}
        assert routes == PAGE_ROUTES | INTERNAL_ROUTES, "decide nginx's answer for a new route"

        async with ChatClient.connect(s.nginx.ws_url("ann")) as ann:
            await ann.join("lobby")
            await ann.say("lobby", "hello", cid="c1")
            await ann.expect("message")
        routed = ["/", "/rooms/lobby/messages", "/dms/bob/messages", "/inbox", "/search?q=x"]
        routed += ["/mentions", "/me/hidden"]
        routed += ["/files/abcdefghijklmnopqrstuv?exp=1&sig=x"]  # 404 here: no store
        routed += [f"/static/{f.name}" for f in STATIC_DIR.iterdir()]
        async with httpx.AsyncClient() as http:
            for path in routed:
                direct = await http.get(f"{s.app.http_url}{path}")
                proxied = await http.get(f"{s.nginx.http_url}{path}")
                assert (proxied.status_code, proxied.content) == (
                    direct.status_code, direct.content,
                ), path  # fmt: skip
            history = await http.get(f"{s.nginx.http_url}/rooms/lobby/messages")
            assert [m["text"] for m in history.json()["messages"]] == ["hello"]
            assert (await http.get(f"{s.nginx.http_url}/")).text.startswith("<!doctype html>")

            # The app serves these (to the network inside), nginx does not.
            served = {"/openapi.json": 200, "/redoc": 200, "/healthz": 200, "/readyz": 200}
            for path, status in served.items():
                assert (await http.get(f"{s.app.http_url}{path}")).status_code == status, path
            assert (await http.post(f"{s.app.http_url}/admin/users/x/kick")).status_code == 401
            assert (await http.post(f"{s.app.http_url}/api/v1/rooms")).status_code == 401
            for path in REFUSED:
                for method in ("GET", "POST", "HEAD"):
                    response = await http.request(method, f"{s.nginx.http_url}{path}")
                    assert response.status_code == 404, (method, path)
                    assert b"openapi" not in response.content and b"{" not in response.content
        for target in RAW_TRICKS:
            status, body = await _raw_get(s.nginx.port, target)
            assert status in (400, 404), (target, status, body[:200])
            assert b"openapi" not in body and b"status" not in body, target


async def test_files_stream_through_nginx_to_every_worker(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """With local file storage behind nginx and two gunicorn workers: a 3 MB upload (far above
    the 64k body limit of the other routes) streams through to whichever worker nginx picks,
    and a link made by one worker is served by any (the workers share the URL secret)."""
    data = os.urandom(3 * 1024 * 1024)
    env = {"CHAT_DATABASE_URL": f"sqlite:///{tmp_path}/chat.db"}
    async with stack(redis_server, env, workers=2) as s:
        async with ChatClient.connect(s.nginx.ws_url("ann")) as ann:
            await ann.expect("inbox")  # with a store, after hello
            await ann.join("lobby")
            asked = {"type": "upload", "room": "lobby", "name": "big.bin", "size": len(data)}
            await ann.send(asked)
            target = await ann.expect("upload")
            async with httpx.AsyncClient(timeout=30) as http:
                stored = await http.put(f"{s.nginx.http_url}{target['url']}", content=data)
                assert stored.status_code == 201, stored.text
                await ann.say("lobby", "", attachments=[target["file"]], cid="f")
                got: dict[str, Any] = {}
                while set(got) != {"ack", "message"}:
                    frame = await ann.next_frame()
                    got[frame["type"]] = frame
                assert got["message"]["attachments"][0]["size"] == len(data)
                for _ in range(4):  # least_conn spreads them over both workers
                    await ann.send({"type": "file", "id": target["file"]})
                    link = await ann.expect("file")
                    served = await http.get(f"{s.nginx.http_url}{link['url']}")
                    assert served.status_code == 200 and served.content == data
