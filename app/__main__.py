"""``python -m app``: serve the chat with one uvicorn worker and the embedded memory broker
(or Redis, with ``CHAT_REDIS_URL``), plus the metrics port when ``CHAT_METRICS_PORT`` is set."""

from __future__ import annotations

import socket
import sys

import uvicorn

from app.main import create_app
from app.ops.logs import logging_config
from app.server import DrainingServer, uvicorn_options
from app.settings import SettingsError, load_settings
from app.store.database import StoreError, prepare


def main() -> int:
    try:
        settings = load_settings()
    except SettingsError as exc:
        print(f"hubbub: {exc}", file=sys.stderr)
        return 2
    if settings.database_url is not None:
        try:
            prepare(settings.database_url)
        except StoreError as exc:
            print(f"hubbub: {exc}", file=sys.stderr)
            return 2
    config = uvicorn.Config(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=logging_config(settings),
        **uvicorn_options(settings),
    )
    sockets: list[socket.socket] = [config.bind_socket()]
    if settings.metrics_port is not None:
        family = socket.AF_INET6 if ":" in settings.metrics_host else socket.AF_INET
        address = (settings.metrics_host, settings.metrics_port)
        sockets.append(socket.create_server(address, family=family))
    DrainingServer(config).run(sockets=sockets)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
