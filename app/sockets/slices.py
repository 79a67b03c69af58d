"""A worker's open connections in a fixed number of groups, so that the heartbeat
(:mod:`app.sockets.heartbeat`) visits one group a tick rather than every connection. The
:class:`~app.sockets.hub.Hub` keeps them as connections come and go."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from app.sockets.connection import Connection

SLICES: Final = 1024


class Slices:
    """A worker's open connections in :data:`SLICES` groups, dealt in turn as they come (an
    identity hash would not do: connections, all of one size, allocated one after the other,
    have addresses that fall into a few of the groups)."""

    __slots__ = ("_groups", "_next", "_part_of")

    def __init__(self) -> None:
        self._groups: list[set[Connection]] = [set() for _ in range(SLICES)]
        self._part_of: dict[Connection, int] = {}
        self._next = 0

    def add(self, conn: Connection) -> None:
        """Put ``conn`` in the next group (no-op when it is in one)."""
        if conn not in self._part_of:
            self._part_of[conn] = part = self._next
            self._groups[part].add(conn)
            self._next = (part + 1) % SLICES

    def discard(self, conn: Connection) -> None:
        part = self._part_of.pop(conn, None)
        if part is not None:
            self._groups[part].discard(conn)

    def group(self, part: int) -> list[Connection]:
        """The connections of group ``part`` now (a copy: closing one may remove it)."""
        return list(self._groups[part])
