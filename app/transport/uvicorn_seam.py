"""The seam to uvicorn's, uvicorn-worker's and websockets' internals: the only module that
reaches below their public APIs.

What it relies on, and why:

- **Direct writes.** A fan-out writes the same message to every socket of a room. Through
  ASGI, each write encodes the text, builds a frame in websockets' sans-I/O protocol and
  passes Starlette's and uvicorn's layers before the write system call. Frames from a server
  are not masked, so a room message is the same bytes on every socket
  (:class:`~app.transport.frames.FrameCache` encodes them once per flush) and
  :class:`DirectSocket` hands them to the transport. That needs the server's protocol object
  for the socket (``writable``, ``close_sent``, ``disconnected``, ``conn.state``,
  ``conn.extensions``, ``transport``): :class:`HubbubWebSocketProtocol`, uvicorn's
  ``websockets-sansio`` protocol, puts itself in the ASGI scope before the app runs, so no
  middleware that wraps ``send`` (uvicorn's own message logger at TRACE level, say) can hide
  it. Only sockets without a negotiated extension (permessage-deflate compresses per socket)
  are written this way, and only while open with their transport not paused; otherwise
  frames go through ASGI, which waits for a paused transport.
- **No reference cycle per connection.** uvicorn's ``httptools`` protocol and its parser
  reference each other, and after an upgrade that cycle also holds the transport;
  :class:`HubbubHttpProtocol` drops the parser once the WebSocket protocol has the transport
  (and the scope holds the WebSocket protocol weakly), so a closed connection is freed by
  reference counting, not left to the cyclic garbage collector (tests/test_garbage.py).
- **The transport's peer.** uvicorn's proxy-headers middleware replaces an HTTP scope's
  ``client`` with the address a trusted proxy wrote into ``X-Forwarded-For``, and keeps no
  trace of the proxy's own. The bearer-token lockout (:mod:`app.access.lockout`) counts
  failures against that proxy too, so :class:`HubbubHttpProtocol` leaves the connection's
  peer address in each request's scope (under :data:`PEER_KEY`, read by
  :func:`transport_peer`) before any middleware runs.
- **The upgrade request parsed once.** uvicorn's ``httptools`` protocol parses the upgrade
  request, writes it back out as bytes, and hands those to the WebSocket protocol, whose
  Python parser (websockets') reads it all again: about a twentieth of a connection's CPU.
  :class:`HubbubHttpProtocol` builds websockets' ``Request`` from what ``httptools`` parsed
  (:func:`parsed_request`, which checks what websockets' parser checks) and
  :meth:`HubbubWebSocketProtocol.open_with` starts the WebSocket protocol on it; a request
  that check refuses takes uvicorn's path, so websockets answers it as before.
- **The plain handshake answered directly.** Even parsed once, websockets' ``accept`` runs
  every header through its generic RFC 7230 parsers and builds two ``Headers``: about a tenth
  of a connect. A plain upgrade (:func:`~app.transport.handshake.plain_upgrade`: nothing to
  negotiate, nothing websockets would refuse) skips it: :meth:`HubbubWebSocketProtocol.open_plain`
  does what uvicorn's ``handle_connect`` does after ``accept``, and when the app accepts,
  :meth:`HubbubWebSocketProtocol.send` writes the 101 answer uvicorn would (byte for byte:
  tests/test_plain_upgrade.py) without building websockets' ``Headers`` and ``Response``
  for it. Others (a subprotocol asked for, compression on, any irregularity) take the path
  above. The WebSocket protocol takes the connection's addresses
  from the HTTP protocol (:meth:`HubbubWebSocketProtocol.connection_taken_over`) rather than
  asking the socket for them again.
- **Whole text frames read directly.** websockets' parser reads each client frame through
  generator-based reads, an enum lookup and a ``Frame`` with its checks, and uvicorn then
  makes the app's receive event: about 3 µs a frame. On a plain upgrade's socket,
  :meth:`HubbubWebSocketProtocol.data_received` reads a chunk that is exactly whole text
  frames (:func:`~app.transport.client_frames.whole_texts`) itself, while websockets' parser
  stands between frames (it waits in ``StreamReader.at_eof``, its buffer empty, no fragment
  begun), and queues the events uvicorn's ``send_receive_event_to_app`` would; it pauses the
  transport's reading, as uvicorn does after each message, once 16 messages wait or after a
  chunk over 4 KiB, until the app has taken them. Any other
  chunk (control frames, fragments, binary, a frame cut in two, invalid UTF-8, a frame over
  the limit) goes to websockets' parser, which reads or refuses it as before
  (tests/test_client_frames.py).
- **Addresses read once.** uvicorn's ``connection_made`` asks a new socket object for each
  of the connection's addresses (four ``getsockname`` and a ``getpeername`` system call per
  connection under uvloop), which the transport read when it was made;
  :meth:`HubbubHttpProtocol.connection_made` takes them from the transport
  (``get_extra_info("sockname")``, ``("peername")``).
- **Abort.** A peer that stopped reading never takes our close frame, and a plain transport
  close waits for the write buffer to drain: :func:`abort` drops the TCP connection
  (``transport.abort()``), which ASGI has no message for.
- **Draining.** uvicorn re-raises the signals it handled after shutdown
  (``Server._captured_signals``, :func:`defer_signal`); uvicorn-worker builds its server in
  ``UvicornWorker._serve``, which :class:`ServerClassWorker` overrides to build ours.

:data:`CHECKED_AGAINST` lists the versions this was checked against; ``pyproject.toml`` bounds
the dependencies to them. At start each worker logs and exports (``hubbub_fast_path_live``)
whether each fast path is live (:func:`fast_paths`); a connection that cannot use the one it
should is counted and logged (``hubbub_transport_fallbacks_total``) by :mod:`app.sockets.session`,
never silently: tests/test_direct_writes.py fails if one does.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import weakref
from collections.abc import Mapping, Sequence
from typing import Any, Final, cast
from urllib.parse import unquote

import uvicorn
from starlette.websockets import WebSocket
from uvicorn.logging import TRACE_LOG_LEVEL
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.utils import (
    ClientDisconnected,
    get_client_addr,
    get_path_with_query_string,
    is_ssl,
)
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from uvicorn_worker import UvicornWorker
from websockets.datastructures import Headers
from websockets.http11 import MAX_LINE_LENGTH, MAX_NUM_HEADERS, Request, Response
from websockets.protocol import Protocol, State
from websockets.server import ServerProtocol
from websockets.streams import StreamReader
from websockets.typing import Origin

from app.transport.client_frames import whole_texts
from app.transport.handshake import PlainUpgrade, fields_as_websockets_reads_them, plain_upgrade

logger = logging.getLogger(__name__)

# Distribution -> the version (prefix) whose internals this module was checked against.
CHECKED_AGAINST: Final = {"uvicorn": "0.54.", "websockets": "17.", "uvicorn-worker": "0.4."}
# Where the protocol object sits in a WebSocket scope (set by HubbubWebSocketProtocol).
PROTOCOL_KEY: Final = "hubbub.protocol"
# Where the address of the connection an HTTP request came on sits in its scope (set by
# HubbubHttpProtocol, before a proxy's X-Forwarded-For replaces the scope's "client").
PEER_KEY: Final = "hubbub.peer"
# The import strings uvicorn's ``http`` and ``ws`` options take (app.server.uvicorn_options).
HTTP_PROTOCOL: Final = "app.transport.uvicorn_seam:HubbubHttpProtocol"
WS_PROTOCOL: Final = "app.transport.uvicorn_seam:HubbubWebSocketProtocol"
# Why a connection writes through ASGI instead (the label of hubbub_transport_fallbacks_total).
FALLBACK_DEFLATE: Final = "permessage_deflate"  # expected: compression is per socket
FALLBACK_NO_PROTOCOL: Final = "no_protocol"  # not served by HubbubWebSocketProtocol: a defect
FALLBACK_UNSUPPORTED: Final = "unsupported_version"  # the internals are not there (fast_paths)
FALLBACK_REASONS: Final = (FALLBACK_DEFLATE, FALLBACK_NO_PROTOCOL, FALLBACK_UNSUPPORTED)

_OPEN: Final = State.OPEN
# What websockets' parser waits in between frames (the first step of Protocol.parse's loop).
_BETWEEN_FRAMES: Final = StreamReader.at_eof.__code__
# Frames read directly stop the socket's reading once this many messages wait for the app, or
# at once for a chunk over _SMALL_CHUNK bytes (see HubbubWebSocketProtocol.data_received).
_QUEUED_HIGH: Final = 16
_SMALL_CHUNK: Final = 4096


def parsed_request(
    method: str, target: bytes, headers: Sequence[tuple[bytes, bytes]]
) -> Request | None:
    """websockets' ``Request`` for ``method`` on ``target`` with ``headers`` (as ``httptools``
    parsed them), or None where websockets' own parser would not return the same request:
    a line or header count over its limits, a name or value it refuses, a non-ASCII target,
    a body. None means: let websockets parse the request (and answer it) itself."""
    if len(target) > MAX_LINE_LENGTH or not target.isascii():
        return None
    if not fields_as_websockets_reads_them(headers, MAX_LINE_LENGTH, MAX_NUM_HEADERS):
        return None
    parsed = Headers()
    for name, value in headers:
        if name in (b"transfer-encoding", b"content-length"):
            return None
        parsed.set_insecure(name.decode("ascii"), value.decode("iso-8859-1"))
    return Request(target.decode("ascii"), parsed, method)


def _switching_protocols(accept: str) -> Response:
    """The 101 answer to a plain upgrade, as websockets' ``accept`` makes it (uvicorn replaces
    its ``Date`` with its own default headers when the app accepts)."""
    return Response(
        101,
        "Switching Protocols",
        Headers(
            [("Date", ""), ("Upgrade", "websocket"), ("Connection", "Upgrade"),
             ("Sec-WebSocket-Accept", accept)]
        ),
    )  # fmt: skip


def _switching_protocols_head(accept: str, default_headers: Sequence[tuple[bytes, bytes]]) -> bytes:
    """The bytes uvicorn writes for :func:`_switching_protocols` once the app accepts: its
    ``default_headers`` (``date``, ``server``, ``CHAT``-configured ones) appended with names in
    lower case, serialised as websockets' ``Headers`` are (ISO-8859-1)."""
    lines = [
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Accept: {accept}\r\n"
    ]
    for name, value in default_headers:
        lines.append(f"{name.decode('latin-1').lower()}: {value.decode('latin-1')}\r\n")
    lines.append("\r\n")
    return "".join(lines).encode("iso-8859-1")


class HubbubWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's ``websockets-sansio`` protocol, which leaves itself in each socket's scope
    (under :data:`PROTOCOL_KEY`) for :class:`DirectSocket` and :func:`abort`."""

    # A plain upgrade's Sec-WebSocket-Accept until the app accepts (open_plain, send).
    _plain_accept: str | None = None
    # Whether whole text frames are read without websockets' parser (open_plain decides).
    _reads_plainly = False

    async def run_asgi(self) -> None:
        scope: dict[str, Any] = self.scope  # type: ignore[assignment]
        # A weak reference: the protocol holds the scope, so a strong one would make every
        # connection a reference cycle, left for the garbage collector to find.
        scope[PROTOCOL_KEY] = weakref.ref(self)
        await super().run_asgi()

    def connection_taken_over(self, http: HttpToolsProtocol) -> None:
        """What uvicorn's ``connection_made`` does (but its TRACE-level log line), on the
        transport of ``http`` (the HTTP protocol the upgrade came to), with the addresses it
        read from the socket already: three lookups on the socket fewer (two of them system
        calls)."""
        self.connections.add(self)
        self.transport = http.transport
        self.server = http.server
        self.client = http.client
        self.scheme = "wss" if http.scheme == "https" else "ws"

    def open_with(self, request: Request) -> None:
        """Start on an upgrade ``request`` already parsed, as :meth:`data_received` does once
        websockets has parsed it from the connection's bytes: from now on the connection's
        bytes are frames."""
        self._read_frames()
        self.handle_connect(request)

    def open_plain(
        self, target: bytes, headers: list[tuple[bytes, bytes]], upgrade: PlainUpgrade
    ) -> None:
        """Start on a plain upgrade (:func:`~app.transport.handshake.plain_upgrade` checked it:
        websockets would accept it with nothing to negotiate), as uvicorn's ``handle_connect``
        does after websockets' ``accept``, with the same scope and the same 101 answer (sent
        when the app accepts), built without websockets' parsers. Only for a protocol that
        offers no extension."""
        self._read_frames()
        conn = self.conn
        # No extension to decode frames with, no fragment limit, no debug log of each frame.
        self._reads_plainly = (
            _LIVE["plain_frames"] and conn.max_fragment_size is None and not conn.debug
        )
        # What ServerProtocol.accept records of a request it accepts with no negotiation.
        conn.accept_called = True
        conn.origin = cast(Origin | None, upgrade.origin)
        self._plain_accept = upgrade.accept  # the 101 is written when the app accepts (send)
        self.handshake_initiated = True
        path = target.decode("ascii")
        raw_path, _, query_string = path.partition("?")
        root_path = self.root_path
        # As uvicorn's handle_connect builds it (0.54); the headers are httptools' as they are:
        # lower-case names, and values that iso-8859-1 round-trips.
        self.scope = {
            "type": "websocket",
            "asgi": {"version": self.asgi_version, "spec_version": "2.4"},
            "http_version": "1.1",
            "scheme": self.scheme,
            "server": self.server,
            "client": self.client,
            "root_path": root_path,
            "path": root_path + unquote(raw_path),
            "raw_path": root_path.encode("ascii") + raw_path.encode("ascii"),
            "query_string": query_string.encode("ascii"),
            "headers": headers,
            "subprotocols": [],
            "state": self.app_state.copy(),
            "extensions": {"websocket.http.response": {}},
        }
        self.queue.put_nowait({"type": "websocket.connect"})
        task = self.loop.create_task(self.run_asgi())
        task.add_done_callback(self.on_task_complete)
        self.tasks.add(task)

    async def send(self, message: Any) -> None:
        """uvicorn's ``send``; the app's plain ``websocket.accept`` of a plain upgrade writes
        the 101 answer uvicorn would (same status line, headers and order: uvicorn's
        ``default_headers`` after the handshake's three) without building websockets'
        ``Headers`` and ``Response`` for it. An accept with headers or a subprotocol, or
        with websockets' debug logging on, goes uvicorn's way, on the same response."""
        accept = self._plain_accept
        if accept is not None and message["type"] == "websocket.accept":
            self._plain_accept = None
            plain = not message.get("headers") and not message.get("subprotocol")
            if plain and not self.conn.debug and self.initial_response is None:
                await self._accept_plainly(accept)
                return
            self.response = _switching_protocols(accept)
        await super().send(message)

    async def _accept_plainly(self, accept: str) -> None:
        """What uvicorn's ``send`` does for ``websocket.accept`` (0.54), and websockets'
        ``send_response`` for a 101, with the answer's bytes made here."""
        if not self.writable.is_set():
            await self.writable.wait()
        if self.disconnected:
            raise ClientDisconnected()
        if self.logger.isEnabledFor(logging.INFO):
            self.logger.info(
                '%s - "WebSocket %s" [accepted]',
                get_client_addr(self.scope),
                get_path_with_query_string(self.scope),
            )
        if self.transport.is_closing():
            return
        self.handshake_complete = True
        conn = self.conn
        conn.state = _OPEN
        conn.logger.info("connection open")
        self.transport.write(_switching_protocols_head(accept, self.default_headers))
        self.start_keepalive()

    def data_received(self, data: bytes) -> None:
        """uvicorn's, but for a chunk that is exactly whole text frames
        (:func:`~app.transport.client_frames.whole_texts`), arriving while websockets' parser
        stands between frames: their receive events are queued here as uvicorn's
        ``send_receive_event_to_app`` queues them, and the parser never sees them. Any other
        chunk (or any chunk while a frame is half read) goes to websockets' parser.

        Back-pressure on a client that sends faster than the app reads: uvicorn stops reading
        the socket after every message until the app has taken it (a libuv poll change each
        way, ~2 µs a message); here reading stops once ``_QUEUED_HIGH`` messages wait, or
        after a chunk of more than ``_SMALL_CHUNK`` bytes, and resumes (uvicorn's
        ``receive``) once the app has taken them all. What waits is thus bounded as before:
        a few small chunks, or one chunk as large as one read."""
        if self._reads_plainly and self._between_frames():
            texts = whole_texts(data, self.conn.max_message_size)
            if texts is not None:
                if not self.close_sent:  # past websocket.close, uvicorn drops messages
                    queue = self.queue
                    for text in texts:
                        queue.put_nowait({"type": "websocket.receive", "text": text})
                    full = queue.qsize() >= _QUEUED_HIGH or len(data) > _SMALL_CHUNK
                    if full and not self.read_paused:
                        self.read_paused = True
                        self.transport.pause_reading()
                return
        super().data_received(data)

    def _between_frames(self) -> bool:
        """Whether websockets' parser has read every byte it was given and waits for the
        start of a frame, with the connection open and no fragmented message begun."""
        conn = self.conn
        if conn.state is not _OPEN or conn.current_size is not None or conn.reader.buffer:
            return False
        waiting = getattr(conn.parser, "gi_yieldfrom", None)  # the generator it is in
        return getattr(waiting, "gi_code", None) is _BETWEEN_FRAMES

    def _read_frames(self) -> None:
        """From now on the connection's bytes are frames: what websockets' server parser goes
        on with once it has read the request."""
        conn = self.conn
        conn.parser = Protocol.parse(conn)
        next(conn.parser)


class HubbubHttpProtocol(HttpToolsProtocol):
    """uvicorn's ``httptools`` protocol, which lets go of its parser once it has handed its
    connection over to a WebSocket protocol, and leaves the connection's peer address in each
    request's scope (:func:`transport_peer`).

    The parser holds the protocol's callbacks and the protocol holds the parser: a reference
    cycle that, after an upgrade, also keeps the transport and its socket. Left alone, every
    WebSocket ever opened would leave ~30 objects for the garbage collector to find.
    """

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """uvicorn's (0.54), with the addresses the transport read when it was made
        (``sockname``, ``peername``) instead of asking a socket object for them again: uvicorn
        makes one per address (each a ``getsockname`` system call, and another per lookup)."""
        if not _LIVE["cached_addresses"]:
            super().connection_made(transport)
            return
        self.connections.add(self)
        self.transport = transport
        self.flow = FlowControl(transport)
        self.server = _local_address(transport.get_extra_info("sockname"))
        peer = transport.get_extra_info("peername")
        self.client = (str(peer[0]), int(peer[1])) if isinstance(peer, tuple) else None
        self.scheme = "https" if is_ssl(transport) else "http"
        if self.logger.level <= TRACE_LOG_LEVEL:
            prefix = f"{self.client[0]}:{self.client[1]} - " if self.client else ""
            self.logger.log(TRACE_LOG_LEVEL, "%sHTTP connection made", prefix)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        # Defensive: with other internals (fast_paths says so) requests still get served.
        scope, client = getattr(self, "scope", None), getattr(self, "client", None)
        if isinstance(scope, dict):
            scope[PEER_KEY] = client[0] if client else None

    def handle_websocket_upgrade(self) -> None:
        ws_class = self.ws_protocol_class
        ours = (
            ws_class
            if isinstance(ws_class, type) and issubclass(ws_class, HubbubWebSocketProtocol)
            else None
        )
        scope, target = self.scope, self.url
        headers = list(scope["headers"])
        plain = request = None
        if ours is not None and _LIVE["plain_upgrade"] and not self.config.ws_per_message_deflate:
            plain = plain_upgrade(
                scope["method"], scope["http_version"], target, headers,
                max_line=MAX_LINE_LENGTH, max_headers=MAX_NUM_HEADERS,
            )  # fmt: skip
        if ours is not None and plain is None and _LIVE["parsed_upgrade"]:
            request = parsed_request(scope["method"], target, headers)
        if ours is None or (plain is None and request is None):
            super().handle_websocket_upgrade()
            self._answer_unparsed_upgrade()
        else:
            # As uvicorn's, without writing the request out for websockets to parse again.
            self.connections.discard(self)
            protocol = ours(
                config=self.config, server_state=self.server_state, app_state=self.app_state
            )
            if _LIVE["upgrade_addresses"]:
                protocol.connection_taken_over(self)
            else:
                protocol.connection_made(self.transport)
            if plain is not None:
                protocol.open_plain(target, headers, plain)
            else:
                assert request is not None
                protocol.open_with(request)
            self.transport.set_protocol(protocol)
        # Nothing reads it after the upgrade: the transport has another protocol now.
        self.__dict__.pop("parser", None)

    def _answer_unparsed_upgrade(self) -> None:
        """After uvicorn's upgrade: when websockets' parser refused the request (431 for too
        many or too long headers, or it just ends the connection), its answer waits in the
        protocol's output, which uvicorn never writes: the connection would hang open. Write
        it and close."""
        protocol = self.transport.get_protocol()
        if isinstance(protocol, WebSocketsSansIOProtocol) and not getattr(
            protocol, "handshake_initiated", True
        ):
            self.transport.write(b"".join(protocol.conn.data_to_send()))
            self.transport.close()


def _local_address(sockname: Any) -> tuple[str, int | None] | None:
    """What uvicorn's ``get_local_addr`` makes of a socket's name: (host, port) for an IP
    socket, (path, None) for a Unix one."""
    if isinstance(sockname, tuple):
        return (str(sockname[0]), int(sockname[1]))
    if isinstance(sockname, str):
        return (sockname, None)
    return None


def transport_peer(scope: Mapping[str, Any]) -> str | None:
    """The address of the connection an HTTP request came on: the proxy's when a proxy
    forwarded it, whatever ``X-Forwarded-For`` says; None when the server does not tell (not
    served by :class:`HubbubHttpProtocol`)."""
    peer = scope.get(PEER_KEY)
    return peer if isinstance(peer, str) else None


def _protocol_of(ws: WebSocket) -> WebSocketsSansIOProtocol | None:
    ref = ws.scope.get(PROTOCOL_KEY)
    protocol = ref() if isinstance(ref, weakref.ref) else None
    return protocol if isinstance(protocol, WebSocketsSansIOProtocol) else None


def received_already(ws: WebSocket) -> bool:
    """Whether an event from the client (a frame, or its leaving) is queued for ``ws``
    already, so that its next ``receive`` returns without waiting."""
    protocol = _protocol_of(ws)
    return protocol is not None and not protocol.queue.empty()


class DirectSocket:
    """The transport under one accepted WebSocket, for writing whole pre-encoded frames."""

    __slots__ = ("_protocol",)

    def __init__(self, protocol: WebSocketsSansIOProtocol) -> None:
        self._protocol = protocol

    @classmethod
    def of(cls, ws: WebSocket) -> DirectSocket | str:
        """For an accepted ``ws``: a DirectSocket, or why frames must go through ASGI
        (:data:`FALLBACK_DEFLATE`, :data:`FALLBACK_NO_PROTOCOL`)."""
        if not _LIVE["direct_writes"]:
            return FALLBACK_UNSUPPORTED
        protocol = _protocol_of(ws)
        if protocol is None:
            return FALLBACK_NO_PROTOCOL
        if protocol.conn.extensions:
            return FALLBACK_DEFLATE
        return cls(protocol)

    def writable(self) -> bool:
        """True if a frame written now goes out: open, not closing, transport not paused."""
        protocol = self._protocol
        return (
            protocol.writable.is_set()
            and not protocol.close_sent
            and not protocol.disconnected
            and protocol.conn.state is _OPEN
            and not protocol.transport.is_closing()  # uvloop refuses writes to a closed one
        )

    def write(self, frame: bytes) -> None:
        """Queue ``frame`` (a whole encoded frame) on the transport; check :meth:`writable`
        first."""
        self._protocol.transport.write(frame)


def abort(ws: WebSocket) -> bool:
    """Drop the TCP connection under ``ws`` at once (no closing handshake); False when the
    server exposes no transport (not served by :class:`HubbubWebSocketProtocol`)."""
    protocol = _protocol_of(ws) if _LIVE["abort"] else None
    if protocol is None:
        logger.warning("cannot abort a stuck WebSocket: the server exposes no transport")
        return False
    protocol.transport.abort()
    return True


def defer_signal(server: uvicorn.Server, sig: int) -> None:
    """Have ``server`` re-raise ``sig`` after it shuts down, as it does for the signals it
    handles itself (a draining server handles the first SIGTERM on its own)."""
    server._captured_signals.append(sig)


class ServerClassWorker(UvicornWorker):  # type: ignore[misc]  # untyped upstream
    """A :class:`uvicorn_worker.UvicornWorker` that serves with :meth:`make_server`."""

    def make_server(self, config: uvicorn.Config) -> uvicorn.Server:
        return uvicorn.Server(config)

    async def _serve(self) -> None:
        # As UvicornWorker._serve (uvicorn-worker 0.4), with make_server.
        self.config.app = self.wsgi
        server = self.make_server(self.config)
        self._install_sigquit_handler()
        await server.serve(sockets=self.sockets)
        if not server.started:
            from gunicorn.arbiter import Arbiter

            sys.exit(Arbiter.WORKER_BOOT_ERROR)


# What uvicorn's protocols' connection_made do (0.54): record the connection and its transport,
# look its addresses and scheme up, log at TRACE level.
_CONNECTION_MADE: Final = frozenset(
    {
        "connections", "add", "transport", "server", "get_local_addr", "client",
        "get_remote_addr", "scheme", "is_ssl", "logger", "level", "TRACE_LOG_LEVEL", "log",
    }
)  # fmt: skip


def fast_paths() -> dict[str, bool]:
    """Whether each fast path can work with what is installed: the internals it uses exist.

    Per connection, :meth:`DirectSocket.of` and :func:`abort` still decide (and say why not).
    """
    protocol = WebSocketsSansIOProtocol
    # The attributes a protocol sets in __init__ (and the scope in handle_connect).
    made = protocol.__init__.__code__.co_names + protocol.handle_connect.__code__.co_names
    writes = all(
        name in made for name in ("writable", "close_sent", "disconnected", "conn", "scope")
    )
    serve = getattr(UvicornWorker, "_serve", None)
    http = HttpToolsProtocol
    return {
        "http_upgrade": "parser" in http.__init__.__code__.co_names
        and "set_protocol" in http.handle_websocket_upgrade.__code__.co_names,
        "transport_peer": {"scope", "client"} <= set(http.on_message_begin.__code__.co_names)
        and "client" in http.connection_made.__code__.co_names,
        "direct_writes": writes and "transport" in protocol.connection_made.__code__.co_names,
        "abort": "transport" in protocol.connection_made.__code__.co_names,
        "parsed_upgrade": {"connections", "ws_protocol_class", "transport"}
        <= set(http.handle_websocket_upgrade.__code__.co_names)
        and {"accept", "send_response", "queue"} <= set(protocol.handle_connect.__code__.co_names)
        and callable(getattr(Protocol, "parse", None)),
        # open_plain does what handle_connect does after websockets' accept, and the 101
        # leaves when the app accepts, from the response it left.
        "plain_upgrade": {"queue", "run_asgi", "on_task_complete", "tasks", "scope", "response"}
        <= set(protocol.handle_connect.__code__.co_names)
        and {"response", "send_response", "default_headers", "start_keepalive"}
        | {"handshake_complete", "initial_response", "writable", "disconnected"}
        <= set(protocol.send.__code__.co_names)
        and {"state", "writes", "serialize"} <= set(ServerProtocol.send_response.__code__.co_names)
        and {"accept_called", "origin"}
        <= set(ServerProtocol.accept.__code__.co_names)
        | set(ServerProtocol.process_request.__code__.co_names)
        and callable(getattr(Protocol, "parse", None)),
        # connection_taken_over does all connection_made does (its trace log line aside),
        # from what the HTTP protocol's connection_made read.
        "upgrade_addresses": set(protocol.connection_made.__code__.co_names)
        <= _CONNECTION_MADE | {"cast", "Transport"}
        and {"server", "client", "scheme", "transport"}
        <= set(http.connection_made.__code__.co_names),
        # HubbubHttpProtocol.connection_made does all uvicorn's does, from the addresses the
        # transport keeps.
        "cached_addresses": set(http.connection_made.__code__.co_names)
        <= _CONNECTION_MADE | {"flow", "FlowControl"}
        and {"server", "client", "scheme", "transport", "flow"}
        <= set(http.connection_made.__code__.co_names),
        # HubbubWebSocketProtocol.data_received queues what send_receive_event_to_app would,
        # while the parser waits where Protocol.parse waits between frames.
        "plain_frames": {"queue", "close_sent", "put_nowait", "read_paused", "pause_reading"}
        <= set(protocol.send_receive_event_to_app.__code__.co_names)
        and {"read_paused", "resume_reading"} <= set(protocol.receive.__code__.co_names)
        and {"reader", "at_eof", "current_size", "max_message_size", "recv_frame"}
        <= set(Protocol.parse.__code__.co_names)
        and {"receive_data", "handle_events"} <= set(protocol.data_received.__code__.co_names),
        "drain_signal": "_captured_signals" in uvicorn.Server.__init__.__code__.co_names,
        "worker_server": serve is not None
        and "_install_sigquit_handler" in serve.__code__.co_names
        and callable(getattr(UvicornWorker, "_install_sigquit_handler", None)),
    }


_LIVE: Final = fast_paths()
