"""SendWindow (app/sockets/send_window.py) without sockets: answers in the order sends started, at
once when nothing earlier waits, and never more than the limit in flight."""

from __future__ import annotations

import asyncio

import pytest

from app.sockets.send_window import Answer, SendWindow


async def _answered(answer: Answer) -> Answer:
    return answer


async def _after(future: asyncio.Future[None], answer: Answer) -> Answer:
    await future
    return answer


async def test_a_publish_that_never_waits_is_answered_on_the_spot() -> None:
    """The embedded broker's case: no task is made and the answer is offered within
    start(), so frames read together are delivered (and flushed) together."""
    offered: list[str] = []
    window = SendWindow(16, offered.append)
    tasks_before = len(asyncio.all_tasks())
    for n in range(100):
        await window.admit()
        window.start(_answered(f"ack{n}"))
        assert offered[-1] == f"ack{n}"
    assert len(asyncio.all_tasks()) == tasks_before
    assert len(window) == 0


async def test_answers_keep_the_order_of_the_sends() -> None:
    """A later send answered first waits for the earlier ones; then all go at once, in order
    (no loop iteration per answer); a send without an answer (no cid) takes its turn."""
    loop = asyncio.get_running_loop()
    offered: list[str] = []
    window = SendWindow(16, offered.append)
    gates = [loop.create_future() for _ in range(3)]
    window.start(_after(gates[0], "a"))
    window.start(_after(gates[1], None))
    window.start(_after(gates[2], "c"))
    window.start(_answered("d"))
    gates[2].set_result(None)
    gates[1].set_result(None)
    await asyncio.sleep(0.01)
    assert offered == [] and len(window) == 4
    gates[0].set_result(None)
    await window.settle()
    assert offered == ["a", "c", "d"]


async def test_admit_waits_while_the_limit_is_in_flight() -> None:
    loop = asyncio.get_running_loop()
    window = SendWindow(2, lambda answer: None)
    gates = [loop.create_future() for _ in range(2)]
    for gate in gates:
        await window.admit()
        window.start(_after(gate, "x"))
    admitted = asyncio.ensure_future(window.admit())
    await asyncio.sleep(0.01)
    assert not admitted.done()
    gates[0].set_result(None)
    await asyncio.wait_for(admitted, 1)
    assert len(window) == 1
    gates[1].set_result(None)
    await asyncio.wait_for(window.settle(), 1)


async def test_a_publish_that_raises_still_frees_its_slot() -> None:
    """An unexpected error (the session closes the connection) must not leave settle()
    waiting forever, nor hold back the answers after it."""
    loop = asyncio.get_running_loop()
    offered: list[str] = []
    window = SendWindow(4, offered.append)
    gate: asyncio.Future[None] = loop.create_future()

    async def fails() -> Answer:
        await gate
        raise RuntimeError("bug")

    window.start(fails())
    window.start(_answered("after"))
    gate.set_result(None)
    await asyncio.wait_for(window.settle(), 1)
    assert offered == ["after"]
    with pytest.raises(RuntimeError):
        window.start(_raises_at_once())
    assert len(window) == 0


async def _raises_at_once() -> Answer:
    raise RuntimeError("bug before any wait")
