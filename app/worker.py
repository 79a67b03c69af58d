"""The Gunicorn worker: uvicorn with Hubbub's settings, and drain on SIGTERM.

``deploy/gunicorn.conf.py`` selects it (``worker_class = "app.worker.HubbubWorker"``).
"""

from __future__ import annotations

import os
from typing import Any

import uvicorn

from app.server import DrainingServer, uvicorn_options
from app.settings import load_settings
from app.transport.uvicorn_seam import ServerClassWorker


class HubbubWorker(ServerClassWorker):
    """A :class:`uvicorn_worker.UvicornWorker` configured from ``CHAT_*`` settings, that drains
    on SIGTERM and stops when its master is gone.

    Gunicorn's own workers exit when their parent changes; uvicorn-worker's do not, so a
    worker whose master was killed (OOM killer, ``kill -9``) would keep serving, and holding
    its port, forever. This one checks at every heartbeat (half of gunicorn's ``timeout``).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Read per worker (not at import), so a bad value fails the boot with its message.
        self.CONFIG_KWARGS = uvicorn_options(load_settings())
        super().__init__(*args, **kwargs)
        self._server: DrainingServer | None = None

    async def callback_notify(self) -> None:
        if os.getppid() != self.ppid and self._server is not None:
            self.log.warning("worker %s: the master is gone, shutting down", os.getpid())
            self._server.should_exit = True
        self.notify()

    def make_server(self, config: uvicorn.Config) -> uvicorn.Server:
        server = self._server = DrainingServer(config)
        return server
