"""SendWindow: a connection's ``send`` frames in flight, published in the order they came,
answered in that order, at most ``limit`` at once.

Each send's publish is started eagerly (:func:`app.transport.eager.start_eagerly`): it runs at
once, inside the reader's step, up to its first suspension. With the embedded broker it never
suspends, so it costs no task and its answer goes out on the spot: a burst of sends read
together is delivered within one loop iteration and leaves, coalesced, in one flush per socket
(what a one-room fan-out's throughput depends on, docs/benchmarks.md). A publish that waits on
Redis goes on in a task; its answer waits in its slot until every earlier one is answered, and
then every answer ready goes out at once, without a loop iteration per slot.

Publishes start in arrival order, so with one Redis connection per worker their ids (their order
in the room) are the order they were sent.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

from app.transport.eager import start_eagerly

Answer = str | None  # the frame that answers a send (ack or error), or None: no answer
Publish = Coroutine[Any, Any, Answer]


class _Slot:
    __slots__ = ("answer", "done")

    def __init__(self) -> None:
        self.answer: Answer = None
        self.done = False


class SendWindow:
    """Up to ``limit`` sends in flight for one connection; ``offer`` writes an answer to it.

    Contract: answers are offered in the order :meth:`start` was called, each once; a publish
    coroutine must not raise for a refused send (it returns the error frame), and one that
    raises anyway still releases its slot (with no answer) before the exception propagates.
    """

    __slots__ = ("_idle", "_limit", "_offer", "_room", "_slots", "_tasks")

    def __init__(self, limit: int, offer: Callable[[str], None]) -> None:
        self._limit = limit
        self._offer = offer
        self._slots: deque[_Slot] = deque()  # oldest first
        self._tasks: set[asyncio.Task[None]] = set()  # publishes that had to wait
        self._room: asyncio.Future[None] | None = None  # for admit(): a slot freed
        self._idle: asyncio.Future[None] | None = None  # for settle(): every slot answered

    def __len__(self) -> int:
        """Sends started and not answered yet."""
        return len(self._slots)

    async def admit(self) -> None:
        """Return once fewer than ``limit`` sends are in flight."""
        while len(self._slots) >= self._limit:
            if self._room is None or self._room.done():
                self._room = asyncio.get_running_loop().create_future()
            await self._room

    async def settle(self) -> None:
        """Return once every send started so far is answered."""
        while self._slots:
            if self._idle is None or self._idle.done():
                self._idle = asyncio.get_running_loop().create_future()
            await self._idle

    def start(self, publish: Publish) -> None:
        """Run ``publish`` now, up to its first suspension; offer its answer after those of
        the sends started before it. Call :meth:`admit` first."""
        slot = _Slot()
        self._slots.append(slot)
        task = start_eagerly(self._run(slot, publish))
        if task is not None:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, slot: _Slot, publish: Publish) -> None:
        try:
            slot.answer = await publish
        finally:
            slot.done = True
            self._release()

    def _release(self) -> None:
        slots = self._slots
        while slots and slots[0].done:
            answer = slots.popleft().answer
            if answer is not None:
                self._offer(answer)
        if len(slots) < self._limit and self._room is not None and not self._room.done():
            self._room.set_result(None)
        if not slots and self._idle is not None and not self._idle.done():
            self._idle.set_result(None)
