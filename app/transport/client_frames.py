"""Client text frames read without websockets' generic frame parser.

Nearly every frame a chat client sends is one small, whole text message: FIN set, no
extension bits, opcode text, masked (RFC 6455 requires it of clients), a length under 64 KiB.
websockets' parser reads each through three generator-based reads, an ``Opcode`` enum lookup,
a ``Frame`` dataclass and its checks, and uvicorn then turns it into the app's receive event:
about 3 µs a frame, where reading those bytes directly takes a tenth of that.
:func:`whole_texts` reads a chunk of bytes that is exactly such frames, and nothing else;
anything else (a control frame, a fragment, binary, a 64-bit length, a frame cut in two by
the network, invalid UTF-8, a payload over the limit) returns None, and the chunk goes to
websockets' parser, which reads (or refuses) it as before. :mod:`app.transport.uvicorn_seam`
uses it while websockets' parser stands at the start of a frame.
"""

from __future__ import annotations

from typing import Final

try:
    from websockets.speedups import apply_mask
except ImportError:  # websockets built without its C extension, as websockets.frames does
    from websockets.utils import apply_mask

# The first byte of a whole text message: FIN, no RSV bit (no extension), opcode 1.
_WHOLE_TEXT: Final = 0x81
_MASKED: Final = 0x80
_LENGTH_16: Final = 126  # the 7-bit length that says a 16-bit one follows
_LENGTH_64: Final = 127  # ... a 64-bit one: never a chat frame's size; websockets reads it


def whole_texts(data: bytes, max_size: int | None) -> list[str] | None:
    """The texts of ``data`` when it is exactly a run of whole client text frames (FIN, no
    RSV bit, masked, a 7- or 16-bit length of at most ``max_size`` bytes, UTF-8, as uvicorn
    decodes it), in order; None when it is anything else, in part or in whole. Reads nothing
    into any state: on None, the same bytes can go to websockets' parser."""
    texts: list[str] = []
    at, end = 0, len(data)
    while at < end:
        if end - at < 6 or data[at] != _WHOLE_TEXT:
            return None
        second = data[at + 1]
        if not second & _MASKED:
            return None  # websockets fails the connection (1002): let it
        length = second & 0x7F
        start = at + 6
        if length == _LENGTH_16:
            start = at + 8
            if end < start:
                return None
            length = data[at + 2] << 8 | data[at + 3]
        elif length == _LENGTH_64:
            return None
        stop = start + length
        if (max_size is not None and length > max_size) or stop > end:
            return None
        try:
            texts.append(apply_mask(data[start:stop], data[start - 4 : start]).decode())
        except UnicodeDecodeError:
            return None  # uvicorn closes with 1007: let it
        at = stop
    return texts
