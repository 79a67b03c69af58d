"""Gunicorn configuration for Hubbub (production).

    CHAT_REDIS_URL=redis://HOST:6379/0 .venv/bin/gunicorn -c deploy/gunicorn.conf.py \\
        --bind HOST:PORT --workers N

Every ``CHAT_*`` setting applies (docs/configuration.md). Workers default to the core count.
"""

from __future__ import annotations

import multiprocessing
import sys
from typing import Any

from app.settings import SettingsError, load_settings

try:
    _settings = load_settings()
except SettingsError as exc:
    sys.exit(f"hubbub: {exc}")

wsgi_app = "app.main:create_app()"
worker_class = "app.worker.HubbubWorker"
bind = [f"{_settings.host}:{_settings.port}"]
workers = multiprocessing.cpu_count()
# Never recycle workers: a restarted worker drops every socket it holds.
max_requests = 0
max_requests_jitter = 0
# SIGTERM: drain for CHAT_DRAIN_WINDOW_S, close stragglers, then exit. Gunicorn must wait longer.
graceful_timeout = int(_settings.drain_window_s + _settings.close_timeout_s + 10)
# Idle HTTP keep-alive toward the proxy; above nginx's upstream keepalive_timeout (60 s).
keepalive = 75
backlog = 4096
# No control socket: it collides between gunicorns on one host and needs a writable home.
control_socket_disable = True
accesslog = None


def on_starting(server: Any) -> None:
    """Refuse several workers with the memory broker: they would split every room."""
    if server.cfg.workers > 1 and not _settings.redis_url:
        sys.exit(
            f"hubbub: {server.cfg.workers} workers need a shared broker: set CHAT_REDIS_URL "
            "(the embedded memory broker lives in one process, so workers would not see each "
            "other's messages), or run with --workers 1"
        )
