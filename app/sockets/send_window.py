"""SendWindow: a connection's ``send`` frames in flight, published in the order they came,
answered in that order, at most ``limit`` at once.

A send takes a slot when it starts (:meth:`SendWindow.open`) and gives its answer when its
publish comes back, from whatever callback learns it: no task and no coroutine per send. With
the embedded broker that is at once, inside the reader's step, so a burst of sends read together
is answered within one loop iteration and leaves, coalesced, in one flush per socket (what a
one-room fan-out's throughput depends on, docs/benchmarks.md). An answer that comes back before
an earlier one waits in its slot until every earlier one is given; then every answer ready goes
out at once, without a loop iteration per slot.

Publishes start in arrival order, so with one Redis connection per worker their ids (their order
in the room) are the order they were sent.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

Answer = str | None  # the frame that answers a send (ack or error), or None: no answer
GiveAnswer = Callable[[Answer], None]


class _Slot:
    __slots__ = ("answer", "done")

    def __init__(self) -> None:
        self.answer: Answer = None
        self.done = False


class SendWindow:
    """Up to ``limit`` sends in flight for one connection; ``offer`` writes an answer to it.

    Contract: answers are offered in the order :meth:`open` was called, each once, as soon as
    every earlier one is; a slot whose answer is never given holds back every later answer (and
    :meth:`settle`), so each caller of :meth:`open` gives one on every path.
    """

    __slots__ = ("_idle", "_limit", "_offer", "_room", "_slots")

    def __init__(self, limit: int, offer: Callable[[str], None]) -> None:
        self._limit = limit
        self._offer = offer
        self._slots: deque[_Slot] = deque()  # oldest first
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

    def open(self) -> GiveAnswer:
        """A slot for a send starting now (call :meth:`admit` first); -> what to call, once,
        with its answer (None: nothing to answer; a second call is ignored). The answer is
        offered after those of the sends opened before it: within that call if they all are."""
        slot = _Slot()
        self._slots.append(slot)

        def give(answer: Answer) -> None:
            if not slot.done:
                slot.answer, slot.done = answer, True
                self._release()

        return give

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
