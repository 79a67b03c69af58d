"""The Gunicorn worker: uvicorn with Hubbub's settings, and drain on SIGTERM.

``deploy/gunicorn.conf.py`` selects it (``worker_class = "app.worker.HubbubWorker"``).
"""

from __future__ import annotations

import sys
from typing import Any

from gunicorn.arbiter import Arbiter
from uvicorn_worker import UvicornWorker

from app.server import DrainingServer, uvicorn_options
from app.settings import load_settings


class HubbubWorker(UvicornWorker):
    """A :class:`uvicorn_worker.UvicornWorker` configured from ``CHAT_*`` settings."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Read per worker (not at import), so a bad value fails the boot with its message.
        self.CONFIG_KWARGS = uvicorn_options(load_settings())
        super().__init__(*args, **kwargs)

    async def _serve(self) -> None:
        # As UvicornWorker._serve, with the draining server.
        self.config.app = self.wsgi
        server = DrainingServer(config=self.config)
        self._install_sigquit_handler()
        await server.serve(sockets=self.sockets)
        if not server.started:
            sys.exit(Arbiter.WORKER_BOOT_ERROR)
