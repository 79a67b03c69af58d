"""The chat page: ``GET /`` and its static files under ``/static`` (``app/static``).

Plain HTML, CSS and JavaScript modules, no build step and nothing from a CDN. The page is sent
with a Content-Security-Policy that allows only this origin's scripts, styles and sockets, so
even a message that slipped through as markup could not run code (the page renders message
text as text anyway).
"""

from __future__ import annotations

from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from app.settings import Settings

STATIC_DIR: Final = Path(__file__).parent.parent / "static"
SECURITY_HEADERS: Final = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}

router = APIRouter()


def page_headers(settings: Settings) -> dict[str, str]:
    """The page's security headers: :data:`SECURITY_HEADERS`, and with ``s3`` file storage
    its origin too, where the page uploads files and shows images from."""
    public = settings.s3_public_url or settings.s3_endpoint_url
    if settings.file_storage != "s3" or public is None:
        return SECURITY_HEADERS
    parts = urlsplit(public)
    origin = f"{parts.scheme}://{parts.netloc}"
    policy = SECURITY_HEADERS["Content-Security-Policy"]
    policy = policy.replace("connect-src 'self'", f"connect-src 'self' {origin}")
    policy = policy.replace("img-src 'self'", f"img-src 'self' {origin}")
    return {**SECURITY_HEADERS, "Content-Security-Policy": policy}


@router.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
async def chat_page(request: Request) -> FileResponse:
    """The chat page."""
    settings: Settings = request.app.state.chat.settings
    return FileResponse(STATIC_DIR / "index.html", headers=page_headers(settings))


def mount_page(app: FastAPI) -> None:
    """Add ``/`` and ``/static`` to ``app``."""
    app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
