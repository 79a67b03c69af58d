"""``python -m app``: serve the chat with one uvicorn worker and the embedded memory broker."""

from __future__ import annotations

import logging
import sys

import uvicorn

from app.main import create_app
from app.server import DrainingServer, uvicorn_options
from app.settings import SettingsError, load_settings


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        settings = load_settings()
    except SettingsError as exc:
        print(f"hubbub: {exc}", file=sys.stderr)
        return 2
    config = uvicorn.Config(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        **uvicorn_options(settings),
    )
    DrainingServer(config).run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
