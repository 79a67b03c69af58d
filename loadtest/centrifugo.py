"""Centrifugo, the peer that ``make bench`` measures Hubbub against, run the way its anchor's
README says (``../shared/anchors/centrifugo/``): anonymous clients may subscribe and publish
in ``chat:``, history on (so its messages are recoverable, as Hubbub's are), the Redis engine
on the Redis given. Nothing of it is part of Hubbub; a machine without the anchor skips the
peer's side of a comparison and says so.
"""

from __future__ import annotations

import asyncio
import json
import lzma
import os
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ANCHOR = ROOT.parent / "shared" / "anchors" / "centrifugo" / "centrifugo-v6.9.1-linux-amd64.xz"
_BINARY = Path(tempfile.gettempdir()) / "hubbub-centrifugo-v6.9.1"


def available() -> bool:
    """Whether the anchor's binary is on this machine."""
    return _BINARY.exists() or ANCHOR.exists()


def binary() -> Path:
    """The unpacked binary (unpacked once per machine)."""
    if not _BINARY.exists():
        partial = _BINARY.with_suffix(".partial")
        partial.write_bytes(lzma.decompress(ANCHOR.read_bytes()))
        partial.chmod(0o755)
        partial.replace(_BINARY)
    return _BINARY


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def config(port: int, redis_url: str, history_size: int = 1000) -> dict[str, Any]:
    """The anchor README's configuration, on ``port``, with ``redis_url``'s Redis."""
    namespace = {
        "name": "chat",
        "allow_subscribe_for_client": True, "allow_subscribe_for_anonymous": True,
        "allow_publish_for_client": True, "allow_publish_for_anonymous": True,
        "history_size": history_size, "history_ttl": "24h", "force_recovery": True,
    }  # fmt: skip
    return {
        "http_server": {"address": "127.0.0.1", "port": port},
        "log": {"level": "error"},
        "usage_stats": {"disabled": True},
        "engine": {
            "type": "redis",
            "redis": {"address": [redis_url.removesuffix("/0")], "prefix": "centrifugo"},
        },
        # One client subscribed to every room stands for a node's many clients (loadtest
        # redis_cost), past the default limit of 128 channels a client.
        "client": {"allow_anonymous_connect_without_token": True, "channel_limit": 1_000_000},
        "channel": {"namespaces": [namespace]},
        "health": {"enabled": True},
    }


class Centrifugo:
    """One Centrifugo node on a free loopback port, pinned to ``cores``."""

    def __init__(
        self,
        redis_url: str,
        cores: set[int],
        history_size: int = 1000,
        under: tuple[str, ...] = (),
    ) -> None:
        """``under``: a command it runs under (valgrind, for loadtest.peer_cost --callgrind)."""
        self.under = under
        self.port = _free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="hubbub-centrifugo-"))
        self.cores = cores
        (self.dir / "config.json").write_text(
            json.dumps(config(self.port, redis_url, history_size))
        )
        self.proc: asyncio.subprocess.Process | None = None

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/connection/websocket"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def log(self) -> Path:
        """Its standard error (and valgrind's, ``under`` it), until :meth:`stop`."""
        return self.dir / "stderr.log"

    def log_tail(self, chars: int = 2000) -> str:
        """The end of :attr:`log`, and how it exited if it has: for errors."""
        text = self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""
        exited = self.proc.returncode if self.proc is not None else None
        return f"exit status {exited}; its stderr ends: {text}"

    async def start(self) -> None:
        env = {**os.environ, "GOMAXPROCS": str(len(self.cores))}
        with self.log.open("wb") as log:  # a file: a pipe no one reads would block it when full
            self.proc = await asyncio.create_subprocess_exec(
                "taskset", "-c", ",".join(map(str, sorted(self.cores))), *self.under,
                str(binary()), "-c", str(self.dir / "config.json"),
                env=env, stdout=asyncio.subprocess.DEVNULL, stderr=log,
            )  # fmt: skip
        await wait_healthy(self.proc, self.port, "/health", "centrifugo", 300 if self.under else 20)

    async def stop(self) -> None:
        if self.proc is not None:
            await terminate(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)


async def wait_healthy(
    proc: asyncio.subprocess.Process, port: int, path: str, name: str, timeout_s: float
) -> None:
    """Wait until ``GET path`` on ``port`` answers 200; fail if ``proc`` exits first."""
    async with asyncio.timeout(timeout_s):
        while True:
            if proc.returncode is not None:
                raise RuntimeError(f"{name} exited {proc.returncode}")
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(f"GET {path} HTTP/1.0\r\n\r\n".encode())
                status = await reader.readline()
                writer.close()
                if b" 200 " in status:
                    return
            except OSError:
                pass
            await asyncio.sleep(0.05)


async def terminate(proc: asyncio.subprocess.Process, grace_s: float = 10.0) -> None:
    """SIGTERM ``proc`` (one this process started), SIGKILL it after ``grace_s``; reap it."""
    if proc.returncode is not None:
        return
    proc.terminate()
    try:
        async with asyncio.timeout(grace_s):
            await proc.wait()
    except TimeoutError:
        proc.kill()
        await proc.wait()
