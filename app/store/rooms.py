"""Rooms and their members in the store (tables ``rooms`` and ``members``).

Contract: every call is one transaction; :meth:`RoomStore.create` stores a room only if no
room of that name is stored (it says whether it did); every call raises
:class:`~app.store.database.StoreError` when the database fails. Who may change what is
decided by :mod:`app.conversations.rooms`, not here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from sqlalchemy import delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store.database import StoreError
from app.store.messages import DATABASE_ERRORS, insert_ignoring_duplicates
from app.store.schema import members, rooms


class Role(StrEnum):
    """What a member may do: an owner everything, an admin add and remove members and change
    the title and topic, a member read and write."""

    OWNER = "owner"
    ADMIN = "admin"
    MEMBER = "member"


@dataclass(frozen=True, slots=True)
class Room:
    name: str
    private: bool
    title: str = ""
    topic: str = ""
    created_by: str = ""
    created_ms: int = 0


class RoomStore:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def get(self, name: str) -> tuple[Room, dict[str, Role]] | None:
        """The room and its members (user -> role), or None when it is not stored."""
        try:
            async with self._engine.connect() as connection:
                row = (await connection.execute(select(rooms).where(rooms.c.name == name))).first()
                if row is None:
                    return None
                found = await connection.execute(
                    select(members.c.user, members.c.role).where(members.c.room == name)
                )
                return Room(*row), {str(u): Role(r) for u, r in found.all()}
        except DATABASE_ERRORS as exc:
            raise StoreError(f"reading room {name!r} failed: {exc!r}") from exc

    async def create(self, room: Room) -> bool:
        """Store ``room`` with its creator as owner; False (nothing stored) if it exists."""
        try:
            async with self._engine.begin() as connection:
                created = await connection.execute(
                    insert_ignoring_duplicates(self._engine, rooms).returning(rooms.c.name),
                    [{"name": room.name, "private": room.private, "title": room.title,
                      "topic": room.topic, "created_by": room.created_by,
                      "created_ms": room.created_ms}],
                )  # fmt: skip
                if not created.all():
                    return False
                await connection.execute(
                    members.insert().values(
                        room=room.name,
                        user=room.created_by,
                        role=Role.OWNER.value,
                        added_ms=room.created_ms,
                    )
                )
                return True
        except DATABASE_ERRORS as exc:
            raise StoreError(f"creating room {room.name!r} failed: {exc!r}") from exc

    async def describe(self, name: str, title: str | None, topic: str | None) -> None:
        """Change the room's title and/or topic."""
        values = {k: v for k, v in (("title", title), ("topic", topic)) if v is not None}
        if not values:
            return
        await self._write(update(rooms).where(rooms.c.name == name).values(values), name)

    async def set_role(self, name: str, user: str, role: Role, now_ms: int) -> None:
        """Make ``user`` a member of the room with ``role`` (added, or changed)."""
        try:
            async with self._engine.begin() as connection:
                await connection.execute(
                    delete(members).where(members.c.room == name, members.c.user == user)
                )
                await connection.execute(
                    members.insert().values(room=name, user=user, role=role.value, added_ms=now_ms)
                )
        except DATABASE_ERRORS as exc:
            raise StoreError(f"adding a member to {name!r} failed: {exc!r}") from exc

    async def remove(self, name: str, user: str) -> bool:
        """Remove ``user`` from the room's members; False if it was not one."""
        try:
            async with self._engine.begin() as connection:
                result = await connection.execute(
                    delete(members).where(members.c.room == name, members.c.user == user)
                )
                return bool(result.rowcount)
        except DATABASE_ERRORS as exc:
            raise StoreError(f"removing a member of {name!r} failed: {exc!r}") from exc

    async def rooms_of(self, user: str, limit: int) -> list[tuple[Room, Role]]:
        """The rooms ``user`` is a member of (by name), with their role, at most ``limit``."""
        query = (
            select(rooms, members.c.role)
            .join(members, members.c.room == rooms.c.name)
            .where(members.c.user == user)
            .order_by(rooms.c.name)
            .limit(limit)
        )
        try:
            async with self._engine.connect() as connection:
                rows = (await connection.execute(query)).all()
        except DATABASE_ERRORS as exc:
            raise StoreError(f"reading the rooms of {user!r} failed: {exc!r}") from exc
        return [(Room(*row[:6]), Role(row[6])) for row in rows]

    async def public(self, contains: str | None, limit: int) -> list[Room]:
        """Public rooms (by name), at most ``limit``; with ``contains``, those whose name,
        title or topic holds it (case-insensitive)."""
        query = select(rooms).where(rooms.c.private.is_(False)).order_by(rooms.c.name).limit(limit)
        if contains:
            pattern = (
                "%"
                + contains.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
                + "%"
            )
            query = query.where(
                func.lower(rooms.c.name).like(pattern, escape="\\")
                | func.lower(rooms.c.title).like(pattern, escape="\\")
                | func.lower(rooms.c.topic).like(pattern, escape="\\")
            )
        try:
            async with self._engine.connect() as connection:
                rows = (await connection.execute(query)).all()
        except DATABASE_ERRORS as exc:
            raise StoreError(f"reading the public rooms failed: {exc!r}") from exc
        return [Room(*row) for row in rows]

    async def _write(self, statement: object, name: str) -> None:
        try:
            async with self._engine.begin() as connection:
                await connection.execute(statement)  # type: ignore[call-overload]
        except DATABASE_ERRORS as exc:
            raise StoreError(f"changing room {name!r} failed: {exc!r}") from exc
