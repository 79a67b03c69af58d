"""Token buckets in this process, one per (kind, key): the memory broker's message quota and
:class:`~app.access.quotas.MemoryQuotas`' rates."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Final

# Past this many buckets, the full ones (idle long enough to have refilled) are forgotten.
_FORGET_ABOVE: Final = 100_000


class _Bucket:
    __slots__ = ("stamp", "tokens")

    def __init__(self, burst: int, now: float) -> None:
        self.tokens = float(burst)
        self.stamp = now


class TokenBuckets:
    """``rates`` maps each kind to (tokens per second, burst)."""

    def __init__(self, rates: Mapping[str, tuple[float, int]]) -> None:
        self._rates = dict(rates)
        self._buckets: dict[tuple[str, str], _Bucket] = {}

    def take_at(self, rate: tuple[float, int], key: str) -> bool:
        """As :meth:`take`, at ``rate`` (per second, burst) instead of a kind's."""
        kind = f"{rate[0]}/{rate[1]}"
        self._rates.setdefault(kind, rate)
        return self.take(kind, key)

    def take(self, kind: str, key: str) -> bool:
        """Take one token from ``key``'s bucket of ``kind``; False when it has none."""
        per_s, burst = self._rates[kind]
        now = time.monotonic()
        bucket = self._buckets.get((kind, key))
        if bucket is None:
            if len(self._buckets) > _FORGET_ABOVE:
                self._buckets = {
                    k: b
                    for k, b in self._buckets.items()
                    if now - b.stamp < self._rates[k[0]][1] / self._rates[k[0]][0]
                }
            bucket = self._buckets[(kind, key)] = _Bucket(burst, now)
        bucket.tokens = min(burst, bucket.tokens + (now - bucket.stamp) * per_s)
        bucket.stamp = now
        if bucket.tokens < 1:
            return False
        bucket.tokens -= 1
        return True
