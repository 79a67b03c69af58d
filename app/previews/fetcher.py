"""SafeFetcher: fetch a URL on the open internet for a link preview, and nothing else.

The failures this guards against are Synapse's (CVE-2022-31052, GHSA-98px-6486-j7qc): a
preview fetcher made to reach the server's own network, or to hold the server up.

Contract:
- **Only public addresses.** Every connection, the first and each redirect's, goes to an
  address the host name resolved to *at connect time* (no second lookup an attacker's DNS
  could answer differently), and only when every address it resolved to is public
  (``ipaddress``'s ``is_global``; IPv4-mapped IPv6 judged as IPv4): no loopback, private,
  link-local (cloud metadata: 169.254.169.254, fd00:ec2::254), shared, multicast, reserved
  or unspecified address. ``http`` and ``https`` only; no user info in URLs.
- **Redirects** are followed by hand, at most ``max_redirects``, each checked as the first.
- **Bounded**: the whole fetch (connects, redirects, the body) within ``timeout_s`` (a slow
  drip fails); the body read no further than ``max_bytes`` (larger fails); only the
  ``accept`` content types (the server's header, checked again by sniffing for images).
- :class:`FetchRefused` says why a URL was not fetched; nothing else is raised.
- ``test_public``: ``host:port`` pairs treated as public (the tests' hostile server on
  loopback, CHAT_PREVIEW_TEST_PUBLIC_ADDRESSES); empty in production.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpcore2 as httpcore

_REDIRECTS = (301, 302, 303, 307, 308)
_USER_AGENT = "HubbubLinkPreview/1.0 (+https://github.com/hubbub-chat)"


class FetchRefused(Exception):
    """The URL was not fetched, or its answer not taken: the reason is the message."""


@dataclass(frozen=True, slots=True)
class Fetched:
    url: str  # after redirects
    content_type: str  # as the server said it, without parameters
    body: bytes


def is_public(address: str) -> bool:
    """Whether ``address`` (an IP) is a public internet address."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


class _GuardedBackend(httpcore.AsyncNetworkBackend):
    """Resolves each host itself and connects to the address it checked."""

    def __init__(self, test_public: frozenset[str]) -> None:
        self._inner = httpcore.AnyIOBackend()
        self._test_public = test_public

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (the interface's)
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise FetchRefused(f"{host} does not resolve") from exc
        addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
        if not addresses:
            raise FetchRefused(f"{host} does not resolve")
        for address in addresses:
            if not is_public(address) and f"{address}:{port}" not in self._test_public:
                raise FetchRefused(f"{host} is not a public address")
        return await self._inner.connect_tcp(
            addresses[0], port, timeout, local_address, socket_options
        )

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class SafeFetcher:
    def __init__(self, test_public: Iterable[str] = ()) -> None:
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=ssl.create_default_context(),
            max_connections=20,
            network_backend=_GuardedBackend(frozenset(test_public)),
        )

    async def fetch(
        self,
        url: str,
        accept: frozenset[str],
        max_bytes: int,
        timeout_s: float,
        max_redirects: int = 3,
    ) -> Fetched:
        """``url``'s body (see the module's contract). Raises :class:`FetchRefused`."""
        try:
            async with asyncio.timeout(timeout_s):
                return await self._follow(url, accept, max_bytes, max_redirects)
        except TimeoutError:
            raise FetchRefused(f"no answer within {timeout_s:g} s") from None
        except httpcore.ConnectError as exc:
            if isinstance(exc.__cause__, FetchRefused):
                raise exc.__cause__ from None
            raise FetchRefused(f"cannot connect: {exc}") from None
        except (httpcore.ProtocolError, httpcore.NetworkError, httpcore.TimeoutException) as exc:
            raise FetchRefused(f"the site failed: {exc!r}") from None
        except (ssl.SSLError, httpcore.UnsupportedProtocol) as exc:
            raise FetchRefused(f"cannot talk to the site: {exc}") from None

    async def _follow(
        self, url: str, accept: frozenset[str], max_bytes: int, max_redirects: int
    ) -> Fetched:
        for _ in range(max_redirects + 1):
            _check_url(url)
            headers = [(b"User-Agent", _USER_AGENT.encode()), (b"Accept", b", ".join(
                t.encode() for t in sorted(accept)))]  # fmt: skip
            async with self._pool.stream("GET", url, headers=headers) as response:
                answer = {k.decode().lower(): v.decode("latin-1") for k, v in response.headers}
                if response.status in _REDIRECTS and "location" in answer:
                    url = urljoin(url, answer["location"])
                    continue
                if response.status != 200:
                    raise FetchRefused(f"the site answered {response.status}")
                content_type = answer.get("content-type", "").split(";", 1)[0].strip().lower()
                if content_type not in accept:
                    raise FetchRefused(f"not a page or image this shows: {content_type!r}")
                declared = answer.get("content-length", "")
                if declared.isdigit() and int(declared) > max_bytes:
                    raise FetchRefused(f"larger than {max_bytes} bytes")
                body = bytearray()
                async for chunk in response.aiter_stream():
                    body += chunk
                    if len(body) > max_bytes:
                        raise FetchRefused(f"larger than {max_bytes} bytes")
                return Fetched(url, content_type, bytes(body))
        raise FetchRefused(f"more than {max_redirects} redirects")

    async def close(self) -> None:
        await self._pool.aclose()


def _check_url(url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise FetchRefused(f"not an http(s) URL: {parts.scheme!r}")
    if parts.username is not None or parts.password is not None or not parts.hostname:
        raise FetchRefused("not a URL to preview")
