"""start_eagerly: a coroutine runs synchronously until it first waits, then as a task."""

from __future__ import annotations

import asyncio

import pytest

from app.transport.eager import start_eagerly


async def test_a_coroutine_that_never_waits_finishes_inline() -> None:
    done: list[str] = []

    async def write() -> None:
        done.append("written")

    assert start_eagerly(write()) is None
    assert done == ["written"]  # before any other task ran


async def test_a_waiting_coroutine_goes_on_in_a_task() -> None:
    writable = asyncio.Event()
    steps: list[str] = []

    async def write() -> None:
        steps.append("before")
        await writable.wait()
        steps.append("after")
        await asyncio.sleep(0)  # a bare yield, too
        steps.append("end")

    task = start_eagerly(write())
    assert task is not None and steps == ["before"]
    await asyncio.sleep(0.01)
    assert steps == ["before"] and not task.done()
    writable.set()
    await asyncio.wait_for(task, 1)
    assert steps == ["before", "after", "end"]


async def test_cancelling_the_task_cancels_the_coroutine_where_it_waits() -> None:
    seen: list[str] = []

    async def write() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    task = start_eagerly(write())
    assert task is not None
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 1)
    assert seen == ["cancelled"] and task.cancelled()


async def test_an_error_before_the_first_wait_reaches_the_caller() -> None:
    async def write() -> None:
        raise OSError("gone")

    with pytest.raises(OSError, match="gone"):
        start_eagerly(write())


async def test_an_error_after_a_wait_ends_the_task_with_it() -> None:
    gate = asyncio.get_running_loop().create_future()

    async def write() -> None:
        await gate

    task = start_eagerly(write())
    assert task is not None
    gate.set_exception(OSError("reset"))
    with pytest.raises(OSError, match="reset"):
        await asyncio.wait_for(task, 1)


async def test_cancelling_the_task_cancels_the_future_it_waits_on() -> None:
    """As a task of its own would: the future the coroutine awaits is cancelled with it."""
    gate = asyncio.get_running_loop().create_future()
    seen: list[str] = []

    async def write() -> None:
        try:
            await gate
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    task = start_eagerly(write())
    assert task is not None
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 1)
    assert gate.cancelled() and seen == ["cancelled"]


async def test_a_cancel_after_the_future_is_done_still_reaches_the_coroutine() -> None:
    """The future resolves, then the task is cancelled before it runs again: the coroutine
    is cancelled there, not resumed as if nothing had happened."""
    gate = asyncio.get_running_loop().create_future()
    seen: list[str] = []

    async def write() -> None:
        try:
            await gate
            seen.append("resumed")
            await asyncio.sleep(0)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    task = start_eagerly(write())
    assert task is not None
    await asyncio.sleep(0)
    gate.set_result(None)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 1)
    assert seen == ["cancelled"] or seen == ["resumed", "cancelled"]
