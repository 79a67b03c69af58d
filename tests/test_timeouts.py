"""The suite's own timeouts (``tests/timeouts.py``) end tests that hang on uvloop, and their
teardowns: an inner pytest run, on uvloop as the suite is, of tests that never end by
themselves must end, each reported failed, within its timeout and grace."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

INNER_CONFIG = """\
[pytest]
asyncio_mode = auto
asyncio_default_fixture_loop_scope = function
asyncio_default_test_loop_scope = function
timeout = 1
timeout_grace = 1
addopts = -p tests.timeouts -p no:cacheprovider
"""

INNER_CONFTEST = """\
import uvloop

def pytest_asyncio_loop_factories(config, item):
    return {"uvloop": uvloop.new_event_loop}
"""

INNER_TESTS = """\
import asyncio
import time

import pytest


async def test_awaits_forever():
    await asyncio.Event().wait()


@pytest.fixture
async def stuck_teardown():
    yield
    await asyncio.Event().wait()


async def test_fails_then_its_teardown_hangs(stuck_teardown):
    assert False


async def test_awaits_forever_then_its_teardown_hangs(stuck_teardown):
    await asyncio.Event().wait()


def test_sleeps_forever():
    time.sleep(3600)


async def test_swallows_every_cancellation():
    while True:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            pass


def test_after_them_all():
    pass
"""


def test_hanging_tests_and_teardowns_end_failed_and_the_run_goes_on(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text(INNER_CONFIG)
    (tmp_path / "conftest.py").write_text(INNER_CONFTEST)
    (tmp_path / "test_inner.py").write_text(INNER_TESTS)
    report = tmp_path / "report.xml"
    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "pytest", f"--junitxml={report}", "test_inner.py"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=50,
    )
    elapsed = time.monotonic() - started
    assert run.returncode == 1, textwrap.shorten(run.stdout + run.stderr, 3000)
    outcomes: dict[str, set[str]] = {}  # a teardown's error is a testcase entry of its own
    for case in ET.parse(report).getroot().iter("testcase"):
        found = {child.tag for child in case if child.tag in ("failure", "error", "skipped")}
        outcomes.setdefault(case.attrib["name"], set()).update(found or {"passed"})
    assert outcomes == {
        "test_awaits_forever": {"failure"},
        "test_fails_then_its_teardown_hangs": {"failure", "error"},
        "test_awaits_forever_then_its_teardown_hangs": {"failure", "error"},
        "test_sleeps_forever": {"failure"},
        "test_swallows_every_cancellation": {"failure"},
        "test_after_them_all": {"passed"},
    }, run.stdout[-3000:]
    assert "Timeout: the test ran past 1 s" in run.stdout + run.stderr
    assert elapsed < 40
