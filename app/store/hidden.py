"""Whom each user hides: muted users (their messages hidden from the user) and blocked ones
(hidden too, and kept from writing to the user directly or inviting them).

Contract:
- A user hides another at most once: as muted or as blocked (:class:`Hiding`). Hiding again
  changes which; :meth:`HiddenStore.unhide` ends it.
- Every call raises :class:`~app.store.database.StoreError` when the database fails.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import ColumnElement, Table, delete, exists, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store.database import StoreError
from app.store.messages import DATABASE_ERRORS
from app.store.schema import hidden_users, messages


@dataclass(frozen=True, slots=True)
class Hiding:
    """Whom one user hides: ``muted`` and ``blocked`` (disjoint)."""

    muted: frozenset[str] = frozenset()
    blocked: frozenset[str] = frozenset()

    @property
    def users(self) -> frozenset[str]:
        """Everyone whose messages are hidden: the muted and the blocked."""
        return self.muted | self.blocked

    def __bool__(self) -> bool:
        return bool(self.muted or self.blocked)


NOBODY = Hiding()


def sent_by_none_of(mentions_table: Table, users: list[str]) -> ColumnElement[bool]:
    """SQL: the message a row of ``mentions_table`` (``conversation``, ``id``) names was sent
    by none of ``users``."""
    sent = messages.alias("sent")
    return ~exists().where(
        sent.c.conversation == mentions_table.c.conversation,
        sent.c.id == mentions_table.c.id,
        sent.c.user.in_(users),
    )


class HiddenStore:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def of(self, users: Sequence[str]) -> dict[str, Hiding]:
        """Whom each of ``users`` hides (everyone asked for is in the answer)."""
        found: dict[str, tuple[set[str], set[str]]] = {user: (set(), set()) for user in users}
        query = select(hidden_users.c.user, hidden_users.c.target, hidden_users.c.blocked).where(
            hidden_users.c.user.in_(list(found))
        )
        try:
            async with self._engine.connect() as connection:
                rows = (await connection.execute(query)).all()
        except DATABASE_ERRORS as exc:
            raise StoreError(f"reading whom users hide failed: {exc!r}") from exc
        for user, target, blocked in rows:
            found[str(user)][1 if blocked else 0].add(str(target))
        return {
            user: Hiding(frozenset(muted), frozenset(blocked))
            for user, (muted, blocked) in found.items()
        }

    async def hide(self, user: str, target: str, blocked: bool, now_ms: int, most: int) -> bool:
        """``user`` hides ``target`` (muted, or ``blocked``); False, nothing changed, when
        ``user`` already hides ``most`` others and ``target`` is not one of them."""
        row = {"user": user, "target": target, "blocked": blocked, "created_ms": now_ms}
        insert: postgresql.Insert | sqlite.Insert = (
            postgresql.insert(hidden_users)
            if self._engine.dialect.name == "postgresql"
            else sqlite.insert(hidden_users)
        ).values(row)
        upsert = insert.on_conflict_do_update(
            index_elements=[hidden_users.c.user, hidden_users.c.target],
            set_={"blocked": blocked},
        )
        count = select(func.count()).where(hidden_users.c.user == user)
        known = select(hidden_users.c.target).where(
            hidden_users.c.user == user, hidden_users.c.target == target
        )
        try:
            async with self._engine.begin() as connection:
                if (await connection.execute(known)).first() is None and int(
                    (await connection.execute(count)).scalar_one()
                ) >= most:
                    return False
                await connection.execute(upsert)
                return True
        except DATABASE_ERRORS as exc:
            raise StoreError(f"storing whom {user!r} hides failed: {exc!r}") from exc

    async def unhide(self, user: str, target: str) -> bool:
        """``user`` no longer hides ``target``; False when it did not."""
        statement = delete(hidden_users).where(
            hidden_users.c.user == user, hidden_users.c.target == target
        )
        try:
            async with self._engine.begin() as connection:
                return bool((await connection.execute(statement)).rowcount)
        except DATABASE_ERRORS as exc:
            raise StoreError(f"storing whom {user!r} hides failed: {exc!r}") from exc
