"""Files in the store (table ``files``): one row per upload, from the upload URL handed out to
the file's deletion.

Contract: every call is one transaction and raises :class:`~app.store.database.StoreError`
when the database fails. A file goes ``PENDING`` (an upload URL was handed out) →
``CLAIMED`` (a ``send`` is attaching it: no other send can) → ``ATTACHED`` (to a message);
a failed send puts it back to ``PENDING``; deleting the message makes it ``DELETED`` until
its objects are deleted too. Who may do what is decided in
:mod:`app.files.service`, not here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store.database import StoreError
from app.store.messages import DATABASE_ERRORS
from app.store.schema import files


class _Raced(Exception):
    pass


class FileState(IntEnum):
    PENDING = 0
    CLAIMED = 1
    ATTACHED = 2
    DELETED = 3  # its message was deleted: its objects are being deleted


@dataclass(frozen=True, slots=True)
class FileRecord:
    id: str
    conversation: str
    uploader: str
    name: str
    size: int  # as declared until attached; as stored after
    content_type: str = ""
    width: int | None = None
    height: int | None = None
    thumbnail: bool = False
    state: FileState = FileState.PENDING
    message_id: int | None = None
    created_ms: int = 0
    cid: str | None = None  # of the send that claimed it


class FileStore:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def add(self, record: FileRecord) -> None:
        """Store a new upload (``PENDING``)."""
        try:
            async with self._engine.begin() as connection:
                await connection.execute(files.insert().values(**_values(record)))
        except DATABASE_ERRORS as exc:
            raise StoreError(f"storing file {record.id} failed: {exc!r}") from exc

    async def get(self, file_id: str) -> FileRecord | None:
        found = await self._select(files.c.id == file_id)
        return found[0] if found else None

    async def bytes_kept(self, uploader: str) -> int:
        """The bytes of every file of ``uploader`` (declared sizes for uploads not attached)."""
        try:
            async with self._engine.connect() as connection:
                total = await connection.scalar(
                    select(func.coalesce(func.sum(files.c.size), 0)).where(
                        files.c.uploader == uploader
                    )
                )
                return int(total or 0)
        except DATABASE_ERRORS as exc:
            raise StoreError(f"reading the files of {uploader!r} failed: {exc!r}") from exc

    async def claim(
        self, ids: list[str], uploader: str, conversation: str, cid: str | None
    ) -> tuple[bool, list[FileRecord]]:
        """Take ``ids`` from ``PENDING`` to ``CLAIMED`` if they are all ``uploader``'s uploads
        for ``conversation``: (True, their records in the order of ``ids``). Otherwise change
        nothing: (False, the records of those of ``ids`` that exist, as they are)."""
        unique = list(dict.fromkeys(ids))
        try:
            async with self._engine.begin() as connection:
                rows = await connection.execute(select(files).where(files.c.id.in_(unique)))
                found = {record.id: record for record in map(_record, rows)}
                mine = [
                    found[i] for i in unique
                    if i in found and found[i].uploader == uploader
                    and found[i].conversation == conversation
                    and found[i].state is FileState.PENDING
                ]  # fmt: skip
                if len(mine) != len(unique):
                    return False, list(found.values())
                claimed = await connection.execute(
                    update(files)
                    .where(files.c.id.in_(unique), files.c.state == FileState.PENDING)
                    .values(state=FileState.CLAIMED, cid=cid)
                    .returning(files.c.id)
                )
                if len(claimed.all()) != len(unique):
                    raise _Raced  # another send claimed one first: roll back
                return True, mine
        except _Raced:
            return False, []
        except DATABASE_ERRORS as exc:
            raise StoreError(f"claiming files failed: {exc!r}") from exc

    async def describe(self, record: FileRecord) -> None:
        """Store what was found out about a claimed file: its size, type, image dimensions,
        thumbnail."""
        try:
            async with self._engine.begin() as connection:
                await connection.execute(
                    update(files)
                    .where(files.c.id == record.id)
                    .values(
                        size=record.size,
                        content_type=record.content_type,
                        width=record.width,
                        height=record.height,
                        thumbnail=record.thumbnail,
                    )
                )
        except DATABASE_ERRORS as exc:
            raise StoreError(f"describing file {record.id} failed: {exc!r}") from exc

    async def attach(self, ids: list[str], message_id: int) -> None:
        """``CLAIMED`` → ``ATTACHED`` to ``message_id``."""
        await self._update(ids, FileState.CLAIMED, state=FileState.ATTACHED, message_id=message_id)

    async def release(self, ids: list[str]) -> None:
        """``CLAIMED`` → ``PENDING`` (the send failed: the files may be attached again)."""
        await self._update(ids, FileState.CLAIMED, state=FileState.PENDING)

    async def mark_deleted(self, conversation: str, message_id: int) -> list[FileRecord]:
        """The files attached to message ``message_id`` of ``conversation``, now ``DELETED``
        (no link to them is handed out again)."""
        try:
            async with self._engine.begin() as connection:
                rows = await connection.execute(
                    update(files)
                    .where(
                        files.c.conversation == conversation,
                        files.c.message_id == message_id,
                        files.c.state == FileState.ATTACHED,
                    )
                    .values(state=FileState.DELETED)
                    .returning(*files.c)
                )
                return [_record(row) for row in rows]
        except DATABASE_ERRORS as exc:
            raise StoreError(f"deleting the files of a message failed: {exc!r}") from exc

    async def doomed(
        self, created_before_ms: int, limit: int, expired_before_ms: int = 0
    ) -> list[FileRecord]:
        """Up to ``limit`` files whose objects are to be deleted: those of deleted messages,
        uploads never attached (pending, or stuck claimed) made before ``created_before_ms``,
        and attached files made before ``expired_before_ms`` (retention); the last two are
        made ``DELETED`` here first (a send can no longer claim them, nor a link be given)."""
        try:
            async with self._engine.begin() as connection:
                await connection.execute(
                    update(files)
                    .where(
                        files.c.state.in_([FileState.PENDING, FileState.CLAIMED]),
                        files.c.created_ms < created_before_ms,
                    )
                    .values(state=FileState.DELETED)
                )
                if expired_before_ms:
                    await connection.execute(
                        update(files)
                        .where(
                            files.c.state == FileState.ATTACHED,
                            files.c.created_ms < expired_before_ms,
                        )
                        .values(state=FileState.DELETED)
                    )
                rows = await connection.execute(
                    select(files).where(files.c.state == FileState.DELETED).limit(limit)
                )
                return [_record(row) for row in rows]
        except DATABASE_ERRORS as exc:
            raise StoreError(f"reading the files to delete failed: {exc!r}") from exc

    async def remove(self, ids: list[str]) -> None:
        """Delete the rows of ``DELETED`` files ``ids`` (their objects are gone)."""
        try:
            async with self._engine.begin() as connection:
                await connection.execute(
                    delete(files).where(files.c.id.in_(ids), files.c.state == FileState.DELETED)
                )
        except DATABASE_ERRORS as exc:
            raise StoreError(f"deleting files failed: {exc!r}") from exc

    async def _update(self, ids: list[str], from_state: FileState, **values: object) -> None:
        try:
            async with self._engine.begin() as connection:
                await connection.execute(
                    update(files)
                    .where(files.c.id.in_(ids), files.c.state == from_state)
                    .values(values)
                )
        except DATABASE_ERRORS as exc:
            raise StoreError(f"updating files failed: {exc!r}") from exc

    async def _select(self, *where: Any) -> list[FileRecord]:
        query = select(files).where(*where)
        try:
            async with self._engine.connect() as connection:
                return [_record(row) for row in await connection.execute(query)]
        except DATABASE_ERRORS as exc:
            raise StoreError(f"reading files failed: {exc!r}") from exc


def _values(record: FileRecord) -> dict[str, object]:
    return {
        "id": record.id, "conversation": record.conversation, "uploader": record.uploader,
        "name": record.name, "size": record.size, "content_type": record.content_type,
        "width": record.width, "height": record.height, "thumbnail": record.thumbnail,
        "state": int(record.state), "message_id": record.message_id,
        "created_ms": record.created_ms, "cid": record.cid,
    }  # fmt: skip


def _record(row: Any) -> FileRecord:
    m = row._mapping
    return FileRecord(
        str(m["id"]), str(m["conversation"]), str(m["uploader"]), str(m["name"]),
        int(m["size"]), str(m["content_type"]), m["width"], m["height"], bool(m["thumbnail"]),
        FileState(m["state"]), m["message_id"], int(m["created_ms"]), m["cid"],
    )  # fmt: skip
