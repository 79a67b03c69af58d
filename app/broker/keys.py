"""Where a conversation's keys live in Redis, and which archive stream its messages go to.

Every script touches the keys of one conversation, plus the archive stream (and, for
messages, the webhook queue) it appends to in the same atomic step. On Redis Cluster all the
keys of one script must hash to one slot, so:

- **one Redis, or Sentinel** (``partitions`` 0): a conversation's keys share the hash tag
  ``{r:<name>}``; there is one archive stream, ``{prefix}:archive``.
- **Redis Cluster** (``CHAT_REDIS_CLUSTER_PARTITIONS`` partitions): each conversation belongs
  to a partition (a hash of its name); a partition's conversations' keys, its archive stream
  and its webhook queue share the partition's hash tag, so they are in one slot. The tags are
  chosen so that the partitions' slots are spread evenly over the 16,384: a cluster's masters
  each serve about as many partitions. The number of partitions is fixed for a deployment's
  life (changing it moves every conversation to new keys: their Redis history is left
  behind; the store keeps it).
"""

from __future__ import annotations

import itertools
import zlib
from functools import cache

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from app.settings import Settings


class KeyLayout:
    """The key names of one deployment (``prefix``), see the module."""

    def __init__(self, prefix: str, partitions: int = 0) -> None:
        self.prefix = prefix
        self.partitions = partitions
        self._tags = _partition_tags(partitions) if partitions else ()

    @classmethod
    def of(cls, settings: Settings) -> KeyLayout:
        partitions = settings.redis_cluster_partitions if settings.redis_cluster_nodes else 0
        return cls(settings.redis_prefix, partitions)

    def tag(self, conversation: str) -> str:
        """The hash tag of ``conversation``'s keys (braces included)."""
        if not self.partitions:
            return f"{{r:{conversation}}}"
        return self._tags[self.partition(conversation)]

    def partition(self, conversation: str) -> int:
        """``conversation``'s partition (0 without partitions)."""
        if not self.partitions:
            return 0
        return zlib.crc32(conversation.encode()) % self.partitions

    def room(self, conversation: str, part: str) -> str:
        """The key ``part`` (meta, log, state, present, ...) of ``conversation``."""
        if not self.partitions:
            return f"{self.prefix}:{{r:{conversation}}}:{part}"
        return f"{self.prefix}:{self.tag(conversation)}:r:{conversation}:{part}"

    def archive(self, conversation: str) -> tuple[str, str]:
        """The archive stream ``conversation``'s messages go to, and its count of messages not
        archived (the backlog was full)."""
        if not self.partitions:
            return f"{self.prefix}:archive", f"{self.prefix}:archive:dropped"
        return self._archive_of(self._tags[self.partition(conversation)])

    def archives(self) -> list[tuple[str, str]]:
        """Every archive stream (one per partition), with its count of messages not archived."""
        if not self.partitions:
            return [self.archive("")]
        return [self._archive_of(tag) for tag in self._tags]

    def _archive_of(self, tag: str) -> tuple[str, str]:
        return f"{self.prefix}:{tag}:archive", f"{self.prefix}:{tag}:archive:dropped"


@cache
def _partition_tags(partitions: int) -> tuple[str, ...]:
    """A hash tag per partition, partition ``i``'s in the ``i``-th of ``partitions`` equal
    ranges of slots (the first string ``{p<i>.<n>}`` that lands there)."""
    width = REDIS_CLUSTER_HASH_SLOTS / partitions
    tags = []
    for i in range(partitions):
        low, high = int(i * width), int((i + 1) * width)
        for n in itertools.count():
            tag = f"p{i}.{n}"
            if low <= key_slot(tag.encode()) < max(high, low + 1):
                tags.append(f"{{{tag}}}")
                break
    return tuple(tags)
