"""``/files/{key}``: uploads to and downloads from ``local`` file storage
(:class:`~app.files.storage.LocalStorage`), by signed URLs only.

The URLs are handed out by :class:`~app.files.service.Files` after the access decision: the
signature is the permission (what object, which method, until when; docs/security.md), so
these routes check it and nothing else. An upload URL is for one object of at most ``max``
bytes and works once; the body is streamed to disk, never held whole. Downloads are served
with the type and disposition the URL names, ``nosniff`` and a sandboxing CSP, so a file is
never run as a page.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from typing import Annotated, Final

from fastapi import APIRouter, HTTPException, Path, Request, Response
from fastapi.responses import FileResponse

from app.files.storage import LocalStorage, Served
from app.state import ChatState

router = APIRouter()

KEY_PATTERN: Final = r"^[A-Za-z0-9_\-]{16,32}(\.thumb)?$"
DOWNLOAD_HEADERS: Final = {
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'none'; sandbox",
    "Cache-Control": "private, max-age=300",
    "Referrer-Policy": "no-referrer",
}
_CHUNK: Final = 64 * 1024


def _local(request: Request) -> LocalStorage:
    state: ChatState = request.app.state.chat
    storage = state.files.storage if state.files is not None else None
    if not isinstance(storage, LocalStorage):
        raise HTTPException(404, "this server keeps no files on its own disk")
    return storage


def _verified(request: Request, storage: LocalStorage, method: str, key: str) -> dict[str, str]:
    query = dict(request.query_params)
    if not storage.signer.verify(method, key, query):
        raise HTTPException(403, "this link is invalid or has expired")
    return query


@router.put("/files/{key}", status_code=201, include_in_schema=False)
async def upload(
    request: Request, key: Annotated[str, Path(pattern=KEY_PATTERN)]
) -> dict[str, object]:
    """Store the body as object ``key`` (an ``upload`` frame's URL): 201, 403 for a bad or
    expired signature, 409 when it was uploaded already, 413 over the declared size."""
    storage = _local(request)
    query = _verified(request, storage, "PUT", key)
    limit = int(query["max"])
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HTTPException(413, f"at most {limit} bytes")
    final, partial = storage.path(key), storage.path(key + ".part")
    try:
        descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise HTTPException(409, "this file is being uploaded already") from None
    size = 0
    try:
        with os.fdopen(descriptor, "wb") as file:
            async for chunk in _body(request):
                size += len(chunk)
                if size > limit:
                    raise HTTPException(413, f"at most {limit} bytes")
                await asyncio.to_thread(file.write, chunk)
        if size == 0:
            raise HTTPException(422, "the file is empty")
        if final.exists():
            raise HTTPException(409, "this file was uploaded already")
        partial.replace(final)
    finally:
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
    return {"file": key, "size": size}


async def _body(request: Request) -> AsyncIterator[bytes]:
    async for chunk in request.stream():
        if chunk:
            yield chunk


@router.api_route("/files/{key}", methods=["GET", "HEAD"], include_in_schema=False)
async def download(request: Request, key: Annotated[str, Path(pattern=KEY_PATTERN)]) -> Response:
    """Object ``key`` as the URL says (type, inline or attachment, name); 403 for a bad or
    expired signature, 404 once it is deleted."""
    storage = _local(request)
    query = _verified(request, storage, "GET", key)
    path = storage.path(key)
    if not path.is_file():
        raise HTTPException(404, "file not found")
    served = Served(query["type"], query["inline"] == "1", query["name"])
    headers = {**DOWNLOAD_HEADERS, "Content-Disposition": served.disposition()}
    return FileResponse(path, media_type=served.content_type, headers=headers)
