"""Close codes and error codes: the only place that says what each failure means to a client.

Close codes end a connection; error codes ride in ``{"type":"error"}`` frames on a connection
that stays open. ``docs/protocol.md`` carries the same two tables, and a test keeps them in step.
"""

from __future__ import annotations

from enum import IntEnum, StrEnum


class CloseCode(IntEnum):
    """WebSocket close codes the server sends, with the client's reconnect policy."""

    NORMAL_CLOSURE = 1000
    INVALID_DATA = 1007  # sent by uvicorn for a text frame that is not UTF-8
    POLICY_VIOLATION = 1008
    MESSAGE_TOO_BIG = 1009
    INTERNAL_ERROR = 1011
    SERVICE_RESTART = 1012
    TRY_AGAIN_LATER = 1013
    AUTH_FAILED = 4001
    TOKEN_EXPIRED = 4002
    FORBIDDEN = 4003
    SLOW_CONSUMER = 4008
    HEARTBEAT_TIMEOUT = 4009
    TOO_MANY_CONNECTIONS = 4029

    @property
    def should_reconnect(self) -> bool:
        """Whether a client should reconnect (with jittered backoff) after this code."""
        return self not in _TERMINAL


MAX_CLOSE_REASON_BYTES = 123  # RFC 6455: a close frame's payload is at most 125 bytes


def close_reason(text: str) -> str:
    """``text`` cut to what a close frame can carry (123 bytes of UTF-8, whole characters): a
    longer reason would make the close itself fail, and the client see 1006."""
    encoded = text.encode()
    if len(encoded) <= MAX_CLOSE_REASON_BYTES:
        return text
    return encoded[:MAX_CLOSE_REASON_BYTES].decode(errors="ignore")


_TERMINAL = frozenset(
    {
        CloseCode.NORMAL_CLOSURE,
        CloseCode.INVALID_DATA,
        CloseCode.POLICY_VIOLATION,
        CloseCode.MESSAGE_TOO_BIG,
        CloseCode.AUTH_FAILED,
        CloseCode.FORBIDDEN,
    }
)


class ErrorCode(StrEnum):
    """The ``code`` of an ``error`` frame. The connection stays open after each of them."""

    BAD_JSON = "bad_json"
    BAD_FRAME = "bad_frame"
    UNKNOWN_TYPE = "unknown_type"
    BINARY_UNSUPPORTED = "binary_unsupported"
    TEXT_TOO_LONG = "text_too_long"
    NOT_JOINED = "not_joined"
    TOO_MANY_ROOMS = "too_many_rooms"
    TOO_MANY_MEMBERS = "too_many_members"
    RATE_LIMITED = "rate_limited"
    BROKER_UNAVAILABLE = "broker_unavailable"
    RESYNC = "resync"
    FORBIDDEN = "forbidden"
    STORE_UNAVAILABLE = "store_unavailable"
    NO_STORE = "no_store"
    NOT_FOUND = "not_found"
    EXISTS = "exists"
    FILE_TOO_LARGE = "file_too_large"
    STORAGE_UNAVAILABLE = "storage_unavailable"
    TOO_MANY_HIDDEN = "too_many_hidden"
    REJECTED = "rejected"
    MODERATION_UNAVAILABLE = "moderation_unavailable"
    PREVIEW_UNAVAILABLE = "preview_unavailable"


class FrameError(Exception):
    """A client frame was refused; the client gets an ``error`` frame and the socket stays open."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class BrokerUnavailable(Exception):
    """The broker cannot take a publish or subscription right now (it is down or reconnecting)."""


class MessageGone(Exception):
    """An event was refused: the message it changes is deleted."""


class QuotaExceeded(Exception):
    """A publish was refused: the sender had no message token left
    (``CHAT_USER_MESSAGES_PER_S``)."""
