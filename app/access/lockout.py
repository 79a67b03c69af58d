"""Failed logins of the moderation and backend APIs: their tokens cannot be guessed online.

Three budgets of failed attempts, in fixed windows of ``CHAT_BEARER_FAILURE_WINDOW_S``, per
worker; past any one of them the attempt is refused with 429 before its token is looked at,
the right token included:

- per client address (``CHAT_BEARER_MAX_FAILURES``);
- per forwarding proxy: a request whose address a trusted proxy (``CHAT_TRUSTED_PROXIES``)
  wrote from ``X-Forwarded-For`` counts against the proxy's own address as well, with the
  same budget, so that a client of the proxy who writes a new address into the header for
  every attempt gains nothing;
- in all (``CHAT_BEARER_MAX_FAILURES_TOTAL``): whatever addresses the failures come from,
  real or made up, a worker takes no more than this many per window. These tokens belong to
  backends, not to browsers: a lockout of everyone for the rest of a window, while someone
  is guessing, is the price (docs/security.md).
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Collection
from typing import Self

from app.settings import Settings

logger = logging.getLogger(__name__)

# What a bearer check answers instead of admitting the request.
LOCKED_OUT, UNAUTHORIZED = 429, 401


class FailedLogins:
    """Failed logins per address, and in all, in fixed windows; bounded in memory."""

    def __init__(
        self,
        max_failures: int,
        window_s: float,
        max_total_failures: int,
        max_addresses: int = 10_000,
    ) -> None:
        self._max_failures = max_failures
        self.window_s = window_s
        self._max_total = max_total_failures
        self._max_addresses = max_addresses
        self._failures: dict[str | None, tuple[float, int]] = {}  # address -> (start, count)
        self._total: tuple[float, int] = (0.0, 0)  # (start, count) of every address together

    @classmethod
    def of(cls, settings: Settings) -> Self:
        return cls(
            settings.bearer_max_failures,
            settings.bearer_failure_window_s,
            settings.bearer_max_failures_total,
        )

    def _count(self, window: tuple[float, int], now: float) -> int:
        start, count = window
        return count if now - start < self.window_s else 0

    def retry_after_s(self, addresses: Collection[str | None], now: float) -> float:
        """0 when none of ``addresses`` is locked out, nor everyone; else the seconds until
        the last of those lockouts ends."""
        locks = [self._total] if self._count(self._total, now) >= self._max_total else []
        for address in addresses:
            window = self._failures.get(address)
            if window is not None and self._count(window, now) >= self._max_failures:
                locks.append(window)
        return max((start + self.window_s - now for start, _ in locks), default=0.0)

    def failed(self, addresses: Collection[str | None], now: float) -> None:
        """Count one failed attempt against each of ``addresses`` and against the total."""
        total = self._count(self._total, now)
        self._total = (self._total[0] if total else now, total + 1)
        if total + 1 == self._max_total:
            logger.warning(
                "bearer tokens: %d failed attempts on this worker within %g s: every attempt "
                "is refused (429) until the window ends",
                total + 1,
                self.window_s,
            )
        if len(self._failures) + len(addresses) > self._max_addresses:
            self._failures = {a: w for a, w in self._failures.items() if now - w[0] < self.window_s}
        for address in addresses:
            window = self._failures.get(address, (now, 0))
            count = self._count(window, now)
            self._failures[address] = (window[0] if count else now, count + 1)


def check_bearer(
    failed_logins: FailedLogins,
    addresses: Collection[str | None],
    authorization: str | None,
    token: str,
    now: float,
) -> int | None:
    """Check an ``Authorization`` header against ``Bearer <token>`` in constant time: None
    when it matches, else the HTTP status to answer: :data:`LOCKED_OUT` while one of
    ``addresses`` (the client's, and the proxy's that forwarded it) or every address is
    locked out, :data:`UNAUTHORIZED` otherwise (a failure, counted towards the lockouts)."""
    if failed_logins.retry_after_s(addresses, now) > 0:
        return LOCKED_OUT
    expected = f"Bearer {token}".encode()
    if authorization is None or not hmac.compare_digest(authorization.encode(), expected):
        failed_logins.failed(addresses, now)
        return UNAUTHORIZED
    return None
