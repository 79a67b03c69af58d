"""Files attached to messages: uploads, attaching them to a ``send``, links to read them, and
deleting them. The frames (``upload``, ``send`` with ``attachments``, ``file``) and the HTTP
routes call this; the one access decision (:mod:`app.access.conversations`) is asked on
every path.

Contract:
- **Upload** (:meth:`Files.start_upload`): only someone who may write in the conversation now;
  within the size limit (``CHAT_FILE_MAX_BYTES``), the user's upload rate and the bytes they
  keep (``CHAT_USER_FILE_BYTES_MAX``). The answer is where to upload to, for at most a tenth
  of ``CHAT_FILE_UPLOAD_TTL_S`` (10 minutes at most), and for that declared size at most.
- **Attach** (:meth:`Files.claim`): a ``send`` names its uploader's own uploads for the same
  conversation, not yet attached; each is checked in the storage (it was uploaded, within its
  size), its type sniffed from its bytes, images thumbnailed (:mod:`app.files.content`). The
  attachments go in the message frame, as JSON (``id``, ``name``, ``size``, ``type``,
  ``image``, and ``width``/``height`` for images). A send retried after its files were
  attached (same files, same conversation) is answered with the message they are on.
- **Read** (:meth:`Files.link`): only someone who may read the conversation now, and only for a
  file of a message that is not deleted; the URLs expire after ``CHAT_FILE_URL_TTL_S``.
  "Not allowed" and "no such file" are one answer (``not_found``).
- **Delete**: deleting a message deletes its files (:meth:`Files.forget_message`); uploads
  never attached are deleted after ``CHAT_FILE_UPLOAD_TTL_S``, and with
  ``CHAT_RETENTION_DAYS`` files as old as the messages retention deletes
  (:meth:`Files.sweep`, on every worker, in bounded batches).
- **Storage down**: :class:`~app.errors.FrameError` ``storage_unavailable``; nothing else in
  the chat depends on the storage.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from dataclasses import replace
from typing import Any, Final

import orjson

from app.access.auth import Identity
from app.access.conversations import ConversationAccess
from app.access.quotas import Quotas
from app.conversations.rooms import RoomError
from app.errors import ErrorCode, FrameError
from app.files.content import (
    IMAGE_TYPES,
    SNIFF_BYTES,
    THUMBNAIL_TYPE,
    NotAnImage,
    served_type,
    sniff,
    thumbnail,
)
from app.files.storage import Served, Storage, StorageUnavailable, UploadTarget
from app.ops.metrics import Metrics
from app.settings import Settings
from app.store.database import StoreError
from app.store.files import FileRecord, FileState, FileStore

logger = logging.getLogger(__name__)

FILE_ID_PATTERN: Final = r"^[A-Za-z0-9_\-]{16,32}$"
_SWEEP_BATCH: Final = 500
_UPLOAD_URL_MAX_S: Final = 600.0


def thumbnail_key(file_id: str) -> str:
    return f"{file_id}.thumb"


class AlreadySent(Exception):
    """The files of a ``send`` are attached to message ``message_id`` already: the send is a
    retry of one that was published."""

    def __init__(self, message_id: int) -> None:
        super().__init__(message_id)
        self.message_id = message_id


def _unavailable(exc: Exception) -> FrameError:
    logger.warning("file storage unavailable: %s", exc)
    return FrameError(ErrorCode.STORAGE_UNAVAILABLE, "file storage unavailable, try again")


def _store_unavailable() -> FrameError:
    return FrameError(ErrorCode.STORE_UNAVAILABLE, "files unavailable, try again")


class Files:
    def __init__(
        self,
        settings: Settings,
        storage: Storage,
        store: FileStore,
        access: ConversationAccess,
        quotas: Quotas,
        metrics: Metrics,
    ) -> None:
        self.settings = settings
        self.storage = storage
        self._store = store
        self._access = access
        self._quotas = quotas
        self._metrics = metrics

    def _unavailable(self, operation: str, exc: Exception) -> FrameError:
        self._metrics.file_storage_errors.labels(operation).inc()
        return _unavailable(exc)

    async def start_upload(
        self, identity: Identity, conversation: str, name: str, size: int
    ) -> tuple[str, UploadTarget, int]:
        """A new upload of ``name`` (``size`` bytes) for ``conversation``: its file id, where
        to upload it, and until when (Unix seconds). Raises FrameError."""
        settings = self.settings
        if size > settings.file_max_bytes:
            raise FrameError(
                ErrorCode.FILE_TOO_LARGE,
                f"the file is {size} bytes, at most {settings.file_max_bytes} are allowed",
            )
        await self._check_access(identity, conversation, hide=False)
        user = identity.user
        if not await self._quotas.allow("upload", user):
            raise FrameError(ErrorCode.RATE_LIMITED, "too many uploads, slow down")
        file_id = secrets.token_urlsafe(16)
        ttl = min(settings.file_upload_ttl_s / 10, _UPLOAD_URL_MAX_S)
        try:
            kept = await self._store.bytes_kept(user)
            if kept + size > settings.user_file_bytes_max:
                raise FrameError(
                    ErrorCode.RATE_LIMITED,
                    f"you keep {kept} bytes of files, at most {settings.user_file_bytes_max} "
                    "are allowed: delete messages with files first",
                )
            target = await self.storage.upload_target(file_id, size, ttl)
            await self._store.add(
                FileRecord(
                    file_id, conversation, user, name, size, created_ms=int(time.time() * 1000)
                )
            )
        except StorageUnavailable as exc:
            raise self._unavailable("upload", exc) from None
        except StoreError:
            raise _store_unavailable() from None
        self._metrics.file_uploads.inc()
        return file_id, target, int(time.time() + ttl)

    async def claim(
        self, user: str, conversation: str, ids: list[str], cid: str | int | None
    ) -> str:
        """Claim ``user``'s uploads ``ids`` for a message in ``conversation`` (sent with
        ``cid``): the message frame's ``attachments`` (JSON). Raises FrameError (nothing
        claimed), or AlreadySent for a retry: the same files, sent with the same cid.
        The caller then publishes and calls :meth:`attach`, or :meth:`release` on failure."""
        if len(ids) > self.settings.files_per_message_max:
            raise FrameError(
                ErrorCode.BAD_FRAME,
                f"attachments: at most {self.settings.files_per_message_max} files a message",
            )
        try:
            claimed, records = await self._store.claim(ids, user, conversation, _cid_key(cid))
        except StoreError:
            raise _store_unavailable() from None
        if not claimed:
            sent = {r.message_id for r in records
                    if r.state is FileState.ATTACHED and r.uploader == user
                    and r.conversation == conversation
                    and cid is not None and r.cid == _cid_key(cid)}  # fmt: skip
            if len(records) == len(set(ids)) and len(sent) == 1 and None not in sent:
                raise AlreadySent(sent.pop() or 0)
            raise FrameError(
                ErrorCode.NOT_FOUND,
                "attachments: each must be an upload of yours for this conversation, "
                "not attached yet",
            )
        try:
            described = [await self._describe(record) for record in records]
            for record in described:
                await self._store.describe(record)
        except (StorageUnavailable, StoreError, FrameError) as exc:
            await self.release(ids)
            if isinstance(exc, FrameError):
                raise
            raise (
                self._unavailable("attach", exc)
                if isinstance(exc, StorageUnavailable)
                else _store_unavailable()
            ) from None
        return orjson.dumps([_attachment(record) for record in described]).decode()

    async def _describe(self, record: FileRecord) -> FileRecord:
        """``record`` as its object is: size, sniffed type, and an image's thumbnail."""
        size = await self.storage.size(record.id)
        if size is None:
            raise FrameError(ErrorCode.NOT_FOUND, f"file {record.id} was not uploaded (yet)")
        if size > record.size:
            raise FrameError(
                ErrorCode.FILE_TOO_LARGE, f"file {record.id} is larger than it was declared"
            )
        content_type = sniff(await self.storage.read(record.id, SNIFF_BYTES))
        described = replace(record, size=size, content_type=content_type)
        if content_type not in IMAGE_TYPES:
            return described
        settings = self.settings
        data = await self.storage.read(record.id, size)
        try:
            thumb = await asyncio.to_thread(
                thumbnail, data, settings.file_thumbnail_px, settings.file_image_pixels_max
            )
        except NotAnImage as exc:
            logger.info("file %s gets no thumbnail: %s", record.id, exc)
            return replace(described, content_type=content_type)
        await self.storage.put(thumbnail_key(record.id), thumb.data, THUMBNAIL_TYPE)
        return replace(described, width=thumb.width, height=thumb.height, thumbnail=True)

    async def attach(self, ids: list[str], message_id: int) -> None:
        """The claimed ``ids`` are on message ``message_id`` now. Best effort: a store that
        fails leaves them claimed, and the sweep deletes them after the upload TTL."""
        try:
            await self._store.attach(ids, message_id)
            self._metrics.files_attached.inc(len(ids))
        except StoreError as exc:
            logger.warning("files %s not marked attached to %d: %s", ids, message_id, exc)

    async def release(self, ids: list[str]) -> None:
        """The send that claimed ``ids`` failed: they may be attached again."""
        try:
            await self._store.release(ids)
        except StoreError as exc:
            logger.warning("files %s not released: %s", ids, exc)

    async def link(self, identity: Identity | None, file_id: str) -> dict[str, Any]:
        """The ``file`` frame's fields for ``file_id``: its URLs (``url``; ``thumbnail`` for an
        image), and until when they work (``expires``). ``identity`` None: the backend API,
        which reads every conversation. Raises FrameError."""
        try:
            record = await self._store.get(file_id)
        except StoreError:
            raise _store_unavailable() from None
        # Claimed: its message may be delivered before the send marks it attached.
        if record is None or record.state not in (FileState.CLAIMED, FileState.ATTACHED):
            raise _no_file()
        if identity is not None:
            await self._check_access(identity, record.conversation, hide=True)
        ttl = self.settings.file_url_ttl_s
        image = record.thumbnail and record.content_type in IMAGE_TYPES
        served = Served(served_type(record.content_type), inline=image, name=record.name)
        try:
            url = await self.storage.download_url(record.id, served, ttl)
            thumb = None
            if record.thumbnail:
                shown = Served(THUMBNAIL_TYPE, inline=True, name=record.name)
                thumb = await self.storage.download_url(thumbnail_key(record.id), shown, ttl)
        except StorageUnavailable as exc:
            raise self._unavailable("link", exc) from None
        return {
            "id": record.id, "name": record.name, "size": record.size,
            "content_type": record.content_type, "url": url, "thumbnail": thumb,
            "expires": int(time.time() + ttl),
        }  # fmt: skip

    async def forget_message(self, conversation: str, message_id: int) -> None:
        """Message ``message_id`` of ``conversation`` was deleted: so are its files (now,
        or by the next sweep if the storage is down)."""
        try:
            records = await self._store.mark_deleted(conversation, message_id)
        except StoreError as exc:
            logger.warning("files of deleted message %d not deleted: %s", message_id, exc)
            return
        if records:
            await self._delete(records)

    async def sweep(self) -> int:
        """Delete one batch of files to delete (of deleted messages, of messages retention
        deleted, and uploads never attached within the upload TTL); returns how many."""
        settings, now = self.settings, time.time()
        before = int((now - settings.file_upload_ttl_s) * 1000)
        # Retention: files of messages it deleted (uploaded before them, within the TTL).
        days = settings.retention_days
        expired = int((now - days * 86_400 - settings.file_upload_ttl_s) * 1000) if days else 0
        try:
            records = await self._store.doomed(before, _SWEEP_BATCH, expired)
        except StoreError as exc:
            logger.warning("file sweep skipped: %s", exc)
            return 0
        return await self._delete(records) if records else 0

    async def _delete(self, records: list[FileRecord]) -> int:
        keys = [r.id for r in records] + [thumbnail_key(r.id) for r in records if r.thumbnail]
        try:
            await self.storage.delete(keys)
            await self._store.remove([r.id for r in records])
        except (StorageUnavailable, StoreError) as exc:
            if isinstance(exc, StorageUnavailable):
                self._metrics.file_storage_errors.labels("delete").inc()
            logger.warning("%d files not deleted yet (next sweep): %s", len(records), exc)
            return 0
        self._metrics.files_deleted.inc(len(records))
        return len(records)

    async def run_sweeps(self) -> None:
        """Sweep every quarter of the upload TTL (5 minutes at most), batch after batch
        while there is more. Runs until cancelled."""
        interval = min(self.settings.file_upload_ttl_s / 4, 300.0)
        while True:
            await asyncio.sleep(interval)
            while await self.sweep() == _SWEEP_BATCH:
                pass

    async def _check_access(self, identity: Identity, conversation: str, hide: bool) -> None:
        """Raise unless ``identity`` may read and write ``conversation`` now; ``hide``: any
        refusal is ``not_found`` ("no such file")."""
        try:
            await self._access.conversation(identity, conversation)
        except RoomError as exc:
            if exc.code is ErrorCode.STORE_UNAVAILABLE:
                raise _store_unavailable() from None
            if hide:
                raise _no_file() from None
            raise FrameError(exc.code, exc.message) from None


def _cid_key(cid: str | int | None) -> str | None:
    """A send's cid as stored (``s:`` a string, ``i:`` an integer: "1" is not 1)."""
    if cid is None:
        return None
    return f"i:{cid}" if isinstance(cid, int) else f"s:{cid}"


def _no_file() -> FrameError:
    return FrameError(ErrorCode.NOT_FOUND, "file not found")


def _attachment(record: FileRecord) -> dict[str, Any]:
    """How a message frame describes one of its files."""
    attachment: dict[str, Any] = {
        "id": record.id, "name": record.name, "size": record.size,
        "type": record.content_type, "image": record.thumbnail,
    }  # fmt: skip
    if record.thumbnail:
        attachment["width"] = record.width
        attachment["height"] = record.height
    return attachment
