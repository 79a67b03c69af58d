"""Reports of messages: the moderators' queue.

Contract:
- A report keeps what the message said when it was reported (``text``), who wrote it, who
  reported it and why. One report per reporter and message: reporting again changes nothing
  (:meth:`ReportStore.add` returns the first).
- Open reports are listed oldest first (the queue's order); resolved ones stay, with who
  resolved them, when and how (``outcome``), and are listed newest first.
- Resolving a resolved report changes nothing (:meth:`ReportStore.resolve` returns it as it
  is, ``changed`` False).
- Every call raises :class:`~app.store.database.StoreError` when the database fails.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store.database import StoreError
from app.store.messages import DATABASE_ERRORS, insert_ignoring_duplicates
from app.store.schema import reports


@dataclass(frozen=True, slots=True)
class Report:
    id: int
    conversation: str
    message_id: int
    author: str
    text: str
    reporter: str
    reason: str
    created_ms: int
    resolved_ms: int | None = None
    resolved_by: str | None = None
    outcome: str | None = None

    @property
    def open(self) -> bool:
        return self.resolved_ms is None


def _report(row: Any) -> Report:
    return Report(*row)


class ReportStore:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def add(
        self,
        conversation: str,
        message_id: int,
        author: str,
        text: str,
        reporter: str,
        reason: str,
        now_ms: int,
    ) -> tuple[Report, bool]:
        """Store a report; returns it and whether it is new (False: ``reporter`` had reported
        this message already, and that report is returned)."""
        row = {
            "conversation": conversation, "message_id": message_id, "author": author,
            "text": text, "reporter": reporter, "reason": reason, "created_ms": now_ms,
        }  # fmt: skip
        mine = select(reports).where(
            reports.c.reporter == reporter,
            reports.c.conversation == conversation,
            reports.c.message_id == message_id,
        )
        try:
            async with self._engine.begin() as connection:
                added = await connection.execute(
                    insert_ignoring_duplicates(self._engine, reports), [row]
                )
                stored = (await connection.execute(mine)).one()
        except DATABASE_ERRORS as exc:
            raise StoreError(f"storing a report failed: {exc!r}") from exc
        return _report(stored), bool(added.rowcount)

    async def listed(self, resolved: bool, before: int | None, limit: int) -> list[Report]:
        """Open reports, oldest first, after ``before`` (an id; None: from the first); or
        resolved ones, newest first, before it."""
        query = select(reports).limit(limit)
        if resolved:
            query = query.where(reports.c.resolved_ms.is_not(None)).order_by(reports.c.id.desc())
            if before is not None:
                query = query.where(reports.c.id < before)
        else:
            query = query.where(reports.c.resolved_ms.is_(None)).order_by(reports.c.id)
            if before is not None:
                query = query.where(reports.c.id > before)
        try:
            async with self._engine.connect() as connection:
                return [_report(row) for row in (await connection.execute(query)).all()]
        except DATABASE_ERRORS as exc:
            raise StoreError(f"reading reports failed: {exc!r}") from exc

    async def get(self, report_id: int) -> Report | None:
        try:
            async with self._engine.connect() as connection:
                row = (
                    await connection.execute(select(reports).where(reports.c.id == report_id))
                ).first()
        except DATABASE_ERRORS as exc:
            raise StoreError(f"reading a report failed: {exc!r}") from exc
        return None if row is None else _report(row)

    async def resolve(
        self, report_id: int, by: str, outcome: str, now_ms: int
    ) -> tuple[Report, bool] | None:
        """Resolve an open report (None: no such report); returns it as it is now and
        whether this call resolved it."""
        statement = (
            update(reports)
            .where(reports.c.id == report_id, reports.c.resolved_ms.is_(None))
            .values(resolved_ms=now_ms, resolved_by=by, outcome=outcome)
        )
        try:
            async with self._engine.begin() as connection:
                changed = bool((await connection.execute(statement)).rowcount)
                row = (
                    await connection.execute(select(reports).where(reports.c.id == report_id))
                ).first()
        except DATABASE_ERRORS as exc:
            raise StoreError(f"resolving a report failed: {exc!r}") from exc
        return None if row is None else (_report(row), changed)
