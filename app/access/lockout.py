"""Failed logins of the moderation and backend APIs, per client address: their tokens cannot
be guessed online."""

from __future__ import annotations

import hmac

# Failed admin logins tolerated per client address and window (per worker); beyond them every
# attempt from that address gets 429 until the window ends: a token cannot be guessed online.
MAX_FAILURES, FAILURE_WINDOW_S = 5, 60.0


class FailedLogins:
    """Failed admin logins per client address, in fixed windows; bounded in memory."""

    def __init__(self, max_failures: int, window_s: float, max_addresses: int = 10_000) -> None:
        self._max_failures = max_failures
        self.window_s = window_s
        self._max_addresses = max_addresses
        self._failures: dict[str | None, tuple[float, int]] = {}  # address -> (start, count)

    def locked_out(self, address: str | None, now: float) -> bool:
        start, count = self._failures.get(address, (now, 0))
        if now - start >= self.window_s:
            del self._failures[address]
            return False
        return count >= self._max_failures

    def failed(self, address: str | None, now: float) -> None:
        start, count = self._failures.get(address, (now, 0))
        if now - start >= self.window_s:
            start, count = now, 0
        if len(self._failures) >= self._max_addresses and address not in self._failures:
            self._failures = {a: w for a, w in self._failures.items() if now - w[0] < self.window_s}
        self._failures[address] = (start, count + 1)


def check_bearer(
    failed_logins: FailedLogins,
    address: str | None,
    authorization: str | None,
    token: str,
    now: float,
) -> int | None:
    """Check an ``Authorization`` header against ``Bearer <token>`` in constant time: None
    when it matches, else the HTTP status to answer (429 while ``address`` is locked out,
    401 otherwise; a failure counts towards the lockout)."""
    if failed_logins.locked_out(address, now):
        return 429
    expected = f"Bearer {token}".encode()
    if authorization is None or not hmac.compare_digest(authorization.encode(), expected):
        failed_logins.failed(address, now)
        return 401
    return None
