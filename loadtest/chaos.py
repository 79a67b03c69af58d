"""``make chaos`` (``python -m loadtest.chaos``): clients chat through faults, and a checker
proves that no message was lost silently (:mod:`loadtest.invariants`).

The runner starts, on 127.0.0.1 and free ports, in a temporary directory of its own: one
``redis-server`` with its append-only file on (``everysec``), and two gunicorn instances
configured like production (``deploy/gunicorn.conf.py``, 2 workers each) sharing it, with short
drain, canary and reconnect settings and per-user limits out of the way. ``--clients`` clients
(each in 1-3 of ``--rooms`` rooms, spread over both instances) speak docs/protocol.md: join
(with ``since`` after a reconnect), send at a steady rate with a ``cid`` and retry it after an
error or a reconnect until acked, reconnect with jittered backoff to either instance after any
close, rejoin on a ``resync`` error, reload over HTTP after ``"recovered": false``, answer
pings. A share of them (``--sse-share``, a quarter by default) speak it over the HTTP fallback
transport instead (:mod:`loadtest.sse`: a stream on one instance, each POST to either). Meanwhile
the fault schedule runs, ``--gap`` seconds apart:

- ``pubsub_kill``: ``CLIENT KILL TYPE pubsub`` (every worker's subscription);
- ``pubsub_burst``: ten of those, 100 ms apart;
- ``redis_kill_aof``: Redis SIGKILLed and restarted on its append-only file;
- ``redis_kill_empty``: Redis SIGKILLed and restarted with its data directory emptied;
- ``redis_stop``: Redis SIGSTOPped for 3 s, then SIGCONTinued;
- ``worker_kill``: one gunicorn worker SIGKILLed (its master starts another);
- ``drain``: one instance SIGTERMed (it drains), waited for and restarted on the same port;
- ``postgres_kill`` (with ``--store``): PostgreSQL SIGKILLed, restarted 5 s later.

``--store`` (``make chaos`` uses it): the instances archive into a PostgreSQL of the run's own
(``CHAT_DATABASE_URL``), and once the archive has drained the store is checked too: every
acked message is stored, once. The only ones allowed to be missing are those acked in the
3 s before a ``redis_kill_empty`` (an emptied Redis loses what it had not archived yet,
docs/operations.md, "The store") and in the 2 s before a ``redis_kill_aof`` that its
append-only file (``appendfsync everysec``) had not synced; they are counted apart. With
``--sentinel`` (acks wait for a replica) none may be missing.

Then sending stops; once acks and messages have been quiet for a while, every client rejoins
every room with ``since`` (the *settle*, which makes the check exact up to the newest message),
and the report is printed (``--json`` writes it as JSON too). Every process is stopped by PID at
the end, also on failure or Ctrl-C. Exit status: 0 when the three invariants hold and every
fault verifiably happened, 1 when an invariant is broken, 2 when a fault did not take effect.

``--sentinel``: Redis is a master, a replica and three Sentinels instead of one server
(``tests.processes.SentinelDeployment``), the instances find it through the Sentinels and wait
for a replica to confirm every ack (``CHAT_REDIS_WAIT_REPLICAS=1``), and the Redis faults are
``master_kill`` (the master SIGKILLed: the Sentinels promote the replica; the old master comes
back as a replica of the new one) and ``pubsub_kill``. With ``--store`` every acked message must
be stored: none may be lost with the master.

``--cluster``: Redis Cluster instead (``tests.processes.ClusterDeployment``: three masters, a
replica each), acks waiting for the replica; ``master_kill`` SIGKILLs the master of room-00's
slot and restarts it once its replica has taken over (it rejoins as a replica).

``--smoke``: 40 clients in 8 rooms, four faults (pubsub_kill, redis_kill_aof, redis_stop,
worker_kill) 8 s apart, under a minute in all (the test suite runs it). ``--no-faults``: the
same traffic without any fault (the harness's own control: it must report no loss and no
duplicate). ``--server-root DIR`` serves another checkout's app (``git archive REV | tar -x -C
DIR``), to score an older version; ``--events`` keeps the raw event log and ``--recheck``
checks one again.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2 as httpx
import orjson
import uvloop
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import RedisError
from sqlalchemy import select
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from app.broker.keys import KeyLayout
from app.broker.redis_scripts import archive_keys
from app.settings import Settings
from app.sockets.rebalance import SHED_REASON
from app.store.database import engine_for
from app.store.schema import messages
from loadtest.bench import free_port
from loadtest.invariants import (
    Ack,
    Connected,
    Disconnected,
    Event,
    Fault,
    HistoryEntry,
    Joined,
    JoinRefused,
    Received,
    Reloaded,
    Report,
    Resync,
    RunLog,
    Send,
    SendError,
    check,
)
from loadtest.sse import SseConnection
from tests.processes import ClusterDeployment, PostgresServer, SentinelDeployment

ROOT = Path(__file__).resolve().parent.parent
FAULTS = (
    "pubsub_kill",
    "pubsub_burst",
    "redis_kill_aof",
    "redis_kill_empty",
    "redis_stop",
    "worker_kill",
    "drain",
)
SMOKE_FAULTS = ("pubsub_kill", "redis_kill_aof", "redis_stop", "worker_kill")
# With --sentinel: the faults of one Redis server are replaced by the master's.
SENTINEL_FAULTS = ("pubsub_kill", "master_kill", "worker_kill", "master_kill", "drain")
SENTINEL_SMOKE_FAULTS = ("master_kill", "worker_kill")

# The service as production runs it, with what a test run needs: quick drains, a deaf
# subscription found within ~2 s, quick Redis reconnects, and the per-user and per-address
# limits out of the way (every client connects from one address, often).
APP_ENV = {
    "CHAT_AUTH_MODE": "names",  # the clients are named users (c000, c001, ...)
    "CHAT_DRAIN_WINDOW_S": "2",
    "CHAT_CLOSE_TIMEOUT_S": "2",
    "CHAT_CANARY_INTERVAL_S": "0.5",
    "CHAT_CANARY_TIMEOUT_S": "2",
    "CHAT_REDIS_RECONNECT_MAX_S": "1",
    "CHAT_REDIS_TIMEOUT_S": "1",
    "CHAT_IP_CONNECTIONS_PER_S": "100000",
    "CHAT_IP_CONNECTION_BURST": "100000",
    "CHAT_MAX_CONNECTIONS_PER_USER": "1000",
    "CHAT_USER_MESSAGES_PER_S": "100000",
    "CHAT_USER_MESSAGE_BURST": "100000",
    "CHAT_USER_JOINS_PER_S": "100000",
    "CHAT_USER_JOIN_BURST": "100000",
    "CHAT_HISTORY_READS_PER_S": "100000",
    "CHAT_HISTORY_READ_BURST": "100000",
    "CHAT_USER_NEW_ROOMS_PER_S": "100000",
    "CHAT_USER_NEW_ROOM_BURST": "100000",
    # Rebalancing at this run's scale (200 clients over 4 workers): after a fault leaves one
    # instance's workers with everyone, they shed (1012) and the clients move back, mid-run.
    "CHAT_REBALANCE_INTERVAL_S": "2",
    "CHAT_REBALANCE_MIN_EXCESS": "10",
    "CHAT_REBALANCE_SHED_PER_S": "20",
}

SEND_INTERVAL_S = (0.5, 1.0)  # between a client's new sends (uniform)
EDIT_SHARE = 0.2  # of the sends, how many edit one of the client's messages instead
MAX_IN_FLIGHT = 8  # unanswered sends per client (the connection's frame burst is 40)
RESEND_AFTER_S = 10.0  # a send unanswered this long on an open connection is sent again
BACKOFF_START_S, BACKOFF_CAP_S = 0.15, 2.0
QUIET_S = 3.0  # the end: no ack and no message for this long
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it if the runner dies without cleaning up."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _spawn(
    command: list[str], env: dict[str, str], log: Path, cwd: Path = ROOT
) -> subprocess.Popen[bytes]:
    """Start ``command`` in a session of its own (a Ctrl-C in the terminal reaches only the
    runner, which then stops it by PID), its output appended to ``log``."""
    with log.open("ab") as out:
        return subprocess.Popen(
            command, cwd=cwd, env=env, stdout=out, stderr=out, stdin=subprocess.DEVNULL,
            start_new_session=True, preexec_fn=_die_with_parent,
        )  # fmt: skip


async def _wait_exit(proc: subprocess.Popen[bytes], within_s: float) -> int | None:
    """The exit status once ``proc`` has ended, None if it is still running after ``within_s``."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        status = proc.poll()
        if status is not None:
            return status
        await asyncio.sleep(0.02)
    return None


class _OneMaster:
    """What the faults do on Redis with one master, reached by ``client()``."""

    def client(self) -> Redis:
        raise NotImplementedError

    async def kill_pubsub(self) -> int:
        async with self.client() as redis:
            return int(await redis.client_kill_filter(_type="pubsub"))

    async def archive_length(self) -> int:
        async with self.client() as redis:
            return int(await redis.xlen(archive_keys("hubbub")[0]))


class RedisServer(_OneMaster):
    """A redis-server with its append-only file (``everysec``) in a directory of its own."""

    def __init__(self, root: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise SystemExit("redis-server is missing: `make deb-deps` installs it")
        self.binary = binary
        self.port = free_port()
        self.dir = root / "redis-data"
        self.dir.mkdir()
        self.log = root / "redis.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> Redis:
        return Redis.from_url(self.url, socket_timeout=2, socket_connect_timeout=2)

    async def start(self) -> None:
        self.proc = proc = _spawn(
            [
                self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
                "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
                "--dir", str(self.dir), "--logfile", str(self.log), "--daemonize", "no",
            ],
            dict(os.environ), self.log,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        async with self.client() as redis:
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"redis-server exited: see {self.log}")
                with contextlib.suppress(RedisError, OSError):
                    if await redis.ping():  # refused with LOADING while reading its AOF
                        return
                if time.monotonic() > deadline:
                    raise RuntimeError("redis-server did not answer PING")
                await asyncio.sleep(0.02)

    async def dbsize(self) -> int:
        async with self.client() as redis:
            return int(await redis.dbsize())

    async def kill(self) -> int | None:
        """SIGKILL; the exit status (-9)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        return await _wait_exit(self.proc, 10)

    def wipe(self) -> int:
        """Remove everything in the data directory; how many entries there were."""
        entries = list(self.dir.iterdir())
        for entry in entries:
            if entry.is_dir():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        return len(entries)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)  # in case it was stopped
                self.proc.kill()
            self.proc.wait()

    @property
    def app_env(self) -> dict[str, str]:
        return {"CHAT_REDIS_URL": self.url}


class SentinelRedis(_OneMaster):
    """Redis with Sentinel (``SentinelDeployment``), with the face of :class:`RedisServer`
    that the runner and the faults use: :meth:`client` reaches whichever server is master."""

    def __init__(self) -> None:
        self.deployment = SentinelDeployment()
        self.port = 0

    @property
    def app_env(self) -> dict[str, str]:
        return {
            "CHAT_REDIS_SENTINELS": self.deployment.addresses,
            "CHAT_REDIS_SENTINEL_MASTER": self.deployment.NAME,
            "CHAT_REDIS_WAIT_REPLICAS": "1",
            "CHAT_REDIS_WAIT_TIMEOUT_S": "0.5",
        }

    def client(self) -> Redis:
        return Redis(port=self.port, socket_timeout=2, socket_connect_timeout=2)

    async def start(self) -> None:
        await self.deployment.start()
        self.port = await self.deployment.master_port()

    async def kill_master(self) -> tuple[bool, str]:
        began = time.monotonic()
        old = await self.deployment.kill_master()
        self.port = await self.deployment.wait_failover(old)
        took = time.monotonic() - began
        await self.deployment.restart_killed()
        await self.deployment.wait_replicated()
        detail = (
            f"SIGKILLed the master on {old}; the Sentinels promoted {self.port} in {took:.1f} s; "
            f"{old} back as its replica after {time.monotonic() - began:.1f} s"
        )
        return self.port != old, detail

    def stop(self) -> None:
        for proc in self.deployment.sentinels:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        for server in self.deployment.servers:
            if server.proc is not None and server.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    server.proc.kill()
        shutil.rmtree(self.deployment.dir, ignore_errors=True)
        for server in self.deployment.servers:
            shutil.rmtree(server.dir, ignore_errors=True)


class ClusterRedis:
    """Redis Cluster (``ClusterDeployment``: 3 masters, a replica each), with the face of
    :class:`RedisServer` that the runner and the faults use. ``master_kill`` SIGKILLs the
    master of the busiest room's slot (``room-00``), waits until its replica took over, then
    restarts it (it rejoins as a replica)."""

    def __init__(self) -> None:
        self.deployment = ClusterDeployment()
        self.port = 0
        self._layout = KeyLayout(
            "hubbub", Settings.model_fields["redis_cluster_partitions"].default
        )

    @property
    def app_env(self) -> dict[str, str]:
        return {
            "CHAT_REDIS_CLUSTER_NODES": self.deployment.addresses,
            "CHAT_REDIS_WAIT_REPLICAS": "1",
            "CHAT_REDIS_WAIT_TIMEOUT_S": "0.5",
        }

    def client(self) -> Redis:
        return Redis(port=self.port, socket_timeout=2, socket_connect_timeout=2)

    async def start(self) -> None:
        await self.deployment.start()
        self.port = self.deployment.servers[0].port

    async def kill_pubsub(self) -> int:
        killed = 0
        for server in self.deployment.servers:
            if server.proc is not None:
                async with Redis(port=server.port, socket_timeout=2) as node:
                    killed += int(await node.client_kill_filter(_type="pubsub"))
        return killed

    async def archive_length(self) -> int:
        cluster = RedisCluster(host="127.0.0.1", port=self.port, socket_timeout=2)
        try:
            return sum([int(await cluster.xlen(key)) for key, _ in self._layout.archives()])
        finally:
            await cluster.aclose()

    async def kill_master(self) -> tuple[bool, str]:
        began = time.monotonic()
        slot = key_slot(self._layout.tag("room-00").strip("{}").encode())
        old = await self.deployment.master_of(slot)
        await old.kill()
        new = old
        while new is old and time.monotonic() - began < 30:
            await asyncio.sleep(0.1)
            with contextlib.suppress(AssertionError):
                new = await self.deployment.master_of(slot)
        took = time.monotonic() - began
        await old.start()  # it rejoins from its nodes.conf, as a replica of the new master
        await self.deployment.wait_ok()
        if self.port == old.port:
            self.port = new.port
        detail = (
            f"SIGKILLed {old.port}, master of slot {slot}; its replica {new.port} took over in "
            f"{took:.1f} s; {old.port} back as a replica after {time.monotonic() - began:.1f} s"
        )
        return new is not old, detail

    def stop(self) -> None:
        for server in self.deployment.servers:
            if server.proc is not None and server.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    server.proc.kill()
            shutil.rmtree(server.dir, ignore_errors=True)


class Instance:
    """One gunicorn (2 workers, ``deploy/gunicorn.conf.py``), restartable on its port, serving
    the app of ``server_root`` (this checkout by default)."""

    def __init__(
        self,
        index: int,
        root: Path,
        redis_env: dict[str, str],
        server_root: Path = ROOT,
        database_url: str | None = None,
    ) -> None:
        self.index = index
        self.server_root = server_root
        self.port = free_port()
        self.tmp = root / f"app{index}-tmp"
        self.tmp.mkdir()
        self.log = root / f"app{index}.log"
        self.env = {
            **os.environ, **APP_ENV,
            "CHAT_HOST": "127.0.0.1", "CHAT_PORT": str(self.port),
            **redis_env, "TMPDIR": str(self.tmp),
        }  # fmt: skip
        if database_url is not None:
            self.env["CHAT_DATABASE_URL"] = database_url
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        gunicorn = str(Path(sys.executable).parent / "gunicorn")
        self.proc = _spawn(
            [gunicorn, "-c", "deploy/gunicorn.conf.py",
             "--bind", f"127.0.0.1:{self.port}", "--workers", "2"],
            self.env, self.log, self.server_root,
        )  # fmt: skip

    def workers(self) -> list[int]:
        """The master's children: its workers' PIDs."""
        if self.proc is None or self.proc.poll() is not None:
            return []
        try:
            text = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        except OSError:
            return []
        return [int(pid) for pid in text.split()]

    async def wait_ready(self, within_s: float = 30) -> None:
        """Until ``/readyz`` answers 200 and both workers exist."""
        deadline = time.monotonic() + within_s
        proc = self.proc
        assert proc is not None
        async with httpx.AsyncClient(trust_env=False) as http:
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    raise RuntimeError(f"gunicorn {self.index} exited: see {self.log}")
                with contextlib.suppress(httpx.HTTPError):
                    response = await http.get(f"{self.http_url}/readyz", timeout=2)
                    if response.status_code == 200 and len(self.workers()) == 2:
                        return
                await asyncio.sleep(0.05)
        raise RuntimeError(f"gunicorn {self.index} not ready in {within_s} s: see {self.log}")

    def stop(self) -> None:
        """SIGKILL the master's whole session (its workers too)."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


# -- the clients ---------------------------------------------------------------------------------


@dataclass
class _Pending:
    """A send not acked yet: waiting (until ``due``) or in flight on connection ``conn``."""

    send: Send
    in_flight: bool = False
    sent_at: float = 0.0
    conn: int = 0
    due: float = 0.0
    errors: int = 0


@dataclass
class Run:
    """What the clients share: the log, and when something last arrived."""

    log: RunLog
    instances: list[Instance]
    http: httpx.AsyncClient
    # The SSE clients' streams and POSTs: a pool of its own, without a bound (each stream
    # holds a connection for its whole life).
    streams: httpx.AsyncClient = field(
        default_factory=lambda: httpx.AsyncClient(
            trust_env=False,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
        )
    )
    last_activity: float = 0.0
    stop_sending: bool = False
    closing: bool = False
    rebalanced: int = 0  # connections moved by the servers' rebalancing (1012)
    connect_failures: Counter[str] = field(default_factory=Counter)
    other_errors: Counter[str] = field(default_factory=Counter)


class ChaosClient:
    """One user of the chat, following docs/protocol.md; records every event for the checker."""

    def __init__(
        self, run: Run, name: str, rooms: list[str], instance: int, seed: int, sse: bool = False
    ) -> None:
        self.run = run
        self.name = name
        self.sse = sse  # over the HTTP fallback transport (loadtest.sse), not a WebSocket
        self.rooms = rooms
        self.instance = instance
        self.rng = random.Random(seed)
        self.events: list[Event] = []
        self.position: dict[str, int] = {}
        self.pending: dict[str, _Pending] = {}
        self.seq = 0
        self.mine: dict[str, list[int]] = {}  # room -> ids of this client's acked messages
        self.ws: ClientConnection | SseConnection | None = None
        self.conn = 0
        self.joined: set[str] = set()
        self.joins: deque[tuple[str, int | None, float]] = deque()  # awaiting an answer
        self.join_retries: dict[str, float] = {}  # room -> when to join again
        self.connected_once = asyncio.Event()
        self.settle_from: float | None = None
        self.settled: set[str] = set()
        self.next_send = 0.0
        self.tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self.tasks = [
            asyncio.create_task(self._connection_loop(), name=f"{self.name}-conn"),
            asyncio.create_task(self._sender(), name=f"{self.name}-send"),
        ]

    @property
    def all_joined(self) -> bool:
        return self.ws is not None and self.joined == set(self.rooms)

    @property
    def settled_all(self) -> bool:
        return self.settled == set(self.rooms)

    # -- connection ------------------------------------------------------------------------------

    async def _connection_loop(self) -> None:
        attempt = 0
        first = True
        while not self.run.closing:
            if not first:
                delay = min(BACKOFF_CAP_S, BACKOFF_START_S * 2**attempt)
                await asyncio.sleep(self.rng.uniform(delay / 2, delay))
                attempt += 1
                self.instance = 1 - self.instance  # the other instance next
            first = False
            instance = self.run.instances[self.instance]
            ws: ClientConnection | SseConnection
            try:
                if self.sse:
                    ws = await SseConnection.open(
                        self.run.streams, instance.http_url,
                        [i.http_url for i in self.run.instances], {"name": self.name}, self.rng,
                    )  # fmt: skip
                else:
                    ws = await connect(
                        f"{instance.ws_url}?name={self.name}", open_timeout=5, close_timeout=2,
                        compression=None, proxy=None, ping_interval=None, max_size=None,
                    )  # fmt: skip
            except (OSError, TimeoutError, InvalidHandshake, ConnectionClosed) as exc:
                self.run.connect_failures[type(exc).__name__] += 1
                continue
            connections = self.conn
            try:
                await self._session(ws)
            except ConnectionClosed:
                pass
            except (OSError, TimeoutError) as exc:
                self.run.connect_failures[type(exc).__name__] += 1
            finally:
                await ws.close()
            if self.conn != connections:
                attempt = 0  # it got as far as hello: start the backoff over

    async def _session(self, ws: ClientConnection | SseConnection) -> None:
        """Serve one connection until it ends."""
        try:
            async with asyncio.timeout(5):
                first = str(await ws.recv()).split("\n")
        except ConnectionClosed:
            self.run.connect_failures[f"closed {ws.close_code} before hello"] += 1
            return
        hello = orjson.loads(first[0])
        if hello.get("type") != "hello":
            raise RuntimeError(f"expected hello, got {hello}")
        self.conn += 1
        now = time.time()
        self.events.append(Connected(self.name, self.conn, self.instance, now))
        self.ws = ws
        self.joined.clear()
        self.joins.clear()
        self.join_retries.clear()
        self.connected_once.set()
        try:
            for room in self.rooms:
                await self._join(room)
            for line in first[1:]:
                await self._handle(orjson.loads(line), now)
            async for data in ws:
                now = time.time()
                for line in str(data).split("\n"):
                    await self._handle(orjson.loads(line), now)
        finally:
            self.ws = None
            self.joined.clear()
            self.joins.clear()
            if not self.run.closing:  # not the runner's own close at the end
                self.events.append(Disconnected(self.name, self.conn, ws.close_code, time.time()))
                if ws.close_reason == SHED_REASON:
                    self.run.rebalanced += 1
            for pending in self.pending.values():
                if pending.in_flight:
                    pending.in_flight = False
                    pending.due = 0.0  # resend after the rejoin

    async def _send_frame(self, frame: dict[str, Any]) -> bool:
        ws = self.ws
        if ws is None:
            return False
        try:
            await ws.send(orjson.dumps(frame).decode())
        except ConnectionClosed:
            return False
        return True

    async def _join(self, room: str) -> None:
        since = self.position.get(room)
        frame: dict[str, Any] = {"type": "join", "room": room}
        if since is not None:
            frame["since"] = since
        now = time.time()
        if await self._send_frame(frame):
            self.joins.append((room, since, now))

    # -- frames --------------------------------------------------------------------------------

    async def _handle(self, frame: dict[str, Any], now: float) -> None:
        kind = frame.get("type")
        if kind in ("message", "edited"):  # an edit is numbered in the log like a message
            room = frame.get("room")
            if room is None:
                return  # a direct message: none are sent here
            message_id = int(frame["id"])
            self.events.append(
                Received(self.name, room, message_id, frame["text"], int(frame["ts"]), now)
            )
            if message_id > self.position.get(room, -1):
                self.position[room] = message_id
            self.run.last_activity = now
        elif kind == "ack":
            cid = str(frame["cid"])
            self.run.log.acks.append(
                Ack(self.name, cid, int(frame["id"]), bool(frame.get("duplicate")), now)
            )
            done = self.pending.pop(cid, None)
            if done is not None and done.send.edit_of is None:
                mine = self.mine.setdefault(done.send.room, [])
                mine.append(int(frame["id"]))
                del mine[:-20]  # edits pick among the newest
            self.run.last_activity = now
        elif kind == "joined":
            self._joined(frame, now)
            await self._flush()
        elif kind == "error":
            await self._error(frame, now)
        elif kind == "ping":
            await self._send_frame({"type": "pong"})

    def _joined(self, frame: dict[str, Any], now: float) -> None:
        room = frame["room"]
        match = next((j for j in self.joins if j[0] == room), None)
        if match is None:
            self.run.other_errors["joined without a join"] += 1
            return
        self.joins.remove(match)
        _, since, sent_at = match
        recovered = frame.get("recovered")
        last = frame.get("last")
        self.events.append(Joined(self.name, room, since, recovered, last, sent_at, now))
        self.joined.add(room)
        if since is None and last is not None and room not in self.position:
            self.position[room] = int(last)
        if since is not None and recovered is False:
            task = asyncio.create_task(self._reload(room, since, self.instance))
            self.tasks.append(task)
        if self.settle_from is not None and sent_at >= self.settle_from:
            self.settled.add(room)

    async def _error(self, frame: dict[str, Any], now: float) -> None:
        code = str(frame.get("code"))
        if code == "resync":
            room = frame.get("room")
            if room is None or "to" in frame:
                return  # a direct-message resync (none are sent here), or malformed
            self.events.append(Resync(self.name, room, now))
            if room in self.joined:
                await self._join(room)  # a join with since on a joined room rejoins it
            return
        ref = frame.get("ref")
        if ref in ("send", "edit") and "cid" in frame:
            cid = str(frame["cid"])
            self.run.log.send_errors.append(SendError(self.name, cid, code, now))
            if code == "not_found":  # the message edited is gone (lost with Redis' data)
                self.pending.pop(cid, None)
                return
            pending = self.pending.get(cid)
            if pending is not None:
                pending.in_flight = False
                pending.errors += 1
                delay = min(BACKOFF_CAP_S, 0.2 * 2 ** min(pending.errors, 5))
                pending.due = now + self.rng.uniform(delay / 2, delay)
        elif ref == "join" and self.joins:
            # Joins are answered in order; the error names the room when it can.
            named = frame.get("room")
            match = next((j for j in self.joins if j[0] == named), self.joins[0])
            self.joins.remove(match)
            room = match[0]
            self.events.append(JoinRefused(self.name, room, code, now))
            # A refused rejoin leaves the client in the room as before (docs/protocol.md);
            # either way the join is made again (with since) until it is answered.
            self.join_retries[room] = now + self.rng.uniform(0.2, 0.6)
        else:
            self.run.other_errors[f"{code} ref={ref}"] += 1

    async def _reload(self, room: str, since: int, instance: int) -> None:
        """``recovered: false``: reload the room over HTTP, move the position to its newest."""
        url = f"{self.run.instances[instance].http_url}/rooms/{room}/messages"
        entries: tuple[HistoryEntry, ...] = ()
        for attempt in range(6):
            try:
                response = await self.run.http.get(url, params={"limit": 50}, timeout=3)
            except httpx.HTTPError:
                response = None
            if response is not None and response.status_code == 200:
                entries = tuple(
                    HistoryEntry(int(m["id"]), m["text"], int(m["ts"]))
                    for m in response.json()["messages"]
                )
                break
            await asyncio.sleep(0.3 * (attempt + 1))
        newest = max((e.id for e in entries), default=None)
        self.events.append(Reloaded(self.name, room, since, newest, entries, time.time()))
        if newest is not None and newest > self.position.get(room, -1):
            self.position[room] = newest

    # -- sending -------------------------------------------------------------------------------

    async def _sender(self) -> None:
        await self.connected_once.wait()
        self.next_send = time.time() + self.rng.uniform(*SEND_INTERVAL_S)
        while not self.run.closing:
            await asyncio.sleep(0.1)
            now = time.time()
            if not self.run.stop_sending and now >= self.next_send:
                self.seq += 1
                cid = f"{self.name}-{self.seq}"
                room = self.rng.choice(self.rooms)
                mine = self.mine.get(room)
                # One in EDIT_SHARE is an edit of one of its messages: an event in the log.
                edit_of = self.rng.choice(mine) if mine and self.rng.random() < EDIT_SHARE else None
                send = Send(self.name, room, cid, f"{self.name}#{self.seq}", now, edit_of)
                self.run.log.sends.append(send)
                self.pending[cid] = _Pending(send)
                self.next_send = now + self.rng.uniform(*SEND_INTERVAL_S)
            for room, when in list(self.join_retries.items()):
                if when <= now and self.ws is not None:
                    del self.join_retries[room]
                    await self._join(room)
            await self._flush()

    async def _flush(self) -> None:
        """Send what is due: new sends, retries after an error, resends after a reconnect."""
        if self.ws is None:
            return
        now = time.time()
        in_flight = 0
        for pending in self.pending.values():
            if pending.in_flight and now - pending.sent_at > RESEND_AFTER_S:
                pending.in_flight = False  # no answer on an open connection: send again
            in_flight += pending.in_flight
        for cid, pending in list(self.pending.items()):
            if in_flight >= MAX_IN_FLIGHT:
                break
            send = pending.send
            if pending.in_flight or pending.due > now or send.room not in self.joined:
                continue
            frame: dict[str, Any] = {"type": "send", "room": send.room, "text": send.text}
            if send.edit_of is not None:
                frame = {"type": "edit", "room": send.room, "id": send.edit_of, "text": send.text}
            frame["cid"] = cid
            if not await self._send_frame(frame):
                return
            pending.in_flight, pending.sent_at, pending.conn = True, now, self.conn
            in_flight += 1

    async def settle(self) -> None:
        """Rejoin every room with ``since`` (on this connection, or on the next one)."""
        self.settle_from = time.time()
        self.settled.clear()
        if self.ws is not None:
            for room in self.rooms:
                await self._join(room)

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        ws = self.ws
        if ws is not None:
            with contextlib.suppress(Exception):
                await ws.close()


# -- faults --------------------------------------------------------------------------------------


class Faults:
    """The faults, each returning what it did and whether it verifiably happened."""

    def __init__(
        self,
        redis: RedisServer | SentinelRedis | ClusterRedis,
        instances: list[Instance],
        postgres: PostgresServer | None = None,
    ) -> None:
        self.redis = redis
        self.instances = instances
        self.postgres = postgres
        # When each Redis SIGKILL was confirmed (the process gone): (fault name, time).
        self.redis_kills: list[tuple[str, float]] = []

    async def run(self, name: str) -> Fault:
        started = time.time()
        action: Callable[[], Awaitable[tuple[bool, str]]] = getattr(self, name)
        try:
            happened, detail = await action()
        except (RedisError, OSError, RuntimeError) as exc:
            happened, detail = False, f"failed: {exc!r}"
        return Fault(name, started, time.time(), happened, detail)

    async def _kill_pubsub(self, times: int) -> list[int]:
        killed = []
        for n in range(times):
            if n:
                await asyncio.sleep(0.1)
            killed.append(await self.redis.kill_pubsub())
        return killed

    async def pubsub_kill(self) -> tuple[bool, str]:
        killed = await self._kill_pubsub(1)
        return killed[0] > 0, f"CLIENT KILL TYPE pubsub closed {killed[0]} subscriptions"

    async def pubsub_burst(self) -> tuple[bool, str]:
        killed = await self._kill_pubsub(10)
        detail = f"10 x CLIENT KILL TYPE pubsub, 100 ms apart, closed {killed}"
        return killed[0] > 0 and sum(k > 0 for k in killed) >= 2, detail

    async def master_kill(self) -> tuple[bool, str]:
        assert not isinstance(self.redis, RedisServer), "master_kill needs --sentinel or --cluster"
        return await self.redis.kill_master()

    async def _kill_redis(self, keep_aof: bool) -> tuple[bool, str]:
        assert isinstance(self.redis, RedisServer), "not with --sentinel"
        before = await self.redis.dbsize()
        files = sum(1 for p in self.redis.dir.rglob("*") if p.is_file())
        status = await self.redis.kill()
        self.redis_kills.append(("redis_kill_aof" if keep_aof else "redis_kill_empty", time.time()))
        removed = 0 if keep_aof else self.redis.wipe()
        await self.redis.start()
        after = await self.redis.dbsize()
        detail = (
            f"SIGKILL (exit {status}) with {before} keys, {files} AOF files; "
            + ("restarted on its AOF" if keep_aof else f"removed {removed} entries, restarted")
            + f": {after} keys"
        )
        restored = after > 0 if keep_aof else removed > 0 and after < before
        return status == -signal.SIGKILL and files > 0 and restored, detail

    async def redis_kill_aof(self) -> tuple[bool, str]:
        return await self._kill_redis(keep_aof=True)

    async def redis_kill_empty(self) -> tuple[bool, str]:
        return await self._kill_redis(keep_aof=False)

    async def postgres_kill(self) -> tuple[bool, str]:
        if self.postgres is None:
            return False, "no PostgreSQL in this run (--store)"
        pid = self.postgres.pid
        await self.postgres.kill()
        try:
            os.kill(pid, 0)
            down = False
        except ProcessLookupError:
            down = True
        await asyncio.sleep(5)
        await self.postgres.resume()
        return down, f"SIGKILLed postgres {pid}, restarted after 5 s"

    async def redis_stop(self) -> tuple[bool, str]:
        assert isinstance(self.redis, RedisServer), "not with --sentinel"
        assert self.redis.proc is not None
        pid = self.redis.proc.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(0.2)
            state = _process_state(pid)
            await asyncio.sleep(2.8)
        finally:
            os.kill(pid, signal.SIGCONT)
        return state == "T", f"SIGSTOP for 3 s (state {state!r}), then SIGCONT"

    async def worker_kill(self) -> tuple[bool, str]:
        instance = self.instances[0]
        workers = instance.workers()
        if not workers:
            return False, "no worker found"
        held = {pid: _client_sockets(pid, instance.port) for pid in workers}
        victim = max(workers, key=lambda pid: held[pid])  # the one with the most clients
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            now = instance.workers()
            if victim not in now and len(now) == 2:
                await instance.wait_ready()
                detail = (
                    f"SIGKILLed worker {victim} of instance 0 (holding {held[victim]} client "
                    f"sockets); workers now {now}"
                )
                return True, detail
            await asyncio.sleep(0.05)
        return False, f"SIGKILLed worker {victim}; no replacement: {instance.workers()}"

    async def drain(self) -> tuple[bool, str]:
        instance = self.instances[1]
        assert instance.proc is not None
        began = time.monotonic()
        instance.proc.send_signal(signal.SIGTERM)
        status = await _wait_exit(instance.proc, 60)
        took = time.monotonic() - began
        if status is None:
            return False, f"SIGTERM: still running after {took:.1f} s"
        instance.start()
        await instance.wait_ready()
        detail = f"SIGTERM to instance 1: drained and exited {status} in {took:.1f} s; restarted"
        return status == 0, detail


# -- the raw log ---------------------------------------------------------------------------------

_KINDS: dict[str, type[Any]] = {
    kind.__name__: kind
    for kind in (
        Connected, Disconnected, Joined, JoinRefused, Received, Resync, Reloaded,
        Send, Ack, SendError, Fault,
    )
}  # fmt: skip


def save_log(log: RunLog, path: Path) -> None:
    """Write ``log`` as JSON lines (``[kind, fields]``), for :func:`load_log` and for people."""
    with path.open("wb") as out:
        head = {"started_at": log.started_at, "traffic_end": log.traffic_end, "meta": log.meta}
        out.write(orjson.dumps(["RunLog", head]) + b"\n")
        for records in (log.faults, log.sends, log.acks, log.send_errors, log.events):
            for record in records:
                out.write(orjson.dumps([type(record).__name__, record]) + b"\n")


def load_log(path: Path) -> RunLog:
    """The log :func:`save_log` wrote."""
    log = RunLog()
    lists: dict[str, list[Any]] = {
        "Fault": log.faults, "Send": log.sends, "Ack": log.acks, "SendError": log.send_errors,
    }  # fmt: skip
    with path.open("rb") as lines:
        for line in lines:
            kind, fields = orjson.loads(line)
            if kind == "RunLog":
                log.started_at, log.traffic_end = fields["started_at"], fields["traffic_end"]
                log.meta = fields["meta"]
                continue
            if kind == "Reloaded":
                fields["entries"] = tuple(HistoryEntry(**e) for e in fields["entries"])
            lists.get(kind, log.events).append(_KINDS[kind](**fields))
    return log


# -- the run -------------------------------------------------------------------------------------


@dataclass
class Config:
    clients: int = 200
    rooms: int = 20
    duration_s: float = 170.0
    warmup_s: float = 15.0
    faults: tuple[str, ...] = FAULTS
    seed: int = 1
    keep: bool = False
    server_root: Path = ROOT
    events: Path | None = None
    store: bool = False
    sentinel: bool = False
    cluster: bool = False
    sse_share: float = 0.25  # of the clients on the HTTP fallback transport


def _client_sockets(pid: int, port: int) -> int:
    """How many established TCP connections on local ``port`` process ``pid`` holds."""
    established: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as rows:
            for row in list(rows)[1:]:
                fields = row.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":
                    established.add(fields[9])  # the inode
    count = 0
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                link = os.readlink(fd)
                count += link.startswith("socket:[") and link[8:-1] in established
    return count


def _process_state(pid: int) -> str:
    """The state letter of ``/proc/PID/stat`` (``T``: stopped)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


async def _until(condition: Callable[[], bool], within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def _quiet(run: Run, clients: list[ChaosClient], within_s: float) -> None:
    """Until every send is acked and nothing arrived for ``QUIET_S`` (at most ``within_s``)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        unacked = sum(len(c.pending) for c in clients)
        if unacked == 0 and time.time() - run.last_activity > QUIET_S:
            return
        await asyncio.sleep(0.1)


async def _check_store(
    redis: RedisServer | SentinelRedis | ClusterRedis,
    database_url: str,
    log: RunLog,
    redis_kills: list[tuple[str, float]],
) -> dict[str, Any]:
    """Once the archive stream is empty: which acked messages the store lacks, and which it
    holds more than once (it cannot: its key is the room and the id; checked all the same)."""
    drained = False
    for _ in range(600):
        if not await redis.archive_length():
            drained = True
            break
        await asyncio.sleep(0.1)
    engine = engine_for(database_url)
    try:
        async with engine.connect() as connection:
            rows = (await connection.execute(select(messages.c.conversation, messages.c.id))).all()
    finally:
        await engine.dispose()
    stored = Counter((str(conversation), int(message_id)) for conversation, message_id in rows)
    rooms = {(send.client, send.cid): send.room for send in log.sends}
    acked = {(rooms[(ack.client, ack.cid)], ack.id): ack.at for ack in log.acks}
    emptied = [at for name, at in redis_kills if name == "redis_kill_empty"]
    crashed = [at for name, at in redis_kills if name == "redis_kill_aof"]
    missing = [key for key in acked if key not in stored]
    # An id is its publish time (1000 x ms): published shortly before Redis was SIGKILLed and
    # emptied, or before it was SIGKILLed with writes its append-only file had not synced yet
    # (`appendfsync everysec` loses up to 2 s of them, Redis' documentation says).
    with_redis = [key for key in missing if any(t - 3 <= key[1] / 1e6 <= t for t in emptied)]
    with_crash = [
        key
        for key in missing
        if key not in with_redis and any(t - 2 <= key[1] / 1e6 <= t for t in crashed)
    ]
    excused = set(with_redis) | set(with_crash)
    return {
        "archive_drained": drained,
        "acked": len(acked),
        "stored": len(stored),
        "missing": len(missing) - len(excused),
        # Each as (room, id, publish time and ack time from the start of traffic), to tell a
        # loss from an archive that lagged behind an emptied Redis.
        "missing_examples": [
            (
                room,
                message_id,
                round(message_id / 1e6 - log.started_at, 3),
                round(acked[(room, message_id)] - log.started_at, 3),
            )
            for room, message_id in missing
            if (room, message_id) not in excused
        ][:5],
        "lost_with_emptied_redis": len(with_redis),
        "lost_with_crashed_redis": len(with_crash),
        "stored_twice": sum(1 for count in stored.values() if count > 1),
    }


def _say(text: str) -> None:
    sys.stderr.write(f"[chaos {time.strftime('%H:%M:%S')}] {text}\n")


async def run_chaos(config: Config) -> tuple[Report, dict[str, Any]]:
    """Start everything, run traffic and faults, stop everything; the report and run facts."""
    root = Path(tempfile.mkdtemp(prefix="hubbub-chaos-"))
    redis: RedisServer | SentinelRedis | ClusterRedis = RedisServer(root)
    if config.sentinel:
        redis = SentinelRedis()
    elif config.cluster:
        redis = ClusterRedis()
    postgres = PostgresServer() if config.store else None
    database_url = None
    if postgres is not None:
        await postgres.start()
        database_url = await postgres.create_database("chaos")
    instances = [
        Instance(i, root, redis.app_env, config.server_root, database_url) for i in range(2)
    ]
    log = RunLog()
    clients: list[ChaosClient] = []
    facts: dict[str, Any] = {"dir": str(root)}
    http = httpx.AsyncClient(trust_env=False)
    run = Run(log, instances, http)
    failed = True
    try:
        await redis.start()
        for instance in instances:
            instance.start()
        await asyncio.gather(*(instance.wait_ready() for instance in instances))
        _say(
            f"redis{' (Sentinel) master' if config.sentinel else ''}"
            f"{' (Cluster) node' if config.cluster else ''} on {redis.port}, "
            f"gunicorn on {[i.port for i in instances]} serving {config.server_root}; "
            f"logs in {root}"
        )
        rng = random.Random(config.seed)
        names = [f"room-{n:02d}" for n in range(config.rooms)]
        for n in range(config.clients):
            rooms = {names[n % config.rooms]}
            rooms.update(rng.sample(names, rng.randint(1, 3) - 1))
            sse = int((n + 1) * config.sse_share) > int(n * config.sse_share)  # spread evenly
            client = ChaosClient(
                run, f"c{n:03d}", sorted(rooms), n % 2, config.seed * 7919 + n, sse
            )
            clients.append(client)
            client.start()
            await asyncio.sleep(0.01)
        if not await _until(lambda: all(c.all_joined for c in clients), 30):
            raise RuntimeError("the clients did not all connect and join within 30 s")
        log.started_at = time.time()
        run.last_activity = log.started_at
        _say(f"{len(clients)} clients in {config.rooms} rooms; traffic on")
        faults = Faults(redis, instances, postgres)
        gap = (config.duration_s - config.warmup_s) / max(1, len(config.faults))
        for n, name in enumerate(config.faults):
            at = log.started_at + config.warmup_s + n * gap
            await asyncio.sleep(max(0.0, at - time.time()))
            _say(f"fault {name}")
            fault = await faults.run(name)
            log.faults.append(fault)
            _say(f"  {'done' if fault.happened else 'DID NOT HAPPEN'}: {fault.detail}")
        await asyncio.sleep(max(0.0, log.started_at + config.duration_s - time.time()))
        run.stop_sending = True
        log.traffic_end = time.time()
        _say("traffic off; waiting for acks and deliveries to stop")
        await _quiet(run, clients, 40)
        _say("settle: every client rejoins every room with since")
        for client in clients:
            await client.settle()
        if not await _until(lambda: all(c.settled_all for c in clients), 30):
            _say(f"{sum(not c.settled_all for c in clients)} clients did not settle")
        await _quiet(run, clients, 15)
        if database_url is not None:
            facts["store"] = await _check_store(redis, database_url, log, faults.redis_kills)
        edits = {(s.client, s.cid) for s in log.sends if s.edit_of is not None}
        facts["edits"] = {
            "sent": len(edits),
            "acked": len({(a.client, a.cid) for a in log.acks} & edits),
            "not_found": sum(
                1 for e in log.send_errors if e.code == "not_found" and (e.client, e.cid) in edits
            ),
        }
        failed = False
    finally:
        run.closing = True
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
        await http.aclose()
        await run.streams.aclose()
        for instance in instances:
            instance.stop()
        redis.stop()
        if postgres is not None:
            await postgres.stop()
        if failed or config.keep:
            _say(f"logs kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    for client in clients:
        log.events.extend(client.events)
    log.meta = {"clients": config.clients, "rooms": config.rooms}
    if config.events is not None:
        save_log(log, config.events)
    facts |= {
        "sse_clients": sum(c.sse for c in clients),
        "connect_failures": dict(run.connect_failures),
        "other_errors": dict(run.other_errors),
        "unsettled_clients": sum(not c.settled_all for c in clients),
        "rebalanced_connections": run.rebalanced,
    }
    return check(log), facts


def parse_args(argv: list[str] | None) -> tuple[Config, argparse.Namespace]:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.chaos", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--duration", type=float, help="seconds of traffic (default 170)")
    parser.add_argument("--clients", type=int, help="clients (default 200)")
    parser.add_argument("--rooms", type=int, help="rooms (default 20)")
    parser.add_argument("--smoke", action="store_true", help="small and short (~1 min)")
    parser.add_argument("--no-faults", action="store_true", help="traffic only: the control")
    parser.add_argument("--faults", help=f"comma-separated subset of {','.join(FAULTS)}")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="write the report here as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the logs' directory")
    parser.add_argument(
        "--server-root",
        type=Path,
        default=ROOT,
        help="serve the app of this checkout (e.g. `git archive REV | tar -x -C DIR`) to "
        "compare versions; default: this one",
    )
    parser.add_argument("--events", type=Path, help="write the raw event log here (JSON lines)")
    parser.add_argument(
        "--store",
        action="store_true",
        help="archive into a PostgreSQL, kill it once, and check that every ack is stored",
    )
    parser.add_argument(
        "--sentinel",
        action="store_true",
        help="Redis with Sentinel (master, replica, 3 Sentinels), acks waiting for the replica; "
        "the Redis faults are the master's SIGKILL",
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="Redis Cluster (3 masters, a replica each), acks waiting for the replica; the "
        "Redis faults are a master's SIGKILL",
    )
    parser.add_argument(
        "--sse-share", type=float, default=0.25,
        help="share of the clients on the HTTP fallback transport (default 0.25)",
    )  # fmt: skip
    parser.add_argument(
        "--recheck", type=Path, help="run no chaos: check the event log written by --events"
    )
    args = parser.parse_args(argv)
    config = Config(
        seed=args.seed, keep=args.keep, server_root=args.server_root.resolve(), events=args.events,
        store=args.store, sentinel=args.sentinel, cluster=args.cluster, sse_share=args.sse_share,
    )  # fmt: skip
    replicated = args.sentinel or args.cluster
    if replicated:
        config.faults = SENTINEL_SMOKE_FAULTS if args.smoke else SENTINEL_FAULTS
    if args.smoke:
        config.clients, config.rooms = 40, 8
        config.faults = SENTINEL_SMOKE_FAULTS if replicated else SMOKE_FAULTS
    if args.faults:
        chosen = tuple(name.strip() for name in args.faults.split(",") if name.strip())
        unknown = set(chosen) - set(FAULTS) - {"postgres_kill", "master_kill"}
        if unknown:
            parser.error(f"unknown faults: {sorted(unknown)}")
        config.faults = chosen
    elif args.store:
        config.faults = (*config.faults, "postgres_kill")
    if args.smoke:
        config.warmup_s, config.duration_s = 5.0, 5.0 + 8.0 * len(config.faults)
    if args.no_faults:
        config.faults = ()
    config.clients = args.clients or config.clients
    config.rooms = args.rooms or config.rooms
    if args.duration:
        config.duration_s = args.duration
        config.warmup_s = min(config.warmup_s, args.duration / 4)
    return config, args


def main(argv: list[str] | None = None) -> int:
    config, args = parse_args(argv)

    async def guarded() -> tuple[Report, dict[str, Any]]:
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        return await run_chaos(config)

    facts: dict[str, Any]
    if args.recheck:
        report, facts = check(load_log(args.recheck)), {"connect_failures": {}, "other_errors": {}}
    else:
        try:
            report, facts = uvloop.run(guarded())
        except (KeyboardInterrupt, asyncio.CancelledError):
            sys.stderr.write("chaos: interrupted; every process it started is stopped\n")
            return 130
    sys.stdout.write(report.text() + "\n")
    missed = [f.name for f in report.faults if not f.happened]
    if missed:
        sys.stdout.write(f"\nFaults that did not take effect: {', '.join(missed)}\n")
    edits = facts.get("edits")
    if edits:
        sys.stdout.write(
            f"\nEdits (events in the rooms' logs, checked like messages): {edits['sent']} sent, "
            f"{edits['acked']} acked, {edits['not_found']} refused not_found (the message was "
            "lost with an emptied Redis)\n"
        )
    store = facts.get("store")
    if store is not None:
        sys.stdout.write(
            f"\nStore: {store['acked']} acked, {store['stored']} stored, "
            f"{store['missing']} acked and not stored {store.get('missing_examples', [])}, "
            f"{store['stored_twice']} stored twice; "
            f"{store['lost_with_emptied_redis']} acked in the 3 s before Redis was emptied and "
            f"lost with it, {store['lost_with_crashed_redis']} in the 2 s before it crashed "
            "that its append-only file had not synced (both allowed); archive drained: "
            f"{store['archive_drained']}\n"
            f"  acked messages stored  {'PASS' if not store['missing'] else 'FAIL'}\n"
        )
    sys.stdout.write(
        f"\nMoved by rebalancing (1012, {SHED_REASON!r}): "
        f"{facts['rebalanced_connections']} connections\n"
    )
    if facts["connect_failures"] or facts["other_errors"]:
        sys.stdout.write(
            f"\nconnect failures: {facts['connect_failures']}; "
            f"other errors: {facts['other_errors']}\n"
        )
    if args.json:
        out = report.as_dict() | {
            "config": {
                "clients": config.clients, "rooms": config.rooms,
                "duration_s": config.duration_s, "faults": list(config.faults),
                "server_root": str(config.server_root),
            },
            "facts": facts,
        }  # fmt: skip
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    if not report.passed or (store is not None and (store["missing"] or store["stored_twice"])):
        return 1
    return 2 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
