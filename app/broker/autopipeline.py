"""Automatic pipelining of Lua script calls: the calls made in one event-loop iteration go to
Redis as one pipeline.

With many sockets sending at once, a worker makes many small script calls per iteration (a
rate-limit token, a publish). Sent one by one, each pays redis-py's per-command overhead (a pool
checkout and release, a write, a read, a timeout) and a round trip; batched, the whole
iteration pays it once. Centrifugo's Redis engine does the same (rueidis auto-pipelining).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

_Call = tuple[AsyncScript, Sequence[Any], Sequence[Any], "asyncio.Future[Any]"]


class AutoPipeline:
    """Batches :meth:`call` s made in the same loop iteration into one Redis pipeline.

    Contract:

    * **Ordering:** calls reach Redis in the order they were made (one pipeline per batch,
      batches in order of their first call, on connections of ``redis``'s pool).
    * **Results:** each caller gets its own script's reply, or the exception its command
      raised; a failure of the whole pipeline (connection lost, timeout) is raised to every
      caller of that batch. A script Redis does not know (restarted, ``SCRIPT FLUSH``) is
      loaded and the call retried, as :class:`~redis.commands.core.AsyncScript` does (after
      the rest of its batch).
    * **Cancellation:** a caller cancelled while waiting does not withdraw its command, which
      may already be on the wire; only its result is dropped.
    * Not transactional: the scripts of a batch are atomic one by one, not together.
    """

    def __init__(self, redis: Redis, max_batch: int = 1000) -> None:
        self._redis = redis
        self._max_batch = max_batch
        self._pending: list[_Call] = []
        self._sending: set[asyncio.Task[None]] = set()
        self.batches = 0  # pipelines sent so far (for tests and profiling)

    async def call(self, script: AsyncScript, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """Run ``script`` with ``keys`` and ``args`` in this iteration's pipeline."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if not self._pending:
            asyncio.get_running_loop().call_soon(self._send_pending)
        self._pending.append((script, keys, args, future))
        if len(self._pending) >= self._max_batch:
            self._send_pending()
        return await future

    def _send_pending(self) -> None:
        batch, self._pending = self._pending, []
        if not batch:
            return
        task = asyncio.create_task(self._send(batch), name="redis-autopipeline")
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, batch: list[_Call]) -> None:
        self.batches += 1
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for script, keys, args, _ in batch:
                    pipe.evalsha(script.sha, len(keys), *keys, *args)
                replies = await pipe.execute(raise_on_error=False)
        except asyncio.CancelledError:
            for *_, future in batch:
                future.cancel()
            raise
        except Exception as exc:  # every caller of the batch learns of it
            for *_, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for (script, keys, args, future), reply in zip(batch, replies, strict=True):
            if isinstance(reply, NoScriptError):
                await self._retry_loading(script, keys, args, future)
            elif future.done():
                continue
            elif isinstance(reply, Exception):
                future.set_exception(reply)
            else:
                future.set_result(reply)

    @staticmethod
    async def _retry_loading(
        script: AsyncScript, keys: Sequence[Any], args: Sequence[Any], future: asyncio.Future[Any]
    ) -> None:
        try:
            reply = await script(keys=keys, args=args)  # loads the script, then runs it
        except Exception as exc:
            if not future.done():
                future.set_exception(exc)
            return
        if not future.done():
            future.set_result(reply)
