"""Where files' bytes live: a bucket of an S3-compatible object store, or a directory on this
host. One setting, ``CHAT_FILE_STORAGE``, chooses (:func:`storage_for`).

Contract (both kinds): objects are named by keys the app makes (a file's id, its thumbnail's
``<id>.thumb``); every call that reaches the storage raises :class:`StorageUnavailable`, and
nothing else, when it cannot be reached or answers with an error, so that a storage outage
is one clear answer (``storage_unavailable``) and never a crash. The app never holds an
uploaded file whole: uploads go from the client straight to the storage (S3: a presigned POST
whose policy fixes the key and the size range; local: :mod:`app.web.files` streams the body to
disk), and downloads are URLs that expire.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote, urlencode

from app.files.signing import UrlSigner
from app.settings import Settings

if TYPE_CHECKING:
    from types_aiobotocore_s3 import S3Client


class StorageUnavailable(Exception):
    """The storage cannot be reached, or refused what the app asked."""


@dataclass(frozen=True)
class UploadTarget:
    """How a client uploads one file: ``method`` (``POST``: a multipart form with ``fields``
    first and the file last, field ``file``; ``PUT``: the bytes as the body) to ``url``."""

    method: str
    url: str
    fields: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Served:
    """How a download is served: its content type and whether a browser may show it inline
    (images) or must save it."""

    content_type: str
    inline: bool
    name: str

    def disposition(self) -> str:
        """The Content-Disposition header: the name in RFC 6266/5987 form, ASCII-safe."""
        kind = "inline" if self.inline else "attachment"
        fallback = "".join(c if c.isascii() and c.isprintable() and c not in '"\\' else "_"
                           for c in self.name)  # fmt: skip
        return f"{kind}; filename=\"{fallback}\"; filename*=UTF-8''{quote(self.name, safe='')}"


class Storage(Protocol):
    async def upload_target(self, key: str, max_bytes: int, expires_s: float) -> UploadTarget:
        """Where a client uploads object ``key`` (at most ``max_bytes``) for ``expires_s``."""
        ...

    async def size(self, key: str) -> int | None:
        """The size of object ``key``; None when there is none."""
        ...

    async def read(self, key: str, limit: int) -> bytes:
        """The first ``limit`` bytes of object ``key`` (all of it when it is shorter)."""
        ...

    async def put(self, key: str, data: bytes, content_type: str) -> None:
        """Store ``data`` (small: thumbnails) as object ``key``."""
        ...

    async def delete(self, keys: list[str]) -> None:
        """Delete the objects ``keys`` (those that do not exist are not an error)."""
        ...

    async def download_url(self, key: str, served: Served, expires_s: float) -> str:
        """A URL that serves object ``key`` as ``served`` says, until ``expires_s`` from now."""
        ...

    async def close(self) -> None: ...


class LocalStorage:
    """Objects as files in one directory (``CHAT_FILE_DIR``), for a single host: ``make run``,
    a one-node deployment with a volume. Upload and download URLs point at this app
    (:mod:`app.web.files`), signed with :class:`~app.files.signing.UrlSigner`."""

    def __init__(self, directory: Path, signer: UrlSigner) -> None:
        self.directory = directory
        self.signer = signer
        directory.mkdir(parents=True, exist_ok=True)

    def path(self, key: str) -> Path:
        """The file of object ``key`` (keys are ids the app made: no separators)."""
        assert "/" not in key and not key.startswith(".")
        return self.directory / key

    async def upload_target(self, key: str, max_bytes: int, expires_s: float) -> UploadTarget:
        expires = int(time.time() + expires_s)
        query = {"max": str(max_bytes), "exp": str(expires)}
        query["sig"] = self.signer.sign("PUT", key, query)
        return UploadTarget("PUT", f"/files/{key}?{urlencode(query)}")

    async def size(self, key: str) -> int | None:
        try:
            return (await asyncio.to_thread(os.stat, self.path(key))).st_size
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StorageUnavailable(f"cannot read {key}: {exc.strerror}") from exc

    async def read(self, key: str, limit: int) -> bytes:
        def read() -> bytes:
            with self.path(key).open("rb") as file:
                return file.read(limit)

        try:
            return await asyncio.to_thread(read)
        except OSError as exc:
            raise StorageUnavailable(f"cannot read {key}: {exc.strerror}") from exc

    async def put(self, key: str, data: bytes, content_type: str) -> None:
        def write() -> None:
            partial = self.path(key + ".part")
            partial.write_bytes(data)
            partial.replace(self.path(key))

        try:
            await asyncio.to_thread(write)
        except OSError as exc:
            raise StorageUnavailable(f"cannot write {key}: {exc.strerror}") from exc

    async def delete(self, keys: list[str]) -> None:
        def remove() -> None:
            for key in keys:
                for path in (self.path(key), self.path(key + ".part")):
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()

        try:
            await asyncio.to_thread(remove)
        except OSError as exc:
            raise StorageUnavailable(f"cannot delete files: {exc.strerror}") from exc

    async def download_url(self, key: str, served: Served, expires_s: float) -> str:
        query = {
            "type": served.content_type,
            "inline": "1" if served.inline else "0",
            "name": served.name,
            "exp": str(int(time.time() + expires_s)),
        }
        query["sig"] = self.signer.sign("GET", key, query)
        return f"/files/{key}?{urlencode(query)}"

    async def close(self) -> None:
        return None


class S3Storage:
    """Objects in one bucket of an S3-compatible store, through aiobotocore. Presigned URLs
    name ``public_url`` (the store as browsers reach it), the app's calls ``endpoint_url``."""

    def __init__(
        self,
        client: S3Client,
        presigner: S3Client,
        bucket: str,
        exit_stack: contextlib.AsyncExitStack,
    ) -> None:
        self._client = client
        self._presigner = presigner
        self.bucket = bucket
        self._exit_stack = exit_stack

    @classmethod
    async def open(cls, settings: Settings) -> S3Storage:
        """Clients for the settings' bucket (the bucket is not created: ops make it, or the
        tests). Reaches nothing yet."""
        from aiobotocore.config import AioConfig
        from aiobotocore.session import get_session

        session = get_session()
        secret = settings.s3_secret_access_key
        credentials: dict[str, Any] = {
            "region_name": settings.s3_region,
            "aws_access_key_id": settings.s3_access_key_id,
            "aws_secret_access_key": None if secret is None else secret.get_secret_value(),
        }
        config = AioConfig(
            connect_timeout=settings.redis_timeout_s,
            read_timeout=max(10.0, settings.redis_timeout_s),
            retries={"max_attempts": 2, "mode": "standard"},
            signature_version="s3v4",
            s3={"addressing_style": "path"},
        )
        stack = contextlib.AsyncExitStack()
        client = await stack.enter_async_context(
            session.create_client(
                "s3", endpoint_url=settings.s3_endpoint_url, config=config, **credentials
            )
        )
        public = settings.s3_public_url or settings.s3_endpoint_url
        presigner = await stack.enter_async_context(
            session.create_client("s3", endpoint_url=public, config=config, **credentials)
        )
        return cls(client, presigner, settings.s3_bucket, stack)

    async def upload_target(self, key: str, max_bytes: int, expires_s: float) -> UploadTarget:
        try:
            post = await self._presigner.generate_presigned_post(
                Bucket=self.bucket,
                Key=key,
                Conditions=[["content-length-range", 1, max_bytes]],
                ExpiresIn=int(expires_s),
            )
        except Exception as exc:  # botocore's errors have no one base class
            raise StorageUnavailable(f"cannot presign an upload: {exc}") from exc
        return UploadTarget("POST", post["url"], {k: str(v) for k, v in post["fields"].items()})

    async def size(self, key: str) -> int | None:
        from botocore.exceptions import ClientError

        try:
            head = await self._client.head_object(Bucket=self.bucket, Key=key)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise StorageUnavailable(f"cannot read {key}: {exc}") from exc
        except Exception as exc:
            raise StorageUnavailable(f"cannot read {key}: {exc}") from exc
        return int(head["ContentLength"])

    async def read(self, key: str, limit: int) -> bytes:
        try:
            got = await self._client.get_object(
                Bucket=self.bucket, Key=key, Range=f"bytes=0-{limit - 1}"
            )
            async with got["Body"] as body:
                return await body.read()
        except Exception as exc:
            raise StorageUnavailable(f"cannot read {key}: {exc}") from exc

    async def put(self, key: str, data: bytes, content_type: str) -> None:
        try:
            await self._client.put_object(
                Bucket=self.bucket, Key=key, Body=data, ContentType=content_type
            )
        except Exception as exc:
            raise StorageUnavailable(f"cannot write {key}: {exc}") from exc

    async def delete(self, keys: list[str]) -> None:
        if not keys:
            return
        try:
            for start in range(0, len(keys), 1000):  # DeleteObjects takes 1000 at most
                await self._client.delete_objects(
                    Bucket=self.bucket,
                    Delete={"Objects": [{"Key": k} for k in keys[start : start + 1000]],
                            "Quiet": True},
                )  # fmt: skip
        except Exception as exc:
            raise StorageUnavailable(f"cannot delete files: {exc}") from exc

    async def download_url(self, key: str, served: Served, expires_s: float) -> str:
        try:
            return await self._presigner.generate_presigned_url(
                "get_object",
                Params={
                    "Bucket": self.bucket,
                    "Key": key,
                    "ResponseContentType": served.content_type,
                    "ResponseContentDisposition": served.disposition(),
                },
                ExpiresIn=max(1, int(expires_s)),
            )
        except Exception as exc:
            raise StorageUnavailable(f"cannot presign a download: {exc}") from exc

    async def close(self) -> None:
        await self._exit_stack.aclose()


async def storage_for(settings: Settings) -> Storage | None:
    """The storage the settings choose (None: ``off``)."""
    if settings.file_storage == "off":
        return None
    if settings.file_storage == "s3":
        return await S3Storage.open(settings)
    return LocalStorage(settings.files_directory, UrlSigner.for_directory(settings))
