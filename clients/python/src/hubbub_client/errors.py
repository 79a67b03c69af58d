"""The exceptions the client raises: a refused frame, a timeout, a closed client."""

from __future__ import annotations

from hubbub_client.frames import Cid, ErrorFrame


class HubbubError(Exception):
    """A frame the server refused (``code``: one of :data:`~hubbub_client.frames.ERROR_CODES`,
    see docs/protocol.md, "Error codes"), or one the client gave up on (``closed``,
    ``disconnected``, ``timeout``, ``ack_timeout``, ``not_connected``).

    ``frame`` is the server's ``error`` frame when there is one; ``cid`` the refused send's,
    for a retry with the same ``cid`` (the server deduplicates it).
    """

    def __init__(
        self, code: str, message: str, frame: ErrorFrame | None = None, cid: Cid | None = None
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.frame = frame
        self.cid: Cid | None = cid if cid is not None or frame is None else frame.get("cid")


class HubbubTimeoutError(HubbubError, TimeoutError):
    """No answer in time (a ``TimeoutError`` too)."""

    def __init__(self, message: str, code: str = "timeout", cid: Cid | None = None) -> None:
        super().__init__(code, message, cid=cid)


class AckTimeoutError(HubbubTimeoutError):
    """No ack within ``ack_timeout_s`` of the send being written on an open connection: it is
    no longer resent. It may still have been published: send it again with the same ``cid``
    (``send(..., cid=error.cid)``) to be sure; the server answers a duplicate with the first
    message's id."""

    def __init__(self, cid: Cid) -> None:
        super().__init__(f"no ack for {cid!r}", code="ack_timeout", cid=cid)


class ClientClosedError(HubbubError):
    """The client is closed (``close()``, or a close code after which it does not reconnect):
    what was waiting for an answer will not get one."""

    def __init__(self, message: str, cid: Cid | None = None) -> None:
        super().__init__("closed", message, cid=cid)


class ConnectionLostError(HubbubError):
    """The connection ended before the answer to a request (``history``, ``rooms``...) came:
    the client reconnects by itself; ask again."""

    def __init__(self, message: str = "the connection was lost before the answer") -> None:
        super().__init__("disconnected", message)
