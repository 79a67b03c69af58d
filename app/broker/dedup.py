"""Recently seen client message ids (``cid``), for dropping retried ``send`` frames."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable


class RecentIds:
    """Maps a key to the message id first published for it, for ``ttl_s`` seconds.

    At most ``max_entries`` keys are kept; the oldest go first. Entries are inserted in time
    order, so expiry only ever looks at the front.
    """

    __slots__ = ("_entries", "_max_entries", "_ttl_s")

    def __init__(self, ttl_s: float, max_entries: int) -> None:
        self._entries: OrderedDict[Hashable, tuple[int, float]] = OrderedDict()
        self._ttl_s = ttl_s
        self._max_entries = max_entries

    def get(self, key: Hashable, now: float) -> int | None:
        """The id recorded for ``key`` if it has not expired by ``now``."""
        self._expire(now)
        entry = self._entries.get(key)
        return None if entry is None else entry[0]

    def add(self, key: Hashable, message_id: int, now: float) -> None:
        self._entries[key] = (message_id, now + self._ttl_s)
        self._entries.move_to_end(key)
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)

    def _expire(self, now: float) -> None:
        entries = self._entries
        while entries:
            _, (_, expires) = next(iter(entries.items()))
            if expires > now:
                return
            entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)
