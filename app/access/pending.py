"""Sockets that are still to say who they are: counted per worker and per client address,
and capped, because each holds a connection slot without being anyone."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from app.errors import CloseCode


@dataclass(frozen=True, slots=True)
class Full:
    """Why a socket may not wait to authenticate: the close code and reason to send."""

    code: CloseCode
    reason: str


class PendingAuth:
    """Sockets of a worker that are still to say who they are (``jwt`` mode, waiting for the
    ``auth`` frame), per client address: they hold a slot without being anyone, so they are
    capped (``CHAT_MAX_PENDING_AUTH``, ``CHAT_MAX_PENDING_AUTH_PER_ADDRESS``)."""

    def __init__(self, max_total: int, max_per_address: int) -> None:
        self._max_total = max_total
        self._max_per_address = max_per_address
        self._by_address: Counter[str | None] = Counter()
        self.total = 0

    def enter(self, ip: str | None) -> Full | None:
        """Count a socket in, or say why it may not wait (the caller closes it; a socket
        counted in is counted out with :meth:`leave`)."""
        if self.total >= self._max_total:
            return Full(CloseCode.TRY_AGAIN_LATER, "too many sockets waiting to authenticate")
        if self._by_address[ip] >= self._max_per_address:
            return Full(
                CloseCode.TOO_MANY_CONNECTIONS, "too many unauthenticated sockets from this address"
            )
        self._by_address[ip] += 1
        self.total += 1
        return None

    def leave(self, ip: str | None) -> None:
        self.total -= 1
        self._by_address[ip] -= 1
        if self._by_address[ip] <= 0:
            del self._by_address[ip]
