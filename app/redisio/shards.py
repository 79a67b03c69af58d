"""The pub/sub connections of a worker on Redis Cluster: one per master for sharded pub/sub
(``SSUBSCRIBE``: a room's channel is in the room's slot, so a message crosses only its
shard), and one classic connection (``SUBSCRIBE``: users' and control channels, which
Redis Cluster propagates to every node) on one of the masters."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot

from app.redisio.subscription import PushHandler, Subscription


class Shards:
    """The subscriptions of one topology (read when :meth:`open` is called).

    Contract: :attr:`lost` resolves with the first exception that ended any of them (a
    master lost, a slot moved: ``MOVED`` to a ``SSUBSCRIBE``); the owner then closes them all
    and opens a new :class:`Shards` on the topology as it is then. Channels whose slot a
    master no longer serves have no subscription here (:meth:`for_channel` returns None).
    """

    def __init__(self, cluster: RedisCluster) -> None:
        self._cluster = cluster
        self.by_master: dict[str, Subscription] = {}
        self.classic: Subscription | None = None
        self._tasks: list[asyncio.Future[Exception]] = []

    @classmethod
    async def open(
        cls,
        cluster: RedisCluster,
        client_for: Callable[[ClusterNode], Redis],
        on_push: PushHandler,
    ) -> Shards:
        shards = cls(cluster)
        await cluster.initialize()  # the first time: the slots and the commands' key positions
        await cluster.nodes_manager.initialize()  # the slots as they are now
        try:
            for node in cluster.get_primaries():
                shards.by_master[node.name] = await Subscription.open(client_for(node), on_push)
            first = cluster.get_primaries()[0]
            shards.classic = await Subscription.open(client_for(first), on_push)
        except BaseException:
            shards.close()
            raise
        return shards

    def for_channel(self, channel: str) -> Subscription | None:
        """The sharded subscription of the master serving ``channel``'s slot."""
        node = self._cluster.nodes_manager.get_node_from_slot(key_slot(channel.encode()))
        return self.by_master.get(node.name)

    def canary_channels(self, base: str) -> dict[str, str]:
        """A shard channel per master (``base`` and a hash tag in one of its slots), to hear
        each shard's pub/sub: master name -> channel."""
        found: dict[str, str] = {}
        for n in itertools.count():
            if len(found) == len(self.by_master) or n > 100_000:
                return found
            channel = f"{base}:{{c{n}}}"
            node = self._cluster.nodes_manager.get_node_from_slot(key_slot(channel.encode()))
            found.setdefault(node.name, channel)
        return found  # pragma: no cover

    async def lost(self) -> Exception:
        """The first exception that ended one of the subscriptions."""
        subscriptions = [*self.by_master.values(), *([self.classic] if self.classic else [])]
        done, _ = await asyncio.wait(
            [subscription.lost for subscription in subscriptions],
            return_when=asyncio.FIRST_COMPLETED,
        )
        return next(iter(done)).result()

    def close(self) -> None:
        for subscription in self.by_master.values():
            subscription.close()
        if self.classic is not None:
            self.classic.close()
