"""The plain WebSocket opening handshake, checked and answered without websockets' generic
HTTP machinery.

websockets' ``ServerProtocol.accept`` parses every header of an upgrade with its RFC 7230
list and token parsers, builds a ``Headers`` for the request and another for the response
(with a ``Date`` that uvicorn replaces with its own): about a tenth of what a connect costs a
worker. Nearly every upgrade is the same plain request — ``GET``, HTTP/1.1, one
``Upgrade: websocket``, ``Connection`` naming ``upgrade``, one 16-byte
``Sec-WebSocket-Key``, ``Sec-WebSocket-Version: 13`` — with no extension to negotiate (the
server offers none unless ``CHAT_WS_PER_MESSAGE_DEFLATE`` is on) and no subprotocol asked for.
:func:`plain_upgrade` recognises exactly those, from the headers ``httptools`` parsed, and
returns what the answer needs; anything else (including every request websockets would refuse
or negotiate on) returns None and takes websockets' own path, which answers it as before.
"""

from __future__ import annotations

import binascii
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

# RFC 6455 section 4.2.2: the key's answer is the base64 of the SHA-1 of the key and this.
_ACCEPT_GUID: Final = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

# The bytes of an RFC 7230 token and of a field value (visible ASCII, space, tab and
# obs-text), as websockets' parser accepts them (``http11._token_re``, ``_value_re``).
_TOKEN_BYTES: Final = (
    b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
)
_VALUE_BYTES: Final = bytes([0x09, *range(0x20, 0x7F), *range(0x80, 0x100)])
# Headers websockets reads for a body (an upgrade has none), or negotiates on: with any of
# them the request takes websockets' path.
_NOT_PLAIN: Final = frozenset((b"content-length", b"transfer-encoding", b"sec-websocket-protocol"))
_SINGLE: Final = (b"upgrade", b"sec-websocket-key", b"sec-websocket-version")
# The headers that decide whether an upgrade is plain; the others are only checked as fields.
_DECIDING: Final = frozenset((*_NOT_PLAIN, *_SINGLE, b"connection", b"origin"))


@dataclass(frozen=True, slots=True)
class PlainUpgrade:
    """A plain upgrade request, checked: its ``Sec-WebSocket-Accept`` answer, and its
    ``Origin`` (None when it sent none), as websockets' ``ServerProtocol`` records it."""

    accept: str
    origin: str | None


def _is_token(data: bytes) -> bool:
    return bool(data) and not data.translate(None, _TOKEN_BYTES)


def fields_as_websockets_reads_them(
    headers: Sequence[tuple[bytes, bytes]], max_line: int, max_headers: int
) -> bool:
    """Whether websockets' parser would read ``headers`` (``httptools``' parse) as they are:
    at most ``max_headers`` of them, every name a token, every value free of control
    characters (tab aside) and of surrounding space or tab, every line (``name: value``)
    within ``max_line`` bytes. Checked on all of them at once, a pass of C each."""
    if len(headers) > max_headers:
        return False
    names = [name for name, _ in headers]
    values = [value for _, value in headers]
    if not all(names) or b"".join(names).translate(None, _TOKEN_BYTES):
        return False
    # The values between NULs: a value starts or ends with space or tab where one follows or
    # precedes a NUL; nothing but those NULs is left once every allowed byte is taken out.
    joined = b"\0" + b"\0".join(values) + b"\0"
    if len(joined.translate(None, _VALUE_BYTES)) != len(values) + 1:
        return False
    if any(edge in joined for edge in (b"\0 ", b"\0\t", b" \0", b"\t\0")):
        return False
    # Every line is within the limit when all of them together are (the usual case).
    if len(joined) + sum(map(len, names)) + 2 * len(headers) <= max_line:
        return True
    return all(len(name) + len(value) + 2 <= max_line for name, value in headers)


def plain_upgrade(
    method: str,
    http_version: str,
    target: bytes,
    headers: Sequence[tuple[bytes, bytes]],
    *,
    max_line: int,
    max_headers: int,
) -> PlainUpgrade | None:
    """The answer to an upgrade request (``httptools``' parse: lower-case names) when
    websockets' ``ServerProtocol``, offering no extension and no subprotocol, would accept it
    with no negotiation and read every header as ``httptools`` did; else None (let websockets
    check and answer it). ``max_line`` and ``max_headers``: the limits of websockets' parser
    (``MAX_LINE_LENGTH``, ``MAX_NUM_HEADERS``: the seam passes them).

    Checks what websockets' parser and ``process_request`` check: the request line within its
    limit, the headers as :func:`fields_as_websockets_reads_them` says and no body headers;
    ``GET`` over HTTP/1.1; ``Connection`` listing ``upgrade`` (every element a token); exactly
    one ``Upgrade``, ``websocket``; exactly one ``Sec-WebSocket-Key``, the base64 of 16 bytes;
    exactly one ``Sec-WebSocket-Version``, 13; at most one ``Origin``. A
    ``Sec-WebSocket-Protocol`` header takes websockets' path."""
    if method != "GET" or http_version != "1.1":
        return None
    if len(target) > max_line or not target.isascii():
        return None
    if not fields_as_websockets_reads_them(headers, max_line, max_headers):
        return None
    upgrade_asked = False
    found: dict[bytes, bytes] = {}
    origin: bytes | None = None
    for name, value in headers:
        if name not in _DECIDING:
            continue
        if name in _NOT_PLAIN:
            return None
        if name == b"connection":
            options = [option.strip(b" \t") for option in value.split(b",")]
            if not all(_is_token(option) for option in options):
                return None
            upgrade_asked = upgrade_asked or any(o.lower() == b"upgrade" for o in options)
        elif name == b"origin":
            if origin is not None:
                return None
            origin = value
        elif name in found:
            return None
        else:
            found[name] = value
    if not upgrade_asked or len(found) != len(_SINGLE):
        return None
    if found[b"upgrade"].lower() != b"websocket" or found[b"sec-websocket-version"] != b"13":
        return None
    key = found[b"sec-websocket-key"]
    try:  # what websockets' base64.b64decode(key, validate=True) does, without its wrapping
        if len(binascii.a2b_base64(key, strict_mode=True)) != 16:
            return None
    except binascii.Error:
        return None
    return PlainUpgrade(
        binascii.b2a_base64(hashlib.sha1(key + _ACCEPT_GUID).digest(), newline=False).decode(),
        None if origin is None else origin.decode("iso-8859-1"),
    )
