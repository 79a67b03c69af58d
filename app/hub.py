"""Hub: this worker's connections and which rooms they are in; fans messages out locally.

One Hub per worker. It is the broker's ``on_message`` callback and never awaits a socket:
delivering a message is a loop of :meth:`Connection.offer <app.connection.Connection.offer>`
calls, each a bounded append. It subscribes the broker to a room when the room's first local
member joins and unsubscribes when the last one leaves, so a worker hears only the rooms its
clients are in.
"""

from __future__ import annotations

from app.broker import Broker
from app.connection import Connection


class Hub:
    """Rooms → local connections, plus the set of every open connection of this worker."""

    def __init__(self, broker: Broker, max_connections: int) -> None:
        self._broker = broker
        self._max_connections = max_connections
        self._rooms: dict[str, set[Connection]] = {}
        self.connections: set[Connection] = set()

    def deliver(self, room: str, payload: bytes) -> None:
        """Queue ``payload`` (one encoded frame) on every local member of ``room``.

        The payload is decoded once for all recipients. Offers never change room membership
        (a slow consumer's close happens later, in its own task), so iterating is safe.
        """
        members = self._rooms.get(room)
        if not members:
            return
        frame = payload.decode()
        nbytes = len(payload)
        for conn in members:
            conn.offer(frame, nbytes)

    def add(self, conn: Connection) -> bool:
        """Register a new connection; False when this worker is at ``max_connections``."""
        if len(self.connections) >= self._max_connections:
            return False
        self.connections.add(conn)
        return True

    async def remove(self, conn: Connection) -> None:
        """Unregister ``conn`` and take it out of every room it is in."""
        self.connections.discard(conn)
        for room in list(conn.rooms):
            await self.leave(conn, room)

    async def join(self, conn: Connection, room: str) -> None:
        """Add ``conn`` to ``room``; returns once the broker delivers that room here.

        If the broker subscription fails, ``conn`` is not in the room and the error propagates.
        """
        members = self._rooms.get(room)
        if members is not None:
            members.add(conn)
            conn.rooms.add(room)
            return
        self._rooms[room] = {conn}
        conn.rooms.add(room)
        try:
            await self._broker.subscribe(room)
        except BaseException:
            await self.leave(conn, room)
            raise

    async def leave(self, conn: Connection, room: str) -> None:
        """Take ``conn`` out of ``room``; the last member out unsubscribes the broker."""
        conn.rooms.discard(room)
        members = self._rooms.get(room)
        if members is None:
            return
        members.discard(conn)
        if not members:
            del self._rooms[room]
            await self._broker.unsubscribe(room)

    def members(self, room: str) -> frozenset[Connection]:
        return frozenset(self._rooms.get(room, ()))

    @property
    def room_count(self) -> int:
        return len(self._rooms)
