"""The chat page: ``GET /`` and its static files under ``/static`` (``app/static``).

Plain HTML, CSS and JavaScript modules, no build step and nothing from a CDN. The page is sent
with a Content-Security-Policy that allows only this origin's scripts, styles and sockets, so
even a message that slipped through as markup could not run code (the page renders message
text as text anyway).
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

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


@router.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
async def chat_page() -> FileResponse:
    """The chat page."""
    return FileResponse(STATIC_DIR / "index.html", headers=SECURITY_HEADERS)


def mount_page(app: FastAPI) -> None:
    """Add ``/`` and ``/static`` to ``app``."""
    app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
