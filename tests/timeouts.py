"""Per-test timeouts that reach tests running on an event loop (a pytest plugin, loaded with
``-p tests.timeouts``).

pytest-timeout's ``signal`` method raises ``Failed`` from its SIGALRM handler. On uvloop, the
loop every async test here runs on, that handler runs as one of the loop's callbacks, and the
loop *logs* an exception a callback raises: a test awaiting something that never comes was
never stopped, and the whole run waited for CI's own limit with nothing said (CI's run of
2026-11-28 stopped printing at a failed test in ``test_broker_contract`` for the rest of its
90 minutes). Two more holes: pytest-timeout stops its timer for good as soon as a test fails
(``pytest_exception_interact``), and its timer is one-shot, so a teardown after a failure or
a timeout ran unbounded.

Contract, with ``timeout`` the test's pytest-timeout setting (``signal`` method, whole test)
and ``grace`` the ini option ``timeout_grace`` (:data:`GRACE_S` seconds unless set):

* When the time is up and an event loop is running, every task of that loop is cancelled
  (the test fails with ``CancelledError``, its ``finally`` blocks and fixtures' teardowns
  run); the stacks of those tasks are printed first. Outside a loop, ``Failed`` is raised
  where the main thread is, as pytest-timeout does.
* Whatever still runs ``grace`` later (a teardown that hangs too) gets the same, again, every
  ``grace``, until the test's protocol ends; from the :data:`STOP_LOOP_ROUND`-th time on the
  loop is also stopped (a task that swallows its cancellation: the test's
  ``run_until_complete`` then ends with ``RuntimeError``).
* Every teardown is bounded: a test's teardown starts a timer of ``grace`` when none runs
  (after a failure, or once a timeout fired).
* The last resort is pytest's ``faulthandler_timeout`` with ``faulthandler_exit_on_timeout``
  (pyproject.toml, past every test's timeout and grace): every thread's stack printed, and the
  run ended.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
from collections.abc import Generator
from types import FrameType
from typing import Any

import pytest

# Time given after a timeout to what it cancelled, and to any teardown nothing else bounds
# (the ``timeout_grace`` ini option).
GRACE_S = 15.0
# From this round on, the loop is also stopped (tasks that would not end when cancelled).
STOP_LOOP_ROUND = 3

_rounds = pytest.StashKey[int]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "timeout_grace",
        "seconds given after a timeout, and to a teardown no timer bounds",
        default=str(GRACE_S),
    )


def _grace_s(item: pytest.Item) -> float:
    return float(item.config.getini("timeout_grace"))


def _expired(item: pytest.Item, what: str) -> None:
    """The SIGALRM handler's work (main thread): stop what runs, and arm the next round."""
    signal.setitimer(signal.ITIMER_REAL, _grace_s(item))
    rounds = item.stash[_rounds] = item.stash.get(_rounds, 0) + 1
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # the main thread is not in an event loop
        pytest.fail(f"Timeout: {what}")
    tasks = [task for task in asyncio.all_tasks(loop) if not task.done()]
    terminal = item.config.get_terminal_writer()
    terminal.sep("+", title=f"Timeout: {what}; cancelling {len(tasks)} tasks")
    for task in tasks:
        task.print_stack(limit=12, file=sys.stderr)
        task.cancel(f"Timeout: {what}")
    if rounds >= STOP_LOOP_ROUND:
        loop.stop()


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool | None:
    """pytest-timeout's ``signal`` method, made to reach event loops (see the module)."""
    if settings.method != "signal" or threading.current_thread() is not threading.main_thread():
        return None  # pytest-timeout's own (signals reach the main thread only)

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        _expired(item, f"the test ran past {settings.timeout:g} s")

    def cancel() -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)

    item.cancel_timeout = cancel  # type: ignore[attr-defined]  # what pytest-timeout calls
    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, settings.timeout)
    return True


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, None, None]:
    """Bound a teardown that no timer bounds any more (see the module)."""
    if signal.getitimer(signal.ITIMER_REAL)[0] > 0:
        return (yield)  # the test's timer, or its grace after a timeout, still runs

    grace_s = _grace_s(item)

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        _expired(item, f"the teardown ran past {grace_s:g} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, grace_s)
    try:
        return (yield)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
