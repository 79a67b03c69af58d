"""Run a coroutine eagerly: synchronously up to its first suspension, and only then as a task.

Writing to a WebSocket through ASGI is a coroutine that, nearly always, never suspends: the
frame goes into the transport's buffer at once. Creating a task for each write costs more than
the write itself and, a thousand at a time during a fan-out, fills the garbage collector's young
generations with short-lived tasks. :func:`start_eagerly` is the 3.11 equivalent of Python
3.12's ``asyncio.eager_task_factory`` for one coroutine.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


def start_eagerly(coro: Coroutine[Any, Any, None]) -> asyncio.Task[None] | None:
    """Step ``coro`` now. None if it finished without suspending; otherwise a task (on the
    running loop) that runs the rest of it. An exception raised before the first suspension
    propagates to the caller, as a plain call's would; later ones end the task."""
    try:
        awaited = coro.send(None)
    except StopIteration:
        return None
    return asyncio.get_running_loop().create_task(_resume(coro, awaited))


async def _resume(coro: Coroutine[Any, Any, None], awaited: Any) -> None:
    """Go on with ``coro``, suspended on ``awaited`` (what it yielded: a future, or None for a
    bare yield), the way a task would: wait for it, then resume, until it returns.

    The future is waited on without being awaited again (``coro``'s own ``await`` still holds
    it); cancelling the task throws ``CancelledError`` into ``coro`` where it waits, as if it
    were a task of its own.
    """
    while True:
        error: BaseException | None = None
        try:
            if awaited is None:
                await asyncio.sleep(0)
            else:
                await asyncio.wait([awaited])
        except asyncio.CancelledError as exc:
            error = exc
        try:
            awaited = coro.send(None) if error is None else coro.throw(error)
        except StopIteration:
            return
