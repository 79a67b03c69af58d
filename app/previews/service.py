"""LinkPreviews: the preview of a URL a message holds — title, description, site and image
from its Open Graph tags (or its ``<title>``) — fetched by the server through
:class:`~app.previews.fetcher.SafeFetcher`.

Contract (docs/protocol.md, "Link previews"):
- A page is read up to ``CHAT_PREVIEW_PAGE_MAX_BYTES`` and only as HTML; its image up to
  ``CHAT_PREVIEW_IMAGE_MAX_BYTES``, sniffed (PNG, JPEG, GIF, WebP only, whatever the site
  says) and re-encoded as a WebP thumbnail (Pillow, the attachments' code), stored in the
  file storage and served like an attachment's (a signed link, from the storage): the
  browser never fetches from the site (no hot-linking: the site learns nothing of who
  reads). Without file storage, previews have no image. An image that fails leaves it out.
- Texts are plain text, cut (title 300, description 1000, site 100 characters).
- Previews (and failures, as ``preview_unavailable`` with the reason) are cached per worker
  for ``CHAT_PREVIEW_CACHE_S``; one fetch per URL at a time.
- Each user may ask for ``CHAT_USER_PREVIEWS_PER_S`` (the caller checks).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import OrderedDict
from html.parser import HTMLParser
from typing import Any, Final
from urllib.parse import urljoin

from app.errors import ErrorCode, FrameError
from app.files.content import THUMBNAIL_TYPE, NotAnImage, sniff, thumbnail
from app.files.storage import Served, Storage, StorageUnavailable
from app.previews.fetcher import FetchRefused, SafeFetcher
from app.settings import Settings

logger = logging.getLogger(__name__)

_PAGE_TYPES: Final = frozenset({"text/html", "application/xhtml+xml"})
_IMAGE_TYPES: Final = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
_CACHE_MAX: Final = 5_000
_CUT: Final = {"title": 300, "description": 1000, "site": 100}


class _OpenGraph(HTMLParser):
    """The ``og:`` meta tags and the ``<title>`` of a page's head."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: dict[str, str] = {}
        self.title = ""
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "meta":
            found = dict(attrs)
            key = (found.get("property") or found.get("name") or "").lower()
            content = found.get("content")
            if key.startswith("og:") and content and key not in self.tags:
                self.tags[key] = content
            elif key == "description" and content:
                self.tags.setdefault("description", content)
        elif tag == "title":
            self._in_title = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data


def _text(value: str | None, field: str) -> str | None:
    if not value:
        return None
    plain = " ".join(value.split())
    most = _CUT[field]
    return plain if len(plain) <= most else plain[: most - 1] + "…"


class LinkPreviews:
    """One per worker (see the module's contract)."""

    def __init__(self, settings: Settings, storage: Storage | None) -> None:
        self._settings = settings
        self._storage = storage
        self._fetcher = SafeFetcher(settings.preview_test_public_addresses)
        self._cache: OrderedDict[str, tuple[float, dict[str, Any] | str]] = OrderedDict()
        # One fetch per URL, in a task of its own: a requester that goes away (its socket
        # closed) does not stop it for the others waiting on it.
        self._fetching: dict[str, asyncio.Task[dict[str, Any] | str]] = {}

    async def preview(self, url: str) -> dict[str, Any]:
        """The preview of ``url``: ``{"url", "title", "description", "site", "image"}``
        (``image``: ``{"url", "width", "height"}`` or None). Raises :class:`FrameError`
        ``preview_unavailable`` with the reason."""
        now = time.monotonic()
        cached = self._cache.get(url)
        if cached is not None and now - cached[0] < self._settings.preview_cache_s:
            found = cached[1]
        else:
            fetching = self._fetching.get(url)
            if fetching is None:
                fetching = asyncio.get_running_loop().create_task(self._fetch(url))
                self._fetching[url] = fetching
            found = await asyncio.shield(fetching)
        if isinstance(found, str):
            raise FrameError(ErrorCode.PREVIEW_UNAVAILABLE, found)
        return await self._with_image_link(found)

    async def _fetch(self, url: str) -> dict[str, Any] | str:
        """:meth:`_build`, cached; a failure of this code is one of the URL's too."""
        try:
            found = await self._build(url)
        except Exception:
            logger.exception("building the preview of a link failed")
            found = "the preview failed"
        finally:
            del self._fetching[url]
        self._cache[url] = (time.monotonic(), found)
        self._cache.move_to_end(url)
        while len(self._cache) > _CACHE_MAX:
            self._cache.popitem(last=False)
        return found

    async def _build(self, url: str) -> dict[str, Any] | str:
        settings = self._settings
        try:
            page = await self._fetcher.fetch(
                url, _PAGE_TYPES, settings.preview_page_max_bytes, settings.preview_timeout_s
            )
        except FetchRefused as exc:
            logger.info("no preview of a link: %s", exc)
            return str(exc)
        parser = _OpenGraph()
        try:
            parser.feed(page.body.decode("utf-8", errors="replace"))
        except Exception as exc:  # html.parser raises little; a page must not break this
            return f"unreadable page: {exc!r}"
        tags = parser.tags
        preview: dict[str, Any] = {
            "url": url,
            "title": _text(tags.get("og:title") or parser.title, "title"),
            "description": _text(tags.get("og:description") or tags.get("description"),
                                 "description"),
            "site": _text(tags.get("og:site_name"), "site"),
            "image": None,
        }  # fmt: skip
        image = tags.get("og:image")
        if image and self._storage is not None:
            preview["image"] = await self._store_image(urljoin(page.url, image))
        if not (preview["title"] or preview["description"]):
            return "the page says nothing to preview"
        return preview

    async def _store_image(self, url: str) -> dict[str, Any] | None:
        """The image re-encoded and stored: its key and size (None: none shown)."""
        settings = self._settings
        assert self._storage is not None
        try:
            fetched = await self._fetcher.fetch(
                url, _IMAGE_TYPES, settings.preview_image_max_bytes, settings.preview_timeout_s
            )
            if sniff(fetched.body[:4096]) not in _IMAGE_TYPES:
                return None
            small = await asyncio.to_thread(
                thumbnail, fetched.body, settings.file_thumbnail_px, settings.file_image_pixels_max
            )
            key = "pv-" + hashlib.sha256(url.encode()).hexdigest()[:29]  # a file key's shape
            await self._storage.put(key, small.data, THUMBNAIL_TYPE)
        except (FetchRefused, NotAnImage, StorageUnavailable) as exc:
            logger.info("no preview image: %s", exc)
            return None
        return {"key": key, "width": small.width, "height": small.height}

    async def _with_image_link(self, preview: dict[str, Any]) -> dict[str, Any]:
        image = preview["image"]
        if image is None or self._storage is None:
            return preview
        served = Served(THUMBNAIL_TYPE, True, "preview.webp")
        try:
            link = await self._storage.download_url(
                image["key"], served, self._settings.file_url_ttl_s
            )
        except StorageUnavailable:
            return preview | {"image": None}
        return preview | {
            "image": {"url": link, "width": image["width"], "height": image["height"]}
        }

    async def close(self) -> None:
        for task in list(self._fetching.values()):
            task.cancel()
        await asyncio.gather(*self._fetching.values(), return_exceptions=True)
        await self._fetcher.close()
