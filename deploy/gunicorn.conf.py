"""Gunicorn configuration for Hubbub (production).

    CHAT_JWT_SECRET=... CHAT_REDIS_URL=redis://HOST:6379/0 \\
        .venv/bin/gunicorn -c deploy/gunicorn.conf.py --bind HOST:PORT --workers N

Users authenticate with JWTs (``CHAT_AUTH_MODE=jwt``, the default): without a key the workers
refuse to start.

Every ``CHAT_*`` setting applies (docs/configuration.md). Workers: ``CHAT_WORKERS``, else one per
CPU the process may run on.

Metrics: the workers share ``PROMETHEUS_MULTIPROC_DIR`` (a fresh temporary directory unless it
is set), wiped when gunicorn starts; a worker that dies is forgotten by the live gauges at once.
With ``CHAT_METRICS_PORT`` set, gunicorn also listens on ``CHAT_METRICS_HOST:CHAT_METRICS_PORT``,
where the workers serve only ``/metrics``.
"""

from __future__ import annotations

import glob
import os
import shutil
import sys
import tempfile
from typing import Any

from app.ops.logs import logging_config
from app.settings import SettingsError, load_settings
from app.store.database import StoreError, prepare

# Not imported from app.ops.metrics: prometheus_client must not be imported in the master before
# this is set, or the forked workers would inherit it in single-process mode.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

try:
    _settings = load_settings()
except SettingsError as exc:
    sys.exit(f"hubbub: {exc}")

# Before anything imports prometheus_client: it picks multiprocess mode at import.
_metrics_dir = os.environ.get(MULTIPROC_ENV)
_owns_metrics_dir = not _metrics_dir
if not _metrics_dir:
    _metrics_dir = os.environ[MULTIPROC_ENV] = tempfile.mkdtemp(prefix="hubbub-metrics-")

wsgi_app = "app.main:create_app()"
worker_class = "app.worker.HubbubWorker"
bind = [f"{_settings.host}:{_settings.port}"]
workers = _settings.workers or len(os.sched_getaffinity(0))
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
forwarded_allow_ips = _settings.trusted_proxies
logconfig_dict = logging_config(_settings)


def on_starting(server: Any) -> None:
    """Refuse several workers with the memory broker; migrate the store; start the metrics
    afresh; listen on the metrics port (added here, so it holds whatever ``--bind`` says)."""
    if server.cfg.workers > 1 and not _settings.uses_redis:
        sys.exit(
            f"hubbub: {server.cfg.workers} workers need a shared broker: set CHAT_REDIS_URL, "
            "CHAT_REDIS_SENTINELS or CHAT_REDIS_CLUSTER_NODES (the embedded memory broker lives "
            "in one process, so workers would not see each other's messages), or run with "
            "--workers 1"
        )
    if _settings.database_url is not None:
        # Once, in the master: workers (and pods, under an advisory lock) never race to migrate.
        try:
            prepare(_settings.database_url)
        except StoreError as exc:
            sys.exit(f"hubbub: {exc}")
    # A previous run's metrics and exemplars (app.ops.exemplars) are not this run's.
    for pattern in ("*.db", "exemplars_*.json"):
        for stale in glob.glob(os.path.join(str(_metrics_dir), pattern)):
            os.remove(stale)
    if _settings.metrics_port is not None:
        host, port = _settings.metrics_host, _settings.metrics_port
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        server.cfg.set("bind", [*server.cfg.bind, address])


def child_exit(server: Any, worker: Any) -> None:
    """A worker is gone: its share of the live gauges (connections...) goes with it, and so
    do the exemplars it saved (app.ops.exemplars)."""
    from prometheus_client import multiprocess

    from app.ops.exemplars import remove_of

    multiprocess.mark_process_dead(worker.pid)
    remove_of(str(_metrics_dir), worker.pid)


def on_exit(server: Any) -> None:
    if _owns_metrics_dir:
        shutil.rmtree(str(_metrics_dir), ignore_errors=True)
