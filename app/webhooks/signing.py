"""Signing webhook requests, and checking them (receivers in Python can import this).

Every request carries ``Hubbub-Signature: t=<unix seconds>,v1=<hex>``, where the hex is the
HMAC-SHA256, keyed with ``CHAT_WEBHOOK_SECRET``, of ``<t>.<the raw body>``. A receiver
recomputes it over the body it received, compares in constant time, and refuses a ``t`` more
than its tolerance (300 s here) away from its clock: a replayed request is refused once it is
that old, and a duplicate within it has an ``id`` already seen.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import Final

HEADER: Final = "Hubbub-Signature"
TOLERANCE_S: Final = 300.0


class BadSignature(Exception):
    """The request is not from Hubbub, altered, or too old."""


def signature(secret: bytes, timestamp: int, body: bytes) -> str:
    """The ``Hubbub-Signature`` header value of ``body`` sent at ``timestamp``."""
    digest = hmac.new(secret, b"%d." % timestamp + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def verify(
    secret: bytes,
    headers: Mapping[str, str],
    body: bytes,
    now: float,
    tolerance_s: float = TOLERANCE_S,
) -> None:
    """Raise :class:`BadSignature` unless ``body`` was signed with ``secret`` within
    ``tolerance_s`` of ``now`` (epoch seconds)."""
    value = headers.get(HEADER) or headers.get(HEADER.lower())
    if not value:
        raise BadSignature(f"no {HEADER} header")
    parts = dict(part.split("=", 1) for part in value.split(",") if "=" in part)
    try:
        timestamp = int(parts["t"])
        given = parts["v1"]
    except (KeyError, ValueError):
        raise BadSignature(f"malformed {HEADER} header") from None
    if abs(now - timestamp) > tolerance_s:
        raise BadSignature("signed too long ago (or in the future): a replay?")
    expected = signature(secret, timestamp, body).split("v1=", 1)[1]
    if not hmac.compare_digest(expected, given):
        raise BadSignature("signature mismatch")
