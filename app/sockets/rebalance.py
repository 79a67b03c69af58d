"""Rebalancing: a worker far above the deployment's average sheds connections, paced.

WebSockets stay on the worker they landed on, so after a scale-out the new pods start empty
and the old ones keep their load. Every ``CHAT_REBALANCE_INTERVAL_S`` each worker reports its
connection count, readiness and draining to a census in Redis (:meth:`Broker.census`) and
reads everyone's. Contract:

- A worker sheds only when every worker in the census is ready and none is draining (a
  deploy or a failover in progress is not a time to move clients), it is one of at least
  two, and it holds more than the average by more than ``CHAT_REBALANCE_MARGIN`` (a
  fraction of the average) and by at least ``CHAT_REBALANCE_MIN_EXCESS`` connections.
- It then sheds down to the average (once started it goes on, round after round, without
  the margin, until it is within half ``CHAT_REBALANCE_MIN_EXCESS`` of the average: the
  margin keeps workers from starting over small differences, not from finishing), no faster
  than ``CHAT_REBALANCE_SHED_PER_S``: each
  round closes at most that rate times the interval, in small batches spread over the
  round, picked at random, with 1012 and the reason ``rebalancing: reconnect``. Clients
  reconnect (through the load balancer, to wherever it sends them) and rejoin with
  ``since``: nothing is lost. After a round that shed, a worker skips one round's decision
  (it still reports): by then every other worker has reported again, with the clients it
  took, so the census shows where they went and the worker does not shed past the average
  on stale counts; it sheds again only if it is still over.
- A worker that stops reporting is out of the census after three intervals. A record this
  release cannot read (a newer one's, during a rolling deploy) is left alone and not counted.

``hubbub_rebalance_shed_total`` counts what was shed; ``hubbub_rebalance_average_connections``
is the average this worker last saw.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import random
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from app.broker import Broker
from app.errors import BrokerUnavailable, CloseCode
from app.ops.metrics import Metrics
from app.settings import Settings
from app.sockets.hub import Hub

logger = logging.getLogger(__name__)

SHED_REASON = "rebalancing: reconnect"
# A round's closes go out in batches at most this often (as a drain's).
_BATCH_INTERVAL_S = 0.1
# A worker missing from this many rounds is gone.
_ROUNDS_TO_FORGET = 3


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    """One worker's census record."""

    worker: str
    connections: int
    ready: bool
    draining: bool
    at_ms: int  # when it reported (its clock)
    host: str = ""
    pid: int = 0

    def encode(self) -> bytes:
        return orjson.dumps(
            {
                "connections": self.connections,
                "ready": self.ready,
                "draining": self.draining,
                "at_ms": self.at_ms,
                "host": self.host,
                "pid": self.pid,
            }
        )

    @classmethod
    def decode(cls, worker: str, record: bytes) -> WorkerLoad | None:
        """None for a record this release cannot read (another release's, or garbage)."""
        try:
            fields = orjson.loads(record)
            return cls(
                worker,
                int(fields["connections"]),
                bool(fields["ready"]),
                bool(fields["draining"]),
                int(fields["at_ms"]),
                str(fields.get("host", "")),
                int(fields.get("pid", 0)),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            return None


def excess_connections(
    own: WorkerLoad,
    loads: Sequence[WorkerLoad],
    margin: float,
    min_excess: int,
    shedding: bool = False,
) -> int:
    """How many connections ``own`` should shed to come down to the average of ``loads``
    (which include ``own``): 0 unless it is over as the module's contract says. ``shedding``:
    it shed in its last decision (it finishes: no margin, half the minimum)."""
    if len(loads) < 2 or any(not load.ready or load.draining for load in loads):
        return 0
    average = sum(load.connections for load in loads) / len(loads)
    over = own.connections - average
    if shedding:
        return math.floor(over) if over >= min_excess / 2 else 0
    if over <= average * margin or over < min_excess:
        return 0
    return math.floor(over)


class Rebalancer:
    """Runs the census and the shedding of one worker (see the module's contract)."""

    def __init__(self, hub: Hub, broker: Broker, settings: Settings, metrics: Metrics) -> None:
        self._hub = hub
        self._broker = broker
        self._settings = settings
        self._metrics = metrics
        self._host = socket.gethostname()
        self._pid = os.getpid()

    def own_load(self) -> WorkerLoad:
        return WorkerLoad(
            self._broker.worker_id,
            len(self._hub.connections),
            self._broker.ready and not self._hub.draining,
            self._hub.draining,
            int(time.time() * 1000),
            self._host,
            self._pid,
        )

    async def loads(self) -> list[WorkerLoad]:
        """Report this worker and read the census: the workers heard from recently, this one
        first. Those silent for too long are dropped from it. Raises BrokerUnavailable."""
        interval_ms = int(self._settings.rebalance_interval_s * 1000)
        own = self.own_load()
        records = await self._broker.census(own.encode(), interval_ms * _ROUNDS_TO_FORGET * 2)
        loads, gone = [own], []
        for worker, record in records.items():
            if worker == own.worker:
                continue
            load = WorkerLoad.decode(worker, record)
            if load is None:
                continue  # another release's (a rolling deploy): not this one's to judge
            if own.at_ms - load.at_ms > interval_ms * _ROUNDS_TO_FORGET:
                gone.append(worker)
            else:
                loads.append(load)
        if gone:
            await self._broker.forget_workers(gone)
        return loads

    async def run(self) -> None:
        """One round every ``CHAT_REBALANCE_INTERVAL_S`` until cancelled."""
        settings = self._settings
        interval = settings.rebalance_interval_s
        settling = False  # the round after one that shed: report only
        shedding = False  # its last decision was to shed
        this = asyncio.current_task()
        while True:
            started = time.monotonic()
            try:
                loads = await self.loads()
            except BrokerUnavailable as exc:
                if this is not None and this.cancelling():
                    # redis-py turned the cancellation into an error: stop all the same.
                    raise asyncio.CancelledError from None
                logger.info("rebalancing: no census this round (%s)", exc)
            else:
                average = sum(load.connections for load in loads) / len(loads)
                self._metrics.rebalance_average.set(average)
                excess = excess_connections(
                    loads[0], loads, settings.rebalance_margin, settings.rebalance_min_excess,
                    shedding,
                )  # fmt: skip
                if settling:
                    settling = False
                else:
                    shedding = bool(excess) and settings.rebalance
                    if shedding:
                        quota = math.ceil(settings.rebalance_shed_per_s * interval)
                        await self._shed(min(excess, quota), average, interval)
                        settling = True
            if this is not None and this.cancelling():
                # A cancellation something below swallowed (redis-py retrying a call it cut
                # short): the sleep would not see it, and the task would never stop.
                raise asyncio.CancelledError
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))

    async def _shed(self, count: int, average: float, within_s: float) -> None:
        """Close ``count`` random connections with 1012, in batches spread over ``within_s``."""
        hub = self._hub
        picked = random.sample(list(hub.connections), min(count, len(hub.connections)))
        logger.info(
            "rebalancing: shedding %d of %d connections (average %.0f per worker)",
            len(picked), len(hub.connections), average,
        )  # fmt: skip
        batches = max(1, min(len(picked), int(within_s / _BATCH_INTERVAL_S)))
        for n in range(batches):
            if hub.draining:  # a drain closes them all anyway, at its own pace
                return
            batch = picked[n * len(picked) // batches : (n + 1) * len(picked) // batches]
            for conn in batch:
                conn.close(CloseCode.SERVICE_RESTART, SHED_REASON)
            self._metrics.rebalance_shed.inc(len(batch))
            if n + 1 < batches:
                await asyncio.sleep(within_s / batches)
