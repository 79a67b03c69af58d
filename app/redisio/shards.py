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
from redis.exceptions import SlotNotCoveredError

from app.redisio.subscription import PushHandler, Subscription


class Shards:
    """The subscriptions of one topology (read when :meth:`open` is called).

    Contract: :meth:`lost_one` returns the first subscription ended (a master lost, a slot
    moved: ``MOVED`` to a ``SSUBSCRIBE``) and forgets it: a master's, which its owner may
    replace on the topology as it is then (:meth:`open_master`) while the others go on, or
    the classic one, after which the owner closes them all and opens a new :class:`Shards`.
    Channels whose slot is served by a master without a subscription here have none
    (:meth:`for_channel` returns None).
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

    def master_of(self, channel: str) -> ClusterNode:
        """The master serving ``channel``'s slot, as the topology last read says. Raises
        ``SlotNotCoveredError`` (a Redis error) when it names none."""
        slot = key_slot(channel.encode())
        try:
            return self._cluster.nodes_manager.get_node_from_slot(slot)
        except LookupError:  # redis-py's slot cache without the slot (IndexError is its own)
            raise SlotNotCoveredError(f"slot {slot} has no master yet") from None

    def for_channel(self, channel: str) -> Subscription | None:
        """The sharded subscription of the master serving ``channel``'s slot."""
        return self.by_master.get(self.master_of(channel).name)

    async def open_master(
        self, node: ClusterNode, client_for: Callable[[ClusterNode], Redis], on_push: PushHandler
    ) -> Subscription:
        """A sharded subscription on ``node`` (a master new to these shards, or replacing one
        lost)."""
        old = self.by_master.pop(node.name, None)
        if old is not None:
            old.close()
        subscription = await Subscription.open(client_for(node), on_push)
        self.by_master[node.name] = subscription
        return subscription

    def canary_channel(self, base: str, master: str) -> str | None:
        """A shard channel (``base`` and a hash tag) in one of ``master``'s slots."""
        for n in range(100_000):
            channel = f"{base}:{{c{n}}}"
            if self.master_of(channel).name == master:
                return channel
        return None

    def canary_channels(self, base: str) -> dict[str, str]:
        """A shard channel per master (``base`` and a hash tag in one of its slots), to hear
        each shard's pub/sub: master name -> channel."""
        found: dict[str, str] = {}
        for n in itertools.count():
            if len(found) == len(self.by_master) or n > 100_000:
                return found
            channel = f"{base}:{{c{n}}}"
            found.setdefault(self.master_of(channel).name, channel)
        return found  # pragma: no cover

    async def lost_one(self) -> tuple[str | None, Exception]:
        """The first subscription that ends from now on: (its master's name, or None for the
        classic one; the exception that ended it). A master's is forgotten (closed)."""
        while True:
            watched: dict[asyncio.Future[Exception], tuple[str | None, Subscription]] = {
                subscription.lost: (name, subscription)
                for name, subscription in self.by_master.items()
            }
            if self.classic is not None:
                watched[self.classic.lost] = (None, self.classic)
            # Masters come and go (open_master): look again every quarter second.
            done, _ = await asyncio.wait(watched, timeout=0.25, return_when=asyncio.FIRST_COMPLETED)
            for future in done:
                name, subscription = watched[future]
                if name is not None:
                    if self.by_master.get(name) is not subscription:
                        continue  # replaced meanwhile (open_master closed it)
                    del self.by_master[name]
                    subscription.close()
                return name, future.result()

    def close(self) -> None:
        for subscription in self.by_master.values():
            subscription.close()
        if self.classic is not None:
            self.classic.close()
