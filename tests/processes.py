"""Real processes for tests: redis-server, ``python -m app`` and gunicorn, each on a free
loopback port, started and stopped (by PID) by the test that uses them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import resource
import secrets
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import httpx2 as httpx
from redis.asyncio import Redis
from redis.exceptions import RedisError

from loadtest.collector import JAEGER, jaeger_config
from tests.helpers import LiveServer, free_port, make_settings, run_server, wait_until

if TYPE_CHECKING:
    from types_aiobotocore_s3 import S3Client

ROOT = Path(__file__).resolve().parent.parent


async def wait_for_port(
    port: int, proc: asyncio.subprocess.Process, describe: str | Callable[[], str]
) -> None:
    """Wait (10 s at most) until ``proc`` accepts TCP connections on loopback ``port``; fail
    with ``describe`` (or what it returns: the process's output) if the process exits first."""
    async with asyncio.timeout(10):
        while True:
            if proc.returncode is not None:
                raise AssertionError(describe if isinstance(describe, str) else describe())
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                await asyncio.sleep(0.02)
                continue
            writer.close()
            return


class RedisServer:
    """A throwaway redis-server that a test can kill and restart: no persistence, or with
    ``appendonly`` an append-only file synced on every write (a restart keeps everything)."""

    def __init__(
        self, appendonly: bool = False, extra: tuple[str, ...] = (), under: tuple[str, ...] = ()
    ) -> None:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is missing: `make test` installs it"
        self.binary = binary
        self.under = under  # a command that runs the server, e.g. valgrind (loadtest.redis_cost)
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="hubbub-redis-")
        self.appendonly = appendonly
        self.extra = extra  # more options, e.g. ("--replicaof", "127.0.0.1", "6379")
        self.proc: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def settings(self) -> dict[str, Any]:
        """The settings that point the app at this Redis."""
        return {"redis_url": self.url}

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            *self.under, self.binary,
            "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "yes" if self.appendonly else "no", "--appendfsync", "always",
            "--dir", self.dir, "--logfile", "", *self.extra,
            stdout=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        await wait_for_port(self.port, self.proc, "redis-server")

    async def kill(self) -> None:
        """SIGKILL: an abrupt loss, as when the Redis host dies."""
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)
            await self.proc.wait()
        self.proc = None

    async def stop(self) -> None:
        await self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.asynccontextmanager
async def server_on(broker: str, **settings: Any) -> AsyncIterator[LiveServer]:
    """A server (:func:`tests.helpers.run_server`, made with ``settings``) on the embedded
    broker (``"memory"``) or on a redis-server of its own (``"redis"``), its broker ready."""
    redis = RedisServer() if broker == "redis" else None
    try:
        if redis is not None:
            await redis.start()
            settings["redis_url"] = redis.url
        async with run_server(make_settings(**settings)) as live:
            await wait_until(lambda: live.state.broker.ready)
            yield live
    finally:
        if redis is not None:
            await redis.stop()


# The service's settings for failover tests: acks wait for a replica, and a lost or moved
# master is noticed, and reconnected to, within a couple of seconds.
# A log line of the app's that a failing test's report shows (JSON or plain logs).
_PROBLEM = re.compile(r'"level":"(warning|error|critical)"| (WARNING|ERROR|CRITICAL) |^Traceback')

FAILOVER_ENV = {
    "CHAT_AUTH_MODE": "names",
    "CHAT_REDIS_WAIT_REPLICAS": "1",
    "CHAT_REDIS_TIMEOUT_S": "1",
    "CHAT_REDIS_RECONNECT_MAX_S": "0.5",
    "CHAT_CANARY_INTERVAL_S": "0.5",
    "CHAT_CANARY_TIMEOUT_S": "2",
}


class SentinelDeployment:
    """Redis with Sentinel, as production runs it, on loopback: a master, a replica and three
    Sentinels (quorum 2) that fail the master over about a second after it stops answering.

    :meth:`kill_master` SIGKILLs whichever server is master now; :meth:`wait_failover` waits
    until the Sentinels name another; :meth:`restart_killed` brings the old one back as a
    replica of the new master (as the Sentinels would reconfigure it).
    """

    NAME = "hubbub"

    def __init__(self) -> None:
        # No diskless-sync delay: a replica (re)joining is in sync at once, not 5 s later.
        fast = ("--repl-diskless-sync-delay", "0")
        self.servers = [RedisServer(extra=fast)]
        master = ("--replicaof", "127.0.0.1", str(self.servers[0].port))
        self.servers.append(RedisServer(extra=(*fast, *master)))
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.sentinels: list[asyncio.subprocess.Process] = []
        self.dir = tempfile.mkdtemp(prefix="hubbub-sentinels-")
        self.killed: RedisServer | None = None
        # Sentinels rewrite their configuration file: each gets its own.
        self.confs = [Path(self.dir, f"sentinel-{i}.conf") for i in range(3)]
        for conf, port in zip(self.confs, self.sentinel_ports, strict=True):
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.dir}\n"
                f"sentinel monitor {self.NAME} 127.0.0.1 {self.servers[0].port} 2\n"
                f"sentinel down-after-milliseconds {self.NAME} 1000\n"
                f"sentinel failover-timeout {self.NAME} 5000\n"
                f"sentinel parallel-syncs {self.NAME} 1\n"
            )

    @property
    def addresses(self) -> str:
        """``CHAT_REDIS_SENTINELS``."""
        return ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)

    async def start(self) -> None:
        for server in self.servers:
            await server.start()
        for conf, port in zip(self.confs, self.sentinel_ports, strict=True):
            proc = await asyncio.create_subprocess_exec(
                self.servers[0].binary, str(conf), "--sentinel",
                stdout=asyncio.subprocess.DEVNULL,
            )  # fmt: skip
            self.sentinels.append(proc)
            await wait_for_port(port, proc, "redis-sentinel")
        await self.wait_replicated()

    async def master_port(self) -> int:
        """The master's port, as the first Sentinel that answers names it."""
        for port in self.sentinel_ports:
            async with Redis(port=port, socket_timeout=1) as sentinel:
                try:
                    address = await sentinel.sentinel_get_master_addr_by_name(self.NAME)
                    return int(cast(tuple[str, int], address)[1])
                except (OSError, RedisError):
                    continue
        raise AssertionError("no Sentinel answers")

    def master(self, port: int) -> RedisServer:
        return next(server for server in self.servers if server.port == port)

    async def wait_replicated(self, timeout: float = 30) -> None:
        """Until the master has a replica in sync and every Sentinel knows that replica (a
        failover needs one it can promote)."""
        async with asyncio.timeout(timeout):
            while not await self._replicated():
                await asyncio.sleep(0.1)

    async def _replicated(self) -> bool:
        master = Redis(port=await self.master_port())
        sentinels = [Redis(port=port, socket_timeout=1) for port in self.sentinel_ports]
        try:
            # redis-py parses "slave0" into a dict. Its offset is 0 until the replica's first
            # acknowledgement, which is when a diskless sync starts streaming writes.
            replica = (await master.info("replication")).get("slave0")
            if not isinstance(replica, dict) or replica.get("state") != "online":
                return False
            if not replica.get("offset"):
                return False
            for sentinel in sentinels:
                known = await sentinel.sentinel_slaves(self.NAME)
                if not any("s_down" not in r["flags"] and r.get("master-link-status") == "ok"
                           for r in known):  # fmt: skip
                    return False
            return True
        except (OSError, RedisError):
            return False
        finally:
            for client in (master, *sentinels):
                await client.aclose()

    async def kill_master(self) -> int:
        """SIGKILL the master; returns its port."""
        port = await self.master_port()
        self.killed = self.master(port)
        await self.killed.kill()
        return port

    async def wait_failover(self, old_port: int, timeout: float = 30) -> int:
        async with asyncio.timeout(timeout):
            while (port := await self.master_port()) == old_port:
                await asyncio.sleep(0.1)
        return port

    async def restart_killed(self) -> None:
        """The killed server back, as a replica of the current master."""
        assert self.killed is not None
        master = ("--replicaof", "127.0.0.1", str(await self.master_port()))
        self.killed.extra = ("--repl-diskless-sync-delay", "0", *master)
        await self.killed.start()
        self.killed = None

    async def stop(self) -> None:
        for proc in self.sentinels:
            if proc.returncode is None:
                proc.send_signal(signal.SIGKILL)
                await proc.wait()
        for server in self.servers:
            await server.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class ClusterDeployment:
    """A Redis Cluster on loopback: ``masters`` masters with ``replicas`` replicas each, made
    with ``redis-cli --cluster create``; a master SIGKILLed fails over to its replica after
    about ``--cluster-node-timeout`` (1 s)."""

    def __init__(self, masters: int = 3, replicas: int = 1) -> None:
        options = (
            "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", "1000", "--repl-diskless-sync-delay", "0",
            "--cluster-require-full-coverage", "no",  # as deployed: see docker-compose.cluster.yml
        )  # fmt: skip
        self.masters, self.replicas = masters, replicas
        self.servers = [RedisServer(extra=options) for _ in range(masters * (1 + replicas))]
        for server in self.servers:
            server.port = _cluster_port()

    @property
    def addresses(self) -> str:
        """``CHAT_REDIS_CLUSTER_NODES`` (every node: any one would do as a seed)."""
        return ",".join(f"127.0.0.1:{server.port}" for server in self.servers)

    def settings(self) -> dict[str, Any]:
        """The settings that point the app at this cluster."""
        return {"redis_cluster_nodes": self.addresses}

    async def start(self) -> None:
        """Start every node and make the cluster (``redis-cli --cluster create`` given 30 s,
        then :meth:`wait_ok`); on any failure, every node started is stopped again before the
        error is raised."""
        try:
            for server in self.servers:
                await self._start_node(server)
            await self._create()
            await self.wait_ok()
        except BaseException:
            await self.stop()
            raise

    @staticmethod
    async def _start_node(server: RedisServer) -> None:
        """Start one node. Its ports are picked free, then bound by the node: a process that
        takes one of the two (the node's, its cluster bus's) in between makes the node exit at
        once; it starts again on other ports (3 tries in all)."""
        for attempt in range(3):
            try:
                await server.start()
                return
            except AssertionError:  # it exited before it listened
                if attempt == 2:
                    raise
                server.port = _cluster_port()
                (Path(server.dir) / "nodes.conf").unlink(missing_ok=True)

    async def _create(self) -> None:
        if self.masters == 1 and self.replicas == 0:  # `--cluster create` needs three
            async with Redis(port=self.servers[0].port) as node:
                await node.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)  # type: ignore[no-untyped-call]
            return
        cli = shutil.which("redis-cli")
        assert cli, "redis-cli is missing: `make test` installs redis-server (it has it)"
        create = await asyncio.create_subprocess_exec(
            cli, "--cluster", "create", *(f"127.0.0.1:{s.port}" for s in self.servers),
            "--cluster-replicas", str(self.replicas), "--cluster-yes",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        try:
            async with asyncio.timeout(30):  # it waits for the nodes to meet: for ever if not
                output, _ = await create.communicate()
        finally:
            if create.returncode is None:
                create.kill()
                await create.wait()
        assert create.returncode == 0, output.decode(errors="replace")

    async def wait_ok(self, timeout: float = 30) -> None:
        """Until every live node says ``cluster_state:ok`` and every slot has a master."""
        async with asyncio.timeout(timeout):
            while not await self._ok():
                await asyncio.sleep(0.1)

    async def _ok(self) -> bool:
        for server in self.servers:
            if server.proc is None:
                continue
            client = Redis(port=server.port, socket_timeout=1)
            try:
                info = await _cluster_command(client, "CLUSTER INFO")  # parsed into a dict
                if (info.get("cluster_state"), info.get("cluster_slots_ok")) != ("ok", "16384"):
                    return False
            except (OSError, RedisError):
                return False
            finally:
                await client.aclose()
        return True

    async def master_of(self, slot: int) -> RedisServer:
        """The server that serves ``slot`` now."""
        for server in self.servers:
            if server.proc is None:
                continue
            client = Redis(port=server.port, socket_timeout=1)
            try:
                for start, end, master, *_ in await _cluster_command(client, "CLUSTER SLOTS"):
                    if start <= slot <= end:
                        port = int(master[1])
                        return next(s for s in self.servers if s.port == port)
            except (OSError, RedisError):
                continue
            finally:
                await client.aclose()
        raise AssertionError("no node answers CLUSTER SLOTS")

    async def stop(self) -> None:
        for server in self.servers:
            await server.stop()


def redis_deployment(kind: str) -> RedisServer | ClusterDeployment | None:
    """A Redis of ``kind`` for a parametrized test (not started): ``redis`` one server,
    ``cluster`` a 3-master cluster with a replica each; None for ``memory``."""
    if kind == "redis":
        return RedisServer()
    if kind == "cluster":
        return ClusterDeployment()
    return None


def _cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is a valid, free port too."""
    while True:
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port


async def _cluster_command(client: Redis, command: str) -> Any:
    return await client.execute_command(command)  # type: ignore[no-untyped-call]


def postgres_binaries() -> Path:
    """Debian's PostgreSQL server binaries (``/usr/lib/postgresql/<version>/bin``)."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    assert found, "PostgreSQL is missing: `make test` installs Debian's postgresql"
    return found[-1].parent


class PostgresServer:
    """A throwaway PostgreSQL cluster (``initdb`` in a temporary directory, ``postgres`` on a
    free loopback port), run as an unprivileged user when the tests run as root (CI does:
    PostgreSQL refuses to run as root). Trust authentication, loopback only."""

    USER = "nobody"

    def __init__(self, fsync: bool = False) -> None:
        """``fsync`` off (the tests' default) trades durability across a host crash for speed;
        a benchmark of the store turns it on, as production runs."""
        self.fsync = fsync
        self.bin = postgres_binaries()
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="hubbub-pg-")
        self.data = os.path.join(self.dir, "data")
        self.proc: asyncio.subprocess.Process | None = None

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def _as_owner(self, *command: str) -> list[str]:
        if os.geteuid() != 0:
            return list(command)
        return ["runuser", "-u", self.USER, "--", *command]

    async def start(self) -> None:
        if os.geteuid() == 0:
            shutil.chown(self.dir, user=self.USER)
        os.chmod(self.dir, 0o700)
        init = await asyncio.create_subprocess_exec(
            *self._as_owner(str(self.bin / "initdb"), "-D", self.data, "-A", "trust",
                            "-U", "postgres", "--no-sync"),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await init.communicate()
        assert init.returncode == 0, f"initdb failed: {err.decode()}"
        await self.resume()

    async def resume(self) -> None:
        """Start ``postgres`` on the cluster (again, after :meth:`kill`)."""
        self.proc = await asyncio.create_subprocess_exec(
            *self._as_owner(str(self.bin / "postgres"), "-D", self.data, "-p", str(self.port),
                            "-k", self.dir, "-c", "listen_addresses=127.0.0.1",
                            "-c", f"fsync={'on' if self.fsync else 'off'}"),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        await wait_for_port(self.port, self.proc, "postgres")

    async def create_database(self, name: str) -> str:
        """Create database ``name``; returns its URL. Waits (up to 60 s: one `CREATE DATABASE`
        took over 30 s on a loaded CI machine) while the server, listening already, is still
        starting up."""
        async with asyncio.timeout(60):
            while True:
                psql = await asyncio.create_subprocess_exec(
                    str(self.bin / "psql"), "-h", "127.0.0.1", "-p", str(self.port),
                    "-U", "postgres", "-v", "ON_ERROR_STOP=1", "-c", f'CREATE DATABASE "{name}"',
                    stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
                )  # fmt: skip
                _, err = await psql.communicate()
                if psql.returncode == 0:
                    return self.url(name)
                assert b"starting up" in err, f"CREATE DATABASE failed: {err.decode()}"
                await asyncio.sleep(0.1)

    @property
    def pid(self) -> int:
        """The postmaster's PID (what ``postgres`` wrote: under runuser, ``self.proc`` is
        runuser)."""
        return int(Path(self.data, "postmaster.pid").read_text().split()[0])

    def _signal_postmaster(self, sig: int) -> bool:
        # The postmaster itself, by the PID it wrote: under runuser, self.proc is runuser,
        # which cannot pass a SIGKILL on.
        try:
            os.kill(self.pid, sig)
        except (OSError, ValueError, IndexError):
            return False
        return True

    async def kill(self) -> None:
        """SIGKILL the postmaster, as when its host dies (its backends exit when they notice)."""
        if self.proc is not None and self.proc.returncode is None:
            if not self._signal_postmaster(signal.SIGKILL):
                self.proc.send_signal(signal.SIGKILL)
            await self.proc.wait()
        self.proc = None

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            if not self._signal_postmaster(signal.SIGINT):  # fast shutdown
                self.proc.send_signal(signal.SIGINT)
            try:
                async with asyncio.timeout(15):
                    await self.proc.wait()
            except TimeoutError:
                await self.kill()
        self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)


# Tests connect often, from one address, with a few names: limits a test does not study are
# out of the way (tests of a limit set it themselves).
GENEROUS_LIMITS = {
    "CHAT_AUTH_MODE": "names",  # tests connect as named users; the modes are tested apart
    "CHAT_HELLO_NAMES_PROCESS": "true",  # tests find a client's worker by its pid
    # A departure is announced when the socket ends: tests of the grace set it themselves.
    "CHAT_PRESENCE_LEAVE_GRACE_S": "0",
    "CHAT_IP_CONNECTIONS_PER_S": "100000",
    "CHAT_IP_CONNECTION_BURST": "100000",
    "CHAT_MAX_CONNECTIONS_PER_USER": "1000",
    "CHAT_USER_MESSAGES_PER_S": "100000",
    "CHAT_USER_MESSAGE_BURST": "100000",
    "CHAT_USER_JOINS_PER_S": "100000",
    "CHAT_USER_JOIN_BURST": "100000",
    "CHAT_USER_NEW_ROOMS_PER_S": "100000",
    "CHAT_USER_NEW_ROOM_BURST": "100000",
    "CHAT_HISTORY_READS_PER_S": "100000",
    "CHAT_HISTORY_READ_BURST": "100000",
    "CHAT_USER_TYPING_PER_S": "100000",
    "CHAT_USER_TYPING_BURST": "100000",
}


class AppProcess:
    """The service as a separate process: ``python -m app`` or gunicorn with the repo's config."""

    def __init__(
        self,
        env: Mapping[str, str],
        gunicorn_workers: int | None = None,
        port: int | None = None,
        descriptor_limit: int | None = None,
    ) -> None:
        self.port = port or free_port()
        self.descriptor_limit = descriptor_limit  # RLIMIT_NOFILE, soft and hard
        self.env = {
            **os.environ, **GENEROUS_LIMITS,
            "CHAT_HOST": "127.0.0.1", "CHAT_PORT": str(self.port), **env,
        }  # fmt: skip
        self.gunicorn_workers = gunicorn_workers
        # The process's temporary files (gunicorn's metrics directory): removed by stop(), as
        # a SIGKILLed gunicorn cannot clean up after itself.
        self.tmpdir = tempfile.mkdtemp(prefix="hubbub-test-app-")
        self.env["TMPDIR"] = self.tmpdir
        self.proc: asyncio.subprocess.Process | None = None
        # A file, not a pipe: nobody has to keep reading it for the app to keep logging.
        self.log = tempfile.NamedTemporaryFile(prefix="hubbub-app-", suffix=".log")  # noqa: SIM115

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def ws_url(self, name: str) -> str:
        return f"ws://127.0.0.1:{self.port}/ws?name={name}"

    def command(self) -> list[str]:
        if self.gunicorn_workers is None:
            return [sys.executable, "-m", "app"]
        gunicorn = str(Path(sys.executable).parent / "gunicorn")
        return [
            gunicorn, "-c", "deploy/gunicorn.conf.py",
            "--bind", f"127.0.0.1:{self.port}", "--workers", str(self.gunicorn_workers),
        ]  # fmt: skip

    async def start(self, wait_ready: bool = True) -> None:
        # A session of its own: stop() ends the whole group (gunicorn's workers too).
        self.proc = await asyncio.create_subprocess_exec(
            *self.command(), cwd=ROOT, env=self.env, stdout=self.log, stderr=self.log,
            start_new_session=True, preexec_fn=self._limit_descriptors,
        )  # fmt: skip
        if wait_ready:
            await self.wait_status(200)

    def _limit_descriptors(self) -> None:
        if self.descriptor_limit is not None:
            limit = self.descriptor_limit
            resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    async def readyz(self) -> int:
        async with httpx.AsyncClient() as http:
            try:
                return (await http.get(f"{self.http_url}/readyz", timeout=2)).status_code
            except httpx.TransportError:
                return 0

    async def wait_status(self, status: int, timeout: float = 20) -> None:
        async with asyncio.timeout(timeout):
            while await self.readyz() != status:
                assert self.proc is not None and self.proc.returncode is None, "app exited"
                await asyncio.sleep(0.05)

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    async def wait(self, timeout: float = 30) -> int:
        assert self.proc is not None
        async with asyncio.timeout(timeout):
            return await self.proc.wait()

    def output(self) -> str:
        """Everything the process has logged so far."""
        return Path(self.log.name).read_text(errors="replace")

    async def stop(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)  # the master and its workers
            if self.proc.returncode is None:
                await self.proc.wait()
        if self.log.closed:  # stopped before (its log, a temporary file, is gone)
            return
        # What went wrong in the app, for a failing test's report (pytest shows a test's
        # captured output only when it fails).
        problems = [line for line in self.output().splitlines() if _PROBLEM.search(line)]
        if problems:
            print(f"app on port {self.port}, warnings and errors:", *problems[-40:], sep="\n")
        self.log.close()
        shutil.rmtree(self.tmpdir, ignore_errors=True)


class PrometheusServer:
    """A throwaway Prometheus (Debian's package) scraping ``targets`` every second under
    job="hubbub", with the given rule files copied next to its config."""

    def __init__(self, targets: list[str], rule_files: list[Path]) -> None:
        binary = shutil.which("prometheus")
        assert binary, "prometheus is missing: `make test` installs Debian's prometheus package"
        self.binary = binary
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="hubbub-prometheus-"))
        for rule_file in rule_files:
            shutil.copy(rule_file, self.dir / rule_file.name)
        rules = "".join(f"  - {rule_file.name}\n" for rule_file in rule_files)
        (self.dir / "prometheus.yml").write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            f"rule_files:\n{rules}"
            "scrape_configs:\n  - job_name: hubbub\n"
            f"    static_configs:\n      - targets: {targets!r}\n"
        )
        self.proc: asyncio.subprocess.Process | None = None
        self.log = self.dir / "prometheus.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        with self.log.open("wb") as log:
            self.proc = await asyncio.create_subprocess_exec(
                self.binary,
                f"--config.file={self.dir / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                stdout=log, stderr=log,
            )  # fmt: skip
        async with asyncio.timeout(30), httpx.AsyncClient() as http:
            while True:
                assert self.proc.returncode is None, self.log.read_text()
                try:
                    if (await http.get(f"{self.url}/-/ready")).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.1)

    async def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result; fails the test when Prometheus refuses it."""
        async with httpx.AsyncClient() as http:
            response = await http.get(f"{self.url}/api/v1/query", params={"query": expr})
        body = response.json()
        assert body["status"] == "success", f"{expr!r}: {body}"
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    async def api(self, path: str) -> dict[str, Any]:
        async with httpx.AsyncClient() as http:
            body = (await http.get(f"{self.url}/api/v1/{path}")).json()
        assert body["status"] == "success", body
        data: dict[str, Any] = body["data"]
        return data

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)
            await self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


NGINX_CONF = ROOT / "nginx" / "nginx.conf"


class NginxServer:
    """nginx running the repository's ``nginx/nginx.conf`` with ``replacements`` applied
    (addresses, and any short timeouts a test needs), on a free loopback port."""

    def __init__(self, upstream: str, replacements: Mapping[str, str] | None = None) -> None:
        binary = shutil.which("nginx") or "/usr/sbin/nginx"
        assert Path(binary).exists(), "nginx is missing: `make test` installs it"
        self.binary = binary
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="hubbub-nginx-"))
        config = NGINX_CONF.read_text()
        swaps = {
            "listen 8080 ": f"listen 127.0.0.1:{self.port} ",
            "server app:8000 ": f"server {upstream} ",
        }
        for old, new in {**swaps, **(replacements or {})}.items():
            assert old in config, f"{old!r} is not in nginx.conf"
            config = config.replace(old, new)
        self.conf = self.dir / "nginx.conf"
        self.conf.write_text(config)
        self.log = self.dir / "nginx.log"
        self.proc: asyncio.subprocess.Process | None = None

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def ws_url(self, name: str) -> str:
        return f"ws://127.0.0.1:{self.port}/ws?name={name}"

    def command(self, *extra: str) -> list[str]:
        return [
            self.binary, "-p", str(self.dir), "-c", str(self.conf),
            "-e", str(self.dir / "early.log"),
            "-g", f"daemon off; pid {self.dir / 'nginx.pid'}; error_log {self.log} info;", *extra,
        ]  # fmt: skip

    async def start(self) -> None:
        with (self.dir / "stdout.log").open("wb") as out:
            self.proc = await asyncio.create_subprocess_exec(
                *self.command(), stdout=out, stderr=out
            )
        await wait_for_port(self.port, self.proc, self.output)

    def output(self) -> str:
        logs = [self.dir / "stdout.log", self.log, self.dir / "early.log"]
        return "\n".join(f.read_text(errors="replace") for f in logs if f.exists())

    def access_log(self) -> list[dict[str, Any]]:
        """The JSON access-log lines nginx wrote to stdout."""
        text = (self.dir / "stdout.log").read_text(errors="replace")
        return [json.loads(line) for line in text.splitlines() if line.startswith("{")]

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)  # fast shutdown
            try:
                async with asyncio.timeout(10):
                    await self.proc.wait()
            except TimeoutError:
                self.proc.send_signal(signal.SIGKILL)
                await self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def upstream_client_ports(port: int) -> set[int]:
    """Client-side ports of the loopback TCP connections to ``port`` that exist now or closed
    recently (TIME_WAIT lasts a minute): one per TCP connection opened to it lately, but for
    a new connection given a port still in TIME_WAIT (Linux reuses those on loopback)."""
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table) as rows:
            for row in list(rows)[1:]:
                local, remote = row.split()[1:3]
                if int(remote.rsplit(":", 1)[1], 16) == port:
                    ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports


WEED = ROOT / ".tools/bin/weed"


def _grpc_paired_ports(count: int) -> list[int]:
    """``count`` free loopback ports whose gRPC ports (+10000, SeaweedFS' convention) are
    valid and free too, none of the ``2 * count`` the same."""
    ports: list[int] = []
    while len(ports) < count:
        port = _cluster_port()
        taken = {*ports, *(p + 10000 for p in ports)}
        if port not in taken and port + 10000 not in taken:
            ports.append(port)
    return ports


class S3Server:
    """SeaweedFS as the S3 store: ``weed mini`` (master, volume server, filer, S3 gateway and
    its admin server, in one process) from ``.tools/bin/weed`` (``make s3-deps`` builds it),
    every port on loopback, keeping its data and logs in ``directory`` (a temporary one by
    default). Authentication is on: one identity (``access_key``, ``secret_key``) may do
    anything; unsigned or badly signed requests, presigned URLs past their expiry and POST
    uploads outside their policy are refused. :meth:`start` creates ``bucket`` and returns once
    it takes writes (about 4 s).

    The store can fail two ways: :meth:`pause` freezes the process (SIGSTOP: connections are
    accepted, nothing answers, as with a stuck store; a client waits for its read timeout)
    until :meth:`resume`; :meth:`kill` takes it away (connections refused at once) and
    :meth:`start` brings it back, on the same ports and data.
    """

    SERVICES = ("master", "volume", "filer", "s3", "admin")

    def __init__(self, directory: Path | None = None, bucket: str = "hubbub-files") -> None:
        assert WEED.exists(), f"{WEED} is missing: `make s3-deps` builds it"
        self.bucket = bucket
        self.access_key = "hubbub-test"
        self.secret_key = secrets.token_urlsafe(30)
        self.ports = dict(zip(self.SERVICES, _grpc_paired_ports(len(self.SERVICES)), strict=True))
        self.port = self.ports["s3"]
        self.own_dir = directory is None
        self.dir = Path(tempfile.mkdtemp(prefix="hubbub-s3-")) if directory is None else directory
        (self.dir / "data").mkdir(parents=True, exist_ok=True)
        identity = {
            "name": "hubbub",
            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }
        (self.dir / "s3.json").write_text(json.dumps({"identities": [identity]}))
        self.log = self.dir / "weed.log"
        self.proc: asyncio.subprocess.Process | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def settings(self) -> dict[str, Any]:
        """The settings that keep the app's files in this store's bucket."""
        return {
            "file_storage": "s3",
            "s3_endpoint_url": self.endpoint,
            "s3_bucket": self.bucket,
            "s3_access_key_id": self.access_key,
            "s3_secret_access_key": self.secret_key,
        }

    def client(self, timeout: float = 5) -> contextlib.AbstractAsyncContextManager[S3Client]:
        """An aiobotocore S3 client of this store (``async with``), signing as the identity:
        ``timeout`` seconds to connect and to read, no retries."""
        from aiobotocore.config import AioConfig
        from aiobotocore.session import get_session

        config = AioConfig(
            connect_timeout=timeout, read_timeout=timeout, retries={"max_attempts": 1},
            signature_version="s3v4", s3={"addressing_style": "path"},
        )  # fmt: skip
        return get_session().create_client(
            "s3", endpoint_url=self.endpoint, region_name="us-east-1", config=config,
            aws_access_key_id=self.access_key, aws_secret_access_key=self.secret_key,
        )  # fmt: skip

    def command(self) -> list[str]:
        # Every port explicit (weed mini moves a default one that is taken elsewhere); no
        # WebDAV, Iceberg or Lance servers, no telemetry. -logtostderr: its whole log, as it
        # goes, in weed.log (glog's own files, in /tmp, are flushed every 30 s).
        flags = [
            f"-dir={self.dir / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-s3.config={self.dir / 's3.json'}", "-master.telemetry=false",
            "-webdav=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
            "-admin.ui=false", "-admin.port.legacy=0",
        ]  # fmt: skip
        for service, port in self.ports.items():
            flags += [f"-{service}.port={port}", f"-{service}.port.grpc={port + 10000}"]
        return [str(WEED), "-logtostderr", "mini", *flags]

    async def start(self, timeout: float = 60) -> None:
        """Start (or start again, after :meth:`kill`); returns once the bucket takes writes."""
        with self.log.open("ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                *self.command(), cwd=self.dir, stdout=log, stderr=log, start_new_session=True
            )
        from botocore.exceptions import BotoCoreError, ClientError

        error: Exception | None = None
        try:
            async with asyncio.timeout(timeout), self.client(timeout=2) as s3:
                while self.proc.returncode is None:
                    try:
                        with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou):
                            await s3.create_bucket(Bucket=self.bucket)
                        await s3.put_object(Bucket=self.bucket, Key=".probe", Body=b"probe")
                        await s3.delete_object(Bucket=self.bucket, Key=".probe")
                        return
                    except (BotoCoreError, ClientError) as exc:
                        error = exc
                        await asyncio.sleep(0.1)
        except TimeoutError:
            raise AssertionError(
                f"SeaweedFS is not ready after {timeout} s ({error}):\n{self.output()}"
            ) from None
        raise AssertionError(f"weed exited ({self.proc.returncode}):\n{self.output()}")

    def output(self, lines: int = 200) -> str:
        """The end of weed's log."""
        if not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    async def pause(self) -> None:
        """SIGSTOP: the store stops answering (connections are still accepted)."""
        assert self.proc is not None and self.proc.returncode is None, "not running"
        self.proc.send_signal(signal.SIGSTOP)

    async def resume(self) -> None:
        """SIGCONT, after :meth:`pause`."""
        assert self.proc is not None and self.proc.returncode is None, "not running"
        self.proc.send_signal(signal.SIGCONT)

    async def kill(self) -> None:
        """SIGKILL (weed takes 15 s to stop on SIGTERM): the store is gone until
        :meth:`start`, which brings it back with what it had."""
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)
            await self.proc.wait()
        self.proc = None
        # The Unix sockets weed also serves on, named by port in /tmp.
        for service, port in self.ports.items():
            for socket_name in (f"{service}-grpc-{port + 10000}", f"{service}-{port}"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(f"/tmp/seaweedfs-{socket_name}.sock")

    async def stop(self) -> None:
        await self.kill()
        if self.own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)


class JaegerServer:
    """Jaeger v2 (``.tools/bin/jaeger``, which ``make otel-deps`` builds): an OpenTelemetry
    collector taking OTLP/HTTP on :attr:`otlp_url`, keeping spans in memory, and its query API
    (:meth:`trace`), every port on loopback."""

    def __init__(self) -> None:
        assert JAEGER.exists(), f"{JAEGER} is missing: `make otel-deps` builds it"
        self.otlp_port, self.query_port, self.grpc_port, self.health_port = (
            free_port() for _ in range(4)
        )
        self.dir = Path(tempfile.mkdtemp(prefix="hubbub-jaeger-"))
        (self.dir / "config.yaml").write_text(
            jaeger_config(self.otlp_port, self.query_port, self.grpc_port, self.health_port)
        )
        self.log = self.dir / "jaeger.log"
        self.proc: asyncio.subprocess.Process | None = None

    @property
    def otlp_url(self) -> str:
        """What CHAT_TRACING_ENDPOINT names: spans go to ``/v1/traces`` there."""
        return f"http://127.0.0.1:{self.otlp_port}"

    async def start(self) -> None:
        with self.log.open("wb") as log:
            self.proc = await asyncio.create_subprocess_exec(
                str(JAEGER), "--config", str(self.dir / "config.yaml"), stdout=log, stderr=log
            )
        proc = self.proc
        async with asyncio.timeout(60), httpx.AsyncClient() as http:
            while True:  # ready: its health check passes (receivers and extensions started)
                assert proc.returncode is None, self.log.read_text(errors="replace")[-4000:]
                with contextlib.suppress(httpx.TransportError):
                    health = await http.get(f"http://127.0.0.1:{self.health_port}/status")
                    if health.status_code == 200:
                        break
                await asyncio.sleep(0.1)
        for port in (self.otlp_port, self.query_port):
            await wait_for_port(port, proc, lambda: self.log.read_text(errors="replace"))

    async def trace(self, trace_id: str) -> list[dict[str, Any]]:
        """The spans Jaeger holds of trace ``trace_id`` (hex), each with its ``process``
        (service name and tags) resolved; [] when it has none."""
        async with httpx.AsyncClient() as http:
            response = await http.get(f"http://127.0.0.1:{self.query_port}/api/traces/{trace_id}")
        if response.status_code == 404:
            return []
        assert response.status_code == 200, response.text
        found: list[dict[str, Any]] = []
        for trace in response.json()["data"] or []:
            for span in trace["spans"]:
                span["process"] = trace["processes"][span["processID"]]
                found.append(span)
        return found

    async def wait_for_spans(
        self, trace_id: str, condition: Callable[[list[dict[str, Any]]], bool], timeout: float = 20
    ) -> list[dict[str, Any]]:
        """The spans of ``trace_id`` once ``condition`` holds of them (fails after
        ``timeout`` with what there was)."""
        spans: list[dict[str, Any]] = []
        try:
            async with asyncio.timeout(timeout):
                while not condition(spans := await self.trace(trace_id)):
                    await asyncio.sleep(0.2)
        except TimeoutError:
            raise AssertionError(f"trace {trace_id}: {summary(spans)}") from None
        return spans

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)
            await self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def summary(spans: list[dict[str, Any]]) -> list[tuple[str, str, list[str]]]:
    """Each span as (operation, span id, the span ids it references), for messages."""
    return [
        (span["operationName"], span["spanID"], [ref["spanID"] for ref in span["references"]])
        for span in spans
    ]
