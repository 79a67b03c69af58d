"""Failed logins of the moderation API, per client address: an admin token cannot be guessed
online."""

from __future__ import annotations

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
