"""Logs: one line per event, JSON (for log shippers) or text (for people).

Every log line of the service — ours, uvicorn's and gunicorn's — goes through
:class:`LineFormatter`, set up by :func:`logging_config` (``python -m app`` passes it to uvicorn,
``deploy/gunicorn.conf.py`` to gunicorn as ``logconfig_dict``). Fields given as ``extra=`` (the
connection id, user, room count, close code...) become JSON keys, or ``key=value`` pairs in
text. Connection events log one line each; messages are never logged.
"""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime
from typing import Any, Final
from urllib.parse import unquote_plus

import orjson

from app.settings import Settings

# Attributes every LogRecord has: anything else on a record came in through ``extra=``.
_STANDARD: Final = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys()
    | {"message", "asctime", "color_message"}  # uvicorn adds color_message for its console
)


# Credentials that may ride in a logged request line, header or frame: the value of a query
# parameter named in _CREDENTIAL_PARAMS (`?token=`, a guest's `?guest=`: uvicorn logs each
# WebSocket's path with its query, and old clients put credentials there), a bearer token, a
# JSON field of the same names (an `auth` frame, `hello`'s guest key: uvicorn's debug log
# shows frames). No log line may carry one.
_CREDENTIAL_PARAMS: Final = frozenset(
    {
        "token", "access_token", "id_token", "refresh_token", "guest", "guest_key", "key",
        "api_key", "apikey", "password", "passwd", "secret", "client_secret",
    }
)  # fmt: skip
# A `name=value` pair of a query string (or of any text), the name as it was sent (it may be
# percent-encoded: the server decodes it before looking it up, so the check does too).
_PARAM: Final = re.compile(r"((?:^|[?&\s\"'/])([^=&?/\s\"']{1,64})=)([^&\s\"']+)")
_FIELD: Final = re.compile(
    r"(\"(?:" + "|".join(sorted(_CREDENTIAL_PARAMS)) + r")\"\s*:\s*\")[^\"]*", re.IGNORECASE
)
_BEARER: Final = re.compile(r"(bearer\s+)[^\s\"',]+", re.IGNORECASE)
# Cheap test first: text without any of these cannot hold a credential (%: a name encoded).
_HINTS: Final = ("token", "guest", "key", "pass", "secret", "bearer", "%")


def _param(match: re.Match[str]) -> str:
    if unquote_plus(match.group(2)).lower() in _CREDENTIAL_PARAMS:
        return f"{match.group(1)}[redacted]"
    return match.group(0)


def redact(text: str) -> str:
    """``text`` without the credentials it may carry (see ``_CREDENTIAL_PARAMS``)."""
    lowered = text.lower()
    if not any(hint in lowered for hint in _HINTS):
        return text
    text = _PARAM.sub(_param, text)
    text = _BEARER.sub(r"\1[redacted]", text)
    return _FIELD.sub(r"\1[redacted]", text)


def _field(name: str, value: object) -> object:
    """An ``extra=`` field as logged: redacted whole when its name is a credential's."""
    if name.lower() in _CREDENTIAL_PARAMS:
        return "[redacted]"
    return redact(value) if isinstance(value, str) else value


class LineFormatter(logging.Formatter):
    """Formats a record as one line: a JSON object (``json=True``) or readable text.

    JSON keys: ``ts`` (UTC, ISO 8601, ms), ``level``, ``logger``, ``msg``, then the extra
    fields, then ``exc`` (the traceback) when there is one. Credentials are redacted from every
    part, and a field named as one (``token``, ``key``...) is redacted whole (uvicorn logs
    request lines and WebSocket paths with their query: ``?token=``, ``?guest=``).
    """

    def __init__(self, json: bool = True) -> None:
        super().__init__()
        self._json = json

    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
        fields = {k: _field(k, v) for k, v in vars(record).items() if k not in _STANDARD}
        exc = redact(self.formatException(record.exc_info)) if record.exc_info else None
        message = redact(record.getMessage())
        if self._json:
            line: dict[str, Any] = {
                "ts": ts.replace("+00:00", "Z"),
                "level": record.levelname.lower(),
                "logger": record.name,
                "msg": message,
                **fields,
            }
            if exc:
                line["exc"] = exc
            return orjson.dumps(line, default=str).decode()
        text = f"{ts[:23]} {record.levelname:<7} {record.name}: {message}"
        if fields:
            text += " " + " ".join(f"{k}={v}" for k, v in fields.items())
        return f"{text}\n{exc}" if exc else text


class ClientFaults(logging.Filter):
    """Demotes uvicorn's ERROR-with-traceback for a client's invalid UTF-8 frame to one INFO
    line: any client can send one, and each would otherwise flood the error log (the socket is
    closed with 1007, and the session logs that close)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and str(record.msg).startswith(
            "Invalid UTF-8 sequence received from client"
        ):
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.exc_info, record.exc_text = None, None
            # Dropped where INFO is not logged, as an INFO record would have been.
            return logging.getLogger(record.name).isEnabledFor(logging.INFO)
        return True


class ConnectionEchoes(logging.Filter):
    """Drops uvicorn's and websockets' INFO lines for each WebSocket that opens or closes
    (``… "WebSocket /ws?…" [accepted]``, ``connection open``, ``connection closed``): the
    session logs each connection's opening and end itself, with its id and user
    (docs/operations.md, "Logs"). Theirs doubled the lines per connection, and formatting and
    writing them cost a worker ~25 us a connect. At ``CHAT_LOG_LEVEL=debug`` they stay."""

    _ECHOES: Final = frozenset(
        {'%s - "WebSocket %s" [accepted]', "connection open", "connection closed"}
    )

    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            record.levelno == logging.INFO
            and isinstance(record.msg, str)
            and record.msg in self._ECHOES
            and not logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        )


def skip_unused_record_fields() -> None:
    """Stop :mod:`logging` from filling in what no line here shows: the caller's file, line
    and function (a walk up the stack, ``sys._getframe``), the thread and the process (the
    Logging HOWTO's "Optimization"). Each record then costs ~2.5 us less; a connection's
    opening is one. Process-wide: gunicorn's workers inherit it from the master."""
    logging._srcfile = None  # documented as the switch for caller information
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False


def logging_config(settings: Settings) -> dict[str, Any]:
    """A :func:`logging.config.dictConfig` for the whole process: one stderr handler with
    :class:`LineFormatter`; uvicorn's per-request access log off (nginx keeps one). Also
    applies :func:`skip_unused_record_fields` (none of the formats shows those fields)."""
    skip_unused_record_fields()
    level = settings.log_level.upper()
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "line": {"()": LineFormatter, "json": settings.log_format == "json"},
        },
        "filters": {
            "client_faults": {"()": ClientFaults},
            "connection_echoes": {"()": ConnectionEchoes},
        },
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "line",
                "stream": "ext://sys.stderr",
            },
        },
        "root": {"handlers": ["stderr"], "level": "WARNING"},
        "loggers": {
            "app": {"level": level},
            "uvicorn": {"level": level},
            "uvicorn.error": {"level": level, "filters": ["client_faults", "connection_echoes"]},
            "uvicorn.access": {"level": "WARNING", "propagate": False},
            "gunicorn.error": {"level": level, "handlers": ["stderr"], "propagate": False},
            "gunicorn.access": {"level": "WARNING", "propagate": False},
        },
    }
