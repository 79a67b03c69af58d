"""Periodic upkeep in Redis spread over time rather than done in one burst.

A worker's upkeep (its presence entries, its connection counts) touches every room or
connection it has, every few seconds. Done at once, it is thousands of script calls that
Redis runs back to back while every worker's messages wait behind them, and a tail of
delivery each time (docs/benchmarks.md, issue 34, "the presence upkeep"). :func:`spread`
deals a pass's chunks out over part of its interval instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator


async def spread(count: int, over_s: float) -> AsyncIterator[int]:
    """0, 1, ... ``count - 1``, the k-th no sooner than k / count of ``over_s`` after the
    first (at once when ``over_s`` is 0, or when the caller is late): ``count`` chunks of
    work evenly spread over ``over_s`` seconds, the last one starting before it ends."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    for k in range(count):
        delay = began + over_s * k / count - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        yield k
