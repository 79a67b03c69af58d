"""Script calls on a Redis Cluster: each routed to the master of its keys' slot, and each
master's calls pipelined by an :class:`~app.redisio.autopipeline.AutoPipeline` of its own.

redis-py's ``RedisCluster`` knows the topology (``CLUSTER SLOTS``, reloaded on ``MOVED`` and
after a failover); this module keeps its fast path: one write per loop iteration per master,
replies parsed by hiredis.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any, cast

from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import MovedError, RedisClusterException, RedisError, ResponseError

from app.redisio.autopipeline import AutoPipeline, Merge, Script
from app.redisio.clients import describe, node_client
from app.settings import Settings

logger = logging.getLogger(__name__)

# Error replies that mean the call went to a node that does not serve its slot (now): the
# script did not run, so it is safe to send it again once the topology is reloaded.
_REROUTE = ("MOVED ", "ASK ", "TRYAGAIN", "CLUSTERDOWN")
_ATTEMPTS = 3


class ClusterPipelines:
    """Routes script calls by the slot of their first key (every key of a call must share it:
    Redis refuses a script that touches another slot).

    Contract:

    * **Ordering:** calls on one slot reach Redis in the order they were made (one connection
      per master); calls on different slots are not ordered with each other.
    * **Re-routing:** a call answered ``MOVED``/``ASK``/``TRYAGAIN``/``CLUSTERDOWN`` did not
      run; the topology is reloaded and the call sent again (at most three times in all).
    * **Failures:** a lost connection fails the calls waiting on it (``ConnectionError``, as
      :class:`AutoPipeline` does: they may have run) and reloads the topology in the
      background, so the next calls go to the master that replaced the lost one.
    * The owner calls :meth:`close`.
    """

    def __init__(
        self,
        cluster: RedisCluster,
        client_for: Callable[[ClusterNode], Redis],
        wait_replicas: int = 0,
        wait_timeout_s: float = 0.5,
        max_merged: int = 32,
        wait_required: bool = True,
        on_reply: Callable[[], None] = lambda: None,
    ) -> None:
        self._cluster = cluster
        self._on_reply = on_reply  # each master's pipeline's (see AutoPipeline)
        self._client_for = client_for
        self._wait = (wait_replicas, wait_timeout_s)
        self._wait_required = wait_required
        self._max_merged = max_merged
        self._pipelines: dict[str, tuple[Redis, AutoPipeline]] = {}
        self._refreshing: asyncio.Task[None] | None = None
        self._initialized = False

    def pipeline_for(self, key: str | bytes) -> AutoPipeline:
        """The pipeline of the master serving ``key``'s slot now."""
        node = self._cluster.nodes_manager.get_node_from_slot(key_slot(_encoded(key)))
        entry = self._pipelines.get(node.name)
        if entry is None:
            client = self._client_for(node)
            replicas, timeout_s = self._wait
            pipeline = AutoPipeline(
                client,
                wait_replicas=replicas,
                wait_timeout_s=timeout_s,
                max_merged=self._max_merged,
                wait_required=self._wait_required,
                on_reply=self._on_reply,
            )
            entry = (client, pipeline)
            self._pipelines[node.name] = entry
        return entry[1]

    @property
    def acked_without_replicas(self) -> int:
        """Over every master's pipeline (see AutoPipeline's ``wait_required``)."""
        return sum(pipeline.acked_without_replicas for _, pipeline in self._pipelines.values())

    @property
    def batches(self) -> int:
        """Writes so far, over every master's pipeline (for tests and profiling)."""
        return sum(pipeline.batches for _, pipeline in self._pipelines.values())

    def submit(
        self,
        script: Script,
        keys: Sequence[Any],
        args: Sequence[Any],
        durable: bool = False,
        merge: Merge | None = None,
    ) -> asyncio.Future[Any]:
        """:meth:`call` as a future. Calls submitted one after the other reach their
        pipelines in that order (each task's first step runs in the order they were made)."""
        return asyncio.ensure_future(self.call(script, keys, args, durable, merge))

    def reconnect(self) -> None:
        """Drop every master's connection (the calls waiting fail); the next calls reopen."""
        for _, pipeline in self._pipelines.values():
            pipeline.reconnect()

    async def call(
        self,
        script: Script,
        keys: Sequence[Any],
        args: Sequence[Any],
        durable: bool = False,
        merge: Merge | None = None,
    ) -> Any:
        """Run ``script`` on the master of ``keys[0]``'s slot (see the class); ``merge``: as
        :meth:`AutoPipeline.submit`'s (its group must name the slot)."""
        return await self._routed(
            keys[0], lambda pipeline: pipeline.submit(script, keys, args, durable, merge)
        )

    async def command(self, key: str, *args: Any) -> Any:
        """A plain command (``args``) on the master of ``key``'s slot (as
        :meth:`AutoPipeline.command`)."""
        return await self._routed(key, lambda pipeline: pipeline.command(key, *args))

    async def _routed(
        self, key: str | bytes, submit: Callable[[AutoPipeline], asyncio.Future[Any]]
    ) -> Any:
        if not self._initialized:
            # Once: the slots and the commands' key positions. Not on every call: after a
            # connection error redis-py initializes again in full, asking COMMAND of a
            # node that may be the one down, which failed calls to healthy masters too.
            await self._cluster.initialize()
            self._initialized = True
        for attempt in range(1, _ATTEMPTS + 1):
            try:
                pipeline = self.pipeline_for(key)
            except (RedisClusterException, LookupError) as exc:  # no master known for the slot
                self._reload_soon()  # (failing over; redis-py's cache may lack it: KeyError)
                raise RedisConnectionError(f"redis cluster: {describe(exc)}") from exc
            try:
                return await submit(pipeline)
            except ResponseError as exc:
                if attempt == _ATTEMPTS or not str(exc).startswith(_REROUTE):
                    raise
                reply = str(exc)
                logger.info("redis cluster: %s; reloading the slots", reply[:60])
                if reply.startswith("MOVED "):
                    # The node that answered knows the slot's owner: go there now. A full
                    # reload may ask a node that has not heard of the move yet (gossip).
                    try:
                        await self._cluster.nodes_manager.move_slot(MovedError(reply[6:]))
                    except LookupError:  # redis-py's slot cache changed meanwhile: reload
                        await self.reload()
                    self._reload_soon()
                else:
                    await self.reload()
            except (RedisConnectionError, OSError):
                self._reload_soon()
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def reload(self) -> None:
        """Read the topology again; drop the pipelines of nodes that are no longer masters."""
        await self._cluster.nodes_manager.initialize()
        masters = {node.name for node in self._cluster.get_primaries()}
        for name in [name for name in self._pipelines if name not in masters]:
            client, pipeline = self._pipelines.pop(name)
            await pipeline.close()
            await client.aclose()

    def _reload_soon(self) -> None:
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.create_task(self._reload_quietly())

    async def _reload_quietly(self) -> None:
        try:
            await self.reload()
        except (RedisError, RedisClusterException, OSError) as exc:
            logger.warning("redis cluster: cannot reload the slots: %r", exc)

    async def close(self) -> None:
        if self._refreshing is not None:
            self._refreshing.cancel()
            with contextlib.suppress(
                asyncio.CancelledError, RedisError, RedisClusterException, OSError
            ):
                await self._refreshing
        for client, pipeline in self._pipelines.values():
            await pipeline.close()
            await client.aclose()
        self._pipelines.clear()


def _encoded(key: str | bytes) -> bytes:
    return key.encode() if isinstance(key, str) else key


def pipelines_for(redis: Redis, settings: Settings) -> AutoPipeline | ClusterPipelines:
    """The pipelining of ``redis`` (a :func:`~app.redisio.clients.command_client`): one
    :class:`AutoPipeline`, or on Redis Cluster one per master (:class:`ClusterPipelines`)."""
    if settings.redis_cluster_nodes:
        return ClusterPipelines(cast(RedisCluster, redis), functools.partial(node_client, settings))
    return AutoPipeline(redis)
