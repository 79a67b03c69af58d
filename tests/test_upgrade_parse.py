"""The upgrade request parsed once (app.transport.uvicorn_seam): what httptools parsed becomes
websockets' ``Request`` without websockets parsing the bytes again, the same request its own
parser returns; what that parser would refuse or read differently goes its way."""

from __future__ import annotations

import asyncio

import pytest
from websockets.http11 import MAX_NUM_HEADERS, Request
from websockets.streams import StreamReader

from app.transport.uvicorn_seam import parsed_request
from tests.helpers import ChatClient, make_settings, raw_upgrade, run_server

pytestmark = pytest.mark.timeout(60)

HEADERS = [
    (b"host", b"127.0.0.1:8000"),
    (b"upgrade", b"websocket"),
    (b"connection", b"Upgrade"),
    (b"sec-websocket-key", b"dGhlIHNhbXBsZSBub25jZQ=="),
    (b"sec-websocket-version", b"13"),
    (b"sec-websocket-protocol", b"chat, superchat"),
    (b"sec-websocket-protocol", b"other"),
    (b"origin", b"http://127.0.0.1:8000"),
    (b"user-agent", b"caf\xe9 \tbrowser/1.0"),  # obs-text: ISO-8859-1, as websockets reads it
]


def websockets_parse(method: bytes, target: bytes, headers: list[tuple[bytes, bytes]]) -> Request:
    """The request as websockets' own parser reads it from the bytes uvicorn writes out."""
    lines = [method + b" " + target + b" HTTP/1.1\r\n"]
    lines += [name + b": " + value + b"\r\n" for name, value in headers]
    reader = StreamReader()
    reader.feed_data(b"".join(lines) + b"\r\n")
    parsing = Request.parse(reader.read_line)
    try:
        next(parsing)
    except StopIteration as done:
        request: Request = done.value
        return request
    raise AssertionError("websockets wanted more bytes")


@pytest.mark.parametrize("target", [b"/ws", b"/ws?name=alice&auth=frame", b"/ws?q=%C3%A9"])
def test_the_same_request_as_websockets_parser_returns(target: bytes) -> None:
    ours = parsed_request("GET", target, HEADERS)
    theirs = websockets_parse(b"GET", target, HEADERS)
    assert ours is not None
    assert (ours.method, ours.path, ours.protocol) == (theirs.method, theirs.path, theirs.protocol)
    assert list(ours.headers.raw_items()) == list(theirs.headers.raw_items())
    assert ours.headers.get_all("Sec-WebSocket-Protocol") == ["chat, superchat", "other"]


@pytest.mark.parametrize(
    ("target", "extra"),
    [
        (b"/ws?name=\xc3\xa9", []),  # a raw non-ASCII target: websockets refuses it
        (b"/ws", [(b"content-length", b"0")]),  # websockets checks the body headers itself
        (b"/ws", [(b"transfer-encoding", b"chunked")]),
        (b"/ws", [(b"x-long", b"a" * 8200)]),  # over its line length
        (b"/ws", [(b"x-many", b"1")] * MAX_NUM_HEADERS),  # over its header count
        (b"/ws", [(b"bad name", b"1")]),
        (b"/ws", [(b"x-ctl", b"a\x00b")]),
        (b"/ws", [(b"x-spaced", b" a")]),  # websockets strips what httptools may leave
    ],
)
def test_what_websockets_would_refuse_or_change_takes_its_path(
    target: bytes, extra: list[tuple[bytes, bytes]]
) -> None:
    assert parsed_request("GET", target, HEADERS + extra) is None


async def answer_head(port: int, extra_headers: bytes) -> bytes:
    """The head of the server's answer to an upgrade request with ``extra_headers``."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(
            b"GET /ws?name=carol HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            b"Sec-WebSocket-Version: 13\r\n" + extra_headers + b"\r\n"
        )
        return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    finally:
        writer.close()


async def test_upgrades_on_both_paths_get_a_working_socket() -> None:
    """A plain upgrade (parsed once) and one websockets parses itself (it carries
    ``Content-Length: 0``) both open a socket that greets and chats; the worker reports the
    path live; and an upgrade over websockets' header count is answered 431 by websockets,
    the server serving on."""
    async with run_server(make_settings()) as live:
        registry = live.state.metrics.registry
        assert registry.get_sample_value("hubbub_fast_path_live", {"path": "parsed_upgrade"}) == 1
        async with ChatClient.connect(live.ws_url("alice")) as alice:
            assert alice.hello["user"] == "alice"
            await alice.join("r")
        sock, rest = await raw_upgrade(live.port, 65536, "bob", b"Content-Length: 0\r\n")
        try:
            while b'"hello"' not in rest:
                data = await asyncio.wait_for(asyncio.get_running_loop().sock_recv(sock, 65536), 5)
                assert data, "closed before hello"
                rest += data
        finally:
            sock.close()
        many = b"".join(b"X-Many-%d: 1\r\n" % n for n in range(MAX_NUM_HEADERS + 1))
        assert (await answer_head(live.port, many)).startswith(b"HTTP/1.1 431")
        async with ChatClient.connect(live.ws_url("dave")) as dave:
            assert (await dave.join("r"))["room"] == "r"
