"""The log lines' format (app.ops.logs), in-process: the configured pipeline a record goes
through (the servers' own lines are checked in test_metrics, test_security, test_identity)."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import orjson
import pytest

from app.ops.logs import LineFormatter, logging_config
from tests.helpers import make_settings

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(autouse=True)
def _record_fields_restored() -> Iterator[None]:
    """The service's logging config switches process-wide globals (caller, thread, process
    fields): put them back for the tests that run after these in this process."""
    saved = (logging._srcfile, logging.logThreads, logging.logProcesses)
    multiprocessing = logging.logMultiprocessing
    yield
    logging._srcfile, logging.logThreads, logging.logProcesses = saved
    logging.logMultiprocessing = multiprocessing


def _captured(logger_name: str) -> tuple[logging.Logger, io.StringIO, list[logging.LogRecord]]:
    """``logger_name`` (not propagating) after the service's logging config was made (not
    applied: the test process keeps its own), writing JSON lines to a buffer, and the records
    it made."""
    config = logging_config(make_settings())
    assert config["formatters"]["line"]["()"] is LineFormatter
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(LineFormatter(json=True))
    records: list[logging.LogRecord] = []

    def keep(record: logging.LogRecord) -> bool:
        records.append(record)
        return True

    handler.addFilter(keep)
    logger = logging.getLogger(logger_name)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger, out, records


def test_a_line_has_its_fields_and_the_record_skips_what_no_line_shows() -> None:
    logger, out, records = _captured("app.test_logs")
    try:
        logger.info("connection opened", extra={"conn": "c1", "user": "alice", "ip": "127.0.0.1"})
        try:
            raise ValueError("boom")
        except ValueError:
            logger.exception("failed", extra={"token": "s3cret"})
    finally:
        logger.handlers.clear()
    first, second = (orjson.loads(line) for line in out.getvalue().splitlines()[:2])
    assert first["msg"] == "connection opened" and first["level"] == "info"
    assert (first["conn"], first["user"], first["ip"]) == ("c1", "alice", "127.0.0.1")
    assert first["ts"].endswith("Z") and first["logger"] == "app.test_logs"
    assert second["level"] == "error" and "ValueError: boom" in second["exc"]
    assert "s3cret" not in out.getvalue()
    # No walk up the stack for the caller, no thread or process lookup: no format shows them.
    assert records[0].funcName == "(unknown function)" and records[0].lineno == 0
    assert records[0].thread is None and records[0].process is None
