"""Per-connection inbound rate limit: a token bucket plus a count of refused frames."""

from __future__ import annotations

from enum import Enum


class Verdict(Enum):
    ALLOW = "allow"
    LIMITED = "limited"  # refuse this frame with an error, keep the connection
    ABUSE = "abuse"  # too many refused frames in the window: close with 1008


class RateLimiter:
    """Token bucket of ``burst`` tokens refilled at ``rate_per_s``; each frame takes one.

    A frame that finds the bucket empty is refused. More than ``max_violations`` refusals within
    one ``window_s`` (a fixed window that starts at the first refusal) is abuse.
    """

    __slots__ = (
        "_burst",
        "_max_violations",
        "_rate",
        "_stamp",
        "_tokens",
        "_violations",
        "_window_s",
        "_window_start",
    )

    def __init__(
        self, rate_per_s: float, burst: int, max_violations: int, window_s: float, now: float
    ) -> None:
        self._rate = rate_per_s
        self._burst = float(burst)
        self._tokens = float(burst)
        self._stamp = now
        self._max_violations = max_violations
        self._window_s = window_s
        self._violations = 0
        self._window_start = now

    def check(self, now: float) -> Verdict:
        """Account one inbound frame arriving at ``now`` (monotonic seconds)."""
        self._tokens = min(self._burst, self._tokens + (now - self._stamp) * self._rate)
        self._stamp = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return Verdict.ALLOW
        if now - self._window_start > self._window_s:
            self._window_start = now
            self._violations = 0
        self._violations += 1
        return Verdict.ABUSE if self._violations > self._max_violations else Verdict.LIMITED
