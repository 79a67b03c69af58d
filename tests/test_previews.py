"""Link previews (docs/protocol.md, "Link previews"; app.previews) against a hostile site on
loopback: a page's Open Graph title, description and image (re-encoded, served from this
server's file storage, never hot-linked) — and every trick of Synapse's advisories
(CVE-2022-31052, GHSA-98px-6486-j7qc) refused: a redirect to a private, loopback, link-local
(cloud metadata) or IPv6 loopback address, a host name that resolves to loopback, a huge
body, a slow drip, a wrong content type, an image that is not one, a redirect loop. The
site is let in by the test-only setting (``CHAT_PREVIEW_TEST_PUBLIC_ADDRESSES``), for its
own ``ip:port`` only."""

from __future__ import annotations

import asyncio
import contextlib
import io
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from PIL import Image
from starlette.types import Receive, Scope, Send

from app.previews.fetcher import is_public
from tests.helpers import free_port, make_settings, run_server, serving
from tests.test_durable import connected
from tests.test_rooms import answer

pytestmark = pytest.mark.timeout(120)


def png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (640, 480), (200, 30, 30)).save(out, "PNG")
    return out.getvalue()


class HostileSite:
    """Serves a good page, and every way a page can try to abuse a preview fetcher."""

    def __init__(self) -> None:
        self.port = free_port()
        self.app_port = 0  # the chat server's, once it runs: a target it must not reach
        self.requests: list[str] = []

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        self.requests.append(path)
        html = b"text/html; charset=utf-8"
        redirects = {
            "/to-private": "http://10.0.0.1/",
            "/to-metadata": "http://169.254.169.254/latest/meta-data/",
            "/to-app": f"http://127.0.0.1:{self.app_port}/metrics",
            "/to-ipv6-loopback": f"http://[::1]:{self.port}/page",
            "/to-localhost": f"http://localhost:{self.app_port}/metrics",
            "/loop": "/loop",
            "/to-page": "/page",
        }
        if path in redirects:
            await _answer(send, 302, b"text/plain", b"", [(b"location", redirects[path].encode())])
        elif path == "/page":
            body = (
                b"<html><head><title>Fallback</title>"
                b'<meta property="og:title" content="A &amp; B &lt;b&gt;news&lt;/b&gt;">'
                b'<meta property="og:description" content="What   happened today.">'
                b'<meta property="og:site_name" content="Example">'
                b'<meta property="og:image" content="/image.png"></head><body>hi</body></html>'
            )
            await _answer(send, 200, html, body)
        elif path == "/fake-image-page":
            body = b'<html><head><title>Fake</title><meta property="og:image" content="/fake.png">'
            await _answer(send, 200, html, body)
        elif path == "/image.png":
            await _answer(send, 200, b"image/png", png())
        elif path == "/fake.png":
            await _answer(send, 200, b"image/png", b"<html><script>alert(1)</script></html>")
        elif path == "/json":
            await _answer(send, 200, b"application/json", b'{"title": "no"}')
        elif path == "/huge":
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", html)]})  # fmt: skip
            chunk = b"<p>" + b"x" * 65_536
            for _ in range(200):  # 13 MB, no Content-Length
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        elif path == "/drip":
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", html)]})  # fmt: skip
            with contextlib.suppress(Exception):
                for _ in range(10):  # 3 s: past the fetcher's 2 s
                    await send({"type": "http.response.body", "body": b"<", "more_body": True})
                    await asyncio.sleep(0.3)
                await send({"type": "http.response.body", "body": b""})
        else:
            await _answer(send, 404, b"text/plain", b"")


async def _answer(
    send: Send, status: int, content_type: bytes, body: bytes,
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:  # fmt: skip
    headers = [(b"content-type", content_type), *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@contextlib.asynccontextmanager
async def hostile_site() -> AsyncIterator[HostileSite]:
    site = HostileSite()
    async with serving(site, site.port, log_level="warning", lifespan="off"):
        yield site


def preview_settings(tmp_path: Path, site: HostileSite, **overrides: Any) -> Any:
    return make_settings(
        database_url=f"sqlite:///{tmp_path}/chat.db",
        preview_test_public_addresses=[f"127.0.0.1:{site.port}"],
        preview_timeout_s=2.0, preview_page_max_bytes=200_000, **overrides,
    )  # fmt: skip


async def test_a_page_is_previewed_with_its_image_served_from_here(tmp_path: Path) -> None:
    async with (
        hostile_site() as site,
        run_server(preview_settings(tmp_path, site)) as live,
        connected(live.ws_url("ada")) as ada,
        httpx.AsyncClient() as http,
    ):
        got = await answer(ada, {"type": "preview", "url": site.url("/to-page")}, "preview")
        assert (got["title"], got["description"], got["site"]) == (
            "A & B <b>news</b>", "What happened today.", "Example",
        )  # fmt: skip
        image = got["image"]
        assert (image["width"], image["height"]) == (640, 480)
        assert image["url"].startswith("/files/")  # this server's own (local storage)
        served = await http.get(live.http_url + image["url"])
        assert served.status_code == 200 and served.headers["content-type"] == "image/webp"
        assert Image.open(io.BytesIO(served.content)).size == (320, 240)
        asked = len(site.requests)
        again = await answer(ada, {"type": "preview", "url": site.url("/to-page")}, "preview")
        assert again["title"] == got["title"] and len(site.requests) == asked  # cached


async def test_every_trick_of_a_hostile_site_is_refused(tmp_path: Path) -> None:
    async with (
        hostile_site() as site,
        run_server(preview_settings(tmp_path, site)) as live,
        connected(live.ws_url("ada")) as ada,
    ):
        site.app_port = int(live.http_url.rsplit(":", 1)[1])
        refused = {
            "/to-private": "not a public address",
            "/to-metadata": "not a public address",
            "/to-app": "not a public address",
            "/to-ipv6-loopback": "not a public address",
            "/to-localhost": "not a public address",
            "/loop": "redirects",
            "/huge": "larger than",
            "/drip": "no answer within",
            "/json": "not a page or image",
            "/nothing": "answered 404",
        }
        for path, reason in refused.items():
            got = await answer(ada, {"type": "preview", "url": site.url(path)}, "preview")
            assert (got["type"], got["code"]) == ("error", "preview_unavailable"), (path, got)
            assert reason in got["message"], (path, got)
        direct = await answer(ada, {"type": "preview", "url": f"{live.http_url}/metrics"},
                              "preview")  # fmt: skip
        assert "not a public address" in direct["message"]
        fake = await answer(ada, {"type": "preview", "url": site.url("/fake-image-page")},
                            "preview")  # fmt: skip
        assert (fake["title"], fake["image"]) == ("Fake", None)  # not an image: left out
        bad = await answer(ada, {"type": "preview", "url": "file:///etc/passwd"}, "preview")
        assert bad["code"] == "bad_frame"
        assert "/metrics" not in site.requests and await ada.is_responsive()


def test_public_addresses() -> None:
    for address in ("10.1.2.3", "192.168.0.1", "172.16.0.1", "127.0.0.1", "169.254.169.254",
                    "100.64.0.1", "0.0.0.0", "::1", "fd00:ec2::254", "fe80::1", "::ffff:10.0.0.1",
                    "224.0.0.1", "255.255.255.255"):  # fmt: skip
        assert not is_public(address), address
    for address in ("8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.8.8"):
        assert is_public(address), address
