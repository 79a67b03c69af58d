"""Measurements a load-test process collects and the parent merges: counters, a latency
histogram (log buckets, 1 % wide: percentiles within 1 %, constant memory), and a per-second
series for the plots."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

_STEP = math.log(1.01)


def bucket_of(ms: float) -> int:
    return int(math.log(max(ms, 0.001)) / _STEP)


@dataclass
class Histogram:
    """Latencies in milliseconds."""

    buckets: Counter[int] = field(default_factory=Counter)
    count: int = 0
    max_ms: float = 0.0

    def add(self, ms: float, bucket: int | None = None) -> None:
        """Count ``ms`` (``bucket``: its bucket, when the caller has it already)."""
        self.buckets[bucket_of(ms) if bucket is None else bucket] += 1
        self.count += 1
        if ms > self.max_ms:
            self.max_ms = ms

    def merge(self, other: Histogram) -> None:
        self.buckets.update(other.buckets)
        self.count += other.count
        self.max_ms = max(self.max_ms, other.max_ms)

    def percentile(self, p: float) -> float:
        """The ``p``-th percentile (0-100), NaN when empty."""
        if not self.count:
            return math.nan
        rank = max(1, math.ceil(p / 100 * self.count))
        seen = 0
        for bucket in sorted(self.buckets):
            seen += self.buckets[bucket]
            if seen >= rank:
                return min(math.exp((bucket + 0.5) * _STEP), self.max_ms)
        return self.max_ms

    def summary(self) -> dict[str, float]:
        return {
            "p50_ms": self.percentile(50),
            "p90_ms": self.percentile(90),
            "p99_ms": self.percentile(99),
            "max_ms": self.max_ms if self.count else math.nan,
        }


@dataclass
class Series:
    """Per-second counts and latency histograms, by whole seconds since the run's start."""

    counts: Counter[int] = field(default_factory=Counter)
    latency: dict[int, Histogram] = field(default_factory=dict)

    def add(self, second: int, ms: float | None = None, bucket: int | None = None) -> None:
        self.counts[second] += 1
        if ms is not None:
            histogram = self.latency.get(second)
            if histogram is None:
                histogram = self.latency[second] = Histogram()
            histogram.add(ms, bucket)

    def merge(self, other: Series) -> None:
        self.counts.update(other.counts)
        for second, hist in other.latency.items():
            self.latency.setdefault(second, Histogram()).merge(hist)

    def rows(self) -> list[dict[str, Any]]:
        seconds = sorted(set(self.counts) | set(self.latency))
        return [
            {
                "second": s,
                "count": self.counts.get(s, 0),
                **(self.latency[s].summary() if s in self.latency else {}),
            }
            for s in seconds
        ]


@dataclass
class Stats:
    """Everything one process measured."""

    latency: Histogram = field(default_factory=Histogram)
    series: Series = field(default_factory=Series)
    counters: Counter[str] = field(default_factory=Counter)
    cpu_s: float = 0.0  # the process's CPU time during the measured phase
    wall_s: float = 0.0  # the measured phase's length
    last_at: float = 0.0  # time.time() of the last operation completed

    def merge(self, other: Stats) -> None:
        self.latency.merge(other.latency)
        self.series.merge(other.series)
        self.counters.update(other.counters)
        self.cpu_s += other.cpu_s
        self.wall_s = max(self.wall_s, other.wall_s)
        self.last_at = max(self.last_at, other.last_at)
