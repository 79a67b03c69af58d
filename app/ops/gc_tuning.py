"""Python's cyclic garbage collector while a worker serves: tuned, and watched.

An open WebSocket keeps ~94 objects in the collector's sight (its call stack's coroutines, the
protocol's buffers, its connection state), and a full (generation 2) collection walks them
all: ~90 ms per 1,000 sockets on the benchmark machine (docs/benchmarks.md), during which the
worker serves nobody. So, while the app serves, :class:`GcTuning`:

- freezes what was built at startup (the imported framework, ~80k objects) out of the
  collector's sight (``gc.freeze``): full collections skip it;
- then, every ``CHAT_GC_FREEZE_INTERVAL_S`` (:func:`keep_freezing`), freezes what survived
  since: open connections' objects stop being walked once they are a second old, so a
  collection's pause is bounded by what a second creates, not by the number of sockets.
  Frozen objects are still freed by reference counting the moment they are unreferenced;
  only a reference cycle among them would never be, and serving creates none: a connection's
  whole life leaves no cyclic garbage (tests/test_garbage.py; uvicorn's own cycle per
  upgrade is broken in :mod:`app.transport.uvicorn_seam`), and
  ``hubbub_gc_collected_objects_total`` shows any the collector still finds. (The frozen
  count is not exported: ``gc.get_freeze_count`` walks every frozen object, a stall of tens of
  ms with 10,000 sockets.)
- makes young collections 7x rarer than Python's default (:data:`GC_THRESHOLDS`): fewer
  short-lived objects (a flush's lists, a message's dicts) are caught alive and promoted to
  older generations, yet each one walks at most 5,000 young objects. A young object costs the
  pass 1-2 us (its references reach into the frozen sockets' memory): with 19,000 sockets
  under traffic, passes of 5,000 took up to 10 ms, of 10,000 up to 25 ms, of 50,000 50-100 ms
  (docs/benchmarks.md);
- while it freezes every interval, leaves middle-generation collections to every 1,000th young
  one instead of every 20th (:data:`GC_THRESHOLDS_FREEZING`): such a pass walks what survived
  young passes since the last freeze, which then freezes it anyway, so it found nothing and
  cost a connect storm 25-30 us of a worker's CPU per client (2-4 passes of 30-60 ms per 4,000
  clients). Without periodic freezing they stay frequent, so each stays short;
- records every collection's pause for ``hubbub_gc_pause_seconds`` (by generation), so that a
  burst of late messages can be matched with a pause. The pause goes into a plain list that
  :meth:`app.ops.metrics.Metrics.sync` publishes: prometheus_client guards its values with a lock
  that is not reentrant (one for all values, in multiprocess mode), and a collection can start
  while this very thread holds it, so observing from inside the collection could deadlock.

:meth:`GcTuning.stop` undoes all three (in-process restarts, tests).
"""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Any, Final

# Python's defaults are (700, 10, 10).
GC_THRESHOLDS: Final = (5_000, 20, 10)
# While survivors are frozen every interval (keep_freezing): middle passes all but never.
GC_THRESHOLDS_FREEZING: Final = (5_000, 1_000, 10)


class GcTuning:
    """Started once the app's long-lived state is built; stopped when the app stops."""

    def __init__(self, pauses: list[tuple[int, float, int]], freezing: bool) -> None:
        """``pauses`` gets (generation, seconds, objects collected) after each collection;
        ``freezing``: :func:`keep_freezing` will run (the thresholds depend on it)."""
        self._pauses = pauses
        self._tuned = GC_THRESHOLDS_FREEZING if freezing else GC_THRESHOLDS
        self._thresholds = gc.get_threshold()
        self._started_at = 0.0

    def start(self) -> None:
        gc.collect()
        gc.freeze()
        self._thresholds = gc.get_threshold()
        gc.set_threshold(*self._tuned)
        gc.callbacks.append(self._observe)

    def stop(self) -> None:
        if self._observe in gc.callbacks:
            gc.callbacks.remove(self._observe)
        gc.unfreeze()
        gc.set_threshold(*self._thresholds)

    def _observe(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started_at = time.perf_counter()
        else:
            seconds = time.perf_counter() - self._started_at
            self._pauses.append((info["generation"], seconds, info["collected"]))


async def keep_freezing(interval_s: float) -> None:
    """Freeze every survivor every ``interval_s`` until cancelled (see the module docstring).
    ``gc.freeze`` moves the collector's lists in O(1): it costs nothing measurable."""
    while True:
        await asyncio.sleep(interval_s)
        gc.freeze()
