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

    The task awaits the future itself, as ``coro``'s own task would (``coro``'s ``await``
    then reads its outcome): cancelling the task cancels that future, and ``coro`` gets
    ``CancelledError`` where it waits, as if it were a task of its own. (Waiting with
    ``asyncio.wait`` instead, as it did, costs a waiter future and two callbacks a wait.)
    """
    while True:
        error: BaseException | None = None
        try:
            if awaited is None:
                await asyncio.sleep(0)
            else:
                # What a task does with a future its coroutine yields (else awaiting it
                # again is refused: "await wasn't used with future").
                awaited._asyncio_future_blocking = False
                await awaited
        except BaseException as exc:
            # The future's own outcome (its error; or cancelled, by this task's cancel or
            # anyone's) is for coro's own await to read. Anything else, such as a cancel that
            # came once the future was done, is thrown into coro where it waits.
            settled = awaited is not None and awaited.done()
            if not settled or (isinstance(exc, asyncio.CancelledError) and not awaited.cancelled()):
                error = exc
        try:
            awaited = coro.send(None) if error is None else coro.throw(error)
        except StopIteration:
            return
