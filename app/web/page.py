"""The chat page: ``GET /`` and its static files under ``/static`` (``app/static``).

Plain HTML, CSS and JavaScript modules, no build step and nothing from a CDN. The page is sent
with a Content-Security-Policy that allows only this origin's scripts, styles and sockets, so
even a message that slipped through as markup could not run code (the page renders message
text as text anyway).

The page's service worker (``app/static/sw.js``: notifications and Web Push) is served by its
own route at ``/static/sw.js``, under the path the proxies already route to the app (nginx,
the Ingress), with ``Service-Worker-Allowed: /`` so that it may take the page's scope.
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
        "img-src 'self'; worker-src 'self'; base-uri 'none'; form-action 'self'; "
        "frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}

# The service worker: JavaScript, never cached stale (a new version reaches browsers on their
# next visit), allowed the scope "/" although it lives under /static/, and itself allowed to
# load nothing.
SERVICE_WORKER_HEADERS: Final = {
    "Service-Worker-Allowed": "/",
    "Cache-Control": "no-cache",
    "Content-Security-Policy": "default-src 'none'",
    "X-Content-Type-Options": "nosniff",
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


@router.api_route("/static/sw.js", methods=["GET", "HEAD"], include_in_schema=False)
async def service_worker() -> FileResponse:
    """The page's service worker, with the headers that let it control ``/``."""
    return FileResponse(
        STATIC_DIR / "sw.js",
        media_type="text/javascript; charset=utf-8",
        headers=SERVICE_WORKER_HEADERS,
    )


def mount_page(app: FastAPI) -> None:
    """Add ``/``, the service worker and ``/static`` to ``app`` (the route before the mount,
    which would serve the file without its headers)."""
    app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
