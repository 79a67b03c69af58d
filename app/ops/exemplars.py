"""Exemplars (the trace behind a latency) in the OpenMetrics exposition, under gunicorn too.

prometheus_client keeps a histogram's exemplars in the memory of the process that observed
them, and its multiprocess mode (gunicorn's workers, PROMETHEUS_MULTIPROC_DIR) leaves them
out. So each worker also keeps, per histogram bucket, its newest traced observation here, and
writes them (when they changed, at most once a second) to ``exemplars_<pid>.json`` in the
multiprocess directory; the exposition, whichever worker serves the scrape, reads every such
file and gives each bucket the newest exemplar any worker saw. A dead worker's file goes with
it (gunicorn's ``child_exit``).

Contract:
- :meth:`Exemplars.heard` is called only for traced observations (rare): it costs nothing
  on untraced ones.
- :func:`attach` adds exemplars to ``<histogram>_bucket`` samples only; the text format 0.0.4
  (what Prometheus asks for unless exemplar storage is on) never carries them.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Final

from prometheus_client.core import Metric
from prometheus_client.samples import Exemplar
from prometheus_client.utils import floatToGoString

FILE_PREFIX: Final = "exemplars_"


class Exemplars:
    """The newest traced observation per bucket of this worker's histograms."""

    def __init__(self) -> None:
        # histogram name -> le -> (trace id, value, unix time)
        self._newest: dict[str, dict[str, tuple[str, float, float]]] = {}
        self._changed = False

    def heard(self, histogram: str, buckets: Sequence[float], value: float, trace_id: str) -> None:
        """``histogram`` observed ``value`` for the trace ``trace_id``."""
        index = bisect.bisect_left(buckets, value)
        le = floatToGoString(buckets[index]) if index < len(buckets) else "+Inf"  # type: ignore[no-untyped-call]  # untyped upstream
        self._newest.setdefault(histogram, {})[le] = (trace_id, value, time.time())
        self._changed = True

    def save(self, directory: str) -> None:
        """Write this worker's exemplars to ``directory`` if they changed since last time."""
        if not self._changed:
            return
        self._changed = False
        target = Path(directory) / f"{FILE_PREFIX}{os.getpid()}.json"
        temporary = target.with_suffix(".tmp")
        temporary.write_text(json.dumps(self._newest))
        temporary.replace(target)  # a scrape never reads half a file


def remove_of(directory: str, pid: int) -> None:
    """Forget the exemplars of worker ``pid`` (it exited)."""
    with contextlib.suppress(OSError):
        (Path(directory) / f"{FILE_PREFIX}{pid}.json").unlink()


def _load(directory: str) -> dict[str, dict[str, tuple[str, float, float]]]:
    """Every worker's exemplars merged: per histogram and bucket, the newest."""
    merged: dict[str, dict[str, tuple[str, float, float]]] = {}
    for path in Path(directory).glob(f"{FILE_PREFIX}*.json"):
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError):  # being replaced, or a worker died writing it
            continue
        for histogram, buckets in saved.items():
            mine = merged.setdefault(histogram, {})
            for le, (trace_id, value, at) in buckets.items():
                if le not in mine or at > mine[le][2]:
                    mine[le] = (str(trace_id), float(value), float(at))
    return merged


def attach(metrics: Iterable[Metric], directory: str) -> Iterator[Metric]:
    """``metrics`` (a multiprocess collection) with the saved exemplars on their buckets."""
    saved = _load(directory)
    for metric in metrics:
        buckets = saved.get(metric.name)
        if buckets and metric.type == "histogram":
            bucket_name = metric.name + "_bucket"
            samples = []
            for sample in metric.samples:
                found = (
                    buckets.get(sample.labels.get("le", "")) if sample.name == bucket_name else None
                )
                if found is not None:
                    exemplar = Exemplar({"trace_id": found[0]}, found[1], found[2])
                    sample = sample._replace(exemplar=exemplar)
                samples.append(sample)
            metric.samples = samples
        yield metric
