"""Graces: the users lingering on one worker (:meth:`app.presence.Presence.leave`), each with a
timer for its grace's end, and the tasks settling the ends that came."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any


class Graces:
    """Timers by (room, user). Contract: at most one timer a key (a new one replaces it);
    :meth:`settle` runs a grace's end as a tracked task; :meth:`close` drops every timer and
    cancels the tasks still running (a stopping worker: what was due is left to lapse)."""

    def __init__(self) -> None:
        self._timers: dict[tuple[str, str], asyncio.TimerHandle] = {}
        self._settling: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        """Graces running, and ends being settled."""
        return len(self._timers) + len(self._settling)

    def start(self, room: str, user: str, delay_s: float, end: Callable[[str, str], None]) -> None:
        """Call ``end(room, user)`` in ``delay_s`` (a running grace of the key is replaced)."""
        self.cancel(room, user)
        self._timers[(room, user)] = asyncio.get_running_loop().call_later(
            delay_s, self._ended, room, user, end
        )

    def _ended(self, room: str, user: str, end: Callable[[str, str], None]) -> None:
        self._timers.pop((room, user), None)
        end(room, user)

    def cancel(self, room: str, user: str) -> bool:
        """Stop the key's grace; whether one was running."""
        timer = self._timers.pop((room, user), None)
        if timer is None:
            return False
        timer.cancel()
        return True

    def settle(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` (what a grace's end does) as a task, kept until it is done."""
        task = asyncio.create_task(work)
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    async def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for task in list(self._settling):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
