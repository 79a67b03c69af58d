"""A worker's shutdown (app.main's lifespan) is not held by a background task that does not
stop when cancelled, nor stopped by one that had failed: both are named in the log."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import pytest

from app.main import _stop_tasks


async def test_a_task_that_swallows_its_cancellation_is_left_behind_and_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = asyncio.Event()

    async def stubborn() -> None:
        while not release.is_set():
            # (what a library that turns a cancellation into an error may do)
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(10)

    async def failed() -> None:
        raise RuntimeError("broke earlier")

    async def obedient() -> None:
        await asyncio.sleep(10)

    tasks = [
        asyncio.create_task(stubborn(), name="stubborn"),
        asyncio.create_task(failed(), name="failed"),
        asyncio.create_task(obedient(), name="obedient"),
    ]
    await asyncio.sleep(0)  # all started; "failed" has failed
    started = time.monotonic()
    with caplog.at_level(logging.ERROR, logger="app.main"):
        await _stop_tasks(tasks, 0.3)
    assert 0.3 <= time.monotonic() - started < 2
    messages = [record.getMessage() for record in caplog.records]
    assert any("task stubborn did not stop" in m for m in messages), messages
    assert any("task failed had failed" in m for m in messages), messages
    assert not any("obedient" in m for m in messages), messages
    assert tasks[2].cancelled() and not tasks[0].done()
    release.set()
    tasks[0].cancel()
    await asyncio.wait([tasks[0]], timeout=5)
    assert tasks[0].done()
