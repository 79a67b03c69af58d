"""Automatic pipelining of Lua script calls: the calls made in one event-loop iteration go to
Redis in one write, on one connection, and their replies are read as they stream back.

With many sockets sending at once, a worker makes many small script calls per iteration (a
rate-limit token, a publish). Centrifugo's Redis engine batches the same way (rueidis
auto-pipelining). redis-py opens and sets up the connection, then hands it over
(:mod:`app.redisio.redis_seam`) to a protocol that parses replies with hiredis straight from
``data_received``. redis-py's own pipeline costs, per command, a timeout context, a parse
coroutine and a response callback, and per batch a task, a pool checkout and a retry wrapper:
in the Redis rtt benchmark that was a fifth of a worker's CPU, for work hiredis does in C.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import hiredis
from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from app.redisio.functions import RedisFunction
from app.redisio.redis_seam import hand_over

logger = logging.getLogger(__name__)

_Command = tuple[Any, ...]
# A Lua script (EVALSHA) or a function of a loaded library (FCALL: app.redisio.functions).
Script = AsyncScript | RedisFunction
# The command, its caller's future, the script it runs (to load it again on NOSCRIPT), and
# whether its reply waits for the replicas (see AutoPipeline's ``wait_replicas``).
_Call = tuple[_Command, "asyncio.Future[Any]", "Script | None", bool]
_SCRIPT_CALLS: Final = ("EVALSHA", "FCALL")
_NOT_FOUND = "ERR Function not found"  # an FCALL's NOSCRIPT
_WAIT = "WAIT"
# While a pipeline does not wait for replicas (wait_required=False and too few), how often it
# asks the master (ROLE) whether it has enough again.
PROBE_S = 1.0


class _ServerRunId:
    """See :data:`SERVER_RUN_ID`."""

    def __repr__(self) -> str:
        return "SERVER_RUN_ID"


SERVER_RUN_ID: Final = _ServerRunId()
"""A script's first argument that the pipeline replaces, as it writes the call, with the
``run_id`` of the Redis server at the other end of its connection (asked once per
connection, with ``INFO server``): what a script would otherwise ask that server on every
call. A connection is to one server process for its whole life, so the id a call carries is
that of the server that runs it, across restarts and failovers alike."""
_RUN_ID = re.compile(rb"run_id:([0-9a-f]+)")


@dataclass(frozen=True, slots=True)
class Merge:
    """A call that may be merged with the calls next to it in the same write: of the same
    script, ``durable`` alike, with an equal ``group`` (on Redis Cluster: the slot's hash tag,
    since one script call touches one slot) and the same shared part: its first
    ``shared_args`` arguments (the very same objects: e.g. :data:`SERVER_RUN_ID` and settings)
    and its last ``shared_keys`` keys (equal). The merged call has each call's own keys one
    call after the other, then the shared keys once, then the shared arguments once, then
    each call's own arguments one call after the other; the script answers a flat array of
    ``reply_width`` entries per call, in order, and each caller gets its own ``reply_width``
    entries as a list (a call merged with none gets the script's reply as it is). A merged
    call's error fails all the calls merged into it."""

    group: Hashable
    reply_width: int
    shared_args: int = 1
    shared_keys: int = 0


class NotReplicated(RedisError):
    """A durable call ran on the master, but fewer replicas than asked confirmed it in time."""


def _reply_error(message: str) -> ResponseError:
    """The exception redis-py raises for an error reply (the codes our scripts can meet)."""
    if message.startswith("NOSCRIPT "):
        return NoScriptError(message.removeprefix("NOSCRIPT "))
    if message.startswith(_NOT_FOUND):
        return NoScriptError(message)
    return ResponseError(message)


def _invocation(script: Script) -> tuple[str, str]:
    """How ``script`` is called: the command and what names the script in it."""
    if isinstance(script, RedisFunction):
        return "FCALL", script.name
    return "EVALSHA", script.sha


def _loading(script: Script) -> _Command:
    """The command that loads ``script`` into Redis."""
    if isinstance(script, RedisFunction):
        return script.load
    return ("SCRIPT", "LOAD", script.script)


class _Replies(asyncio.Protocol):
    """One Redis connection's reply stream: replies resolve the sent calls in order.

    Every call waits at most ``timeout_s`` (None: forever) for its reply; a call that waits
    longer aborts the connection, and every call still waiting on it fails with a
    ``TimeoutError``, as a lost connection fails them with a ``ConnectionError``. A call
    whose script Redis does not know goes to ``rerun`` instead of its caller. A ``READONLY``
    reply (this server was demoted to a replica by a failover) reaches its caller, then fails
    every other call and closes the connection, so that the next one finds the new master.
    A durable call's reply is held until the ``WAIT`` after it answers.
    """

    writer: asyncio.StreamWriter  # set once handed over (and kept: see hand_over)
    run_id = b""  # the server's (see SERVER_RUN_ID), set once handed over

    def __init__(
        self,
        timeout_s: float | None,
        rerun: Callable[[_Call], None],
        short: Callable[[int], bool] = lambda held: False,
        replied: Callable[[], None] = lambda: None,
    ) -> None:
        self._timeout_s = timeout_s
        self._rerun = rerun
        self._replied = replied  # told once replies have been handed to their callers
        self._short = short  # told how many replies a short WAIT holds; True: release them
        self._reader = hiredis.Reader(replyError=_reply_error)
        self._waiting: deque[tuple[_Call, float]] = deque()
        self._held: list[tuple[asyncio.Future[Any], Any]] = []  # replies waiting for a WAIT
        self._deadline: asyncio.TimerHandle | None = None
        self._loaded: set[str] = set()  # the scripts loaded on this connection
        self.closed = False

    @property
    def usable(self) -> bool:
        return not self.closed and not self.writer.transport.is_closing()

    def send(self, batch: list[_Call]) -> None:
        batch = self._loading_first(batch)
        self.writer.transport.write(b"".join([self._pack(call[0]) for call in batch]))
        now = time.monotonic()
        self._waiting.extend([(call, now) for call in batch])
        if self._deadline is None and self._timeout_s is not None:
            loop = asyncio.get_running_loop()
            self._deadline = loop.call_at(loop.time() + self._timeout_s, self._check_deadline)

    def _loading_first(self, batch: list[_Call]) -> list[_Call]:
        """``batch`` with a ``SCRIPT LOAD`` before the first call of each script this
        connection has not loaded yet. A script is thus in Redis before its first call on
        every connection (a restarted or promoted server has none), so that calls are not
        refused with NOSCRIPT and run again after later ones: reruns keep their order among
        themselves, not with the calls sent while they were refused (the first sends of a
        room after a restart would be numbered out of order)."""
        if all(call[2] is None or call[2].sha in self._loaded for call in batch):
            return batch
        out: list[_Call] = []
        loop = asyncio.get_running_loop()
        for call in batch:
            script = call[2]
            if script is not None and script.sha not in self._loaded:
                self._loaded.add(script.sha)
                loaded: asyncio.Future[Any] = loop.create_future()
                loaded.add_done_callback(_log_failed_load)
                out.append((_loading(script), loaded, None, False))
            out.append(call)
        return out

    def _pack(self, command: _Command) -> bytes:
        # A script's first argument follows its keys: (EVALSHA, sha, n, *keys, *args).
        first = 3 + command[2] if command[0] in _SCRIPT_CALLS else 0
        if first and len(command) > first and command[first] is SERVER_RUN_ID:
            command = (*command[:first], self.run_id, *command[first + 1 :])
        return hiredis.pack_command(command)  # type: ignore[no-any-return]

    def _check_deadline(self) -> None:
        self._deadline = None
        if not self._waiting or self._timeout_s is None:
            return
        late_by = time.monotonic() - self._waiting[0][1] - self._timeout_s
        if late_by >= 0:
            self._fail(RedisTimeoutError(f"no reply from Redis in {self._timeout_s} s"))
            self.writer.transport.abort()
            return
        loop = asyncio.get_running_loop()
        self._deadline = loop.call_at(loop.time() - late_by, self._check_deadline)

    def data_received(self, data: bytes) -> None:
        self._reader.feed(data)
        waiting = self._waiting
        calls_waiting = len(waiting)
        self._answer(waiting)
        if len(waiting) != calls_waiting:
            self._replied()

    def _answer(self, waiting: deque[tuple[_Call, float]]) -> None:
        """Hand each complete reply read so far to the call it answers, in order."""
        while (reply := self._reader.gets()) is not False:
            if not waiting:  # a reply nobody asked for: the stream is out of step
                self._fail(RedisConnectionError("unexpected reply from Redis"))
                self.writer.transport.abort()
                return
            call = waiting.popleft()[0]
            future = call[1]
            if isinstance(reply, NoScriptError) and call[2] is not None:
                self._rerun(call)
            elif call[3] and not isinstance(reply, Exception):
                self._held.append((future, reply))
            elif call[0][0] is _WAIT:
                self._release(reply, call[0][1])
            elif future.done():  # its caller was cancelled
                continue
            elif isinstance(reply, Exception):
                future.set_exception(reply)
                if str(reply).startswith("READONLY"):
                    self._fail(RedisConnectionError("Redis was demoted to a replica"))
                    self.writer.transport.abort()
                    return
            else:
                future.set_result(reply)

    def _release(self, replicas: Any, wanted: int) -> None:
        """The held replies, now that ``WAIT`` answered: theirs if enough replicas have them."""
        held, self._held = self._held, []
        short = None
        if isinstance(replicas, Exception) or replicas < wanted:
            short = NotReplicated(f"{replicas!r} of {wanted} replicas confirmed the write")
            if not isinstance(replicas, Exception) and self._short(len(held)):
                short = None  # acked all the same (AutoPipeline's wait_required=False)
        for future, reply in held:
            if future.done():
                continue
            if short is None:
                future.set_result(reply)
            else:
                future.set_exception(short)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(RedisConnectionError(f"connection to Redis lost: {exc!r}"))

    def close(self) -> None:
        self._fail(RedisConnectionError("pipeline closed"))
        self.writer.transport.close()

    def _fail(self, exc: Exception) -> None:
        self.closed = True
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        futures = [call[1] for call, _ in self._waiting] + [held[0] for held in self._held]
        self._waiting.clear()
        self._held = []
        for future in futures:
            if not future.done():
                future.set_exception(exc)


class AutoPipeline:
    """Batches :meth:`call` s made in the same loop iteration into one write to Redis.

    Contract:

    * **Ordering:** calls reach Redis in the order they were made (one connection, batches
      written in order of their first call).
    * **Results:** each caller gets its own script's reply, or the exception its command
      raised. A lost connection fails every call waiting on it with a ``ConnectionError``, a
      reply later than the client's ``socket_timeout`` fails them with a ``TimeoutError``
      (and closes the connection); the next call opens a new one. Each connection loads a
      script (or a :class:`RedisFunction`'s library) before its first call of it; a call to
      a script Redis forgot since (``SCRIPT FLUSH``, ``FUNCTION FLUSH``) is run again after
      loading it again on the same connection (the calls rerun keep their order among
      themselves).
    * **Cancellation:** a caller cancelled while waiting does not withdraw its command, which
      may already be on the wire; only its result is dropped.
    * **Durability** (``wait_replicas`` above 0): a batch with a ``durable`` call ends with a
      ``WAIT wait_replicas timeout``; the batch's durable calls get their replies only once it
      answers, or fail with :class:`NotReplicated` (their writes are done on the master, but
      fewer replicas confirmed them in time; a failover may lose them).
      With ``wait_required=False`` a short ``WAIT`` fails nothing: its calls get their
      replies, are counted in :attr:`acked_without_replicas`, and the pipeline stops waiting
      (the master lacks replicas: after a failover, the promoted replica has none until one
      is attached) until a ``ROLE``, asked every ``PROBE_S`` meanwhile, lists enough replicas
      again; the durable calls of that time are counted too.
    * Not transactional: the scripts of a batch are atomic one by one, not together.
    * **Replied:** ``on_reply`` is called (synchronously) each time replies, or errors, have
      been handed to their callers, whose tasks then wake in the loop's next pass (the
      replies of merged calls one pass later): see :meth:`app.transport.flusher.Flusher.hold`.
    * The owner calls :meth:`close`, which fails the calls still waiting.
    """

    def __init__(
        self,
        redis: Redis,
        max_batch: int = 1000,
        wait_replicas: int = 0,
        wait_timeout_s: float = 0.5,
        max_merged: int = 32,
        wait_required: bool = True,
        on_reply: Callable[[], None] = lambda: None,
    ) -> None:
        self._redis = redis
        self._on_reply = on_reply
        self._wait_required = wait_required
        self._alone_until: float | None = None  # not waiting for replicas; next ROLE then
        self.acked_without_replicas = 0  # durable calls answered unconfirmed (see the class)
        self._max_merged = max_merged
        self._mergeable = 0  # mergeable calls pending
        self._timeout_s: float | None = redis.connection_pool.connection_kwargs.get(
            "socket_timeout"
        )
        self._max_batch = max_batch
        self._wait_replicas = wait_replicas
        self._wait_timeout_ms = max(1, int(wait_timeout_s * 1000))
        self._pending: list[_Call] = []
        self._replies: _Replies | None = None
        self._connecting: list[list[_Call]] | None = None  # batches waiting for a connection
        self._loading: set[str] = set()  # scripts being loaded again
        self._connector: asyncio.Task[None] | None = None
        self._closed = False
        self.batches = 0  # writes so far (for tests and profiling)
        self._invocations: dict[Script, tuple[str, str]] = {}  # see _invocation

    async def call(
        self, script: Script, keys: Sequence[Any], args: Sequence[Any], durable: bool = False
    ) -> Any:
        """Run ``script`` with ``keys`` and ``args`` in this iteration's pipeline; ``durable``:
        its reply waits for the replicas (see the class)."""
        return await self.submit(script, keys, args, durable)

    def submit(
        self,
        script: Script,
        keys: Sequence[Any],
        args: Sequence[Any],
        durable: bool = False,
        merge: Merge | None = None,
    ) -> asyncio.Future[Any]:
        """:meth:`call` without the coroutine (for hot paths): the future gets the reply or
        the error; cancelling it drops the result, as cancelling a caller of :meth:`call` does.
        ``merge``: the call may share one script run with its neighbours (see :class:`Merge`),
        up to ``max_merged`` calls in one."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        durable = durable and self._wait_replicas > 0
        invocation = self._invocations.get(script)
        if invocation is None:  # a pipeline calls a few scripts, each many times
            invocation = self._invocations[script] = _invocation(script)
        command = (merge or invocation[0], invocation[1], len(keys), *keys, *args)
        self._mergeable += merge is not None
        self._enqueue((command, future, script, durable))
        return future

    def command(self, key: str, *args: Any) -> asyncio.Future[Any]:
        """A plain command (``args``, its name first) in this iteration's pipeline; ``key``
        is the key it is about (it routes the call on Redis Cluster, see
        :meth:`~app.redisio.cluster.ClusterPipelines.command`). The reply is as Redis sends
        it (bytes, ints, lists), with no redis-py response callback."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._enqueue((args, future, None, False))
        return future

    def _enqueue(self, call: _Call) -> None:
        if not self._pending:
            asyncio.get_running_loop().call_soon(self._send_pending)
        self._pending.append(call)
        if len(self._pending) >= self._max_batch:
            self._send_pending()

    def _send_pending(self) -> None:
        batch, self._pending = self._pending, []
        if not batch:
            return
        if self._mergeable:
            self._mergeable = 0
            batch = _merged(batch, self._max_merged, self._on_reply)
        if self._wait_replicas and self._alone_until is not None:
            batch = self._alone(batch)
        if self._wait_replicas and any(call[3] for call in batch):
            waited: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            # Nobody awaits it (its reply releases the held ones, see _Replies._release):
            # a lost connection's error is retrieved here, not logged as never retrieved.
            waited.add_done_callback(_retrieve)
            wait = (_WAIT, self._wait_replicas, self._wait_timeout_ms)
            batch.append((wait, waited, None, False))
        replies = self._replies
        if self._closed:
            _fail([batch], RedisConnectionError("pipeline closed"))
        elif self._connecting is not None:
            self._connecting.append(batch)
        elif replies is not None and replies.usable:
            self.batches += 1
            replies.send(batch)
        else:
            self._connecting = [batch]
            self._connector = asyncio.create_task(self._connect(), name="redis-autopipeline")

    def _short_wait(self, held: int) -> bool:
        """A ``WAIT`` answered short with ``held`` replies: release them unless required."""
        if self._wait_required:
            return False
        self.acked_without_replicas += held
        if self._alone_until is None:
            logger.warning(
                "Redis confirmed fewer than %d replicas: acks stop waiting for them until it "
                "has enough (CHAT_REDIS_WAIT_POLICY=available)", self._wait_replicas,
            )  # fmt: skip
            self._alone_until = time.monotonic() + PROBE_S
        return True

    def _alone(self, batch: list[_Call]) -> list[_Call]:
        """``batch`` without waiting for replicas (counted), and with a ``ROLE`` probe when
        one is due."""
        if not any(call[3] for call in batch):
            return batch
        for call in batch:
            if call[3]:
                call[1].add_done_callback(self._count_unconfirmed)
        batch = [(command, future, script, False) for command, future, script, _ in batch]
        if self._alone_until is not None and time.monotonic() >= self._alone_until:
            self._alone_until = time.monotonic() + PROBE_S
            role: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            role.add_done_callback(self._probed)
            batch.append((("ROLE",), role, None, False))
        return batch

    def _count_unconfirmed(self, answered: asyncio.Future[Any]) -> None:
        if not answered.cancelled() and answered.exception() is None:
            self.acked_without_replicas += 1

    def _probed(self, role: asyncio.Future[Any]) -> None:
        """``ROLE``'s answer: wait for replicas again once the master lists enough."""
        if role.cancelled() or role.exception() is not None:
            return
        reply = role.result()
        is_master = isinstance(reply, list) and len(reply) > 2 and reply[0] == b"master"
        if is_master and len(reply[2]) >= self._wait_replicas and self._alone_until is not None:
            self._alone_until = None
            logger.warning("Redis has %d replicas again: acks wait for them", len(reply[2]))

    async def _connect(self) -> None:
        """Open a connection; then send the batches that waited for it, in order."""
        try:
            replies = _Replies(
                self._timeout_s, self._rerun_loading, self._short_wait, self._on_reply
            )
            asked = ("INFO", "server", "replication")
            replies.writer, info = await hand_over(self._redis, replies, asked)
            text = info if isinstance(info, bytes) else str(info).encode()
            found = _RUN_ID.search(text)
            if found is None:  # pragma: no cover - every Redis since 2.4 says it
                replies.writer.transport.close()
                raise RedisConnectionError("Redis did not say its run_id")
            if b"role:master" not in text:
                # A Sentinel not yet told of a failover names the old master, back as a
                # replica: its reads would be stale and its writes refused.
                replies.writer.transport.close()
                raise RedisConnectionError("the server is a replica, not the master")
            replies.run_id = found.group(1)
        except Exception as exc:
            batches, self._connecting = self._connecting or [], None
            _fail(batches, exc)
            return
        self._replies = replies
        batches, self._connecting = self._connecting or [], None
        for batch in batches:
            self.batches += 1
            replies.send(batch)

    def _rerun_loading(self, call: _Call) -> None:
        """Queue a ``SCRIPT LOAD`` (once per script at a time), then the call again, once."""
        command, future, script, durable = call
        assert script is not None
        if script.sha not in self._loading:
            self._loading.add(script.sha)
            loaded: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            loaded.add_done_callback(lambda done: self._loaded(script.sha, done))
            self._enqueue((_loading(script), loaded, None, False))
        if not future.done():
            self._enqueue((command, future, None, durable))  # a 2nd NOSCRIPT goes to the caller

    def _loaded(self, sha: str, loaded: asyncio.Future[Any]) -> None:
        self._loading.discard(sha)
        if not loaded.cancelled() and loaded.exception() is not None:
            logger.warning("could not load a script into Redis: %r", loaded.exception())

    def reconnect(self) -> None:
        """Drop the connection (the calls waiting on it fail with a ``ConnectionError``); the
        next call opens a new one (with Sentinels: to the master they name now)."""
        if self._replies is not None:
            self._replies.close()
            self._replies = None

    async def close(self) -> None:
        """Fail every call not answered yet and close the connection; later calls fail."""
        self._closed = True
        closed = RedisConnectionError("pipeline closed")
        batches, self._connecting = [*(self._connecting or []), self._pending], None
        self._pending = []
        _fail(batches, closed)
        if self._connector is not None:
            self._connector.cancel()
        if self._replies is not None:
            self._replies.close()
            self._replies = None


def _fail(batches: list[list[_Call]], exc: Exception) -> None:
    for batch in batches:
        for _, future, _, _ in batch:
            if not future.done():
                future.set_exception(exc)


def _merged(batch: list[_Call], most: int, replied: Callable[[], None]) -> list[_Call]:
    """``batch`` with each run of neighbouring calls that may merge (see :class:`Merge`) as
    one call, of at most ``most`` calls; every call still in its place in the order.
    ``replied`` is called once a merged call's reply is split among its callers."""
    out: list[_Call] = []
    run: list[_Call] = []
    for call in batch:
        command = call[0]
        if run and len(run) < most and _merge_with(run[0], call):
            run.append(call)
            continue
        if run:
            out.append(_one_call(run, replied))
        run = [call] if isinstance(command[0], Merge) else []
        if not run:
            out.append(call)
    if run:
        out.append(_one_call(run, replied))
    return out


def _merge_with(first: _Call, call: _Call) -> bool:
    (command, _, _, durable), (other, _, _, other_durable) = first, call
    if other[0] != command[0] or other[1] != command[1] or other_durable != durable:
        return False  # not a Merge of the same group and shape, or not the same script
    merge: Merge = command[0]
    own, other_own = 3 + command[2], 3 + other[2]  # where each one's arguments start
    for index in range(merge.shared_args):  # every call of a Merge carries its whole header
        if command[own + index] is not other[other_own + index]:
            return False
    shared = merge.shared_keys
    return shared == 0 or command[own - shared : own] == other[other_own - shared : other_own]


def _one_call(run: list[_Call], replied: Callable[[], None]) -> _Call:
    """The calls of ``run`` as one script call whose reply is split among their futures."""
    first_command, _, script, durable = run[0]
    assert script is not None  # a Merge is a script call's
    verb = _invocation(script)[0]
    if len(run) == 1:
        return ((verb, *first_command[1:]), run[0][1], script, durable)
    merge: Merge = first_command[0]
    keys: list[Any] = []
    rest: list[Any] = []
    for command, _, _, _ in run:
        count = command[2]
        keys.extend(command[3 : 3 + count - merge.shared_keys])
        rest.extend(command[3 + count + merge.shared_args :])
    count = first_command[2]
    keys.extend(first_command[3 + count - merge.shared_keys : 3 + count])
    shared = first_command[3 + count : 3 + count + merge.shared_args]
    merged = (verb, first_command[1], len(keys), *keys, *shared, *rest)
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    width = merge.reply_width
    futures = [call[1] for call in run]
    future.add_done_callback(lambda done: _split(done, futures, width, replied))
    return (merged, future, script, durable)


def _split(
    done: asyncio.Future[Any],
    futures: list[asyncio.Future[Any]],
    width: int,
    replied: Callable[[], None],
) -> None:
    """A merged call's reply (or error) to the calls merged into it."""
    error = RedisConnectionError("merged call cancelled") if done.cancelled() else done.exception()
    reply: list[Any] = []
    if error is None:
        answer = done.result()
        if isinstance(answer, list) and len(answer) == width * len(futures):
            reply = answer
        else:
            error = ResponseError(f"a merged call answered {answer!r:.100}")
    for index, future in enumerate(futures):
        if future.done():
            continue
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(reply[index * width : (index + 1) * width])
    replied()


def _log_failed_load(loaded: asyncio.Future[Any]) -> None:
    if not loaded.cancelled() and loaded.exception() is not None:
        logger.warning("could not load a script into Redis: %r", loaded.exception())


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
