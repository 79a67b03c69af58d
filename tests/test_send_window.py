"""SendWindow (app/sockets/send_window.py) without sockets: answers in the order sends started, at
once when nothing earlier waits, and never more than the limit in flight."""

from __future__ import annotations

import asyncio

import pytest

from app.sockets.send_window import SendWindow

pytestmark = pytest.mark.timeout(10)


async def test_an_answer_given_at_once_is_offered_on_the_spot() -> None:
    """The embedded broker's case: the answer is offered within the call that gives it, so
    frames read together are delivered (and flushed) together; no task is made."""
    offered: list[str] = []
    window = SendWindow(16, offered.append)
    tasks_before = len(asyncio.all_tasks())
    for n in range(100):
        await window.admit()
        window.open()(f"ack{n}")
        assert offered[-1] == f"ack{n}"
    assert len(asyncio.all_tasks()) == tasks_before
    assert len(window) == 0


async def test_answers_keep_the_order_of_the_sends() -> None:
    """A later send answered first waits for the earlier ones; then all go at once, in order
    (within the call that gives the earliest); a send without an answer (no cid) takes its
    turn."""
    offered: list[str] = []
    window = SendWindow(16, offered.append)
    a, b, c, d = (window.open() for _ in range(4))
    d("d")
    c("c")
    b(None)
    assert offered == [] and len(window) == 4
    a("a")
    assert offered == ["a", "c", "d"] and len(window) == 0
    await asyncio.wait_for(window.settle(), 1)


async def test_an_answer_is_given_once() -> None:
    """A second call for the same send is ignored: it neither offers a second frame nor frees
    a slot that belongs to a later send."""
    offered: list[str] = []
    window = SendWindow(16, offered.append)
    first, second = window.open(), window.open()
    first("one")
    first("again")
    assert offered == ["one"] and len(window) == 1
    second("two")
    assert offered == ["one", "two"] and len(window) == 0


async def test_admit_waits_while_the_limit_is_in_flight() -> None:
    window = SendWindow(2, lambda answer: None)
    gives = []
    for _ in range(2):
        await window.admit()
        gives.append(window.open())
    admitted = asyncio.ensure_future(window.admit())
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert not admitted.done()
    gives[0]("x")
    await asyncio.wait_for(admitted, 1)
    assert len(window) == 1
    gives[1]("y")
    await asyncio.wait_for(window.settle(), 1)


async def test_settle_waits_for_every_slot() -> None:
    """settle() returns only once the last send opened is answered, whichever order they are
    answered in."""
    window = SendWindow(8, lambda answer: None)
    gives = [window.open() for _ in range(3)]
    settled = asyncio.ensure_future(window.settle())
    for give in (gives[2], gives[0]):
        give("x")
        await asyncio.sleep(0)
        assert not settled.done()
    gives[1]("x")
    await asyncio.wait_for(settled, 1)
