"""The plain opening handshake (app.transport.handshake, app.transport.uvicorn_seam): a plain
upgrade is answered without websockets' parsers, with the answer websockets gives it; anything
websockets would refuse or negotiate on goes websockets' way."""

from __future__ import annotations

import asyncio
import base64
import itertools
from typing import Any

import pytest
import uvicorn
from uvicorn.protocols.utils import get_local_addr, get_remote_addr
from websockets import http11
from websockets.datastructures import Headers
from websockets.http11 import MAX_LINE_LENGTH, MAX_NUM_HEADERS, Request
from websockets.server import ServerProtocol

from app.main import create_app
from app.server import uvicorn_options
from app.state import ChatState
from app.transport import handshake
from app.transport.handshake import PlainUpgrade
from app.transport.uvicorn_seam import (
    HubbubWebSocketProtocol,
    _switching_protocols,
    _switching_protocols_head,
)
from tests.helpers import ChatClient, free_port, make_settings, run_server

pytestmark = pytest.mark.timeout(60)

KEY = b"dGhlIHNhbXBsZSBub25jZQ=="
# What a browser sends (lower-case names: as httptools hands them over).
BROWSER = [
    (b"host", b"127.0.0.1:8000"),
    (b"connection", b"keep-alive, Upgrade"),
    (b"pragma", b"no-cache"),
    (b"user-agent", b"Mozilla/5.0 (X11; Linux x86_64) caf\xe9\tbrowser"),
    (b"upgrade", b"websocket"),
    (b"origin", b"http://127.0.0.1:8000"),
    (b"sec-websocket-version", b"13"),
    (b"sec-websocket-key", KEY),
    (b"sec-websocket-extensions", b"permessage-deflate; client_max_window_bits"),
]


def plain_upgrade(
    method: str, version: str, target: bytes, headers: list[tuple[bytes, bytes]]
) -> PlainUpgrade | None:
    """handshake.plain_upgrade with websockets' limits, as the seam calls it."""
    return handshake.plain_upgrade(
        method, version, target, headers, max_line=MAX_LINE_LENGTH, max_headers=MAX_NUM_HEADERS
    )


def websockets_answer(
    method: str, target: bytes, headers: list[tuple[bytes, bytes]]
) -> tuple[int, str | None]:
    """What websockets' ServerProtocol (no extension, no subprotocol, as uvicorn makes it
    with deflate off) answers: the status and the Sec-WebSocket-Accept."""
    parsed = Headers()
    for name, value in headers:
        parsed.set_insecure(name.decode("ascii"), value.decode("iso-8859-1"))
    response = ServerProtocol(extensions=[]).accept(Request(target.decode("ascii"), parsed, method))
    return response.status_code, response.headers.get("Sec-WebSocket-Accept")


def test_a_browsers_upgrade_gets_websockets_answer() -> None:
    plain = plain_upgrade("GET", "1.1", b"/ws?auth=frame", BROWSER)
    assert plain is not None
    assert plain.origin == "http://127.0.0.1:8000"
    assert websockets_answer("GET", b"/ws?auth=frame", BROWSER) == (101, plain.accept)
    # RFC 6455's own example: the key above is answered with this.
    assert plain.accept == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
    without_origin = [h for h in BROWSER if h[0] != b"origin"]
    answered = plain_upgrade("GET", "1.1", b"/ws", without_origin)
    assert answered is not None and answered.origin is None


def test_the_field_bytes_are_websockets_parsers() -> None:
    """The token and value bytes are those websockets' parser accepts, byte for byte."""
    for byte in range(256):
        one = bytes([byte])
        assert (byte in handshake._TOKEN_BYTES) == bool(http11._token_re.fullmatch(one)), byte
        assert (byte in handshake._VALUE_BYTES) == bool(http11._value_re.fullmatch(one)), byte


def test_long_headers_each_within_a_line_are_plain() -> None:
    """Headers over a line in all, each within one, are read as they are by websockets too."""
    headers = [*BROWSER, *[(b"x-big-%d" % n, b"v" * 1000) for n in range(10)]]
    plain = plain_upgrade("GET", "1.1", b"/ws", headers)
    assert plain is not None
    assert websockets_answer("GET", b"/ws", headers) == (101, plain.accept)


def _replace(name: bytes, value: bytes | None) -> list[tuple[bytes, bytes]]:
    kept = [h for h in BROWSER if h[0] != name]
    return kept if value is None else [*kept, (name, value)]


# Requests websockets refuses, or reads differently, or negotiates on.
NOT_PLAIN: list[tuple[str, str, bytes, list[tuple[bytes, bytes]]]] = [
    ("POST", "1.1", b"/ws", BROWSER),
    ("GET", "1.0", b"/ws", BROWSER),
    ("GET", "1.1", b"/ws?q=\xc3\xa9", BROWSER),
    ("GET", "1.1", b"/ws", _replace(b"connection", b"keep-alive")),
    ("GET", "1.1", b"/ws", _replace(b"connection", None)),
    ("GET", "1.1", b"/ws", _replace(b"connection", b"Upgrade,")),  # an empty element
    ("GET", "1.1", b"/ws", _replace(b"upgrade", b"h2c")),
    ("GET", "1.1", b"/ws", _replace(b"upgrade", b"websocket, h2c")),
    ("GET", "1.1", b"/ws", [*BROWSER, (b"upgrade", b"websocket")]),
    ("GET", "1.1", b"/ws", _replace(b"upgrade", None)),
    ("GET", "1.1", b"/ws", _replace(b"sec-websocket-key", None)),
    ("GET", "1.1", b"/ws", _replace(b"sec-websocket-key", b"not base64!")),
    ("GET", "1.1", b"/ws", _replace(b"sec-websocket-key", base64.b64encode(b"x" * 15))),
    ("GET", "1.1", b"/ws", [*BROWSER, (b"sec-websocket-key", KEY)]),
    ("GET", "1.1", b"/ws", _replace(b"sec-websocket-version", b"8")),
    ("GET", "1.1", b"/ws", _replace(b"sec-websocket-version", None)),
    ("GET", "1.1", b"/ws", [*BROWSER, (b"sec-websocket-version", b"13")]),
    ("GET", "1.1", b"/ws", [*BROWSER, (b"origin", b"http://evil.example")]),
    ("GET", "1.1", b"/ws", [*BROWSER, (b"sec-websocket-protocol", b"chat")]),
    ("GET", "1.1", b"/ws", [*BROWSER, (b"content-length", b"0")]),
    ("GET", "1.1", b"/ws", [*BROWSER, (b"transfer-encoding", b"chunked")]),
    ("GET", "1.1", b"/ws", [*BROWSER, (b"bad name", b"1")]),
    ("GET", "1.1", b"/ws", [*BROWSER, (b"x-ctl", b"a\x00b")]),
    ("GET", "1.1", b"/ws", [*BROWSER, (b"x-spaced", b" a")]),
    ("GET", "1.1", b"/ws", [*BROWSER, (b"x-long", b"a" * 8200)]),
    ("GET", "1.1", b"/ws", [*BROWSER, *[(b"x-many", b"1")] * MAX_NUM_HEADERS]),
]


@pytest.mark.parametrize(("method", "version", "target", "headers"), NOT_PLAIN)
def test_anything_else_takes_websockets_path(
    method: str, version: str, target: bytes, headers: list[tuple[bytes, bytes]]
) -> None:
    assert plain_upgrade(method, version, target, headers) is None


def test_never_accepts_what_websockets_would_not_accept_alike() -> None:
    """Over every combination of a few values of the headers that decide, a plain answer is
    only ever given where websockets answers 101 with the same Sec-WebSocket-Accept."""
    choices: dict[bytes, list[bytes | None]] = {
        b"connection": [b"Upgrade", b"upgrade, keep-alive", b"keep-alive", b"Upgrade,,", None],
        b"upgrade": [b"websocket", b"WebSocket", b"websocket/13", b"h2c", None],
        b"sec-websocket-key": [KEY, b"AAAA", b"dGhlIHNhbXBsZSBub25jZQ", None],
        b"sec-websocket-version": [b"13", b"13 ", b"7", None],
    }
    plain_count = 0
    for values in itertools.product(*choices.values()):
        headers = [(b"host", b"h")] + [
            (name, value) for name, value in zip(choices, values, strict=True) if value is not None
        ]
        plain = plain_upgrade("GET", "1.1", b"/ws", headers)
        if plain is not None:
            plain_count += 1
            assert websockets_answer("GET", b"/ws", headers) == (101, plain.accept), headers
    assert plain_count >= 4  # the combinations that are plain were found plain


async def _head(port: int, extra: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(
            b"GET /ws?name=erin HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Key: " + KEY + b"\r\n"
            b"Sec-WebSocket-Version: 13\r\n" + extra + b"\r\n"
        )
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        return head
    finally:
        writer.close()


async def test_the_server_answers_plain_upgrades_itself_and_others_through_websockets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A plain upgrade opens a working socket without websockets' ``accept`` and gets the
    same answer head (status, headers, their order) as one that went through it (a
    subprotocol asked for); websockets still answers what it refuses."""
    accepted: list[Any] = []
    original = ServerProtocol.accept

    def counting_accept(self: ServerProtocol, request: Request) -> Any:
        accepted.append(request)
        return original(self, request)

    async with run_server(make_settings()) as live:
        registry = live.state.metrics.registry
        assert registry.get_sample_value("hubbub_fast_path_live", {"path": "plain_upgrade"}) == 1
        monkeypatch.setattr(ServerProtocol, "accept", counting_accept)  # after the check above
        async with ChatClient.connect(live.ws_url("alice")) as alice:
            assert alice.hello["user"] == "alice"
            assert (await alice.join("r"))["room"] == "r"
        assert accepted == []
        plain = await _head(live.port, b"")
        assert accepted == []
        negotiated = await _head(live.port, b"Sec-WebSocket-Protocol: chat\r\n")
        assert len(accepted) == 1

        def lines(head: bytes) -> list[bytes]:
            return [line for line in head.split(b"\r\n") if not line.startswith(b"date:")]

        assert plain.startswith(b"HTTP/1.1 101 Switching Protocols\r\n")
        assert b"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n" in plain
        assert b"\r\ndate: " in plain
        assert lines(plain) == lines(negotiated)
        refused = await _head(live.port, b"Sec-WebSocket-Version: 13\r\n")  # twice
        assert refused.startswith(b"HTTP/1.1 400"), refused
        async with ChatClient.connect(live.ws_url("bob")) as bob:
            assert (await bob.join("r"))["room"] == "r"


async def test_with_compression_on_the_offer_is_negotiated_by_websockets() -> None:
    async with run_server(make_settings(ws_per_message_deflate=True)) as live:
        head = await _head(live.port, b"Sec-WebSocket-Extensions: permessage-deflate\r\n")
        assert head.startswith(b"HTTP/1.1 101")
        assert b"Sec-WebSocket-Extensions: permessage-deflate" in head


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
async def test_a_connections_addresses_are_uvicorns_without_asking_the_socket(host: str) -> None:
    """HubbubHttpProtocol.connection_made takes the addresses the transport keeps: the same
    ``server`` and ``client`` uvicorn's socket lookups give (an IPv6 address's 4-tuple
    included), which the WebSocket takes over and the session reads (its ``ip``)."""
    settings = make_settings()
    port = free_port()
    config = uvicorn.Config(
        create_app(settings), host=host, port=port,
        **(uvicorn_options(settings) | {"loop": "none", "log_level": "warning"}),
    )  # fmt: skip
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(10):
            while not server.started:
                await asyncio.sleep(0.01)
        netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        async with ChatClient.connect(f"ws://{netloc}/ws?name=alice") as alice:
            assert (await alice.join("r"))["room"] == "r"
            (socket,) = [p for p in server.server_state.connections if hasattr(p, "conn")]
            assert isinstance(socket, HubbubWebSocketProtocol)
            assert socket.server == get_local_addr(socket.transport) == (host, port)
            assert socket.client == get_remote_addr(socket.transport)
            assert socket.client is not None and socket.client[0] == host
            state: ChatState = config.loaded_app.app.state.chat  # under uvicorn's proxy headers
            assert [conn.ip for conn in state.hub.connections] == [host]
    finally:
        server.should_exit = True
        async with asyncio.timeout(15):
            await task


def test_the_plain_accepts_answer_is_the_one_uvicorn_sends() -> None:
    """The 101 written for a plain accept is, byte for byte, what uvicorn makes of websockets'
    response: its Date dropped, its default headers appended with lower-case names, all
    serialised as ISO-8859-1 (a value uvicorn is configured with may be non-ASCII)."""
    defaults = [
        (b"date", b"Sat, 05 Dec 2026 18:00:00 GMT"),
        (b"server", b"uvicorn"),
        (b"X-Served-By", b"caf\xe9"),
    ]
    accept = "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
    response = _switching_protocols(accept)
    del response.headers["Date"]  # as uvicorn's send does
    response.headers.update(
        (name.decode("latin-1").lower(), value.decode("latin-1")) for name, value in defaults
    )
    ours = _switching_protocols_head(accept, defaults)
    assert ours == response.serialize()
    assert ours.startswith(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n")
    assert b"\r\nx-served-by: caf\xe9\r\n\r\n" in ours
