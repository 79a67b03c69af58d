"""The Origin check on WebSocket upgrades (against cross-site WebSocket hijacking).

Browsers send ``Origin`` with every upgrade and let any site open a WebSocket to any server,
cookies and all; CORS does not apply. An upgrade whose ``Origin`` is neither this server's own
host nor in ``CHAT_ALLOWED_ORIGINS`` is refused with HTTP 403 before a socket exists.
Requests without ``Origin`` (non-browser clients, which can send any header anyway) pass.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from starlette.datastructures import Headers


class OriginPolicy:
    """Which ``Origin`` values may open WebSockets: the request's own host, plus a list."""

    def __init__(self, allowed: str) -> None:
        entries = [entry.strip().rstrip("/").lower() for entry in allowed.split(",")]
        self._any = "*" in entries
        self._allowed = frozenset(entry for entry in entries if entry and entry != "*")

    def allows(self, headers: Headers) -> bool:
        origin = headers.get("origin")
        if origin is None or self._any:
            return True
        origin = origin.rstrip("/").lower()
        if origin in self._allowed:
            return True
        host = headers.get("host", "").lower()
        netloc = urlsplit(origin).netloc
        return bool(host) and netloc == host
